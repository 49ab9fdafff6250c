"""TraceLab reader at the size of the public release: time and peak memory to read it, and to convert it to Arrow.

TraceLab v0.0.2 holds 665,453 LLM rounds in 8,058 sessions (~650 MB of round JSONL); the release is not shipped with
the project, so this generates a file of that size and shape (`--rounds`, default 665,453): Claude Code and Codex
sessions of 10 to 250 rounds whose prompts grow by a lognormal ~2.5k tokens a round from a ~25k-token preamble, the
cached prefix the previous prompt (3% of rounds a miss back to the preamble, Codex rounds cached in 128-token steps),
compactions back to ~30k tokens past 160k, 2 to 8 timing events and up to 2 tools a round (~1 KB a row), and one
subagent thread in one session of 20 (Claude Code's transcripts, numbered from round 0 again). The file is kept in
`--out` and reused.

Then it reads the file with `agentx.load_trace` in a fresh process, `--repeat` times, and prints the time and the
process's peak RSS (`ru_maxrss`) beside the targets (under a minute, under 2 GB), and the same for `agentx convert` to
Arrow and for reading that Arrow file. Never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/tracelab_read.py [--rounds 665453] [--repeat 2] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
RELEASE_ROUNDS = 665_453
RELEASE_SESSIONS = 8_058
SEED = 2_606_305
TARGET_READ_S = 60.0
TARGET_RSS_MB = 2_000.0
MB = 1e6

_EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
_TOOLS = ("Bash", "Read", "Edit", "Grep", "Glob", "Write", "WebSearch", "exec_command", "apply_patch")


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _session_rows(rng: random.Random, index: int, rounds: int, subagent: bool) -> list[dict[str, object]]:
    """One session's rows, in file order: the main thread's, then (where asked) a subagent's, numbered from 0."""
    codex = rng.random() < 0.3
    provider, model = ("codex", "gpt-5.4") if codex else ("claude", "claude-opus-4-8")
    session_id = f"{provider}:{index:08x}-6d12-7b3a-9f42-{rng.getrandbits(48):012x}"
    start = _EPOCH + timedelta(seconds=rng.uniform(0, 180 * 86_400))
    rows = _thread_rows(rng, provider, model, session_id, start, rounds, preamble=rng.randint(18_000, 30_000))
    if subagent:
        spawn = rows[len(rows) // 3]["timing_events"][0]["timestamp"]  # type: ignore[index]
        at = datetime.fromisoformat(str(spawn).replace("Z", "+00:00")) + timedelta(seconds=1)
        rows += _thread_rows(rng, provider, model, session_id, at, rng.randint(3, 12), preamble=12_000)
    return rows


def _thread_rows(
    rng: random.Random, provider: str, model: str, session_id: str, at: datetime, rounds: int, preamble: int
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    context = preamble + rng.randint(200, 3_000)
    for round_index in range(rounds):
        appended = int(rng.lognormvariate(math.log(1_800), 0.9))
        miss = rng.random() < 0.03
        prefix = preamble if miss or round_index == 0 else context
        if context > 160_000:
            context, prefix = 30_000, preamble  # a compaction: the conversation starts over from a summary
        total = context + appended
        prefix = min(prefix, total)
        if provider == "codex":
            prefix -= prefix % 128
        output = int(rng.lognormvariate(math.log(300), 1.0)) + 1
        events: list[dict[str, object]] = []
        user = round_index == 0 or rng.random() < 0.08
        tool_count = 0 if rng.random() < 0.6 else rng.choice((1, 1, 1, 2))
        if user:
            events.append(_event("user_message", at, "user.message", content_chars=rng.randint(20, 2_000)))
        else:
            for _ in range(rng.choice((1, 1, 1, 2))):
                events.append(
                    _event("tool_result", at, "user.content.tool_result", result_chars=rng.randint(10, 9_000))
                )
        at += timedelta(seconds=rng.uniform(0.5, 6))
        if rng.random() < 0.5:
            events.append(_event("reasoning", at, "assistant.content.thinking", content_chars=0))
        at += timedelta(seconds=rng.uniform(0.1, 2))
        events.append(_event("text", at, "assistant.content.text", content_chars=rng.randint(10, 800)))
        tools: list[dict[str, object]] = []
        for tool_index in range(tool_count):
            at += timedelta(seconds=rng.uniform(0.1, 1.5))
            name = rng.choice(_TOOLS)
            call_id = f"toolu_{rng.getrandbits(88):022x}"
            events.append(_event("tool_call", at, "assistant.content.tool_use", tool_call_id=call_id, tool_name=name))
            wall_ms = int(rng.lognormvariate(math.log(900), 1.3))
            tools.append(
                {"tool_index": tool_index, "tool_name": name, "tool_call_id": call_id, "emitted_at": _stamp(at),
                 "input_chars": rng.randint(20, 400), "result_chars": rng.randint(10, 9_000),
                 "tool_wall_latency_ms": wall_ms, "tool_internal_latency_ms": None, "is_error": False,
                 "result_at": _stamp(at + timedelta(milliseconds=wall_ms))}
            )  # fmt: skip
        if provider == "codex":
            events.append(_event("usage_report", at, "event_msg.token_count"))
        rows.append(
            {"provider": provider, "project": f"project_{hash(session_id) % 52:08x}", "session_id": session_id,
             "round_index": round_index, "round_id": f"msg_{rng.getrandbits(96):024x}", "model": model,
             "input_tokens_total": total, "prefix_tokens": prefix, "newly_append_tokens": total - prefix,
             "output_tokens": output, "reasoning_output_tokens": output // 3 if provider == "codex" else None,
             "timing_events": events, "tools": tools, "first_input_event_type": events[0]["event_type"],
             "store": f".{provider}", "trace_key": f"{provider}:{session_id}:{round_index}"}
        )  # fmt: skip
        context = total + output
        at += timedelta(seconds=rng.lognormvariate(math.log(3), 1.2) if not user else rng.uniform(5, 120))
    return rows


def _event(kind: str, at: datetime, source: str, **fields: object) -> dict[str, object]:
    return {"event_type": kind, "timestamp": _stamp(at), "source": source, **fields}


def generate(path: Path, rounds: int) -> None:
    """Write a release-shaped TraceLab file of about `rounds` rounds to `path`."""
    rng = random.Random(SEED)
    per_session = rounds / RELEASE_SESSIONS
    written = 0
    encoder = msgspec.json.Encoder()
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as out:
        index = 0
        while written < rounds:
            length = max(10, min(rounds - written, int(rng.uniform(0.12, 1.88) * per_session)))
            for row in _session_rows(rng, index, length, subagent=index % 20 == 7):
                out.write(encoder.encode(row))
                out.write(b"\n")
                written += 1
            index += 1
    partial.rename(path)


_READ = """
import resource, sys, time
started = time.perf_counter()
from agentx.trace.io import load_trace
trace = load_trace(sys.argv[1])
elapsed = time.perf_counter() - started
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 * 1.048576, trace.request_count,
      len(trace.sessions), sum(1 for s in trace.sessions for a, p, _ in s.agents() if p is not None))
"""


def _timed_convert(source: Path, target: Path) -> tuple[float, float]:
    started = time.perf_counter()
    agentx = ROOT / ".venv" / "bin" / "agentx"
    result = subprocess.run(
        ["/usr/bin/time", "-f", "%M", str(agentx), "convert", str(source), str(target), "--overwrite"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    return elapsed, int(result.stderr.strip().splitlines()[-1]) * 1024 / MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=RELEASE_ROUNDS)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tracelab_{args.rounds}.jsonl"
    if not path.exists():
        if shutil.disk_usage(args.out).free < args.rounds * 1_200 * 2:
            sys.exit(f"not enough free disk space in {args.out} for a {args.rounds:,}-round file")
        started = time.perf_counter()
        generate(path, args.rounds)
        print(f"generated {path} in {time.perf_counter() - started:.1f} s")
    size_mb = path.stat().st_size / MB
    print(f"file: {path} ({size_mb:,.0f} MB)")
    reads: list[tuple[float, float]] = []
    for _ in range(args.repeat):
        answer = subprocess.run(
            [sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, check=True, cwd=ROOT
        )
        elapsed, rss_mb, requests, sessions, subagents = answer.stdout.split()
        reads.append((float(elapsed), float(rss_mb)))
    converts = [_timed_convert(path, args.out / "tracelab.arrow") for _ in range(args.repeat)]
    arrow_reads: list[tuple[float, float]] = []
    for _ in range(args.repeat):
        answer = subprocess.run(
            [sys.executable, "-c", _READ, str(args.out / "tracelab.arrow")],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        arrow_reads.append((float(answer.stdout.split()[0]), float(answer.stdout.split()[1])))
    print(f"read: {int(requests):,} requests in {int(sessions):,} sessions, {int(subagents):,} subagents")
    print(f"{'figure':<34} {'median':>9} {'max':>9} {'target':>9}")
    for name, runs in (
        ("load_trace", reads),
        ("agentx convert → Arrow", converts),
        ("load_trace of the Arrow", arrow_reads),
    ):
        seconds, peaks = [run[0] for run in runs], [run[1] for run in runs]
        target_s, target_mb = f"< {TARGET_READ_S:.0f}", f"< {TARGET_RSS_MB:,.0f}"
        print(f"{name + ', s':<34} {statistics.median(seconds):>9.1f} {max(seconds):>9.1f} {target_s:>9}")
        print(f"{name + ', peak RSS MB':<34} {statistics.median(peaks):>9,.0f} {max(peaks):>9,.0f} {target_mb:>9}")
        print(f"{name + ', MB/s':<34} {size_mb / statistics.median(seconds):>9,.0f}")
    print(json.dumps({"reads": reads, "converts": converts, "arrow_reads": arrow_reads}))


if __name__ == "__main__":
    main()
