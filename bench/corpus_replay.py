"""The AgentX-size corpus replayed in the AgentX scenario: how long the client's own work holds the loop.

Large sessions (over 100 ms to split and plan) and 100k-token prompts (10–30 ms to make) are made on worker threads
(agentx.replayer.schedule.offloop). This runs the corpus of `startup.py` against the built-in simulator, with the
simulator's times and the trace's delays scaled by `--scale`, once with that off-loop work and once with every plan and
body made on the loop, alternating, and prints the profiling requests' dispatch lag and the event loop's lag (how late a
100 ms timer fires) for each. Never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/corpus_replay.py [--lanes 32] [--duration 40] [--scale 0.05] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import _corpus  # a sibling script, not a package

from agentx.records.record import read_records, to_records
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.schedule import runner
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace
from agentx.trace.model import Trace

ROOT = Path(__file__).resolve().parent.parent
OFF_LOOP_THRESHOLDS = ("OFF_LOOP_REQUESTS", "OFF_LOOP_TOKENS")
"""The runner's sizes from which plans and bodies go off the loop (agentx.replayer.schedule.offloop)."""


def _one_run(trace: Trace, lanes: int, duration_s: float, scale: float, off_loop: bool) -> dict[str, float]:
    thresholds = vars(runner)
    defaults = {name: thresholds[name] for name in OFF_LOOP_THRESHOLDS}
    if not off_loop:  # every plan and body on the loop, as before agentx.replayer.schedule.offloop
        thresholds.update(dict.fromkeys(OFF_LOOP_THRESHOLDS, sys.maxsize))
    try:
        with SimServer(time_scale=scale, block_size=trace.block_size) as sim, tempfile.TemporaryDirectory() as out:
            options = ReplayOptions(
                server=Server(url=sim.url, model=sim.model),
                out_dir=Path(out),
                load=AgentxLoad(concurrency=lanes),
                scenario=Scenario(duration_s=duration_s, delay_scale=scale),
                runtime=Runtime(grace_s=1.0, quiet_gc=True, fast_thread_switch=True),  # the CLI's settings
            )
            result = asyncio.run(run_replay(trace, options))
            records = [r for r in to_records(read_records(result.records_path)) if r.phase == "profiling"]
    finally:
        thresholds.update(defaults)
    lag_ms = np.array([r.dispatch_lag_s for r in records] or [np.nan]) * 1e3
    loop_ms = np.array(result.loop_lag_s or [np.nan]) * 1e3
    return {
        "requests": float(len(records)),
        "dispatch lag p99 ms": float(np.percentile(lag_ms, 99)),
        "dispatch lag max ms": float(lag_ms.max()),
        "loop lag p99 ms": float(np.percentile(loop_ms, 99)),
        "loop lag max ms": float(loop_ms.max()),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=32)
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per run")
    parser.add_argument("--scale", type=float, default=0.05, help="simulator time and trace delays scale")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = load_trace(_corpus(args.out, 400))
    runs: dict[str, list[dict[str, float]]] = {"off the loop": [], "on the loop": []}
    for number in range(args.repeat):
        for name, values in runs.items():  # interleaved: a drift in machine speed touches both alike
            figures = _one_run(trace, args.lanes, args.duration, args.scale, off_loop=name == "off the loop")
            values.append(figures)
            shown = ", ".join(f"{key} {value:.1f}" for key, value in figures.items())
            print(f"  run {number + 1} ({name}): {shown}", flush=True)
    print(
        f"\nAgentX-size corpus, {args.lanes} lanes, {args.duration:g} s, simulator and delays ×{args.scale:g}; "
        f"median (min–max) of {args.repeat} runs"
    )
    for name, values in runs.items():
        cells = []
        for key in values[0]:
            column = [v[key] for v in values]
            cells.append(f"{key} {statistics.median(column):.1f} ({min(column):.1f}–{max(column):.1f})")
        print(f"  {name:13s} " + "; ".join(cells))


if __name__ == "__main__":
    main()
