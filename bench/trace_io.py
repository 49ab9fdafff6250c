"""Trace I/O benchmark: Weka JSONL → Arrow conversion, Arrow load time and peak RSS, file sizes.

Generates an AgentX-size corpus (~400 sessions, ~100k requests, median `in` ~90k tokens at block size
64, ~150M hash ids, ~0.75 GB of Weka JSONL), then times each operation several times, each run in a fresh
subprocess, and compares with parsing the same JSONL with the stdlib `json` module in the same run.
Prints figures; never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/trace_io.py [--scale 0.1] [--repeat 3] [--out bench/out] [--keep]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

FULL_SESSIONS = 400
BLOCK_SIZE = 64
SEED = 1_729
ROOT_MODEL = "claude-opus-4-5"
SUBAGENT_MODEL = "claude-haiku-4-5"
JSONL_BYTES_PER_SESSION = 2.7e6
"""Rough size of one generated session in JSONL, to check free disk space before writing."""

TARGET_CONVERT_MB_PER_S = 50.0
TARGET_LOAD_S = 2.0
TARGET_LOAD_RSS_MB = 1_500.0
TARGET_SIZE_RATIO = 1 / 5

MB = 1e6


# ---------------------------------------------------------------------------------------------
# corpus generation


class _IdText:
    """The JSON text of consecutive id runs, sliced out of one prebuilt string instead of formatted id by id."""

    def __init__(self, count: int = 1 << 20) -> None:
        self._build(count)

    def _build(self, count: int) -> None:
        self.count = count
        self.text = ",".join(map(str, range(count))) + ","
        self.offsets = [0, *itertools.accumulate(len(str(i)) + 1 for i in range(count))]

    def run(self, start: int, stop: int) -> str:
        """`"start,start+1,...,stop-1"` (ids of a run `[start, stop)`)."""
        if stop > self.count:
            self._build(max(stop, 2 * self.count))
        return self.text[self.offsets[start] : self.offsets[stop] - 1]


class _Prompt:
    """A prompt's hash ids as runs `[start, stop)` of consecutive ids, and its exact token count."""

    def __init__(self, runs: list[tuple[int, int]], tokens: int) -> None:
        self.runs = runs
        self.tokens = tokens

    @property
    def id_count(self) -> int:
        return sum(stop - start for start, stop in self.runs)


class _CorpusStats(msgspec.Struct, kw_only=True):
    sessions: int = 0
    requests: int = 0
    subagents: int = 0
    compactions: int = 0
    hash_ids: int = 0
    in_tokens: list[int] = msgspec.field(default_factory=list)


class _SessionWriter:
    """Simulates one Claude-Code-like session (tool loop, subagent groups, compactions) as a Weka JSON line."""

    def __init__(self, rng: random.Random, ids: _IdText, stats: _CorpusStats) -> None:
        self.rng = rng
        self.ids = ids
        self.stats = stats
        self.next_id = 0
        self.prefixes: dict[str, tuple[int, int, tuple[int, int]]] = {}

    def fresh(self, count: int) -> tuple[int, int]:
        run = (self.next_id, self.next_id + count)
        self.next_id += count
        return run

    def prefix(self, kind: str) -> tuple[int, int, tuple[int, int]]:
        """(tool tokens, system tokens, run of full-block ids) shared by every agent of `kind`."""
        if kind not in self.prefixes:
            rng = self.rng
            if kind == "root":
                tool, system = rng.randint(11_800, 12_600), rng.randint(2_700, 3_100)
            else:
                tool, system = rng.randint(7_300, 7_500), rng.randint(1_000, 1_500)
            self.prefixes[kind] = (tool, system, self.fresh((tool + system) // BLOCK_SIZE))
        return self.prefixes[kind]

    def start(self, kind: str, message_tokens: int) -> _Prompt:
        tool, system, run = self.prefix(kind)
        tokens = tool + system + message_tokens
        return _Prompt([run, self.fresh(-(-tokens // BLOCK_SIZE) - (run[1] - run[0]))], tokens)

    def grow(self, prompt: _Prompt, tokens: int) -> None:
        runs = prompt.runs
        if prompt.tokens % BLOCK_SIZE:  # the partial last block is re-hashed once it fills
            start, stop = runs[-1]
            if stop - start == 1:
                runs.pop()
            else:
                runs[-1] = (start, stop - 1)
        kept = prompt.id_count
        prompt.tokens += tokens
        new_start, new_stop = self.fresh(-(-prompt.tokens // BLOCK_SIZE) - kept)
        if runs and runs[-1][1] == new_start:
            runs[-1] = (runs[-1][0], new_stop)
        else:
            runs.append((new_start, new_stop))

    def compact(self, prompt: _Prompt, kind: str, summary_tokens: int) -> None:
        tool, system, run = self.prefix(kind)
        prompt.tokens = tool + system + summary_tokens
        prompt.runs = [run, self.fresh(-(-prompt.tokens // BLOCK_SIZE) - (run[1] - run[0]))]
        self.stats.compactions += 1

    def request(
        self, t: float, model: str, prompt: _Prompt, out: int, think: float | None, first: bool, final: bool
    ) -> tuple[str, float]:
        """The request's JSON text and its end time."""
        rng = self.rng
        tokens_per_s = 60.0 if model == ROOT_MODEL else 110.0
        api_time = round(1.0 + prompt.tokens / 80_000 + out / tokens_per_s * rng.uniform(0.85, 1.2), 2)
        ids = ",".join([self.ids.run(start, stop) for start, stop in prompt.runs])
        self.stats.requests += 1
        self.stats.hash_ids += prompt.id_count
        self.stats.in_tokens.append(prompt.tokens)
        outputs = '["text","thinking"]' if final else '["thinking","tool_use"]'
        text = (
            f'{{"type":"n","t":{t!r},"model":"{model}","in":{prompt.tokens},"out":{out},"hash_ids":[{ids}],'
            f'"input_types":["{"text" if first else "tool_result"}"],"output_types":{outputs},'
            f'"stop":"{"end_turn" if final else "tool_use"}","api_time":{api_time!r},'
            f'"think_time":{"null" if think is None else repr(think)}}}'
        )
        return text, t + api_time

    def think_s(self) -> float:
        return round(min(30.0, max(1.0, self.rng.lognormvariate(math.log(5.0), 0.7))), 3)

    def subagent(self, number: int, start_s: float) -> tuple[str, float]:
        """A Haiku Explore subagent from `start_s`: its JSON entry and its end time."""
        rng = self.rng
        prompt = self.start("Explore", rng.randint(150, 1_200))
        entries: list[str] = []
        turns = rng.randint(4, 15)
        t = round(start_s, 3)
        end = t
        for k in range(turns):
            final = k == turns - 1
            out = rng.randint(600, 3_000) if final else min(900, max(50, round(rng.lognormvariate(math.log(220), 0.6))))
            text, end = self.request(t, SUBAGENT_MODEL, prompt, out, self.think_s(), k == 0, final)
            entries.append(text)
            self.grow(prompt, out + min(20_000, max(40, round(rng.lognormvariate(math.log(3_000), 1.1)))))
            t = round(end + self.think_s() * 0.5, 3)
        tool, system, _ = self.prefix("Explore")
        duration_ms = math.ceil((end - start_s) * 1000)
        self.stats.subagents += 1
        entry = (
            f'{{"type":"subagent","t":{round(start_s, 3)!r},"agent_id":"agent_{number:03d}","subagent_type":"Explore",'
            f'"duration_ms":{duration_ms},"total_tokens":{prompt.tokens},"tool_use_count":{turns - 1},'
            f'"status":"completed","requests":[{",".join(entries)}],"models":["{SUBAGENT_MODEL}"],'
            f'"tool_tokens":{tool},"system_tokens":{system}}}'
        )
        return entry, round(start_s, 3) + duration_ms / 1000

    def session(self, index: int) -> str:
        rng = self.rng
        turns = min(1_200, max(20, round(rng.lognormvariate(math.log(180), 0.6))))
        compact_above = rng.randint(165_000, 185_000)
        prompt = self.start("root", rng.randint(300, 4_500))
        entries: list[str] = []
        subagents = 0
        t = 0.0
        think: float | None = None
        for k in range(turns):
            final = k == turns - 1
            if prompt.tokens > compact_above:
                self.compact(prompt, "root", rng.randint(25_000, 45_000))
            out = (
                rng.randint(200, 1_500) if final else min(4_000, max(50, round(rng.lognormvariate(math.log(280), 0.8))))
            )
            text, end = self.request(t, ROOT_MODEL, prompt, out, think, k == 0, final)
            entries.append(text)
            tool_result = min(40_000, max(20, round(rng.lognormvariate(math.log(500), 1.4))))
            if not final and rng.random() < 0.01:
                # A group of parallel Explore subagents; the parent's next request joins them.
                group = [
                    self.subagent(subagents + i + 1, end + rng.uniform(0.05, 0.8)) for i in range(rng.randint(1, 3))
                ]
                subagents += len(group)
                entries.extend(entry for entry, _ in group)
                end = max(sub_end for _, sub_end in group)
                tool_result = rng.randint(1_000, 6_000)
            self.grow(prompt, out + tool_result)
            think = self.think_s()
            t = round(end + think, 3)
        self.stats.sessions += 1
        tool, system, _ = self.prefix("root")
        models = f'["{ROOT_MODEL}","{SUBAGENT_MODEL}"]' if subagents else f'["{ROOT_MODEL}"]'
        return (
            f'{{"id":"bench_{index:04d}","models":{models},"block_size":{BLOCK_SIZE},"hash_id_scope":"local",'
            f'"tool_tokens":{tool},"system_tokens":{system},"requests":[{",".join(entries)}]}}\n'
        )


def generate_corpus(path: Path, sessions: int, seed: int = SEED) -> _CorpusStats:
    """Write `sessions` synthetic sessions as Weka JSONL to `path`."""
    rng = random.Random(seed)
    ids = _IdText()
    stats = _CorpusStats()
    with open(path, "w", encoding="ascii", buffering=1 << 22) as out:
        for index in range(sessions):
            out.write(_SessionWriter(rng, ids, stats).session(index))
    return stats


# ---------------------------------------------------------------------------------------------
# measurements, each run in a fresh subprocess (`--worker`)


def _peak_rss_mb() -> float:
    """This process's peak RSS since it started (exec), in MB."""
    # ru_maxrss would do, but Linux carries the parent's RSS at fork over to the child's ru_maxrss:
    # VmHWM is the high-water mark of this process's own address space only.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB  # KiB on Linux


def _worker(kind: str, paths: Sequence[str]) -> dict[str, float]:
    """Run one measurement in this (fresh) process; returns its figures."""
    from agentx.trace.io import load_trace, save_trace

    figures = {"baseline_rss_mb": _peak_rss_mb()}
    start = time.perf_counter()
    if kind == "convert":
        trace = load_trace(paths[0], format="weka")
        loaded = time.perf_counter()
        save_trace(trace, paths[1], format="arrow")
        figures |= {"load_s": loaded - start, "save_s": time.perf_counter() - loaded, "requests": trace.request_count}
    elif kind == "load":
        trace = load_trace(paths[0], format="arrow")
        figures |= {"requests": trace.request_count}
    elif kind == "json":
        sessions = 0
        with open(paths[0], "rb") as lines:
            for line in lines:
                json.loads(line)
                sessions += 1
        figures |= {"sessions": sessions}
    else:
        raise ValueError(kind)
    figures["duration_s"] = time.perf_counter() - start
    figures["rss_mb"] = _peak_rss_mb()
    return figures


def _measure(kind: str, *paths: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--worker", kind, *map(str, paths)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


# ---------------------------------------------------------------------------------------------
# report


@dataclass
class _Figure:
    name: str
    values: list[float]
    unit_format: str = "{:.2f}"
    target: str = ""
    met: Callable[[float], bool] | None = None


def _row(figure: _Figure) -> list[str]:
    median = statistics.median(figure.values)
    spread = (
        f"{figure.unit_format.format(min(figure.values))}–{figure.unit_format.format(max(figure.values))}"
        if len(figure.values) > 1
        else ""
    )
    status = "" if figure.met is None else ("met" if figure.met(median) else "MISSED")
    return [figure.name, figure.unit_format.format(median), spread, figure.target, status]


def _print_table(figures: list[_Figure]) -> None:
    header = ["figure", "median", "min–max", "target", ""]
    rows = [header, *(_row(figure) for figure in figures)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for number, row in enumerate(rows):
        cells = [
            row[0].ljust(widths[0]),
            *(cell.rjust(width) for cell, width in zip(row[1:4], widths[1:4], strict=True)),
        ]
        print("  ".join([*cells, row[4]]).rstrip())
        if number == 0:
            print("  ".join("-" * width for width in widths[:4]))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full 400-session corpus")
    parser.add_argument("--sessions", type=int, help="number of sessions (overrides --scale)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (default 3)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep the generated JSONL and Arrow files")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker[0], args.worker[1:])))
        return

    sessions = args.sessions or max(1, round(FULL_SESSIONS * args.scale))
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl, arrow_path = args.out / "corpus.weka.jsonl", args.out / "corpus.arrow"
    free_bytes = shutil.disk_usage(args.out).free
    needed_bytes = 2 * sessions * JSONL_BYTES_PER_SESSION
    if free_bytes < needed_bytes:
        sys.exit(f"{args.out}: {free_bytes / MB:,.0f} MB free, the corpus needs ~{needed_bytes / MB:,.0f} MB")

    print(f"generating {sessions} sessions into {jsonl} ({free_bytes / 1e9:,.0f} GB free) ...", flush=True)
    start = time.perf_counter()
    stats = generate_corpus(jsonl, sessions)
    generate_s = time.perf_counter() - start
    jsonl_mb = jsonl.stat().st_size / MB
    print(
        f"corpus: {stats.sessions} sessions, {stats.requests:,} requests, {stats.subagents} subagents, "
        f"{stats.compactions} compactions, {stats.hash_ids / 1e6:,.1f}M hash ids, "
        f"median in {statistics.median(stats.in_tokens):,.0f} tokens, {jsonl_mb:,.0f} MB JSONL "
        f"(generated in {generate_s:.1f} s)",
        flush=True,
    )

    runs: dict[str, list[dict[str, float]]] = {"convert": [], "load": [], "json": []}
    try:
        for number in range(args.repeat):
            # Interleaved, so that a drift in machine speed touches every figure alike.
            runs["convert"].append(_measure("convert", jsonl, arrow_path))
            runs["load"].append(_measure("load", arrow_path))
            runs["json"].append(_measure("json", jsonl))
            print(
                f"run {number + 1}/{args.repeat}: convert {runs['convert'][-1]['duration_s']:.2f} s, "
                f"load {runs['load'][-1]['duration_s']:.2f} s, json {runs['json'][-1]['duration_s']:.2f} s",
                flush=True,
            )
        arrow_mb = arrow_path.stat().st_size / MB
    finally:
        if not args.keep:
            jsonl.unlink(missing_ok=True)
            arrow_path.unlink(missing_ok=True)

    def values(kind: str, key: str) -> list[float]:
        return [run[key] for run in runs[kind]]

    convert_s, json_s = values("convert", "duration_s"), values("json", "duration_s")
    # Per-run ratios pair runs made back to back, which is what keeps a ratio stable on a noisy machine.
    speedup = [peer / ours for ours, peer in zip(convert_s, json_s, strict=True)]
    load_speedup = [peer / ours for ours, peer in zip(values("convert", "load_s"), json_s, strict=True)]
    figures = [
        _Figure(name="Weka JSONL → Arrow, total (s)", values=convert_s),
        _Figure(name="  of which load_trace(JSONL) (s)", values=values("convert", "load_s")),
        _Figure(name="  of which save_trace(Arrow) (s)", values=values("convert", "save_s")),
        _Figure(
            name="  conversion speed (MB/s of JSONL)",
            values=[jsonl_mb / s for s in convert_s],
            unit_format="{:.0f}",
            target=f"≥ {TARGET_CONVERT_MB_PER_S:.0f}",
            met=lambda v: v >= TARGET_CONVERT_MB_PER_S,
        ),
        _Figure(name="  conversion peak RSS (MB)", values=values("convert", "rss_mb"), unit_format="{:.0f}"),
        _Figure(
            name="Arrow → Trace, load_trace (s)",
            values=values("load", "duration_s"),
            target=f"< {TARGET_LOAD_S:.0f}",
            met=lambda v: v < TARGET_LOAD_S,
        ),
        _Figure(
            name="  load peak RSS (MB)",
            values=values("load", "rss_mb"),
            unit_format="{:.0f}",
            target=f"< {TARGET_LOAD_RSS_MB:,.0f}",
            met=lambda v: v < TARGET_LOAD_RSS_MB,
        ),
        _Figure(name="  RSS before loading (MB)", values=values("load", "baseline_rss_mb"), unit_format="{:.0f}"),
        _Figure(name="peer: stdlib json.loads per line (s)", values=json_s),
        _Figure(name="  peer speed (MB/s of JSONL)", values=[jsonl_mb / s for s in json_s], unit_format="{:.0f}"),
        _Figure(name="  peer peak RSS (MB)", values=values("json", "rss_mb"), unit_format="{:.0f}"),
        _Figure(name="agentx conversion speed ÷ peer speed", values=speedup),
        _Figure(name="agentx JSONL load speed ÷ peer speed", values=load_speedup),
        _Figure(name="JSONL size (MB)", values=[jsonl_mb], unit_format="{:.0f}"),
        _Figure(name="Arrow size (MB)", values=[arrow_mb], unit_format="{:.1f}"),
        _Figure(
            name="Arrow / JSONL size",
            values=[arrow_mb / jsonl_mb],
            unit_format="{:.4f}",
            target=f"≤ {TARGET_SIZE_RATIO:.2f}",
            met=lambda v: v <= TARGET_SIZE_RATIO,
        ),
    ]
    print(f"\n{args.repeat} runs each, every run in a fresh subprocess; the JSONL is in the page cache.\n")
    _print_table(figures)


if __name__ == "__main__":
    main()
