"""`agentx frontier`: a sweep whose levels the search chooses (agentx.run.frontier)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentx.cli.commands.sweep import Shown, checked_flags, level_server
from agentx.cli.common import (
    EXIT_INTERRUPTED,
    fail,
    interactivity_targets,
    stderr,
    stdout,
)
from agentx.cli.flags import GroupedCommand
from agentx.cli.parsed import ParsedFlags, parsed, replay_flags
from agentx.cli.shared_flags import (
    block_size_option,
    format_option,
    frontier_flags,
    gpu_sku_flag,
    gpus_flag,
    overwrite_flag,
)
from agentx.trace.io import Format

if TYPE_CHECKING:
    from agentx.replayer.schedule.hooks import RunHooks
    from agentx.run.frontier import Decision, SearchResult, TargetReading

_SEARCH_OPTIONS = ("start", "half_width", "max_levels", "max_gpu_hours", "targets", "statistic", "basis")


def _in_section(command: click.Command) -> click.Command:
    """The search's own options under "Sweep" in `--help` (agentx.cli.flags.option_group)."""
    for param in command.params:
        if param.name in _SEARCH_OPTIONS:
            param.group = "Sweep"  # type: ignore[attr-defined]
    return command


@_in_section
@click.command("frontier", cls=GroupedCommand)
@click.argument("trace", type=click.Path(path_type=Path))
@replay_flags(sweep=True)
@frontier_flags
@click.option("--start", type=click.IntRange(min=1), default=4, show_default=True, help="The first level probed.")
@click.option(
    "--half-width",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Stop a target once its throughput per GPU is known within ± this fraction (0.05: ±5%).",
)
@click.option(
    "--max-levels", type=click.IntRange(min=1), default=16, show_default=True, help="At most this many levels."
)
@click.option(
    "--max-gpu-hours",
    type=click.FloatRange(min=0, min_open=True),
    metavar="H",
    help="Start no level that would take the levels' duration × GPUs past H.",
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Sweep directory.")
@gpus_flag()
@gpu_sku_flag("for prices")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the search in --out: its finished levels are kept (refused when they ran with other settings or "
    "another trace), the others run again, and the search goes on from them.",
)
@overwrite_flag("a sweep already in --out", ", unless --resume")
@format_option
@block_size_option
@parsed
def frontier_command(
    trace: Path,
    served_models: tuple[str, ...],
    sim_time_scale: float,
    targets: str,
    basis: str,
    statistic: str,
    start: int,
    half_width: float,
    max_levels: int,
    max_gpu_hours: float | None,
    out_dir: Path,
    gpus: int | None,
    gpu_sku: str | None,
    resume: bool,
    overwrite: bool,
    input_format: Format | None,
    block_size: int | None,
    flags: ParsedFlags,
) -> None:
    """Search TRACE's throughput-per-GPU frontier: levels chosen one by one to bracket each interactivity target.

    From --start it doubles the concurrency until interactivity falls below the lowest target, a level fails or
    throughput stops growing; halves it while the highest target is out of reach; then bisects the levels around
    each target until throughput per GPU there is known within --half-width (the levels' bootstrap intervals over
    sessions and over stretches of each run, propagated to the interpolated value) or a budget is spent. Each
    decision is printed as it is made, then a table of the targets. OUT is an ordinary sweep folder (`agentx report
    OUT`, `agentx compare`).
    """
    from agentx.errors import SweepError
    from agentx.results.folders.sweep_index import existing_sweep
    from agentx.run.frontier import MeasureOptions, SearchOptions, search_frontier
    from agentx.run.sweep import SweepOptions

    if not (resume or overwrite) and (held := existing_sweep(out_dir)) is not None:
        fail(
            f"{out_dir} already holds a sweep ({held}); pass --resume to continue its search, --overwrite to replace "
            "it, or choose another --out"
        )
    try:
        wanted = interactivity_targets(targets)
    except click.BadParameter as exc:
        fail(exc.format_message())
    _, _, loaded, parts = checked_flags(trace, str(start), None, gpu_sku, input_format, block_size, flags)
    search = SearchOptions(
        targets_tps=tuple(sorted(wanted)),
        start=start,
        half_width=half_width,
        max_levels=max_levels,
        max_gpu_hours=max_gpu_hours,
    )
    measure = MeasureOptions(statistic=statistic, basis=basis)  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        _, base = level_server(stack, flags, parts, served_models, sim_time_scale, loaded.block_size, out_dir,
                               doing="searching")  # fmt: skip
        sweep_options = SweepOptions(
            concurrency=(start,),
            out_dir=out_dir,
            num_gpus=gpus,
            gpu_sku=None if gpu_sku is None else gpu_sku.lower(),
            trace_label=str(trace),
            resume=resume,
            overwrite=overwrite,
        )
        shown = Shown(loaded, base)

        started = [0]

        def start_level(_: int, __: int, level: int) -> None:
            started[0] += 1  # the count is the budget's: the search may stop sooner
            shown.start_level(started[0], max_levels, level)

        def runs(hooks: RunHooks) -> Coroutine[Any, Any, SearchResult]:
            return search_frontier(
                loaded,
                base,
                sweep_options,
                search,
                measure,
                hooks,
                on_decision=_say_decision,
                on_level_start=start_level,
                on_level_done=shown.level_done,
            )

        try:
            result = shown.run(runs, out_dir)
        except SweepError as exc:
            fail(str(exc))
    for line in table_lines(result.final.targets, search.half_width):
        stdout.print(line, markup=False)
    kept = len(result.levels) - len(result.ran)
    stdout.print(
        f"frontier: {len(result.levels)} level(s) in {out_dir} ({len(result.ran)} run now, {kept} kept); "
        f"{result.final.reason}; `agentx report {out_dir}` for the frontier and costs",
        markup=False,
    )
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _say_decision(decision: Decision) -> None:
    if decision.next_level is None:
        stderr.print(f"search {decision.reason}", markup=False)
    else:
        stderr.print(f"next c{decision.next_level}: {decision.reason}", markup=False)


def table_lines(readings: Sequence[TargetReading], half_width: float) -> list[str]:
    """The final table: per target, throughput per GPU ± its half-width, the levels around it, and its status."""
    lines = [f"{'target tok/s/user':>17}  {'tok/s/GPU':>10}  {'±':>7}  {'between':>11}  status"]
    for reading in readings:
        estimate = reading.throughput
        value = f"{estimate.value:,.1f}" if estimate is not None else "-"
        spread = f"{estimate.relative_half_width():.1%}" if estimate is not None else "-"
        between = f"c{reading.between[0]}..c{reading.between[1]}" if reading.between is not None else "-"
        status = reading.status + (f" ({reading.note})" if reading.note else "")
        if reading.status == "resolved" and estimate is not None:
            status += f" within ±{half_width:.0%}"
        lines.append(f"{reading.target_tps:>17g}  {value:>10}  {spread:>7}  {between:>11}  {status}")
    return lines
