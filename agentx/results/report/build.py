"""The report of one or more runs or sweeps, from their directories alone: frontier, cost, latency, peak.

`load_series(path)` reads a run directory (run.json, or records.arrow alone for a run that never finished) or a
sweep directory (sweep.json and its level directories; or, without sweep.json, every subdirectory holding a
run); `build_report` turns series into a `Report`: per series its levels, the throughput at every interactivity
target with its $/M and operating point, what serving costs per price tier at one target, the best TTFT and
TPOT, the peak throughput, what one agent task costs; and the findings of every level's plausibility audit.
`report_json` gives it as JSON; agentx.cli.display.report_tables renders it as rich and Markdown tables,
agentx.results.report.plots as plots.

The audit (agentx.results.summary.checks.audit) is carried, never applied silently: a level's row names its findings and
marks each figure an error finding rejects; a best or peak figure comes from a level whose audit does not reject it
when one exists, and otherwise says it is rejected (`Best.rejected_by`); a target interpolated from a rejected point
says so too. A run.json written before the audit has none: its level is shown as clean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from agentx.errors import RecordsDamaged, RecordsError, ReportError
from agentx.records.record import run_info
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE, SWEEP_FILE
from agentx.results.folders.run_file import RunFile, check_records, read_run_file
from agentx.results.folders.sweep_index import read_index
from agentx.results.report.cost import (
    GIVEN_TIER,
    Cost,
    Energy,
    Price,
    PriceTable,
    cost,
    energy,
    load_price_table,
    prices_for,
    usd_per_million_tokens,
)
from agentx.results.report.frontier import Basis, Frontier, FrontierOptions, Point, Statistic, frontier, point
from agentx.results.report.notes import no_point, price_problem, rejected_point, target_note, with_target
from agentx.results.summary.checks.audit import Figure, Severity
from agentx.results.summary.checks.validity import rules_of
from agentx.results.summary.explain.critical_path import PathParts
from agentx.results.summary.goodput import slo_text
from agentx.results.summary.model import Throughput
from agentx.results.summary.stats import Stats
from agentx.results.summary.summarize import RunRecords, Summary, summarize_run
from agentx.results.summary.tasks import TaskCosts


class Level(msgspec.Struct, kw_only=True):
    """One run of a series, as read from its directory."""

    label: str
    concurrency: int | None
    run_dir: str
    status: str
    error: str | None = None
    summary: Summary | None = None
    model: str | None = None
    engine: str | None = None
    """The engine that served the run, with its version when it gave one (e.g. "vLLM 0.11.0")."""
    rules: str | None = None
    """The AgentX rule set the run played (agentx.replayer.options.rules; a run that predates rule sets played AIPerf
    0.13.0's); None for a level that left no run."""
    failed_request_threshold: float | None = None
    """The run's `--failed-request-threshold` (None: off, or not known)."""


class Series(msgspec.Struct, kw_only=True):
    """A run (one level) or a sweep (many), as read from its directory."""

    label: str
    path: str
    kind: str
    """"run" or "sweep"."""
    gpu_sku: str | None
    num_gpus: int | None
    levels: list[Level]


class ReportOptions(msgspec.Struct, frozen=True, kw_only=True):
    frontier: FrontierOptions = FrontierOptions()
    target_tps: float = 50.0
    """The interactivity target of the per-tier cost table."""
    tier: str = "hyperscaler"
    """The price tier of the targets table's $/M (`given` when a price is given outright)."""
    gpu_sku: str | None = None
    """Overrides each series' recorded SKU."""
    num_gpus: int | None = None
    """Overrides each series' recorded GPU count."""
    usd_per_gpu_hour: float | None = None
    kw_per_gpu: float | None = None


POINT_FIGURES: Final[tuple[Figure, ...]] = ("interactivity", "throughput")
"""The figures a frontier point is made of: a level whose audit rejects either has a rejected point."""


class AuditMark(msgspec.Struct, frozen=True, kw_only=True):
    """One finding of a level's audit as its row shows it; the finding in words is in `Report.audit`."""

    code: str
    severity: Severity


class LevelRow(msgspec.Struct, kw_only=True):
    label: str
    concurrency: int | None
    status: str
    error: str | None
    run_dir: str
    interactivity_tps: float | None = None
    total_tps_per_gpu: float | None = None
    output_tps_per_gpu: float | None = None
    input_tps_per_gpu: float | None = None
    tokens_per_joule: float | None = None
    """Measured GPU energy (`--gpu-metrics`): total tokens per joule; None unmeasured."""
    tasks_per_mwh: float | None = None
    """Measured GPU energy: completed tasks per MWh; None unmeasured."""
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None
    """Time per output token (TPOT), per request, median over requests."""
    tpot_p90_s: float | None = None
    requests: int = 0
    """Profiling requests that succeeded: the population of the level's figures."""
    errors: int = 0
    """Profiling requests that failed (cancellations apart)."""
    errors_text: str = ""
    """The errors by kind and HTTP status, "http 46 (HTTP 503 ×46)"; "" when none."""
    over_failure_threshold: bool = False
    """The level's failed share of its profiling requests is above its run's `--failed-request-threshold`."""
    on_front: bool = False
    slo: str | None = None
    """The level's `--slo` targets ("TTFT ≤ 2 s, TPOT ≤ 50 ms"); None: the run had none."""
    slo_met: int | None = None
    slo_judged: int | None = None
    slo_met_fraction: float | None = None
    goodput_requests_per_s: float | None = None
    goodput_output_tps_per_gpu: float | None = None
    """Output tokens/s of the requests meeting every SLO, per GPU (agentx.results.summary.goodput)."""
    note: str | None = None
    """Why a level with a summary has no interactivity or throughput (`notes.no_point`), or that its point rests on
    figures its audit rejects (`notes.rejected_point`); None otherwise."""
    audit: list[AuditMark] = []
    """The findings of the level's plausibility audit; empty when clean or written before the audit."""
    critical_path: PathParts | None = None
    """Where the level's plays' time went, as shares of their summed makespans
    (agentx.results.summary.explain.critical_path); None for a run whose records do not say what released each
    request."""
    critical_path_plays: int = 0
    play_makespan_mean_s: float | None = None
    rejected: dict[Figure, list[str]] = {}
    """Per figure an error finding rejects, the codes of those findings."""

    def rejecting(self, *figures: Figure) -> list[str]:
        """The codes of the findings that reject any of `figures` at this level, each once."""
        return list(dict.fromkeys(code for figure in figures for code in self.rejected.get(figure, [])))


class TargetRow(msgspec.Struct, kw_only=True):
    target_tps: float
    total_tps_per_gpu: float | None
    output_tps_per_gpu: float | None
    input_tps_per_gpu: float | None
    between: tuple[str, str] | None
    cost: Cost | None
    """At the report's tier; None without a price for the series' SKU and tier."""
    rejected_by: list[str] = []
    """The codes of the audit findings that reject the interactivity or throughput of a level it lies between."""
    tokens_per_joule: float | None = None
    """Measured (`--gpu-metrics`): total tokens per joule of GPU energy along the front; None unmeasured."""
    tasks_per_mwh: float | None = None
    """Measured (`--gpu-metrics`): completed tasks per MWh of GPU energy along the front; None unmeasured."""


class Best(msgspec.Struct, kw_only=True):
    """The best (lowest latency, highest throughput) of one figure across a series' levels, and where it is."""

    value: float
    label: str
    interactivity_tps: float | None = None
    rejected: bool = False
    """Whether the level's audit rejects the figure; only when every level's audit that has it does (a level whose
    audit does not reject it is preferred, even when a rejected one looks better)."""
    rejected_by: list[str] = []
    """The codes of the findings that reject it."""


class TaskPrice(msgspec.Struct, frozen=True, kw_only=True):
    """$ per task at one price tier, from the task's GPU time: GPU-s × $/GPU-hour / 3600."""

    tier: str
    usd_per_gpu_hour: float | None
    usd_per_task: float | None


class TaskPriceAtTarget(msgspec.Struct, frozen=True, kw_only=True):
    """$ per task at one interactivity target and price tier: total tokens per task × total $/1M tokens / 10⁶."""

    tier: str
    total_usd_per_m: float | None
    usd_per_task: float | None


class LevelTasks(msgspec.Struct, kw_only=True):
    """What one agent task cost at one level (agentx.results.summary.tasks): means over the tasks its run completed."""

    label: str
    completed: int
    failed: int
    cut: int
    cached_tokens: float | None
    """None when the server reported no cached tokens."""
    uncached_tokens: float | None
    output_tokens: float | None
    total_tokens: float | None
    gpu_s: float | None
    """GPU-seconds per task at the report's GPU count (`--gpus` rescales the run's; a run without a count is one
    GPU, as every per-GPU figure of the report)."""
    prices: list[TaskPrice] = []
    """Per price tier of the series' SKU (and a price given outright)."""
    rejected_by: list[str] = []
    """The codes of the audit findings that reject the level's throughput, which its GPU time is made of."""


class TasksAtTarget(msgspec.Struct, kw_only=True):
    target_tps: float
    prices: list[TaskPriceAtTarget]
    """Per price tier."""
    rejected_by: list[str] = []
    """As `TargetRow.rejected_by`."""


class SeriesTasks(msgspec.Struct, kw_only=True):
    """What one agent task costs in a series: per level from its GPU time, and at each interactivity target from its
    tokens."""

    tasks: int
    """Tasks completed over every level."""
    total_tokens: float | None
    """Mean total (cached + uncached + output) tokens per task over every level's tasks: what a task is, whatever
    the level; the targets price it."""
    levels: list[LevelTasks]
    targets: list[TasksAtTarget]
    """Per row of the targets table (the report's target included)."""


class AuditedLevel(msgspec.Struct, frozen=True, kw_only=True):
    """Where a finding was made, and what showed it there."""

    series: str
    level: str
    evidence: str
    requests: int = 0
    """The requests it concerns (0: the run as a whole)."""


class AuditEntry(msgspec.Struct, kw_only=True):
    """One distinct finding (code and severity) of the report's levels, with each level it was made at."""

    code: str
    severity: Severity
    title: str
    advice: str
    affects: tuple[Figure, ...]
    levels: list[AuditedLevel]


class SeriesReport(msgspec.Struct, kw_only=True):
    label: str
    model: str | None
    engine: str | None
    path: str
    gpu_sku: str | None
    num_gpus: int
    gpus_known: bool
    """False: no GPU count was recorded or given; per-GPU figures count the server as one GPU."""
    levels: list[LevelRow]
    targets: list[TargetRow]
    costs_at_target: list[Cost]
    """Per price tier at `Report.target_tps` (empty when the SKU has no prices and none was given)."""
    energy_at_target: Energy | None = None
    best_ttft_s: Best | None = None
    best_tpot_s: Best | None = None
    peak_total_tps_per_gpu: Best | None = None
    peak_output_tps_per_gpu: Best | None = None
    target_note: str | None = None
    """Why targets show no throughput (off the front), with targets that would, when some do not."""
    price_note: str | None = None
    """Why there is no $/M at the report's tier, and what to pass instead."""
    tasks: SeriesTasks | None = None
    """What one agent task costs; None when no level's summary has tasks (a run.json written before they were)."""


class Report(msgspec.Struct, kw_only=True):
    statistic: Statistic
    basis: Basis
    target_tps: float
    tier: str
    series: list[SeriesReport]
    prices_updated: str = ""
    audit: list[AuditEntry] = []
    """Each distinct finding of the levels' plausibility audits, errors first; empty when every run is clean."""


# ---------------------------------------------------------------------------------------------
# reading directories


def _read_run_file(run_dir: Path) -> tuple[RunFile | None, str | None]:
    """The run.json of `run_dir`, or None and why not (None: there is none)."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return None, None
    try:
        return read_run_file(path), None
    except (OSError, msgspec.DecodeError) as exc:
        return None, f"{path}: not a run.json this version reads ({exc})"


def _from_records(path: Path) -> tuple[Summary, dict[str, Any]]:
    """The summary of a records file, and the run options its schema metadata carries (if any)."""
    try:
        records = RunRecords.read(path)  # a batch at a time: a long run's chunk lists are never held whole
        summary = summarize_run(records)
    except RecordsDamaged:
        raise
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: cannot read the records ({exc})") from None
    try:
        options = run_info(records.table).options
    except RecordsError:
        options = {}
    return summary, options


def _level(run_dir: Path, label: str | None = None, concurrency: int | None = None) -> Level | None:
    """The run in `run_dir` (its run.json, else its records summarized), or None when it has neither.

    A run.json this version cannot read (an older or newer layout) falls back to the records, which every
    version reads; without records it is a ReportError.
    """
    run_file, problem = _read_run_file(run_dir)
    engine = None
    if run_file is not None:
        check_records(run_dir, run_file)
        summary = run_file.summary
        options = run_file.options
        status = "interrupted" if run_file.run.interrupted else "ok"
        engine = run_file.run.server.label
    elif (run_dir / RECORDS_FILE).is_file():
        summary, options = _from_records(run_dir / RECORDS_FILE)
        status = "no run.json" if problem is None else "run.json unreadable: from records"
    elif problem is not None:
        raise ReportError(problem)
    else:
        return None
    found = options.get("concurrency")
    level = concurrency if concurrency is not None else found if isinstance(found, int) else None
    model = options.get("model")
    return Level(
        label=label or (f"c{level}" if level is not None else run_dir.name),
        concurrency=level,
        run_dir=str(run_dir),
        status=status,
        summary=summary,
        model=model if isinstance(model, str) else None,
        engine=engine,
        rules=rules_of(options).name,
        failed_request_threshold=threshold
        if isinstance(threshold := options.get("failed_request_threshold"), float)
        else None,
    )


def load_series(path: Path, label: str | None = None, engine: str | None = None) -> Series:
    """The run or sweep in `path`; ReportError when it holds neither. `engine` replaces what the runs recorded
    (a gateway in front of the engine, runs older than the record)."""
    series = _load_series(path, label)
    if engine is not None:
        for level in series.levels:
            level.engine = engine
    return series


def _load_series(path: Path, label: str | None) -> Series:
    if not path.is_dir():
        raise ReportError(f"{path}: no such directory")
    name = label or path.resolve().name
    if (path / SWEEP_FILE).is_file():
        try:
            index = read_index(path)
        except msgspec.DecodeError as exc:
            raise ReportError(f"{path / SWEEP_FILE}: not a sweep index ({exc})") from None
        assert index is not None
        levels: list[Level] = []
        for entry in index.levels:
            level = _level(path / entry.dir, f"c{entry.concurrency}", entry.concurrency)
            if level is None or entry.status == "failed":
                level = level or Level(
                    label=f"c{entry.concurrency}",
                    concurrency=entry.concurrency,
                    run_dir=str(path / entry.dir),
                    status=entry.status,
                )
                level.status, level.error = entry.status, entry.error
            levels.append(level)
        return Series(
            label=name, path=str(path), kind="sweep", gpu_sku=index.gpu_sku, num_gpus=index.num_gpus, levels=levels
        )
    single = _level(path)
    if single is not None:
        return Series(label=name, path=str(path), kind="run", gpu_sku=None, num_gpus=_gpus(single), levels=[single])
    found = [level for child in sorted(path.iterdir()) if child.is_dir() and (level := _level(child)) is not None]
    if not found:
        raise ReportError(
            f"{path} holds no run (run.json or records.arrow) and no sweep (sweep.json, or subdirectories with "
            "runs): pass the directory a replay or a sweep wrote (its --out)"
        )
    found.sort(key=lambda lv: (lv.concurrency is None, lv.concurrency or 0, lv.label))
    return Series(label=name, path=str(path), kind="sweep", gpu_sku=None, num_gpus=_gpus(found[0]), levels=found)


def mixed_rules(series: Sequence[Series]) -> str | None:
    """Why the runs of `series` do not belong on one frontier, when they played different AgentX rule sets (each
    set sends a different request stream, so their numbers are not comparable); None when they played one."""
    played: dict[str, list[str]] = {}
    for one in series:
        for level in one.levels:
            if level.rules is not None:
                played.setdefault(level.rules, []).append(
                    f"{one.label}/{level.label}" if one.kind == "sweep" else one.label
                )
    if len(played) < 2:
        return None
    which = "; ".join(
        f"{rules}: {', '.join(runs[:4])}{' …' if len(runs) > 4 else ''}" for rules, runs in played.items()
    )
    return (
        f"these runs played different AgentX rule sets ({which}): each sends a different request stream (joins, idle "
        "caps, warmup, profiling start), so their figures are not comparable and do not belong on one frontier; "
        "replay them under one --rules, or pass --mixed-rules to report them anyway"
    )


def _gpus(level: Level) -> int | None:
    throughput = level.summary.throughput if level.summary is not None else None
    return throughput.num_gpus if throughput is not None else None


# ---------------------------------------------------------------------------------------------
# the report


def _frontier_of(series: Series, options: ReportOptions) -> tuple[Frontier, dict[str, Point], int | None]:
    num_gpus = options.num_gpus or series.num_gpus
    points: dict[str, Point] = {}
    for level in series.levels:
        if level.summary is None or level.status == "failed":
            continue
        found = point(
            level.summary,
            level.label,
            concurrency=level.concurrency,
            num_gpus=num_gpus,
            statistic=options.frontier.statistic,
        )
        if found is not None:
            points[level.label] = found
    return frontier(list(points.values()), options.frontier), points, num_gpus


def _level_row(level: Level, found: Point | None, on_front: bool, num_gpus: int | None) -> LevelRow:
    row = LevelRow(
        label=level.label,
        concurrency=level.concurrency,
        status=level.status,
        error=level.error,
        run_dir=level.run_dir,
        on_front=on_front,
    )
    audit = level.summary.audit if level.summary is not None else None
    if audit is not None:
        row.audit = [AuditMark(code=f.code, severity=f.severity) for f in audit.findings]
        for finding in audit.findings:
            if finding.severity == "error":
                for figure in finding.affects:
                    row.rejected.setdefault(figure, []).append(finding.code)
    if found is None and level.summary is not None and level.status != "failed":
        row.note = no_point(level.summary)
    if found is not None:
        row.interactivity_tps = found.interactivity_tps
        row.total_tps_per_gpu = found.total_tps_per_gpu
        row.output_tps_per_gpu = found.output_tps_per_gpu
        row.input_tps_per_gpu = found.input_tps_per_gpu
        row.tokens_per_joule, row.tasks_per_mwh = found.tokens_per_joule, found.tasks_per_mwh
        rejected = {figure: row.rejected[figure] for figure in POINT_FIGURES if figure in row.rejected}
        if rejected:
            row.note = rejected_point(rejected)
    if level.summary is not None:
        latency = level.summary.latency
        counts = level.summary.counts
        row.requests, row.errors = counts.kept, counts.errors
        row.errors_text = counts.errors_text()
        threshold = level.failed_request_threshold
        row.over_failure_threshold = threshold is not None and counts.errors > threshold * max(counts.profiling, 1)
        path = level.summary.critical_path
        if path is not None:
            row.critical_path, row.critical_path_plays = path.shares, path.plays
            row.play_makespan_mean_s = path.play_makespan_s.mean if path.play_makespan_s is not None else None
        if latency.ttft_s is not None:
            row.ttft_p50_s, row.ttft_p90_s = latency.ttft_s.p50, latency.ttft_s.p90
        if latency.tpot_s is not None:
            row.tpot_p50_s, row.tpot_p90_s = latency.tpot_s.p50, latency.tpot_s.p90
        good = level.summary.goodput
        if good is not None:
            row.slo = slo_text(good.targets_s) or "--slo"
            row.slo_met, row.slo_judged, row.slo_met_fraction = good.met, good.judged, good.met_fraction
            row.goodput_requests_per_s = good.requests_per_s
            if good.output_tps is not None:
                row.goodput_output_tps_per_gpu = good.output_tps / (num_gpus or 1)
    return row


def _best(
    rows: Sequence[LevelRow], value: Callable[[LevelRow], float | None], figure: Figure, *, lowest: bool
) -> Best | None:
    """The best `value` over the levels whose audit does not reject `figure`; over every level, marked rejected, when
    each one's does."""
    candidates = [(v, row) for row in rows if (v := value(row)) is not None]
    trusted = [(v, row) for v, row in candidates if not row.rejecting(figure)]
    if not candidates:
        return None
    v, row = (min if lowest else max)(trusted or candidates, key=lambda pair: pair[0])
    codes = row.rejecting(figure)
    return Best(
        value=v, label=row.label, interactivity_tps=row.interactivity_tps, rejected=bool(codes), rejected_by=codes
    )


def _between_rejected(between: tuple[str, str] | None, rows: Sequence[LevelRow]) -> list[str]:
    """The codes rejecting the point of either level a target lies between."""
    if between is None:
        return []
    by_label = {row.label: row for row in rows}
    return list(
        dict.fromkeys(
            code for label in between if label in by_label for code in by_label[label].rejecting(*POINT_FIGURES)
        )
    )


def _gpu_s_per_task(tasks: TaskCosts, throughput: Throughput | None, num_gpus: int | None) -> float | None:
    """Mean GPU-seconds per task at the report's GPU count `num_gpus`: the run's figure (`tasks.gpu_s`) times the GPUs
    the report counts over those the run recorded; for a run that recorded none, its tokens over its throughput per
    `num_gpus` GPUs (per server when None, as the report's per-GPU figures)."""
    divisor = num_gpus or 1
    recorded = throughput.num_gpus if throughput is not None else None
    if tasks.gpu_s is not None and recorded:
        return tasks.gpu_s.mean * divisor / recorded
    if tasks.total_tokens is None or throughput is None or throughput.total_tps <= 0:
        return None
    return tasks.total_tokens.mean * divisor / throughput.total_tps


def _mean(found: Stats | None) -> float | None:
    return found.mean if found is not None else None


def _series_tasks(
    series: Series,
    rows: Sequence[LevelRow],
    targets: Sequence[TargetRow],
    tiers: Sequence[tuple[str, Price]],
    num_gpus: int | None,
) -> SeriesTasks | None:
    """What one task costs in `series`: per level priced by its GPU time, at each target by its tokens."""
    by_label = {row.label: row for row in rows}
    levels: list[LevelTasks] = []
    pooled_tasks, pooled_tokens = 0, 0.0
    for level in series.levels:
        summary = level.summary
        if summary is None or summary.tasks is None or level.status == "failed":
            continue
        tasks = summary.tasks
        gpu_s = _gpu_s_per_task(tasks, summary.throughput, num_gpus) if tasks.completed else None
        row = by_label.get(level.label)
        levels.append(
            LevelTasks(
                label=level.label,
                completed=tasks.completed,
                failed=tasks.failed,
                cut=tasks.cut,
                cached_tokens=_mean(tasks.cached_tokens),
                uncached_tokens=_mean(tasks.uncached_tokens),
                output_tokens=_mean(tasks.output_tokens),
                total_tokens=_mean(tasks.total_tokens),
                gpu_s=gpu_s,
                prices=[
                    TaskPrice(
                        tier=name,
                        usd_per_gpu_hour=price.usd_per_gpu_hour,
                        usd_per_task=None
                        if gpu_s is None or price.usd_per_gpu_hour is None
                        else gpu_s * price.usd_per_gpu_hour / 3600.0,
                    )
                    for name, price in tiers
                ],
                rejected_by=row.rejecting("throughput") if row is not None else [],
            )
        )
        if tasks.total_tokens is not None and tasks.completed:
            pooled_tasks += tasks.completed
            pooled_tokens += tasks.total_tokens.mean * tasks.completed
    if not levels:
        return None
    tokens = pooled_tokens / pooled_tasks if pooled_tasks else None

    def at_target(name: str, price: Price, target: TargetRow) -> TaskPriceAtTarget:
        # The targets table's $/M at its tier; the same formula at every other tier.
        usd_per_m = (
            target.cost.total_usd_per_m
            if target.cost is not None and target.cost.tier == name
            else usd_per_million_tokens(price.usd_per_gpu_hour, target.total_tps_per_gpu)
        )
        return TaskPriceAtTarget(
            tier=name,
            total_usd_per_m=usd_per_m,
            usd_per_task=None if tokens is None or usd_per_m is None else tokens * usd_per_m / 1e6,
        )

    return SeriesTasks(
        tasks=pooled_tasks,
        total_tokens=tokens,
        levels=levels,
        targets=[
            TasksAtTarget(
                target_tps=target.target_tps,
                prices=[at_target(name, price, target) for name, price in tiers],
                rejected_by=target.rejected_by,
            )
            for target in targets
        ],
    )


def series_report(series: Series, options: ReportOptions, prices: PriceTable) -> SeriesReport:
    """One series' part of the report; the targets table also holds `options.target_tps`."""
    targets_tps = with_target(options.frontier.targets_tps, options.target_tps)
    options = msgspec.structs.replace(
        options, frontier=msgspec.structs.replace(options.frontier, targets_tps=targets_tps)
    )
    front, points, num_gpus = _frontier_of(series, options)
    on_front = {p.label for p in front.front}
    rows = [_level_row(level, points.get(level.label), level.label in on_front, num_gpus) for level in series.levels]
    sku = options.gpu_sku or series.gpu_sku
    tiers = prices_for(prices, sku, options.usd_per_gpu_hour)
    tier = GIVEN_TIER if options.usd_per_gpu_hour is not None else options.tier
    chosen: Price | None = next((price for name, price in tiers if name == tier), None)
    targets = [
        TargetRow(
            target_tps=at.target_tps,
            total_tps_per_gpu=at.total_tps_per_gpu,
            output_tps_per_gpu=at.output_tps_per_gpu,
            input_tps_per_gpu=at.input_tps_per_gpu,
            between=at.between,
            cost=None
            if chosen is None
            else cost(chosen, tier, at.total_tps_per_gpu, at.output_tps_per_gpu, at.input_tps_per_gpu),
            rejected_by=_between_rejected(at.between, rows),
            tokens_per_joule=at.tokens_per_joule,
            tasks_per_mwh=at.tasks_per_mwh,
        )
        for at in front.at_targets
    ]
    target = frontier(
        list(points.values()), msgspec.structs.replace(options.frontier, targets_tps=(options.target_tps,))
    )
    at = target.at_targets[0]
    costs = [
        cost(price, name, at.total_tps_per_gpu, at.output_tps_per_gpu, at.input_tps_per_gpu) for name, price in tiers
    ]
    models = {level.model for level in series.levels if level.model}
    engines = {level.engine for level in series.levels if level.engine}
    return SeriesReport(
        label=series.label,
        model=", ".join(sorted(models)) or None,
        engine=", ".join(sorted(engines)) or None,
        path=series.path,
        gpu_sku=sku,
        num_gpus=num_gpus or 1,
        gpus_known=num_gpus is not None,
        levels=rows,
        targets=targets,
        costs_at_target=costs,
        energy_at_target=None
        if options.kw_per_gpu is None
        else energy(options.kw_per_gpu, at.total_tps_per_gpu, at.output_tps_per_gpu),
        best_ttft_s=_best(rows, lambda r: r.ttft_p50_s, "ttft", lowest=True),
        best_tpot_s=_best(rows, lambda r: r.tpot_p50_s, "tpot", lowest=True),
        peak_total_tps_per_gpu=_best(rows, lambda r: r.total_tps_per_gpu, "throughput", lowest=False),
        peak_output_tps_per_gpu=_best(rows, lambda r: r.output_tps_per_gpu, "throughput", lowest=False),
        target_note=target_note(
            series.label, [p.interactivity_tps for p in front.front], targets_tps, options.frontier.statistic
        ),
        price_note=price_problem(series.label, sku, tier, tiers, prices),
        tasks=_series_tasks(series, rows, targets, tiers, num_gpus),
    )


def audit_entries(series: Sequence[Series]) -> list[AuditEntry]:
    """Each distinct finding (code and severity) of the levels' audits, with the levels it was made at: errors
    first, then in the order first met."""
    entries: dict[tuple[str, str], AuditEntry] = {}
    for one in series:
        for level in one.levels:
            audit = level.summary.audit if level.summary is not None else None
            for finding in audit.findings if audit is not None else []:
                entry = entries.setdefault(
                    (finding.code, finding.severity),
                    AuditEntry(
                        code=finding.code,
                        severity=finding.severity,
                        title=finding.title,
                        advice=finding.advice,
                        affects=finding.affects,
                        levels=[],
                    ),
                )
                entry.levels.append(
                    AuditedLevel(
                        series=one.label, level=level.label, evidence=finding.evidence, requests=finding.requests
                    )
                )
    return sorted(entries.values(), key=lambda entry: entry.severity != "error")


def build_report(
    series: Sequence[Series], options: ReportOptions | None = None, prices: PriceTable | None = None
) -> Report:
    """The report of `series`, priced from `prices` (default: the built-in table)."""
    options = options or ReportOptions()
    table = prices if prices is not None else load_price_table()
    return Report(
        statistic=options.frontier.statistic,
        basis=options.frontier.basis,
        target_tps=options.target_tps,
        tier=GIVEN_TIER if options.usd_per_gpu_hour is not None else options.tier,
        series=[series_report(s, options, table) for s in series],
        prices_updated=table.updated,
        audit=audit_entries(series),
    )


def report_json(report: Report) -> str:
    """The report as indented JSON."""
    return msgspec.json.format(msgspec.json.encode(report)).decode()
