"""`agentx sweep`: one replay per concurrency level."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from agentx.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    cluster_output,
    fail,
    load_to_replay,
    run_interruptibly,
    stderr,
    stdout,
)
from agentx.cli.flags import GroupedCommand
from agentx.cli.parsed import (
    ParsedFlags,
    ReplayParts,
    only_model,
    parsed,
    replay_flags,
    say_route,
    sim_fields,
    simulator_line,
)
from agentx.cli.repeats import refuse_existing_repeats, repeat_header, repeats_footer
from agentx.cli.shared_flags import (
    block_size_option,
    format_option,
    gpu_sku_flag,
    gpus_flag,
    json_flag,
    overwrite_flag,
    repeat_flag,
)
from agentx.trace.io import Format

if TYPE_CHECKING:
    from agentx.replayer.options.replay import ReplayOptions, Speculative
    from agentx.replayer.schedule.hooks import RunHooks
    from agentx.run.repeats import SweepRepeats
    from agentx.run.sweep import LevelResult, LevelSettings, SweepResult
    from agentx.sim.process import SimServer
    from agentx.trace.model import Trace


@click.command("sweep", cls=GroupedCommand)
@click.argument("trace", type=click.Path(path_type=Path))
@replay_flags(sweep=True)
@click.option("--concurrency", "levels", required=True, metavar="N[,N...]", help="The levels, e.g. 1,2,4,8,16,32,64.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Sweep directory.")
@gpus_flag()
@gpu_sku_flag("for prices")
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the levels whose run.json says they ran to the end, refused when they ran with other settings (seed, "
    "duration, mode, server URL, ...) or another trace; the levels not asked stay in the index.",
)
@click.option(
    "--resume-anyway",
    is_flag=True,
    help="--resume, keeping finished levels even when they ran with other settings (their figures are then not this "
    "sweep's).",
)
@overwrite_flag("a sweep already in --out", ", unless --resume")
@repeat_flag("Sweep")
@click.option(
    "--before-level",
    metavar="CMD",
    help="Shell command run before each level, {concurrency}, {spec_al} and {spec_k} substituted; "
    "a non-zero exit fails that level.",
)
@click.option(
    "--before-level-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Fail the level when --before-level runs longer.",
)
@click.option(
    "--level-settings",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help='JSON of concurrency → settings, e.g. {"64": {"spec_al": 2.1, "spec_k": 1, "extra_body": {}}}.',
)
@json_flag("sweep.json's index", " (with --repeat: repeats.json's and each repeat's sweep.json)")
@format_option
@block_size_option
@parsed
def sweep_command(
    trace: Path,
    served_models: tuple[str, ...],
    sim_time_scale: float,
    levels: str,
    out_dir: Path,
    gpus: int | None,
    gpu_sku: str | None,
    resume: bool,
    resume_anyway: bool,
    overwrite: bool,
    repeat: int,
    before_level: str | None,
    before_level_timeout: float | None,
    level_settings: Path | None,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
    flags: ParsedFlags,
) -> None:
    """Replay TRACE once per concurrency level (same seed), each level into OUT/c{N}, the index into OUT/sweep.json.

    A level that fails is recorded with its error and the sweep goes on (exit 3 when any failed). `agentx report
    OUT` turns the sweep into the frontier and cost tables. Ctrl-C stops the current level gracefully and ends the
    sweep (exit 130); `--resume` picks it up. With --repeat N, OUT/rK is the K-th sweep (its levels in OUT/rK/c{N});
    Ctrl-C ends the set, and OUT/repeats.json indexes the sweeps that ran to their end.
    """
    from agentx.records.run_folder import SWEEP_FILE
    from agentx.results.folders.sweep_index import existing_sweep
    from agentx.run.repeats import SweepRepeats, sweep_repeats
    from agentx.run.sweep import SweepOptions, sweep

    resume = resume or resume_anyway
    if repeat > 1 and not (resume or overwrite):
        refuse_existing_repeats(
            out_dir, flags="--resume to keep the finished levels of its repeats, or --overwrite to replace them"
        )
    if not (resume or overwrite) and (held := existing_sweep(out_dir)) is not None:
        fail(
            f"{out_dir} already holds a sweep ({held}); pass --resume to keep its finished levels, "
            "--overwrite to replace it, or choose another --out"
        )
    concurrency, settings, loaded, parts = checked_flags(
        trace, levels, level_settings, gpu_sku, input_format, block_size, flags
    )
    with contextlib.ExitStack() as stack:
        sims, base = level_server(stack, flags, parts, served_models, sim_time_scale, loaded.block_size, out_dir,
                                  doing="sweeping")  # fmt: skip
        url_for: Callable[[int, LevelSettings], str] | None = sims.url_for if sims is not None and settings else None
        options = SweepOptions(
            concurrency=concurrency,
            out_dir=out_dir,
            num_gpus=gpus,
            gpu_sku=None if gpu_sku is None else gpu_sku.lower(),
            trace_label=str(trace),
            resume=resume,
            resume_anyway=resume_anyway,
            overwrite=overwrite,
            before_level=before_level,
            before_level_timeout_s=before_level_timeout,
            level_settings=settings,
        )
        shown = Shown(loaded, base)

        # One sweep, or a set of repeats of it (agentx.run.repeats).
        def runs(hooks: RunHooks) -> Coroutine[Any, Any, SweepResult | SweepRepeats]:
            if repeat > 1:
                return sweep_repeats(
                    loaded,
                    base,
                    options,
                    repeat,
                    hooks,
                    on_repeat_start=shown.start_repeat,
                    on_level_start=shown.start_level,
                    on_level_done=shown.level_done,
                    level_server=url_for,
                )
            return sweep(
                loaded,
                base,
                options,
                hooks,
                on_level_start=shown.start_level,
                on_level_done=shown.level_done,
                level_server=url_for,
            )

        result = shown.run(runs, out_dir)
    if isinstance(result, SweepRepeats):
        _end_repeats(result, as_json)
        return
    index = (out_dir / SWEEP_FILE).read_text()
    if as_json:
        sys.stdout.write(index)
    else:
        stdout.print(sweep_line(result, len(concurrency)), markup=False)
    _exit_for(result.interrupted, [("", result)])


def checked_flags(
    trace: Path,
    levels: str,
    level_settings: Path | None,
    gpu_sku: str | None,
    input_format: Format | None,
    block_size: int | None,
    flags: ParsedFlags,
) -> tuple[tuple[int, ...], dict[int, LevelSettings], Trace, ReplayParts]:
    """The sweep's levels, their settings, the trace and the replay's option parts, every flag checked before a
    simulator starts; a one-line failure otherwise."""
    from agentx.errors import SweepError
    from agentx.results.report.cost import load_price_table
    from agentx.run.sweep import load_level_settings, parse_levels

    try:
        concurrency = parse_levels(levels)
        settings = load_level_settings(level_settings) if level_settings is not None else {}
        loaded = load_to_replay(trace, format=input_format, block_size=block_size)
        if gpu_sku is not None and gpu_sku.lower() not in load_price_table().gpus:
            known = ", ".join(load_price_table().gpus)
            raise SweepError(
                f"--gpu-sku {gpu_sku!r} is not one of {known} (the price table's GPUs); for another GPU leave it "
                "out and price the report with `agentx report OUT --price USD_PER_GPU_HOUR`"
            )
        parts = flags.replay_parts(concurrency=1)
    except (click.BadParameter, msgspec.DecodeError) as exc:
        fail(exc.format_message() if isinstance(exc, click.BadParameter) else str(exc))
    if parts.runtime.workers > 1 and parts.runtime.ray is None:
        fail("a sweep shards its levels over Ray actors only: --workers needs --ray (on this host alone: --ray local)")
    return concurrency, settings, loaded, parts


Ran = TypeVar("Ran")


class Shown:
    """What a sweep shows on stderr: each repeat's header, each level's progress (live on a terminal, else a line
    every 10 s), then the level's headline numbers."""

    def __init__(self, trace: Trace, base: ReplayOptions) -> None:
        from agentx.cli.display.progress import ReplayProgress

        self.trace = trace
        self.base = base
        self.progress = ReplayProgress(console=None)
        self.seed = base.scenario.seed
        """The current repeat's: it draws the session order, so the count of planned requests."""

    def run(self, runs: Callable[[RunHooks], Coroutine[Any, Any, Ran]], out_dir: Path) -> Ran:
        """`runs` with this progress, to its end: a sweep folder it cannot write is a usage error naming the file, and
        an interrupted one exits 130 (the levels it finished are on disk)."""
        import asyncio

        try:
            return run_interruptibly(runs, self.hooks(), cluster_output(self.base))
        except OSError as exc:
            fail(f"{exc.filename or out_dir}: cannot write the sweep ({exc.strerror or exc})")
        except (KeyboardInterrupt, asyncio.CancelledError):
            stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
        finally:
            self.close()

    def hooks(self) -> RunHooks:
        """The hooks that feed the current level's progress."""
        from agentx.cli.display.progress import current_progress_hooks

        return current_progress_hooks(lambda: self.progress)

    def start_repeat(self, number: int, count: int, seed: int) -> None:
        self.seed = seed
        stderr.print(repeat_header(number, count, seed), markup=False)

    def start_level(self, position: int, count: int, level: int) -> None:
        from agentx.cli.display.planned import planned_requests
        from agentx.cli.display.progress import ReplayProgress
        from agentx.replayer.options.replay import LaneLoad

        stderr.print(f"level {position}/{count}: concurrency {level}", markup=False)
        base = self.base
        assert isinstance(base.load, LaneLoad)  # `sweep` refuses open loops before the first level
        level_options = msgspec.structs.replace(
            base,
            load=msgspec.structs.replace(base.load, concurrency=level),
            scenario=msgspec.structs.replace(base.scenario, seed=self.seed),
        )
        self.progress = ReplayProgress(
            console=stderr,
            duration_s=base.scenario.duration_s,
            planned=planned_requests(self.trace, level_options),
            grace_s=base.runtime.grace_s,
        )
        self.progress.start()

    def level_done(self, result: LevelResult) -> None:
        self.progress.close()
        for line in level_lines(result):
            stderr.print(line, markup=False)

    def close(self) -> None:
        self.progress.close()


def _end_repeats(repeated: SweepRepeats, as_json: bool) -> None:
    """Print a set of sweeps' outcome, and exit as `_exit_for` says."""
    from agentx.records.run_folder import SWEEP_FILE

    sweeps = [(f"r{number}/", result) for number, result in enumerate(repeated.results, start=1)]
    if as_json:
        indexes = [msgspec.json.decode((result.out_dir / SWEEP_FILE).read_bytes()) for _, result in sweeps]
        document = {"repeats": repeated.index, "sweeps": indexes}
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(document)).decode() + "\n")
    else:
        failed = sum(level.entry.status == "failed" for _, result in sweeps for level in result.levels)
        first = repeated.out_dir / "r1"
        stdout.print(
            f"sweeps: {len(sweeps)} in {repeated.out_dir}, {failed} level(s) failed; `agentx report {first}` for one "
            "repeat's frontier and costs",
            markup=False,
        )
        stdout.print(repeats_footer(repeated.out_dir, len(repeated.index.dirs)), markup=False)
    _exit_for(repeated.interrupted, sweeps)


def sweep_line(result: SweepResult, asked: int) -> str:
    """The sweep's last line: its levels by how they ended, and where to read them; an interrupted sweep says where it
    stopped and how many levels it never reached."""
    statuses = [level.entry.status for level in result.levels]
    ended = ", ".join(f"{statuses.count(status)} {_STATUS[status]}" for status in _STATUS if status in statuses)
    where = f"{len(result.levels)} of {asked} level(s) in {result.out_dir} ({ended})"
    if result.interrupted:
        return f"sweep interrupted at c{result.levels[-1].entry.concurrency}: {where}; the rest were not run"
    return f"sweep: {where}; `agentx report {result.out_dir}` for the frontier and costs"


def _exit_for(interrupted: bool, sweeps: list[tuple[str, SweepResult]]) -> None:
    """Exit 130 when interrupted, 3 naming every failed level of `sweeps` (each with its folder's prefix) when any
    failed."""
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    failed = [(prefix, level.entry) for prefix, result in sweeps for level in result.levels]
    failed = [(prefix, entry) for prefix, entry in failed if entry.status == "failed"]
    if failed:
        count = sum(len(result.levels) for _, result in sweeps)
        named = "; ".join(f"{prefix}c{entry.concurrency}: {entry.error}" for prefix, entry in failed)
        fail(f"{len(failed)} of {count} level(s) failed ({named})", EXIT_RUN_FAILED)


_STATUS = {"ok": "ok", "kept": "kept", "failed": "failed", "interrupted": "interrupted"}
"""How a level's status reads in its line ("kept": kept from an earlier run by --resume)."""


def seconds_text(seconds: float | None) -> str:
    """A latency in 3 significant digits: `850 us`, `12.3 ms`, `1.23 s`, `123 s`; `n/a` when unknown."""
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:,.0f} s"


def level_lines(result: LevelResult) -> list[str]:
    """A finished level's headline numbers in two lines (a third names a failure), within 80 columns up to
    7-digit counts and throughput:

    `  c4: ok in 58.0 s, 1,234 requests, 0 errors, 3,456 out tok/s`
    `    TTFT p50 123 ms p99 456 ms, 45.6 tok/s/user p90, dispatch lag p99 1.2 ms`
    """
    from agentx.cli.display.progress import clock_text

    entry, summary = result.entry, result.summary
    took = f"{entry.elapsed_s:.1f} s" if entry.elapsed_s < 60 else clock_text(entry.elapsed_s)
    head = f"  c{entry.concurrency}: {_STATUS.get(entry.status, entry.status)} in {took}"
    if summary is None:
        return [f"{head}: {entry.error}" if entry.error else head]
    counts, latency = summary.counts, summary.latency
    first = f"{head}, {counts.profiling:,} requests, {counts.errors:,} errors"
    if counts.cancelled:
        first += f", {counts.cancelled:,} cancelled"
    if summary.throughput is not None:
        first += f", {summary.throughput.output_tps:,.0f} out tok/s"
    ttft = latency.ttft_s
    p50, p99 = (None, None) if ttft is None else (ttft.p50, ttft.p99)
    second = f"    TTFT p50 {seconds_text(p50)} p99 {seconds_text(p99)}"
    if latency.interactivity_tps is not None:  # at p90, the statistic `agentx report` plots by default
        user = latency.interactivity_tps.p90
        second += f", {user:,.0f}" if user >= 100 else f", {user:.3g}"
        second += " tok/s/user p90"
    lag = None if summary.dispatch_lag is None else summary.dispatch_lag.p99_s
    second += f", dispatch lag p99 {seconds_text(lag)}"
    return [first, second] + ([f"    {entry.error}"] if entry.error else [])


def level_server(
    stack: contextlib.ExitStack,
    flags: ParsedFlags,
    parts: ReplayParts,
    served_models: tuple[str, ...],
    sim_time_scale: float,
    block_size: int,
    out_dir: Path,
    *,
    doing: str,
) -> tuple[LevelSims | None, ReplayOptions]:
    """The server the levels run against, `--url` or else the built-in simulator (started now, stopped with `stack`;
    `doing` says what it serves in its line), and the replay options every level starts from."""
    from agentx.errors import SimServerError

    url = flags.url
    model = served_models[0] if served_models else None
    sims: LevelSims | None = None
    if url is None:
        sims = stack.enter_context(LevelSims(sim_time_scale, block_size, parts.speculative))
        try:
            sim = sims.start(parts.speculative)
        except SimServerError as exc:
            fail(f"cannot start the simulator: {exc}")
        url, model = sim.url, model or sim.model
        stderr.print(simulator_line(doing, url), markup=False)
    else:
        say_route(url, flags)
    if model is None:
        model = only_model(url, flags)
    try:
        base = parts.options(flags.server(url, (model, *served_models[1:])), out_dir, overwrite=True)
    except click.BadParameter as exc:
        fail(exc.format_message())
    return sims, base


class LevelSims:
    """The built-in simulator of a sweep without --url, restarted with a level's forced acceptance when it differs
    from the running one's (what --before-level does for a real server)."""

    def __init__(self, time_scale: float, block_size: int, forced: Speculative) -> None:
        self.time_scale = time_scale
        self.block_size = block_size
        self.forced = forced
        self.sim: SimServer | None = None
        self.running: Speculative | None = None

    def start(self, forced: Speculative) -> SimServer:
        from agentx.sim.process import SimServer

        self.close()
        self.sim = SimServer(time_scale=self.time_scale, block_size=self.block_size, **sim_fields(forced)).start()
        self.running = forced
        return self.sim

    def url_for(self, concurrency: int, settings: LevelSettings) -> str:
        wanted = msgspec.structs.replace(
            self.forced,
            al=settings.spec_al if settings.spec_al is not None else self.forced.al,
            k=settings.spec_k if settings.spec_k is not None else self.forced.k,
        )
        if self.sim is None or wanted != self.running:
            stderr.print(f"  restarting the simulator for c{concurrency}: AL {wanted.al}, K {wanted.k}", markup=False)
            return self.start(wanted).url
        return self.sim.url

    def close(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None

    def __enter__(self) -> LevelSims:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
