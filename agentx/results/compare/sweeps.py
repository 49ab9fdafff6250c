"""Sweeps compared: throughput per GPU at each interactivity target, each level resampled over its sessions and the
front rebuilt and interpolated per replicate (agentx.results.report.frontier); and, when every level's GPU energy was
measured (`--gpu-metrics`), tokens per joule at each target along the same front (a level's replicate tokens over its
measured energy)."""

from __future__ import annotations

import math

import msgspec
import numpy as np

from agentx.errors import ReportError
from agentx.results.compare.bootstrap import (
    FloatArray,
    IntArray,
    draw_weights,
    interval,
    weighted_means,
    weighted_percentiles,
    weighted_sums,
)
from agentx.results.compare.fairness import (
    Difference,
)
from agentx.results.compare.options import CompareOptions, floored, row_level
from agentx.results.compare.sample import Repeat, RunSample
from agentx.results.compare.sides import Loaded, level_repeat
from agentx.results.report.frontier import BASES, Basis, FrontierOptions, Statistic, pareto_front, pchip


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
    tokens_per_joule: list[TargetRow] = []
    """Measured total tokens per joule at each target (`targets`' layout); empty unless every level was measured."""


def _levels(item: Loaded) -> list[RunSample]:
    """One pooled sample per concurrency level (repeats of a level pooled)."""
    by_label: dict[str, list[Repeat]] = {}
    for series in item.repeats:
        for level in series.levels:
            repeat = level_repeat(level, series.num_gpus)
            if repeat is not None:
                by_label.setdefault(level.label, []).append(repeat)
    return [RunSample(repeats) for repeats in by_label.values()]


def level_replicates(
    sample: RunSample, weights: IntArray, statistic: Statistic, basis: Basis
) -> tuple[FloatArray, FloatArray]:
    """A level's interactivity (1 / TPOT at `statistic`) and throughput per GPU of `basis` in each replicate of
    `weights` (replicates × the sample's clusters), as the report reads a level's point."""
    tpot = np.where(sample.values["tpot_s"] > 0, sample.values["tpot_s"], np.nan)
    clusters = sample.cluster["tpot_s"]
    if statistic == "mean":
        tpot_s = weighted_means(tpot, clusters, weights)
    else:
        tpot_s = weighted_percentiles(tpot, clusters, weights, float(statistic[1:]))
    with np.errstate(divide="ignore", invalid="ignore"):
        interactivity: FloatArray = 1.0 / tpot_s
    name = "output_tokens" if basis == "output" else "total_tokens"
    tokens = weighted_sums(sample.values[name], sample.cluster[name], weights)
    if basis == "input":
        tokens = tokens - weighted_sums(sample.values["output_tokens"], sample.cluster["output_tokens"], weights)
    if sample.gpu_seconds <= 0:
        return interactivity, np.full(weights.shape[0], np.nan)
    return interactivity, tokens / sample.gpu_seconds


def _front_at(
    levels: list[RunSample], weights: list[IntArray], options: FrontierOptions, replicates: int
) -> tuple[FloatArray, FloatArray]:
    """Throughput per GPU, and tokens per joule, at each target per replicate (each replicates × targets), both
    along the throughput's front; NaN outside it, and tokens per joule all NaN unless every level was measured."""
    xs = np.full((replicates, len(levels)), np.nan)
    ys = np.full((replicates, len(levels)), np.nan)
    per_joule = np.full((replicates, len(levels)), np.nan)
    for column, (sample, w) in enumerate(zip(levels, weights, strict=True)):
        xs[:, column], ys[:, column] = level_replicates(sample, w, options.statistic, options.basis)
        if sample.energy_j is not None and sample.energy_j > 0:
            total = weighted_sums(sample.values["total_tokens"], sample.cluster["total_tokens"], w)
            per_joule[:, column] = total / sample.energy_j
    result = np.full((replicates, len(options.targets_tps)), np.nan)
    energy = np.full((replicates, len(options.targets_tps)), np.nan)
    targets = list(options.targets_tps)
    for r in range(replicates):
        ok = np.isfinite(xs[r]) & np.isfinite(ys[r]) & (xs[r] > 0)
        if not ok.any():
            continue
        x, y, e = xs[r][ok], ys[r][ok], per_joule[r][ok]
        front = pareto_front(x.tolist(), y.tolist())
        order = sorted(front, key=lambda i: x[i])
        knots = [float(x[i]) for i in order]
        result[r] = [math.nan if v is None else v for v in pchip(knots, [float(y[i]) for i in order], targets)]
        if np.isfinite(per_joule[r]).all():
            values = pchip(knots, [float(e[i]) for i in order], targets)
            energy[r] = [math.nan if v is None else v for v in values]
    return result, energy


def sweep_versus(
    base: Loaded, other: Loaded, options: CompareOptions, withheld: list[Difference], rng: np.random.Generator
) -> SweepVersus:
    """Throughput per GPU at each target of `other` against `base`, with the relative difference's interval."""
    frontier = options.frontier
    assert frontier.basis in BASES
    sides = []
    for item in (base, other):
        levels = _levels(item)
        if not levels:
            raise ReportError(f"{item.path}: no level of the sweep has kept requests to compare")
        ones = [np.ones((1, len(s.clusters)), dtype=np.int64) for s in levels]
        point, point_energy = _front_at(levels, ones, frontier, 1)
        weights = [draw_weights(rng, len(s.clusters), options.replicates) for s in levels]
        reps, reps_energy = _front_at(levels, weights, frontier, options.replicates)
        sides.append(((point[0], reps), (point_energy[0], reps_energy)))
    (base_tput, base_energy), (tput, energy) = sides
    measured = np.isfinite(base_energy[0]).any() and np.isfinite(energy[0]).any()
    return SweepVersus(
        baseline=base.label,
        other=other.label,
        basis=frontier.basis,
        statistic=frontier.statistic,
        targets=_target_rows(base_tput, tput, options, withheld),
        tokens_per_joule=_target_rows(base_energy, energy, options, withheld) if measured else [],
    )


def _target_rows(
    base: tuple[FloatArray, FloatArray],
    other: tuple[FloatArray, FloatArray],
    options: CompareOptions,
    withheld: list[Difference],
) -> list[TargetRow]:
    """One row per target: `other`'s figure against `base`'s (each the point and its replicates), with the relative
    difference's interval and verdict."""
    (base_point, base_reps), (point, reps) = base, other
    frontier = options.frontier
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
    return rows
