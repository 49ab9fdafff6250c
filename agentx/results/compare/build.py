"""`compare(paths, options)`: two or more runs or sweeps side by side, each against the first (the baseline).

For runs, every figure of agentx.results.compare.metrics, on each side and as a relative difference (other /
baseline − 1) with its bootstrap interval over sessions (agentx.results.compare.bootstrap). Runs that played the same
trace, rules, mode and seed are *paired*: one set of weights per replicate draws the same sessions from both, so the
interval is that of the difference on an identical session sample, and their requests are matched one to one by
(session, agent, turn, occurrence). Otherwise each side is resampled on its own.

Every interval is at least ±`min_effect` (1 %) around the difference (`floored`), and for TTFT, ITL and E2EL at
least the client's event-loop lag p99 over the baseline's figure (a timestamp is late by up to that much):
near-deterministic figures give bootstrap intervals far tighter than the client's own timing can vouch for.
Intervals are simultaneous: each row's is at 1 − (1 − level) / rows (Bonferroni), so that two runs of one deployment
have every row unresolved with at least `level` chance, however many rows are shown. A row is *resolved* when its
interval excludes 0: the difference is larger than the variation the session sample shows and than that floor. Its
`resolvable` is half the interval's width: a true difference smaller than that would not have been resolved.
With repeats on both sides (a folder of `repeats.json`), the rows also give each side's spread over its repeats (the
standard deviation of the figure over repeats) and a difference is resolved only when the repeats' own interval (a
Welch interval on the per-repeat figures) excludes 0 too.

For sweeps, throughput per GPU at each interactivity target: each level resampled on its own, the front rebuilt and
interpolated per replicate (agentx.results.report.frontier).

A verdict is withheld on every row when the sides differ in a way `--allow` did not accept
(agentx.results.compare.fairness), and on a row whose figure a side's plausibility audit rejects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any, Final

import msgspec
import numpy as np

from agentx.errors import RecordsError, ReportError
from agentx.records.record import read_records
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE
from agentx.results.compare.bootstrap import (
    FloatArray,
    IntArray,
    draw_weights,
    interval,
    weighted_means,
    weighted_percentiles,
    weighted_sums,
)
from agentx.results.compare.fairness import Difference, Identity, differences, identity, paired
from agentx.results.compare.metrics import MetricSpec, metrics
from agentx.results.compare.repeats import REPEATS_FILE, read_repeats
from agentx.results.compare.sample import Repeat, RunSample
from agentx.results.report.build import Level, Series, load_series
from agentx.results.report.cost import PriceTable, load_price_table, prices_for
from agentx.results.report.folders import read_run_file
from agentx.results.report.frontier import BASES, FrontierOptions, pareto_front, pchip
from agentx.results.summary.audit import Audit, Finding
from agentx.results.summary.critical_path import PathParts, pooled_shares

TIMESTAMPED: Final = frozenset({"ttft", "itl", "e2el"})
"""Figures read off one pair of client timestamps per value (TPOT divides its error by the output length)."""
DEFAULT_REPLICATES: Final = 2000
"""Enough for a row's interval at 99.7 % (a family of 17 rows at 95 %) to have a few replicates in each tail."""


class CompareOptions(msgspec.Struct, frozen=True, kw_only=True):
    level: float = 0.95
    """The confidence level of the intervals."""
    min_effect: float = 0.01
    """The floor of every interval's half-width (relative): below it, the client's timing and the machine's noise are
    of the same order, however tight the bootstrap's interval."""
    replicates: int = DEFAULT_REPLICATES
    seed: int = 0
    """Seeds the bootstrap: the same inputs and seed give the same intervals."""
    allow: frozenset[str] = frozenset()
    """Difference keys (agentx.results.compare.fairness.KEYS) accepted for a verdict."""
    gpu_sku: str | None = None
    """Prices the GPU time per task (overrides what a sweep recorded)."""
    usd_per_gpu_hour: float | None = None
    frontier: FrontierOptions = FrontierOptions()


class Side(msgspec.Struct, kw_only=True):
    """One run or sweep of the comparison (its repeats pooled)."""

    label: str
    path: str
    kind: str
    """"run" or "sweep"."""
    repeats: int
    requests: int
    sessions: int
    """Clusters the bootstrap draws: root sessions (× repeats)."""
    gpus: int | None
    gpu_sku: str | None
    findings: list[Finding]
    """Every repeat's and level's plausibility audit findings (each once)."""
    tasks: int
    """Completed tasks (agentx.results.summary.tasks) over the repeats."""
    gpu_s_per_task: float | None
    critical_path: PathParts | None = None
    """Where the plays' time went, as shares of their summed makespans over every repeat and level
    (agentx.results.summary.critical_path)."""
    loop_lag_p99_s: float | None = None
    """The client's event-loop lag p99 (the largest over its repeats): the resolution of one timestamp."""
    usd_per_task: dict[str, float] = {}
    """$ per task by price tier, where the GPU has a price."""


class Row(msgspec.Struct, kw_only=True):
    metric: str
    unit: str
    better: str
    baseline: float | None
    value: float | None
    relative: float | None
    """value / baseline − 1."""
    low: float | None = None
    high: float | None = None
    """The relative difference's interval at the comparison's level."""
    resolvable: float | None = None
    """Half the interval's width: the smallest relative difference this data could resolve."""
    baseline_spread: float | None = None
    """The figure's standard deviation over the baseline's repeats (with ≥ 2)."""
    spread: float | None = None
    verdict: str = ""
    """"better", "worse", "no resolved difference", or why there is none ("withheld: ...")."""


class PairedRequests(msgspec.Struct, kw_only=True):
    """Requests of two paired runs matched by (session, agent, turn, occurrence)."""

    matched: int
    ttft_median_delta_ms: float | None
    e2el_median_delta_ms: float | None
    e2el_faster_share: float | None
    """The share of matched requests whose E2EL was shorter than the baseline's."""


class Versus(msgspec.Struct, kw_only=True):
    baseline: str
    other: str
    paired: bool
    pairing: str
    """Why paired or not, and over how many sessions."""
    rows: list[Row]
    requests: PairedRequests | None = None


class TargetRow(msgspec.Struct, kw_only=True):
    """Throughput per GPU at one interactivity target, on each sweep, with the difference's interval."""

    target_tps: float
    baseline: float | None
    value: float | None
    relative: float | None
    low: float | None = None
    high: float | None = None
    resolvable: float | None = None
    verdict: str = ""


class SweepVersus(msgspec.Struct, kw_only=True):
    baseline: str
    other: str
    basis: str
    statistic: str
    targets: list[TargetRow]


class Comparison(msgspec.Struct, kw_only=True):
    level: float
    """The family-wise level: the chance that no row of a comparison is called resolved when nothing differs."""
    row_level: float
    """Each row's interval's level, Bonferroni over the rows of a comparison: 1 − (1 − level) / rows."""
    replicates: int
    sides: list[Side]
    differences: list[Difference]
    versus: list[Versus] = []
    sweeps: list[SweepVersus] = []

    @property
    def withheld(self) -> list[Difference]:
        return [difference for difference in self.differences if not difference.allowed]


# ---------------------------------------------------------------------------------------------
# loading


class _Loaded(msgspec.Struct, kw_only=True, dict=True):
    label: str
    path: str
    kind: str
    repeats: list[Series]
    identity: Identity


def _load(path: Path) -> _Loaded:
    repeat_dirs = read_repeats(path)
    folders = repeat_dirs if repeat_dirs is not None else [path]
    series = [load_series(folder) for folder in folders]
    kinds = {s.kind for s in series}
    if len(kinds) > 1:
        raise ReportError(f"{path / REPEATS_FILE}: its repeats mix runs and sweeps")
    first = series[0]
    level = next((lv for lv in first.levels if lv.summary is not None), None)
    if level is None:
        raise ReportError(f"{path}: no run in it has a summary to compare")
    options, run = _run_document(Path(level.run_dir))
    validity = level.summary.validity.verdict() if level.summary and level.summary.validity else None
    concurrency = ",".join(str(lv.concurrency) for lv in first.levels) if first.kind == "sweep" else None
    gpus = first.num_gpus if first.num_gpus is not None else _gpus(level)
    return _Loaded(
        label=path.resolve().name,
        path=str(path),
        kind=first.kind,
        repeats=series,
        identity=identity(options, run, gpus=gpus, gpu_sku=first.gpu_sku, validity=validity, concurrency=concurrency),
    )


def _gpus(level: Level) -> int | None:
    throughput = level.summary.throughput if level.summary is not None else None
    return throughput.num_gpus if throughput is not None else None


def _run_document(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's options and RunResult as dicts: from run.json, else from the records' metadata (options only)."""
    if (run_dir / RUN_FILE).is_file():
        try:
            run_file = read_run_file(run_dir / RUN_FILE)
            return run_file.options, msgspec.to_builtins(run_file.run, enc_hook=str)
        except (OSError, msgspec.DecodeError):
            pass
    try:
        from agentx.records.record import run_info

        return run_info(read_records(run_dir / RECORDS_FILE)).options, {}
    except (OSError, RecordsError):
        return {}, {}


def _repeat(level: Level, num_gpus: int | None) -> Repeat | None:
    summary = level.summary
    if summary is None or summary.throughput is None:
        return None
    try:
        records = read_records(Path(level.run_dir) / RECORDS_FILE)
    except (OSError, RecordsError) as exc:
        raise ReportError(f"{level.run_dir}: cannot read its records ({exc})") from None
    _, run = _run_document(Path(level.run_dir))
    started, finished = run.get("trees_started"), run.get("trees_finished")
    cut = not (isinstance(started, int) and isinstance(finished, int) and finished >= started)
    gpus = num_gpus if num_gpus is not None else summary.throughput.num_gpus
    return Repeat(records=records, duration_s=summary.throughput.duration_s, num_gpus=gpus, trees_cut=cut)


# ---------------------------------------------------------------------------------------------
# comparing


def compare(paths: Sequence[Path], options: CompareOptions | None = None) -> Comparison:
    """Compare the runs or sweeps in `paths` (each a run folder, a sweep folder, or a folder of repeats), the first
    being the baseline; ReportError when they cannot be read or mix runs and sweeps."""
    options = options or CompareOptions()
    if len(paths) < 2:
        raise ReportError("compare needs two or more runs or sweeps")
    loaded = [_load(path) for path in paths]
    if len({item.kind for item in loaded}) > 1:
        kinds = ", ".join(f"{item.path} is a {item.kind}" for item in loaded)
        raise ReportError(f"compare takes runs or sweeps, not both: {kinds}")
    found = differences([item.identity for item in loaded], options.allow)
    withheld = [d for d in found if not d.allowed]
    prices = load_price_table()
    rng = np.random.default_rng(options.seed)
    rows = len(metrics(True)) if loaded[0].kind == "run" else len(options.frontier.targets_tps)
    comparison = Comparison(
        level=options.level,
        row_level=row_level(options.level, rows),
        replicates=options.replicates,
        sides=[],
        differences=found,
    )
    if loaded[0].kind == "run":
        repeats = [_repeats(item) for item in loaded]
        samples = [RunSample(runs) for runs in repeats]
        per_gpu = all(item.identity.gpus is not None for item in loaded)
        specs = metrics(per_gpu)
        figures = [_per_repeat([RunSample([run]) for run in runs], specs) for runs in repeats]
        comparison.sides = [_side(item, sample, prices, options) for item, sample in zip(loaded, samples, strict=True)]
        for index in range(1, len(loaded)):
            comparison.versus.append(
                _versus(loaded[0], loaded[index], samples[0], samples[index], specs, figures, index, options,
                        withheld, comparison.sides, rng)
            )  # fmt: skip
    else:
        comparison.sides = [_sweep_side(item, prices, options) for item in loaded]
        for index in range(1, len(loaded)):
            comparison.sweeps.append(_sweep_versus(loaded[0], loaded[index], options, withheld, rng))
    return comparison


def _repeats(item: _Loaded) -> list[Repeat]:
    repeats = [r for series in item.repeats for level in series.levels if (r := _repeat(level, series.num_gpus))]
    if not repeats:
        raise ReportError(f"{item.path}: no run in it has kept requests to compare")
    return repeats


def _per_repeat(samples: list[RunSample], specs: list[tuple[MetricSpec, Any]]) -> list[FloatArray]:
    """Each figure on each repeat alone (for the spread); empty for a single run."""
    if len(samples) < 2:
        return []
    figures: list[FloatArray] = []
    for sample in samples:
        ones = np.ones((1, len(sample.clusters)), dtype=np.int64)
        figures.append(np.array([_scaled(spec, float(estimate(sample, ones)[0])) for spec, estimate in specs]))
    return figures


def _scaled(spec: MetricSpec, value: float) -> float:
    return value * spec.scale if math.isfinite(value) else math.nan


def _side(item: _Loaded, sample: RunSample, prices: PriceTable, options: CompareOptions) -> Side:
    findings = _findings(item)
    tasks = int(sample.values["task_tokens"].size) if "task_tokens" in sample.values else 0
    ones = np.ones((1, len(sample.clusters)), dtype=np.int64)
    gpu_s = None
    for spec, estimate in metrics(True):
        if spec.name == "GPU time per task":
            value = float(estimate(sample, ones)[0])
            gpu_s = value if math.isfinite(value) else None
    sku = options.gpu_sku or item.identity.gpu_sku
    usd = {
        tier: gpu_s * price.usd_per_gpu_hour / 3600.0
        for tier, price in prices_for(prices, sku, options.usd_per_gpu_hour)
        if gpu_s is not None and price.usd_per_gpu_hour is not None
    }
    return Side(
        label=item.label,
        path=item.path,
        kind=item.kind,
        repeats=len(item.repeats),
        loop_lag_p99_s=_loop_lag_p99_s(item),
        critical_path=_critical_path(item),
        requests=int(sample.values["ttft_s"].size),
        sessions=len(sample.clusters),
        gpus=item.identity.gpus,
        gpu_sku=sku,
        findings=findings,
        tasks=tasks,
        gpu_s_per_task=gpu_s,
        usd_per_task=usd,
    )


def _critical_path(item: _Loaded) -> PathParts | None:
    found = [
        level.summary.critical_path
        for series in item.repeats
        for level in series.levels
        if level.summary is not None and level.summary.critical_path is not None
    ]
    return pooled_shares(found) if found else None


def _loop_lag_p99_s(item: _Loaded) -> float | None:
    lags = [
        level.summary.loop_lag.p99_s
        for series in item.repeats
        for level in series.levels
        if level.summary is not None and level.summary.loop_lag is not None
    ]
    return max(lags) if lags else None


def _findings(item: _Loaded) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for series in item.repeats:
        for level in series.levels:
            if level.summary is not None and level.summary.audit is not None:
                for finding in level.summary.audit.findings:
                    seen.setdefault(finding.code, finding)
    return list(seen.values())


def _versus(
    base_item: _Loaded,
    other_item: _Loaded,
    base: RunSample,
    other: RunSample,
    specs: list[tuple[MetricSpec, Any]],
    figures: list[list[FloatArray]],
    index: int,
    options: CompareOptions,
    withheld: list[Difference],
    sides: list[Side],
    rng: np.random.Generator,
) -> Versus:
    is_paired = paired([base_item.identity, other_item.identity])
    common = [key for key in base.clusters if key in set(other.clusters)] if is_paired else []
    if is_paired and common:
        base_p, other_p = base.with_clusters(common), other.with_clusters(common)
        weights = draw_weights(rng, len(common), options.replicates)
        base_w = other_w = weights
        dropped = len(base.clusters) + len(other.clusters) - 2 * len(common)
        pairing = f"paired over {len(common):,} sessions (same trace, rules, mode and seed)" + (
            f"; {dropped:,} sessions played by one run only left out" if dropped else ""
        )
    else:
        base_p, other_p = base, other
        base_w = draw_weights(rng, len(base.clusters), options.replicates)
        other_w = draw_weights(rng, len(other.clusters), options.replicates)
        why = "no session in common" if is_paired else "different trace, rules, mode or seed"
        pairing = f"not paired ({why}): each run resampled over its own sessions"
    audit_rejects = {
        figure
        for side in (sides[0], sides[index])
        for figure in ("ttft", "tpot", "itl", "e2el", "interactivity", "throughput")
        if Audit(findings=side.findings).rejects(figure)
    }
    each_level = row_level(options.level, len(specs))
    lag_s = max(sides[0].loop_lag_p99_s or 0.0, sides[index].loop_lag_p99_s or 0.0)
    ones_base = np.ones((1, len(base_p.clusters)), dtype=np.int64)
    ones_other = np.ones((1, len(other_p.clusters)), dtype=np.int64)
    rows: list[Row] = []
    for position, (spec, estimate) in enumerate(specs):
        base_value = _scaled(spec, float(estimate(base_p, ones_base)[0]))
        value = _scaled(spec, float(estimate(other_p, ones_other)[0]))
        if not (math.isfinite(base_value) or math.isfinite(value)):
            continue
        row = Row(
            metric=spec.name,
            unit=spec.unit,
            better=spec.better,
            baseline=base_value if math.isfinite(base_value) else None,
            value=value if math.isfinite(value) else None,
            relative=value / base_value - 1.0 if math.isfinite(value) and base_value not in (0.0,) and
            math.isfinite(base_value) else None,
        )  # fmt: skip
        if row.relative is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios = estimate(other_p, other_w) / estimate(base_p, base_w) - 1.0
            floor = options.min_effect
            if spec.figure in TIMESTAMPED and base_value:
                # One timestamp's error is the client's loop lag: a difference below it is not the server's.
                floor = max(floor, lag_s * spec.scale / abs(base_value))
            bounds = floored(interval(ratios, each_level), row.relative, floor)
            if bounds is not None:
                row.low, row.high = bounds
                row.resolvable = (bounds[1] - bounds[0]) / 2.0
        if figures[0] and figures[index]:
            row.baseline_spread = float(np.nanstd([f[position] for f in figures[0]], ddof=1))
            row.spread = float(np.nanstd([f[position] for f in figures[index]], ddof=1))
        row.verdict = _verdict(row, spec, withheld, audit_rejects, figures, position, index, each_level)
        rows.append(row)
    requests = _paired_requests(base, other) if is_paired else None
    return Versus(
        baseline=base_item.label, other=other_item.label, paired=is_paired and bool(common), pairing=pairing,
        rows=rows, requests=requests,
    )  # fmt: skip


def _verdict(
    row: Row,
    spec: MetricSpec,
    withheld: list[Difference],
    audit_rejects: set[str],
    figures: list[list[FloatArray]],
    position: int,
    index: int,
    each_level: float,
) -> str:
    if withheld:
        return "withheld (" + ", ".join(d.key for d in withheld) + " differs)"
    if spec.figure is not None and spec.figure in audit_rejects:
        return "withheld (the audit rejects it)"
    if row.low is None or row.high is None or row.relative is None:
        return "no interval"
    resolved = row.low > 0 or row.high < 0
    if resolved and figures[0] and figures[index]:
        resolved = _welch_excludes_zero([f[position] for f in figures[0]], [f[position] for f in figures[index]],
                                        each_level)  # fmt: skip
    if not resolved:
        return "no resolved difference"
    higher = row.relative > 0
    return "better" if higher == (spec.better == "higher") else "worse"


def row_level(level: float, rows: int) -> float:
    """Each row's level for a family-wise `level` over `rows` rows (Bonferroni): with 17 rows at 95 %, 99.7 %."""
    return 1.0 - (1.0 - level) / max(rows, 1)


def floored(bounds: tuple[float, float] | None, relative: float, min_effect: float) -> tuple[float, float] | None:
    """`bounds` widened to at least `min_effect` on each side of `relative`: no interval claims a precision finer than
    the measurement's (near-deterministic figures give bootstrap intervals far tighter than the client's timing)."""
    if bounds is None:
        return None
    return min(bounds[0], relative - min_effect), max(bounds[1], relative + min_effect)


def _welch_excludes_zero(base: list[float], other: list[float], level: float) -> bool:
    """Whether the Welch interval of mean(other) − mean(base) over repeats excludes 0 (normal quantile: repeats are
    few, so this is generous; the bootstrap interval must exclude 0 as well)."""
    a, b = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2:
        return True
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    error = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return bool(abs(b.mean() - a.mean()) > z * error)


def _paired_requests(base: RunSample, other: RunSample) -> PairedRequests:
    position = {key: i for i, key in enumerate(base.request_keys)}
    pairs = [(position[key], j) for j, key in enumerate(other.request_keys) if key in position]
    if not pairs:
        return PairedRequests(matched=0, ttft_median_delta_ms=None, e2el_median_delta_ms=None, e2el_faster_share=None)
    left = np.array([i for i, _ in pairs], dtype=np.int64)
    right = np.array([j for _, j in pairs], dtype=np.int64)

    def median_delta_ms(name: str) -> float | None:
        delta = other.values[name][right] - base.values[name][left]
        delta = delta[np.isfinite(delta)]
        return float(np.median(delta)) * 1e3 if delta.size else None

    e2el = other.values["e2el_s"][right] - base.values["e2el_s"][left]
    e2el = e2el[np.isfinite(e2el)]
    return PairedRequests(
        matched=len(pairs),
        ttft_median_delta_ms=median_delta_ms("ttft_s"),
        e2el_median_delta_ms=median_delta_ms("e2el_s"),
        e2el_faster_share=float((e2el < 0).mean()) if e2el.size else None,
    )


# ---------------------------------------------------------------------------------------------
# sweeps


def _sweep_side(item: _Loaded, prices: PriceTable, options: CompareOptions) -> Side:
    findings = _findings(item)
    requests = sum(
        level.summary.counts.kept for series in item.repeats for level in series.levels if level.summary is not None
    )
    return Side(
        label=item.label, path=item.path, kind=item.kind, repeats=len(item.repeats), requests=requests, sessions=0,
        gpus=item.identity.gpus, gpu_sku=options.gpu_sku or item.identity.gpu_sku, findings=findings, tasks=0,
        gpu_s_per_task=None, critical_path=_critical_path(item),
    )  # fmt: skip


def _levels(item: _Loaded) -> list[RunSample]:
    """One pooled sample per concurrency level (repeats of a level pooled)."""
    by_label: dict[str, list[Repeat]] = {}
    for series in item.repeats:
        for level in series.levels:
            repeat = _repeat(level, series.num_gpus)
            if repeat is not None:
                by_label.setdefault(level.label, []).append(repeat)
    return [RunSample(repeats) for repeats in by_label.values()]


def _front_at(
    levels: list[RunSample], weights: list[IntArray], options: FrontierOptions, replicates: int
) -> FloatArray:
    """Throughput per GPU at each target, per replicate (replicates × targets); NaN outside the front."""
    statistic = None if options.statistic == "mean" else float(options.statistic[1:])
    basis_name = {"total": "total_tokens", "output": "output_tokens", "input": "total_tokens"}[options.basis]
    xs = np.full((replicates, len(levels)), np.nan)
    ys = np.full((replicates, len(levels)), np.nan)
    for column, (sample, w) in enumerate(zip(levels, weights, strict=True)):
        tpot = np.where(sample.values["tpot_s"] > 0, sample.values["tpot_s"], np.nan)
        clusters = sample.cluster["tpot_s"]
        tpot_s = weighted_means(tpot, clusters, w) if statistic is None else weighted_percentiles(tpot, clusters, w,
                                                                                                 statistic)  # fmt: skip
        xs[:, column] = 1.0 / tpot_s
        tokens = weighted_sums(sample.values[basis_name], sample.cluster[basis_name], w)
        if options.basis == "input":
            tokens = tokens - weighted_sums(sample.values["output_tokens"], sample.cluster["output_tokens"], w)
        ys[:, column] = tokens / sample.gpu_seconds
    result = np.full((replicates, len(options.targets_tps)), np.nan)
    for r in range(replicates):
        ok = np.isfinite(xs[r]) & np.isfinite(ys[r]) & (xs[r] > 0)
        if not ok.any():
            continue
        x, y = xs[r][ok], ys[r][ok]
        front = pareto_front(x.tolist(), y.tolist())
        order = sorted(front, key=lambda i: x[i])
        values = pchip([float(x[i]) for i in order], [float(y[i]) for i in order], list(options.targets_tps))
        result[r] = [math.nan if v is None else v for v in values]
    return result


def _sweep_versus(
    base: _Loaded, other: _Loaded, options: CompareOptions, withheld: list[Difference], rng: np.random.Generator
) -> SweepVersus:
    frontier = options.frontier
    assert frontier.basis in BASES
    sides = []
    for item in (base, other):
        levels = _levels(item)
        if not levels:
            raise ReportError(f"{item.path}: no level of the sweep has kept requests to compare")
        point = _front_at(levels, [np.ones((1, len(s.clusters)), dtype=np.int64) for s in levels], frontier, 1)[0]
        weights = [draw_weights(rng, len(s.clusters), options.replicates) for s in levels]
        sides.append((point, _front_at(levels, weights, frontier, options.replicates)))
    (base_point, base_reps), (point, reps) = sides
    each_level = row_level(options.level, len(frontier.targets_tps))
    rows: list[TargetRow] = []
    for t, target in enumerate(frontier.targets_tps):
        b, v = base_point[t], point[t]
        row = TargetRow(
            target_tps=target,
            baseline=float(b) if math.isfinite(b) else None,
            value=float(v) if math.isfinite(v) else None,
            relative=float(v / b - 1.0) if math.isfinite(b) and math.isfinite(v) and b > 0 else None,
        )
        if row.relative is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                bounds = floored(interval(reps[:, t] / base_reps[:, t] - 1.0, each_level), row.relative,
                                 options.min_effect)  # fmt: skip
            if bounds is not None:
                row.low, row.high = bounds
                row.resolvable = (bounds[1] - bounds[0]) / 2.0
        if withheld:
            row.verdict = "withheld (" + ", ".join(d.key for d in withheld) + " differs)"
        elif row.relative is None:
            row.verdict = "outside a front"
        elif row.low is None or row.high is None:
            row.verdict = "no interval (a replicate's front misses the target)"
        elif row.low > 0 or row.high < 0:
            row.verdict = "better" if row.relative > 0 else "worse"
        else:
            row.verdict = "no resolved difference"
        rows.append(row)
    return SweepVersus(
        baseline=base.label, other=other.label, basis=frontier.basis, statistic=frontier.statistic, targets=rows
    )


def comparison_json(comparison: Comparison) -> str:
    return msgspec.json.format(msgspec.json.encode(comparison)).decode()
