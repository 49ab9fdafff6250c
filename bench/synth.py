"""Synthesis benchmark: from-logs prompt tokens per second (built-in tokenizer) and generation time.

1. from-logs: renders preset-generated sessions into Anthropic proxy-capture JSONL with random text
   (agentx.synth.logs.mock_logs), then times `from_logs` on the file end to end (read, render, tokenize,
   hash, rebuild trees), against decoding the same file with msgspec alone (the floor any reader
   pays). The figure is the sum of every request's prompt tokens over the wall time; target >= 1M/s.
   Also the built-in tokenizer alone on never-seen text (no segment repeats).
2. generate: wall time of `generate(preset("agentic-coding"), sessions=100_000)`; target < 30 s.

Prints figures (median and min-max over --repeat runs); never fails on a number.

Usage: .venv/bin/python bench/synth.py [--log-sessions 40] [--sessions 100000] [--repeat 3] [--out bench/out]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from agentx.synth.generation import generate
from agentx.synth.logs.from_logs import from_logs
from agentx.synth.logs.mock_logs import mock_logs
from agentx.synth.logs.options import FromLogsOptions
from agentx.synth.logs.tokenize import ApproxTokenizer
from agentx.synth.presets import preset

TARGET_TOKENS_PER_S = 1e6
TARGET_GENERATE_S = 30.0


def _timed(action: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return times


def _spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    med, low, high = statistics.median(values) * scale, min(values) * scale, max(values) * scale
    return f"{med:,.2f} {unit} (min {low:,.2f}, max {high:,.2f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-sessions", type=int, default=40, help="sessions rendered into logs")
    parser.add_argument("--sessions", type=int, default=100_000, help="sessions to generate")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    source = generate(preset("agentic-coding"), sessions=args.log_sessions, seed=11)
    logs = args.out / "synth_capture.jsonl"
    lines = mock_logs(source, seed=11)
    logs.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    tokens = sum(r.in_tokens for s in source.sessions for a, _, _ in s.agents() for r in a.requests)
    size_mb = logs.stat().st_size / 1e6
    print(f"from-logs input: {source.request_count:,} requests, {tokens:,} prompt tokens, {size_mb:,.1f} MB JSONL")
    options = FromLogsOptions(format="anthropic-proxy")
    synth_s = _timed(lambda: from_logs([logs], options, salt=b"bench"), args.repeat)
    decode_s = _timed(lambda: [msgspec.json.decode(line) for line in logs.read_bytes().splitlines()], args.repeat)
    rates = [tokens / s for s in synth_s]
    print(f"  from-logs           {_spread(synth_s, 's')}")
    print(f"  prompt tokens/s     {_spread(rates, 'M/s', 1e-6)}   target >= {TARGET_TOKENS_PER_S / 1e6:g} M/s")
    ratio = statistics.median(synth_s) / statistics.median(decode_s)
    print(f"  peer: JSON decode   {_spread(decode_s, 's')}   (from-logs takes {ratio:.1f}x)")
    # Conversations re-send their history, so from-logs tokenizes each distinct segment once; this
    # is the tokenizer alone on text it has never seen (the worst case: no repetition at all).
    text = " ".join(line["request"]["messages"][-1]["content"][0].get("text", "x") for line in lines[:400]) * 4
    pieces = len(ApproxTokenizer().encode(text))
    raw_s = _timed(lambda: ApproxTokenizer().encode(text), args.repeat)
    print(
        f"  tokenizer uncached  {_spread([pieces / s for s in raw_s], 'M tokens/s', 1e-6)} on {len(text) / 1e6:.1f} MB"
    )
    logs.unlink()

    model = preset("agentic-coding")
    generate_s = _timed(lambda: generate(model, sessions=args.sessions, seed=1), max(1, args.repeat // 2))
    print(f"generate {args.sessions:,} sessions: {_spread(generate_s, 's')}   target < {TARGET_GENERATE_S:g} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
