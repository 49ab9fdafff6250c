"""The AgentX-size corpus replayed in the AgentX scenario: how long the client's own work holds the loop, and (with
`--peak`) the memory it takes through the command line.

Large sessions (over 100 ms to split and plan) are planned on a worker thread (agentx.replayer.schedule.offloop), and
the new blocks of a large prompt (~4 ms for 80k tokens) are made a group at a time on the loop, what is due going
between groups (agentx.replayer.schedule.runner, `WARM_TOKENS`). This runs the corpus of `startup.py` against the
built-in simulator, with the simulator's times and the trace's delays scaled by `--scale`, once that way and once with
every plan and body made at once on the loop, alternating, and prints the profiling requests' dispatch lag and the
event loop's lag (how late a 100 ms timer fires) for each.

`--peak` instead runs `agentx replay CORPUS --concurrency LANES` (its own simulator, `--sim-time-scale` and
`--delay-scale` at `--scale`) `--repeat` times and prints its peak RSS through the run (start-up, warmup, profiling and
grace: the process's `VmHWM` when the last request ended) beside the target (< 400 MB at 64 lanes, bench/README.md),
and the whole process's peak, its end-of-run summary included. Never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/corpus_replay.py [--lanes 32] [--duration 40] [--scale 0.05] [--repeat 2]
       .venv/bin/python bench/corpus_replay.py --peak [--lanes 64] [--duration 40] [--scale 0.05] [--repeat 2]
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
from startup import TARGET_CORPUS_RSS_MB, _corpus, measure, run_end_wall_ns  # a sibling script, not a package

from agentx.records.record import read_records, to_records
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.schedule import runner
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace
from agentx.trace.model import Trace

ROOT = Path(__file__).resolve().parent.parent
OFF_LOOP_THRESHOLDS = ("OFF_LOOP_REQUESTS", "WARM_TOKENS")
"""The runner's sizes from which plans go off the loop (agentx.replayer.schedule.offloop) and bodies' new blocks are
made a group at a time (agentx.replayer.schedule.runner)."""


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


def _peak_run(corpus: Path, lanes: int, duration_s: float, scale: float, work: Path) -> tuple[float, float] | None:
    """One replay through the command line: its peak RSS through the run and over its whole life, MB (10⁶ bytes)."""
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(corpus), "--concurrency", str(lanes),
        "--duration", f"{duration_s:g}", "--delay-scale", f"{scale:g}", "--sim-time-scale", f"{scale:g}",
        "--grace", "1", "--out", str(work), "--overwrite",
    ]  # fmt: skip
    measured = measure(command, work.with_name(work.name + ".stderr"), timeout_s=duration_s * 4 + 300)
    end_ns = run_end_wall_ns(work)
    through_run = None if end_ns is None else measured.peak_until(end_ns)
    if measured.code != 0 or through_run is None:
        print(f"  the replay exited {measured.code}; see {work.with_name(work.name + '.stderr')}")
        return None
    return through_run / 1e6, measured.peak / 1e6


def _peak(args: argparse.Namespace) -> None:
    corpus = _corpus(args.out, 400)
    runs: list[tuple[float, float]] = []
    for number in range(args.repeat):
        figures = _peak_run(corpus, args.lanes, args.duration, args.scale, args.out / "corpus-peak-run")
        if figures is not None:
            runs.append(figures)
            print(f"  run {number + 1}: peak RSS {figures[0]:.0f} MB through the run, {figures[1]:.0f} MB in all")
    if not runs:
        return
    through = [run for run, _ in runs]
    whole = [peak for _, peak in runs]
    median = statistics.median(through)
    print(
        f"\nagentx replay of the AgentX-size corpus, {args.lanes} lanes, {args.duration:g} s, simulator and delays "
        f"×{args.scale:g}; median (min–max) of {len(runs)} runs\n"
        f"  peak RSS through the run {median:.0f} MB ({min(through):.0f}–{max(through):.0f}) ÷ target "
        f"{TARGET_CORPUS_RSS_MB:.0f} MB = {median / TARGET_CORPUS_RSS_MB:.2f}\n"
        f"  peak RSS with the end-of-run summary {statistics.median(whole):.0f} MB ({min(whole):.0f}–{max(whole):.0f})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=None, help="default: 32, or 64 with --peak (its target's)")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per run")
    parser.add_argument("--scale", type=float, default=0.05, help="simulator time and trace delays scale")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--peak", action="store_true", help="the command line's peak RSS instead (module docstring)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.lanes is None:
        args.lanes = 64 if args.peak else 32
    if args.peak:
        _peak(args)
        return
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
