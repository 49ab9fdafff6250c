"""A concurrency sweep by hand: replay the same sessions at a few concurrency levels, one line per level.

    .venv/bin/python examples/sweep_by_hand.py                          # levels 1, 2, 4 on the simulator
    .venv/bin/python examples/sweep_by_hand.py --levels 8,16,32 --url http://127.0.0.1:8000 --model my-model

Without --url each level gets a fresh `agentx.sim.SimServer`, so every level starts with a cold prefix cache.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import agentx

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "sample.arrow"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=SAMPLE)
    parser.add_argument("--url", help="an OpenAI-compatible server (default: a simulator per level)")
    parser.add_argument("--model", help="the model to name (default: the simulator's)")
    parser.add_argument("--levels", default="1,2,4", help="concurrency levels, comma-separated")
    parser.add_argument("--sessions", type=int, default=4, help="session trees per level")
    parser.add_argument("--time-scale", type=float, default=0.05, help="simulator clock, wall s per simulated s")
    parser.add_argument("--delay-scale", type=float, default=0.05, help="multiplies the trace's think times")
    parser.add_argument("--out", type=Path, help="directory for one run directory per level (default: temporary)")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    if args.url is not None and args.model is None:
        parser.error("--model is required with --url")

    trace = agentx.trace.load_trace(args.trace)
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentx-sweep-")))
        print(f"{'concurrency':>11}  {'requests':>8}  {'output tok/s':>12}  {'total tok/s':>12}  {'p90 intvty':>10}")
        for level in levels:
            with contextlib.ExitStack() as server:
                url, model = args.url, args.model
                if url is None:
                    sim = agentx.sim.SimServer(time_scale=args.time_scale, block_size=trace.block_size)
                    server.enter_context(sim)
                    url, model = sim.url, sim.model
                options = agentx.ReplayOptions(
                    server=agentx.Server(url=url, model=model),
                    out_dir=out / f"c{level}",
                    # Every turn from the start of each session; the default load, AgentxLoad, resumes each lane
                    # mid-session at its t* after a warmup, as the AgentX benchmark does.
                    load=agentx.ClosedLoad(concurrency=level),
                    scenario=agentx.Scenario(sessions=args.sessions, delay_scale=args.delay_scale),
                )
                summary = agentx.replay_sync(trace, options).summary
            output_tps = summary.throughput.output_tps if summary.throughput else 0.0
            total_tps = summary.throughput.total_tps if summary.throughput else 0.0
            p90 = summary.latency.interactivity_tps.p90 if summary.latency.interactivity_tps else float("nan")
            print(f"{level:>11}  {summary.counts.kept:>8}  {output_tps:>12,.1f}  {total_tps:>12,.1f}  {p90:>10,.1f}")


if __name__ == "__main__":
    main()
