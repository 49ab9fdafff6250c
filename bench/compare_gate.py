"""The `agentx compare --fail-on` gate on the built-in simulator: its false-alarm rate and its power.

- False alarms: `--pairs` pairs of runs of one simulated deployment (a fresh simulator per run, same engine), each
  pair paired (one seed) and each pair drawing its own sessions (the seed differs from pair to pair); every pair
  gated with a few typical bounds at compare's defaults (95 % family-wise, 2,000 replicates, ±1 % floor). Nothing
  differs, so a failing pair is a false alarm: at most the family-wise 5 % is expected (1 of 20).
- Power: `--power-pairs` pairs whose candidate's every step takes 10 % longer (`--time-scale 1.1`: the simulated
  clock runs 10 % slow, prefill, decode and overheads alike), gated with `-3%`/`+5%` bounds: how many fail.

Prints the figures (pairs failing, per bound, and why); never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/compare_gate.py [--pairs 20] [--power-pairs 10] [--sessions 10] [--slowdown 0.10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

import agentx
from agentx.results.compare.build import compare
from agentx.results.compare.gate import GateResult, evaluate, parse_gate
from agentx.results.compare.options import CompareOptions
from agentx.sim.engine.config import EngineConfig
from agentx.trace.model import Agent, Request, Session, Trace

BLOCK = 16
FALSE_ALARM_GATE = "output_throughput:-3%,interactivity_p50:-3%,tpot_p50:+5%,ttft_p90:+10%,e2el_p90:+10%"
"""Typical bounds a serving team would set on an upgrade."""
POWER_GATE = "output_throughput:-3%,interactivity_p50:-3%,tpot_p50:+5%,e2el_p90:+5%"


def _trace(sessions: int) -> Trace:
    """Coding-agent-like sessions: four turns each, a growing prompt (reused prefix), 8-96 output tokens, think times
    of 0.2 s plus an exponential draw; each session drawn on its own, so sessions differ as in a real trace."""
    rng = np.random.default_rng(3)
    out = []
    for s in range(sessions):
        requests, kept, t = [], 0, 0.0
        for _ in range(4):
            blocks = kept + int(rng.integers(8, 48))
            requests.append(
                Request(t=t, model="m", in_tokens=blocks * BLOCK, out_tokens=int(rng.integers(8, 96)), api_time=0.3,
                        hash_ids_kept=kept, hash_ids_added=tuple(range(10_000 * s + kept, 10_000 * s + blocks)))
            )  # fmt: skip
            kept, t = blocks, t + 0.3 + float(rng.exponential(0.4))
        out.append(Session(session_id=f"s{s}", root=Agent(requests=requests)))
    return Trace(sessions=out, block_size=BLOCK)


def _engine(time_scale: float) -> EngineConfig:
    """A step of 8 ms, 1 ms per running sequence and 20 µs per prefill token (× `time_scale`)."""
    return EngineConfig(block_size=BLOCK, step_overhead_s=0.008, decode_s_per_token=0.001, prefill_s_per_token=20e-6,
                        attention_s_per_kv_token=0.0, time_scale=time_scale)  # fmt: skip


def _run(trace: Trace, out_dir: Path, time_scale: float, seed: int, sessions: int) -> Path:
    with agentx.sim.SimServer(_engine(time_scale)) as server:
        options = agentx.ReplayOptions(
            server=agentx.Server(url=server.url, model=server.model),
            out_dir=out_dir,
            load=agentx.ClosedLoad(concurrency=3),
            scenario=agentx.Scenario(sessions=sessions, delay_scale=0.2, session_order="shuffle", seed=seed),
            runtime=agentx.Runtime(grace_s=5.0),
        )
        agentx.replay_sync(trace, options, num_gpus=8)
    return out_dir


def _pairs(label: str, pairs: int, slowdown: float, gate_text: str, args: argparse.Namespace, root: Path) -> None:
    """Run `pairs` (baseline, candidate) pairs, gate each, print how many fail, per bound and why."""
    trace = _trace(args.trace_sessions)
    gate = parse_gate(gate_text, ())
    failed_pairs = 0
    per_bound: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    started = time.monotonic()
    for pair in range(pairs):
        seed = 1000 + pair
        base = _run(trace, root / f"{label}-{pair}-base", 1.0, seed, args.sessions)
        new = _run(trace, root / f"{label}-{pair}-new", 1.0 + slowdown, seed, args.sessions)
        result: GateResult = evaluate(gate, compare([base, new], CompareOptions(seed=pair)), gate_text)
        failed_pairs += not result.passed
        for check in result.failed:
            per_bound[check.bound] += 1
            reasons[check.reason.split(":")[0]] += 1
        shown = "; ".join(f"{c.bound} {c.reason}" for c in result.failed) or "passed"
        print(f"  {label} pair {pair + 1:2d}/{pairs}: {shown}", flush=True)
    wall = time.monotonic() - started
    print(f"{label}: {failed_pairs} of {pairs} pairs fail the gate {gate_text} ({wall:.0f} s)")
    for bound in gate.bounds:
        print(f"  {bound.text:28s} fails in {per_bound[bound.text]} of {pairs}")
    for reason, count in reasons.most_common():
        print(f"  why: {reason} ({count} bounds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="Pairs of one deployment (false alarms).")
    parser.add_argument("--power-pairs", type=int, default=10, help="Pairs with a slower candidate (power).")
    parser.add_argument("--slowdown", type=float, default=0.10, help="The candidate's steps take this much longer.")
    parser.add_argument("--sessions", type=int, default=10, help="Session trees a run plays.")
    parser.add_argument("--trace-sessions", type=int, default=24, help="Sessions in the trace the runs draw from.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compare-gate-") as folder:
        root = Path(folder)
        if args.pairs:
            _pairs("same deployment", args.pairs, 0.0, FALSE_ALARM_GATE, args, root)
        if args.power_pairs:
            _pairs(f"{args.slowdown:.0%} slower", args.power_pairs, args.slowdown, POWER_GATE, args, root)
    print(f"wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
