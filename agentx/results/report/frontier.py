"""The throughput-per-GPU vs interactivity frontier of a set of runs, and throughput at interactivity targets.

A point per run (a sweep level): x = interactivity, tokens/s per user = 1 / TPOT at a statistic (p90 by default,
as AgentX reports, so the slow tail counts; p50 and the others too); y = tokens/s per GPU over the run's window
[first sent, last end] of its kept requests (`Summary.throughput`), for total (input + output), output-only or
input-only tokens.

The front keeps the points no other point beats on both axes (`pareto_front`). Sorted by interactivity, its
throughput strictly falls, so a monotone cubic Hermite interpolant (PCHIP, Fritsch–Carlson: `pchip_slopes`)
through it never overshoots: between two knots it stays between their values. Targets outside the front's
interactivity range get None, never an extrapolation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Final, Literal

import msgspec
import numpy as np

from agentx.results.summary.stats import FloatArray
from agentx.results.summary.summarize import Summary

Statistic = Literal["p50", "p75", "p90", "p95", "p99", "mean"]
Basis = Literal["total", "output", "input"]
BASES: Final = ("total", "output", "input")
DEFAULT_TARGETS_TPS: Final = (30.0, 50.0, 75.0, 100.0, 150.0, 200.0)
"""Interactivity targets, tokens/s per user, as the AgentX tables have them."""


class FrontierOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How points are made and read: the TPOT statistic, the throughput basis, the targets."""

    statistic: Statistic = "p90"
    """Interactivity = 1 / TPOT at this statistic."""
    basis: Basis = "total"
    """Which tokens the front is built on: total (input + output), output or input."""
    targets_tps: tuple[float, ...] = DEFAULT_TARGETS_TPS


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One run on the plane; per-GPU figures use `num_gpus` (1 when the run did not say: `gpus_known` False)."""

    label: str
    concurrency: int | None
    interactivity_tps: float
    total_tps_per_gpu: float
    output_tps_per_gpu: float
    input_tps_per_gpu: float
    num_gpus: int
    gpus_known: bool
    tokens_per_joule: float | None = None
    """Total tokens per joule of the GPUs' measured energy (agentx.results.summary.energy); None unmeasured."""
    tasks_per_mwh: float | None = None
    """Completed tasks per MWh of the GPUs' measured energy; None unmeasured."""

    def throughput(self, basis: Basis) -> float:
        """Tokens/s per GPU of `basis`."""
        if basis == "output":
            return self.output_tps_per_gpu
        if basis == "input":
            return self.input_tps_per_gpu
        return self.total_tps_per_gpu


class AtTarget(msgspec.Struct, frozen=True, kw_only=True):
    """Throughput per GPU at one interactivity target; None outside the front (no extrapolation)."""

    target_tps: float
    total_tps_per_gpu: float | None
    output_tps_per_gpu: float | None
    input_tps_per_gpu: float | None
    between: tuple[str, str] | None
    """The labels of the front points around the target (equal when the target is a knot)."""
    tokens_per_joule: float | None = None
    """Measured total tokens per joule along the front (`energy_at`); None where a front point was not measured."""
    tasks_per_mwh: float | None = None
    """Measured completed tasks per MWh along the front (`energy_at`)."""


class Frontier(msgspec.Struct, frozen=True, kw_only=True):
    options: FrontierOptions
    points: list[Point]
    front: list[Point]
    """The Pareto-optimal points, by interactivity ascending (throughput descending)."""
    at_targets: list[AtTarget]


def point(
    summary: Summary,
    label: str,
    *,
    concurrency: int | None = None,
    num_gpus: int | None = None,
    statistic: Statistic = "p90",
) -> Point | None:
    """The run's point, or None when it has no TPOT or no throughput (no kept request with two tokens).

    `num_gpus` overrides the GPUs the summary was made with; with neither, throughput counts as one GPU's.
    """
    interactivity = summary.latency.interactivity_tps
    throughput = summary.throughput
    if interactivity is None or throughput is None:
        return None
    x = float(getattr(interactivity, statistic))
    gpus = num_gpus if num_gpus is not None else throughput.num_gpus
    divisor = gpus or 1
    if not (math.isfinite(x) and x > 0):
        return None
    return Point(
        label=label,
        concurrency=concurrency,
        interactivity_tps=x,
        total_tps_per_gpu=throughput.total_tps / divisor,
        output_tps_per_gpu=throughput.output_tps / divisor,
        input_tps_per_gpu=throughput.input_tps / divisor,
        num_gpus=divisor,
        gpus_known=gpus is not None,
        tokens_per_joule=summary.energy.tokens_per_joule if summary.energy is not None else None,
        tasks_per_mwh=summary.energy.tasks_per_mwh if summary.energy is not None else None,
    )


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point dominates (≥ on both axes, > on one), by x ascending.

    Of identical points the first is kept. Along the result x strictly rises and y strictly falls.
    """
    order = sorted(range(len(xs)), key=lambda i: (-xs[i], -ys[i], i))
    front: list[int] = []
    best_y = -math.inf
    # From the highest x down, a point is on the front iff its y beats every y at a higher-or-equal x.
    for i in order:
        if ys[i] > best_y:
            front.append(i)
            best_y = ys[i]
    return front[::-1]


def pchip_slopes(x: FloatArray, y: FloatArray) -> FloatArray:
    """Knot derivatives of the monotone piecewise cubic Hermite interpolant (Fritsch–Carlson).

    Interior: 0 where the secants change sign or one is 0, else their weighted harmonic mean (Fritsch–Butland,
    as scipy's PchipInterpolator); ends: the one-sided three-point formula, zeroed when its sign differs from
    the first secant's and capped at 3× it when the secants change sign. Then the Fritsch–Carlson limiter:
    where α² + β² > 9 (α, β = slopes over secant), both are scaled onto that circle, which keeps every piece
    monotone. `x` strictly increasing, at least two knots.
    """
    n = x.size
    h = np.diff(x)
    delta = np.diff(y) / h
    m = np.zeros(n)
    if n == 2:
        m[:] = delta[0]
        return m
    for k in range(1, n - 1):
        d0, d1 = delta[k - 1], delta[k]
        if d0 * d1 <= 0:
            continue
        w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
        # (w1 + w2) / (w1/d0 + w2/d1), multiplied through so that tiny secants cannot overflow.
        m[k] = (w1 + w2) * d0 * d1 / (w1 * d1 + w2 * d0)
    m[0] = _end_slope(h[0], h[1], delta[0], delta[1])
    m[-1] = _end_slope(h[-1], h[-2], delta[-1], delta[-2])
    for k in range(n - 1):
        if delta[k] == 0:
            m[k] = m[k + 1] = 0.0
            continue
        alpha, beta = m[k] / delta[k], m[k + 1] / delta[k]
        radius = math.hypot(alpha, beta)
        if radius > 3:
            tau = 3 / radius
            m[k], m[k + 1] = tau * alpha * delta[k], tau * beta * delta[k]
    return m


def _end_slope(h0: float, h1: float, d0: float, d1: float) -> float:
    slope = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
    if np.sign(slope) != np.sign(d0):
        return 0.0
    if np.sign(d0) != np.sign(d1) and abs(slope) > abs(3 * d0):
        return 3 * d0
    return float(slope)


def pchip(x: Sequence[float], y: Sequence[float], at: Sequence[float]) -> list[float | None]:
    """The monotone interpolant through (x, y) at each of `at`; None outside [x₀, xₙ] (never extrapolated).

    `x` strictly increasing. Exact at the knots; never below the smaller of the two knots around a value, so
    never negative for non-negative `y`.
    """
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.size == 0:
        return [None for _ in at]
    if np.any(np.diff(xs) <= 0):
        raise ValueError("pchip: x must be strictly increasing")
    slopes = pchip_slopes(xs, ys) if xs.size > 1 else np.zeros(1)
    result: list[float | None] = []
    for value in at:
        if not (xs[0] <= value <= xs[-1]):
            result.append(None)
            continue
        k = min(int(np.searchsorted(xs, value, side="right")) - 1, xs.size - 2)
        if xs.size == 1 or value == xs[k]:
            result.append(float(ys[max(k, 0)]))
            continue
        if value == xs[k + 1]:
            result.append(float(ys[k + 1]))
            continue
        h = xs[k + 1] - xs[k]
        t = (value - xs[k]) / h
        h00, h10 = (1 + 2 * t) * (1 - t) ** 2, t * (1 - t) ** 2
        h01, h11 = t * t * (3 - 2 * t), t * t * (t - 1)
        v = h00 * ys[k] + h10 * h * slopes[k] + h01 * ys[k + 1] + h11 * h * slopes[k + 1]
        # Rounding may step a hair outside the knots' range; the monotone piece cannot.
        low, high = min(ys[k], ys[k + 1]), max(ys[k], ys[k + 1])
        result.append(float(min(max(v, low), high)))
    return result


def frontier(points: Sequence[Point], options: FrontierOptions | None = None) -> Frontier:
    """The front of `points` on `options.basis` and each basis' throughput at `options.targets_tps` along it."""
    options = options or FrontierOptions()
    xs = [p.interactivity_tps for p in points]
    ys = [p.throughput(options.basis) for p in points]
    front = [points[i] for i in pareto_front(xs, ys)]
    knots = [p.interactivity_tps for p in front]
    targets = list(options.targets_tps)
    values = {basis: pchip(knots, [p.throughput(basis) for p in front], targets) for basis in BASES}
    per_joule = energy_at(knots, [p.tokens_per_joule for p in front], targets)
    per_mwh = energy_at(knots, [p.tasks_per_mwh for p in front], targets)
    at_targets = []
    for i, target in enumerate(targets):
        between = _between(front, target)
        at_targets.append(
            AtTarget(
                target_tps=target,
                total_tps_per_gpu=values["total"][i],
                output_tps_per_gpu=values["output"][i],
                input_tps_per_gpu=values["input"][i],
                between=between,
                tokens_per_joule=per_joule[i],
                tasks_per_mwh=per_mwh[i],
            )
        )
    return Frontier(options=options, points=list(points), front=front, at_targets=at_targets)


def energy_at(knots: Sequence[float], values: Sequence[float | None], at: Sequence[float]) -> list[float | None]:
    """A measured energy figure along the front at each target, read as the throughput is (`pchip`): the run at
    each interactivity the front reaches; all None unless every front point was measured."""
    if not values or any(v is None for v in values):
        return [None for _ in at]
    return pchip(knots, [float(v) for v in values if v is not None], at)


def _between(front: Sequence[Point], target: float) -> tuple[str, str] | None:
    for knot in front:
        if knot.interactivity_tps == target:
            return knot.label, knot.label
    for low, high in itertools.pairwise(front):
        if low.interactivity_tps < target < high.interactivity_tps:
            return low.label, high.label
    return None


def curve(front: Sequence[Point], basis: Basis = "total", samples: int = 200) -> tuple[list[float], list[float]]:
    """The interpolant along the front sampled at `samples` interactivities, for plots."""
    if len(front) < 2:
        return [p.interactivity_tps for p in front], [p.throughput(basis) for p in front]
    knots = [p.interactivity_tps for p in front]
    xs = np.linspace(knots[0], knots[-1], samples).tolist()
    xs[-1] = knots[-1]  # linspace may round the end a hair past the last knot
    ys = pchip(knots, [p.throughput(basis) for p in front], xs)
    return xs, [0.0 if y is None else y for y in ys]
