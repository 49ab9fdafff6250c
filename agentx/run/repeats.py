"""Repeats: one configuration replayed (or swept) several times, one after another, each with a seed of its own.

Layout: `OUT/r1/` … `OUT/rN/` each hold a complete run folder (`replay_repeats`) or sweep folder (`sweep_repeats`);
`OUT/repeats.json` (`RepeatIndex`) names the base seed and every completed repeat's seed and folder. The index is
written as the set starts (no repeat yet) and again after every repeat that ran to its end, so that a set stopped
early indexes the repeats it completed; an interrupted repeat keeps its partial folder but is not indexed.
`agentx compare` pools a folder's indexed repeats into one side.

Seeds: repeat k runs with `repeat_seed(base, k)`: the first keeps the options' seed, so a set's first repeat is the
single run of the same options; every repeat's run.json keeps its own seed in its options.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec

from agentx.errors import ConfigError, RunExists, RunStopped, SweepError
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.preparation import prepare_trace
from agentx.replayer.schedule.hooks import RunHooks
from agentx.results.folders.repeat_index import (
    RepeatIndex,
    existing_repeats,
    repeat_dir_name,
    repeat_seed,
    write_repeats,
)
from agentx.run.replay import ReplayResult, replay
from agentx.run.sweep import LevelServer, OnLevel, OnLevelDone, SweepOptions, SweepResult, sweep
from agentx.run.sync import run_sync
from agentx.trace.model import Trace

OnRepeat = Callable[[int, int, int], None]
"""`on_repeat_start(number, count, seed)`: repeat `number` (from 1) of `count` is about to start with `seed`."""
OnReplayRepeatDone = Callable[[int, ReplayResult], None]
"""`on_repeat_done(number, result)`: repeat `number` has ended (interrupted or not), its run.json written."""
OnSweepRepeatDone = Callable[[int, SweepResult], None]
"""`on_repeat_done(number, result)`: repeat `number`'s sweep has ended (interrupted or not), its sweep.json written."""


class ReplayRepeats(msgspec.Struct, kw_only=True):
    """A set of replays of one configuration: its folder, its index and each repeat's result, in order (the last one
    is a partial run when `interrupted` and the run had started)."""

    out_dir: Path
    index: RepeatIndex
    results: list[ReplayResult]
    interrupted: bool = False


class SweepRepeats(msgspec.Struct, kw_only=True):
    """A set of sweeps of one configuration: its folder, its index and each repeat's sweep, in order (the last one
    stopped early when `interrupted` and it had started)."""

    out_dir: Path
    index: RepeatIndex
    results: list[SweepResult]
    interrupted: bool = False


def _check_count(repeats: int) -> None:
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1 (the runs of one configuration), got {repeats}")


class _RepeatSet:
    """A set's folder and index as repeats complete: the seeds and folders of the set (`repeat_seed`)."""

    def __init__(self, out_dir: Path, base_seed: int) -> None:
        self.out_dir = out_dir
        self.index = RepeatIndex(base_seed=base_seed)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_repeats(out_dir, self.index)  # a stale index of an overwritten set must not outlive its start

    def seed(self, number: int) -> int:
        return repeat_seed(self.index.base_seed, number)

    def folder(self, number: int) -> Path:
        return self.out_dir / repeat_dir_name(number)

    def start_replay(self, options: ReplayOptions, number: int) -> ReplayOptions:
        """Repeat `number`'s options (its seed and folder), its folder emptied first when replacing a set (as a
        sweep empties a level's)."""
        folder = self.folder(number)
        if options.overwrite and folder.exists():
            shutil.rmtree(folder)  # a stale repeat's files (its server metrics, its shards) would mix with the new
        scenario = msgspec.structs.replace(options.scenario, seed=self.seed(number))
        return msgspec.structs.replace(options, scenario=scenario, out_dir=folder)

    def completed(self, number: int) -> None:
        """Index repeat `number`, which ran to its end."""
        self.index.seeds.append(self.seed(number))
        self.index.dirs.append(repeat_dir_name(number))
        write_repeats(self.out_dir, self.index)


def _replay_set(options: ReplayOptions, repeats: int) -> _RepeatSet:
    _check_count(repeats)
    out_dir = Path(options.out_dir)
    if not options.overwrite and (held := existing_repeats(out_dir)) is not None:
        raise RunExists(f"{out_dir} already holds runs ({held}); pass overwrite=True to replace them").worded_for_cli(
            f"{out_dir} already holds runs ({held}); pass --overwrite to replace them"
        )
    return _RepeatSet(out_dir, options.scenario.seed)


async def replay_repeats(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    repeats: int,
    hooks: RunHooks | None = None,
    *,
    num_gpus: int | None = None,
    on_repeat_start: OnRepeat | None = None,
    on_repeat_done: OnReplayRepeatDone | None = None,
    trace_path: str | os.PathLike[str] | None = None,
) -> ReplayRepeats:
    """Replay `trace` `repeats` times with `options`, one run after another, repeat k into `options.out_dir/rk` with
    seed `repeat_seed(options.scenario.seed, k)`; the index into `options.out_dir/repeats.json` (module docstring).

    A folder that already holds runs is refused (RunExists) unless `options.overwrite`. The trace is prepared once
    for every repeat. `hooks` and the other keywords go to each repeat's `agentx.run.replay.replay`, which runs it the
    way `options.runtime` says. A stop of `hooks.stops` ends the current repeat early (its partial run written, not
    indexed), starts no other, and returns with `interrupted` set; cancelling the caller ends the current repeat at
    once (written, not indexed) and raises CancelledError.
    """
    repeat_set = _replay_set(options, repeats)
    prepared = prepare_trace(trace, options) if isinstance(trace, Trace) else trace
    results: list[ReplayResult] = []
    for number in range(1, repeats + 1):
        repeat_options = repeat_set.start_replay(options, number)
        if on_repeat_start is not None:
            on_repeat_start(number, repeats, repeat_set.seed(number))
        try:
            result = await replay(prepared, repeat_options, hooks, num_gpus=num_gpus, trace_path=trace_path)
        except RunStopped:  # stopped before its run started (over processes): no run of this repeat to keep
            return ReplayRepeats(out_dir=repeat_set.out_dir, index=repeat_set.index, results=results, interrupted=True)
        results.append(result)
        if not result.run.interrupted:
            repeat_set.completed(number)
        if on_repeat_done is not None:
            on_repeat_done(number, result)
        if result.run.interrupted:
            break
    interrupted = bool(results) and results[-1].run.interrupted
    return ReplayRepeats(out_dir=repeat_set.out_dir, index=repeat_set.index, results=results, interrupted=interrupted)


def replay_repeats_sync(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    repeats: int,
    *,
    num_gpus: int | None = None,
    trace_path: str | os.PathLike[str] | None = None,
) -> ReplayRepeats:
    """`replay_repeats` for code without an event loop."""
    return run_sync(
        replay_repeats(trace, options, repeats, num_gpus=num_gpus, trace_path=trace_path),
        "agentx.run.repeats.replay_repeats",
    )


async def sweep_repeats(
    trace: Trace | PreparedTrace,
    base: ReplayOptions,
    options: SweepOptions,
    repeats: int,
    hooks: RunHooks | None = None,
    *,
    on_repeat_start: OnRepeat | None = None,
    on_repeat_done: OnSweepRepeatDone | None = None,
    on_level_start: OnLevel | None = None,
    on_level_done: OnLevelDone | None = None,
    level_server: LevelServer | None = None,
) -> SweepRepeats:
    """Sweep `trace` `repeats` times, one sweep after another, repeat k into `options.out_dir/rk` with seed
    `repeat_seed(base.scenario.seed, k)` for all its levels; the index into `options.out_dir/repeats.json`.

    A folder that already holds results is refused (SweepError) unless `options.overwrite` or `options.resume`,
    which then apply to each repeat's sweep (`resume`: each keeps its finished levels). The trace is prepared once
    for every repeat and level. The other keywords go to each repeat's `agentx.run.sweep.sweep`. A stop of
    `hooks.stops` ends the current level early; that repeat is not indexed, and the set returns with `interrupted`
    set. Cancelling the caller ends the current level at once, its repeat not indexed, and raises CancelledError.
    """
    _check_count(repeats)
    out_dir = options.out_dir
    if not (options.resume or options.overwrite) and (held := existing_repeats(out_dir)) is not None:
        raise SweepError(
            f"{out_dir} already holds results ({held}); resume the repeats, overwrite them, or choose another folder"
        )
    repeat_set = _RepeatSet(out_dir, base.scenario.seed)
    prepared = prepare_trace(trace, base) if isinstance(trace, Trace) else trace
    results: list[SweepResult] = []
    for number in range(1, repeats + 1):
        scenario = msgspec.structs.replace(base.scenario, seed=repeat_set.seed(number))
        repeat_base = msgspec.structs.replace(base, scenario=scenario)
        repeat_options = msgspec.structs.replace(options, out_dir=repeat_set.folder(number))
        if on_repeat_start is not None:
            on_repeat_start(number, repeats, repeat_set.seed(number))
        result = await sweep(
            prepared,
            repeat_base,
            repeat_options,
            hooks,
            on_level_start=on_level_start,
            on_level_done=on_level_done,
            level_server=level_server,
        )
        results.append(result)
        if not result.interrupted:
            repeat_set.completed(number)
        if on_repeat_done is not None:
            on_repeat_done(number, result)
        if result.interrupted:
            break
    interrupted = bool(results) and results[-1].interrupted
    return SweepRepeats(out_dir=out_dir, index=repeat_set.index, results=results, interrupted=interrupted)


def sweep_repeats_sync(trace: Trace, base: ReplayOptions, options: SweepOptions, repeats: int) -> SweepRepeats:
    """`sweep_repeats` for code without an event loop."""
    return run_sync(sweep_repeats(trace, base, options, repeats), "agentx.run.repeats.sweep_repeats")
