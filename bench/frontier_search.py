"""Frontier search against a dense sweep: the same simulated server, throughput per GPU at each interactivity target.

Runs on the simulator (`SimServer`, a step model whose per-user speed falls from ~215 tok/s at concurrency 2 to ~26 at
64, so a fixed sweep of 1..64 crosses all six AgentX targets), started afresh for every level so that no level finds
the prefix cache an earlier one left, one after the other:

- the search (agentx.run.frontier.search_frontier): levels chosen one at a time until every target is known within
  `--half-width` (the levels' bootstrap intervals over sessions and over stretches of time, propagated to the
  interpolated value);
- a dense sweep (agentx.run.sweep) of 1,2,3,4,6,8,12,16,24,32,48,64, read as `agentx report` reads it.

Prints, per target, the search's throughput per GPU ± its half-width, the dense sweep's, and whether they agree
within the half-width; and each one's levels and wall time. The target: the same figures within the half-width with
at most half the dense sweep's levels. Beside them, the half-width the same levels give with their bootstrap over
sessions only, and whether the dense sweep lies within it: what the time stretches add. Prints figures; never fails
on a number. See bench/README.md.

Usage: .venv/bin/python bench/frontier_search.py [--duration 10] [--half-width 0.05] [--out bench/out/frontier]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import time
from pathlib import Path

from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.results.report.build import load_series
from agentx.results.report.frontier import FrontierOptions, Point, frontier, point
from agentx.run.frontier import (
    Decision,
    Measured,
    MeasureOptions,
    SearchOptions,
    SearchResult,
    TargetReading,
    measure_level,
    read_targets,
    search_frontier,
)
from agentx.run.sweep import LevelSettings, SweepOptions, SweepResult, sweep
from agentx.sim.engine.config import EngineConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

TARGETS = (30.0, 50.0, 75.0, 100.0, 150.0, 200.0)
DENSE = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
GPUS = 8
BLOCK = 16
# Simulated: a step costs 14 ms + 2.2 ms per running sequence (+ prefill), played 4× faster. Per user 1/(step) falls
# from ~215 tok/s at 2 sequences to ~26 at 64 (wall clock): 200 is crossed between 2 and 3, 30 between 48 and 64,
# while throughput b/(step) rises and bends.
ENGINE = EngineConfig(step_overhead_s=0.014, decode_s_per_token=0.0022, time_scale=0.25, block_size=BLOCK)


def bench_trace(sessions: int, seed: int = 0) -> Trace:
    """`sessions` two-turn sessions of 512–640 prompt and 64–80 output tokens: short enough for many sessions per
    level (the bootstrap's clusters), alike enough that a level of seconds pins its throughput within a few %."""
    rng = random.Random(seed)
    result = []
    for s in range(sessions):
        prompt, requests = rng.randrange(512, 640), []
        for turn in range(2):
            blocks = prompt // BLOCK
            added = tuple(range(10_000 * s + turn * 100, 10_000 * s + turn * 100 + blocks))
            requests.append(
                Request(
                    t=float(turn), model="m", in_tokens=prompt, out_tokens=rng.randrange(64, 80), hash_ids_added=added
                )
            )
            prompt += rng.randrange(64, 128)
        result.append(Session(session_id=f"s{s}", root=Agent(requests=requests)))
    return Trace(sessions=result, block_size=BLOCK, hash_id_scope="session")


def base_options(server: Server, duration_s: float, out_dir: Path) -> ReplayOptions:
    return ReplayOptions(
        server=server,
        out_dir=out_dir,
        load=ClosedLoad(),
        scenario=Scenario(delay_scale=0.0, duration_s=duration_s, session_order="shuffle"),
        runtime=Runtime(grace_s=10.0),
    )


def say(decision: Decision) -> None:
    shown = "" if decision.next_level is None else f"c{decision.next_level}: "
    print(f"  search: {shown}{decision.reason}", flush=True)


def dense_values(result: SweepResult) -> list[float | None]:
    """Throughput per GPU at each target along the dense sweep's front, as `agentx report` reads it."""
    points: list[Point] = []
    for level in result.levels:
        if level.summary is not None:
            found = point(level.summary, f"c{level.entry.concurrency}", concurrency=level.entry.concurrency)
            if found is not None:
                points.append(found)
    return [at.total_tps_per_gpu for at in frontier(points, FrontierOptions(targets_tps=TARGETS)).at_targets]


class FreshServers:
    """A fresh simulator for every level: its prefix cache empty, so that a level's figures do not depend on which
    levels ran before it (a search and a sweep run different ones)."""

    def __init__(self) -> None:
        self.sim: SimServer | None = None

    def start(self) -> SimServer:
        self.close()
        self.sim = SimServer(ENGINE).start()
        return self.sim

    def __call__(self, concurrency: int, settings: LevelSettings) -> str:
        return self.start().url

    def close(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None


async def both(args: argparse.Namespace) -> tuple[SearchResult, float, SweepResult, float]:
    trace = bench_trace(args.sessions)
    servers = FreshServers()
    try:
        sim = servers.start()
        server = Server(url=sim.url, model=sim.model)  # each level's URL replaced by its fresh server's
        started = time.monotonic()
        searched = await search_frontier(
            trace,
            base_options(server, args.duration, args.out / "search"),
            SweepOptions(concurrency=(args.start,), out_dir=args.out / "search", num_gpus=GPUS, overwrite=True),
            SearchOptions(targets_tps=TARGETS, start=args.start, half_width=args.half_width),
            MeasureOptions(),
            on_decision=say,
            level_server=servers,
        )
        search_s = time.monotonic() - started
        started = time.monotonic()
        print(f"  dense sweep: {','.join(map(str, DENSE))}", flush=True)
        dense = await sweep(
            trace,
            base_options(server, args.duration, args.out / "dense"),
            SweepOptions(concurrency=DENSE, out_dir=args.out / "dense", num_gpus=GPUS, overwrite=True),
            level_server=servers,
        )
        dense_s = time.monotonic() - started
    finally:
        servers.close()
    return searched, search_s, dense, dense_s


def sessions_only(out: Path) -> list[TargetReading]:
    """The targets as the search's own levels read with their bootstrap over sessions only (no stretches of time):
    what the half-width was before it held the variation over time."""
    levels = []
    for level in load_series(out).levels:
        if level.concurrency is None:
            continue
        x, y = measure_level(Path(level.run_dir), level.summary, GPUS, MeasureOptions(time_stretches=0))
        levels.append(Measured(concurrency=level.concurrency, interactivity=x, throughput=y))
    return read_targets(levels, SearchOptions(targets_tps=TARGETS), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="Seconds per level (wall clock).")
    parser.add_argument("--half-width", type=float, default=0.05)
    parser.add_argument("--start", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--out", type=Path, default=Path("bench/out/frontier"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    searched, search_s, dense, dense_s = asyncio.run(both(args))
    values = dense_values(dense)
    print()
    narrow = sessions_only(args.out / "search")
    print(
        f"{'target':>7}  {'search tok/s/GPU':>17}  {'±':>6}  {'between':>9}  {'dense tok/s/GPU':>16}  agree  "
        "(± over sessions only: agree)"
    )
    agreed = 0
    for reading, value, other_reading in zip(searched.final.targets, values, narrow, strict=True):
        estimate = reading.throughput
        found = f"{estimate.value:,.1f}" if estimate else "-"
        spread = f"{estimate.relative_half_width():.1%}" if estimate else "-"
        between = f"c{reading.between[0]}..c{reading.between[1]}" if reading.between else reading.status
        other = f"{value:,.1f}" if value is not None else "-"
        agree = estimate is not None and value is not None and estimate.low <= value <= estimate.high
        agreed += agree
        off = f" ({value / estimate.value - 1:+.1%})" if estimate is not None and value is not None else ""
        alone = other_reading.throughput
        held = alone is not None and value is not None and alone.low <= value <= alone.high
        without = f"±{alone.relative_half_width():.1%}: {held}" if alone is not None else "-"
        line = f"{reading.target_tps:>7g}  {found:>17}  {spread:>6}  {between:>9}  {other:>16}  {agree}{off}"
        print(f"{line}  ({without})")
    ran = sorted(m.concurrency for m in searched.levels)
    print(f"search: {len(ran)} levels ({','.join(map(str, ran))}) in {search_s:.0f} s ({searched.final.reason})")
    print(f"dense:  {len(dense.levels)} levels in {dense_s:.0f} s")
    print(f"agree within the half-width at {agreed} of {len(TARGETS)} targets; levels {len(ran)} / {len(dense.levels)}")


if __name__ == "__main__":
    main()
