"""The report of one or more runs or sweeps, from their directories alone: frontier, cost, latency, peak.

`load_series(path)` reads a run directory (run.json, or records.arrow alone for a run that never finished) or a
sweep directory (sweep.json and its level directories; or, without sweep.json, every subdirectory holding a
run); `build_report` turns series into a `Report`: per series its levels, the throughput at every interactivity
target with its $/M and operating point, what serving costs per price tier at one target, the best TTFT and
TPOT, the peak throughput. `report_json` gives it as JSON; agentx.cli.display.report_tables renders it as rich and
Markdown tables, agentx.results.report.plots as plots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from agentx.errors import RecordsError, ReportError
from agentx.records.record import read_records, run_info
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE
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
)
from agentx.results.report.folders import SWEEP_FILE, RunFile, read_index, read_run_file
from agentx.results.report.frontier import Basis, Frontier, FrontierOptions, Point, Statistic, frontier, point
from agentx.results.report.notes import no_point, price_problem, target_note, with_target
from agentx.results.summary.goodput import slo_text
from agentx.results.summary.summarize import Summary, summarize
from agentx.results.summary.validity import rules_of


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
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None
    """Time per output token (TPOT), per request, median over requests."""
    tpot_p90_s: float | None = None
    requests: int = 0
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
    """Why a level with a summary has no interactivity or throughput (`report_notes.no_point`); None when it has."""


class TargetRow(msgspec.Struct, kw_only=True):
    target_tps: float
    total_tps_per_gpu: float | None
    output_tps_per_gpu: float | None
    input_tps_per_gpu: float | None
    between: tuple[str, str] | None
    cost: Cost | None
    """At the report's tier; None without a price for the series' SKU and tier."""


class Best(msgspec.Struct, kw_only=True):
    value: float
    label: str
    interactivity_tps: float | None = None


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


class Report(msgspec.Struct, kw_only=True):
    statistic: Statistic
    basis: Basis
    target_tps: float
    tier: str
    series: list[SeriesReport]
    prices_updated: str = ""


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
        table = read_records(path)
        summary = summarize(table)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: cannot read the records ({exc})") from None
    try:
        options = run_info(table).options
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
    if found is None and level.summary is not None and level.status != "failed":
        row.note = no_point(level.summary)
    if found is not None:
        row.interactivity_tps = found.interactivity_tps
        row.total_tps_per_gpu = found.total_tps_per_gpu
        row.output_tps_per_gpu = found.output_tps_per_gpu
        row.input_tps_per_gpu = found.input_tps_per_gpu
    if level.summary is not None:
        latency = level.summary.latency
        row.requests = level.summary.counts.kept
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


def _best(rows: Sequence[LevelRow], value: Callable[[LevelRow], float | None], *, lowest: bool) -> Best | None:
    candidates = [(v, row) for row in rows if (v := value(row)) is not None]
    if not candidates:
        return None
    v, row = (min if lowest else max)(candidates, key=lambda pair: pair[0])
    return Best(value=v, label=row.label, interactivity_tps=row.interactivity_tps)


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
        best_ttft_s=_best(rows, lambda r: r.ttft_p50_s, lowest=True),
        best_tpot_s=_best(rows, lambda r: r.tpot_p50_s, lowest=True),
        peak_total_tps_per_gpu=_best(rows, lambda r: r.total_tps_per_gpu, lowest=False),
        peak_output_tps_per_gpu=_best(rows, lambda r: r.output_tps_per_gpu, lowest=False),
        target_note=target_note(
            series.label, [p.interactivity_tps for p in front.front], targets_tps, options.frontier.statistic
        ),
        price_note=price_problem(series.label, sku, tier, tiers, prices),
    )


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
    )


def report_json(report: Report) -> str:
    """The report as indented JSON."""
    return msgspec.json.format(msgspec.json.encode(report)).decode()
