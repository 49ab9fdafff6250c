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

from agentx.errors import ReportError
from agentx.results.compare.bootstrap import (
    FloatArray,
    draw_weights,
    interval,
)
from agentx.results.compare.fairness import (
    Difference,
    differences,
    paired,
)
from agentx.results.compare.metrics import MetricSpec, energy_metrics, metrics
from agentx.results.compare.options import CompareOptions, floored, row_level
from agentx.results.compare.sample import RunSample
from agentx.results.compare.sides import (
    Loaded,
    Side,
    load_side,
    runs_side,
    side_repeats,
    sweep_side,
)
from agentx.results.compare.sweeps import SweepVersus, sweep_versus
from agentx.results.report.cost import load_price_table
from agentx.results.summary.checks.audit import Audit

TIMESTAMPED: Final = frozenset({"ttft", "itl", "e2el"})
"""Figures read off one pair of client timestamps per value (TPOT divides its error by the output length)."""


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


def compare(paths: Sequence[Path], options: CompareOptions | None = None) -> Comparison:
    """Compare the runs or sweeps in `paths` (each a run folder, a sweep folder, or a folder of repeats), the first
    being the baseline; ReportError when they cannot be read or mix runs and sweeps."""
    options = options or CompareOptions()
    if len(paths) < 2:
        raise ReportError("compare needs two or more runs or sweeps")
    loaded = [load_side(path) for path in paths]
    if len({item.kind for item in loaded}) > 1:
        kinds = ", ".join(f"{item.path} is a {item.kind}" for item in loaded)
        raise ReportError(f"compare takes runs or sweeps, not both: {kinds}")
    found = differences([item.identity for item in loaded], options.allow)
    withheld = [d for d in found if not d.allowed]
    prices = load_price_table()
    rng = np.random.default_rng(options.seed)
    repeats = [side_repeats(item) for item in loaded] if loaded[0].kind == "run" else []
    samples = [RunSample(runs) for runs in repeats]
    if loaded[0].kind == "run":
        # The energy rows count only where every side measured its GPUs' energy: the others leave them out, and a
        # row that is never shown must not narrow the ones that are.
        unmeasured = any(sample.energy_j is None for sample in samples)
        rows = len(metrics(True)) - (len(energy_metrics()) if unmeasured else 0)
    else:
        rows = len(options.frontier.targets_tps)
    comparison = Comparison(
        level=options.level,
        row_level=row_level(options.level, rows),
        replicates=options.replicates,
        sides=[],
        differences=found,
    )
    if loaded[0].kind == "run":
        per_gpu = all(item.identity.gpus is not None for item in loaded)
        specs = metrics(per_gpu)
        figures = [_per_repeat([RunSample([run]) for run in runs], specs) for runs in repeats]
        comparison.sides = [
            runs_side(item, sample, prices, options) for item, sample in zip(loaded, samples, strict=True)
        ]
        for index in range(1, len(loaded)):
            comparison.versus.append(
                _versus(loaded[0], loaded[index], samples[0], samples[index], specs, figures, index, options,
                        withheld, comparison.sides, rng)
            )  # fmt: skip
    else:
        comparison.sides = [sweep_side(item, prices, options) for item in loaded]
        for index in range(1, len(loaded)):
            comparison.sweeps.append(sweep_versus(loaded[0], loaded[index], options, withheld, rng))
    return comparison


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


def _versus(
    base_item: Loaded,
    other_item: Loaded,
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


def comparison_json(comparison: Comparison) -> str:
    return msgspec.json.format(msgspec.json.encode(comparison)).decode()
