"""The frontier's math: the Pareto front, the monotone (PCHIP) interpolation along it, the targets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.results.report.frontier import FrontierOptions, Point, frontier, pareto_front, pchip, pchip_slopes

coordinates = st.floats(min_value=0.0, max_value=1e5, allow_nan=False, allow_infinity=False)
planes = st.lists(st.tuples(coordinates, coordinates), min_size=1, max_size=30)


def _dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a != b


@given(planes)
def test_the_front_is_pareto_optimal_and_holds_every_non_dominated_point(points: list[tuple[float, float]]) -> None:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    front = pareto_front(xs, ys)
    chosen = [points[i] for i in front]
    # Pareto-optimal: nothing in the set beats a front point on both axes.
    for p in chosen:
        assert not any(_dominates(q, p) for q in points)
    # Complete: every non-dominated value is on the front (identical points once).
    undominated = {p for p in points if not any(_dominates(q, p) for q in points)}
    assert set(chosen) == undominated and len(chosen) == len(undominated)
    # Ordered: interactivity strictly rises and throughput strictly falls along it.
    assert all(a[0] < b[0] and a[1] > b[1] for a, b in itertools.pairwise(chosen))


@st.composite
def decreasing_knots(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    """A front: x strictly increasing, y strictly decreasing, y ≥ 0 — as `pareto_front` returns them."""
    n = draw(st.integers(min_value=1, max_value=12))
    gaps = draw(st.lists(st.floats(min_value=0.01, max_value=500.0), min_size=n, max_size=n))
    drops = draw(st.lists(st.floats(min_value=0.01, max_value=5000.0), min_size=n, max_size=n))
    x0 = draw(st.floats(min_value=0.1, max_value=100.0))
    floor = draw(st.floats(min_value=0.0, max_value=1000.0))
    xs = list(np.cumsum([x0, *gaps[1:]]))
    ys = list(floor + np.cumsum(drops[::-1]))[::-1]
    return [float(x) for x in xs], [float(y) for y in ys]


@settings(max_examples=examples(200))
@given(decreasing_knots(), st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=20))
def test_pchip_is_exact_at_knots_monotone_between_them_and_never_negative(
    knots: tuple[list[float], list[float]], fractions: list[float]
) -> None:
    xs, ys = knots
    assert pchip(xs, ys, xs) == ys
    span = xs[-1] - xs[0]
    # Clamped: x₀ + 1.0 × span can round to just past xₙ, where pchip rightly refuses to extrapolate.
    at = sorted(min(xs[0] + f * span, xs[-1]) for f in fractions)
    values = pchip(xs, ys, at)
    assert all(v is not None for v in values)
    found = [v for v in values if v is not None]
    tolerance = 1e-9 * max(ys)
    # Monotone: throughput never rises with interactivity, and stays between the knots around each value.
    assert all(b <= a + tolerance for a, b in itertools.pairwise(found))
    for x, v in zip(at, found, strict=True):
        k = min(int(np.searchsorted(xs, x, side="right")) - 1, len(xs) - 2) if len(xs) > 1 else 0
        low, high = min(ys[k], ys[min(k + 1, len(ys) - 1)]), max(ys[k], ys[min(k + 1, len(ys) - 1)])
        assert low - tolerance <= v <= high + tolerance
        assert v >= 0


@given(decreasing_knots(), st.floats(min_value=1e-6, max_value=1e4))
def test_pchip_refuses_to_extrapolate(knots: tuple[list[float], list[float]], beyond: float) -> None:
    xs, ys = knots
    assert pchip(xs, ys, [xs[0] - beyond, xs[-1] + beyond]) == [None, None]


@given(
    st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=3, max_size=10),
    st.lists(st.floats(min_value=-1000.0, max_value=1000.0), min_size=3, max_size=10),
)
def test_slopes_follow_fritsch_carlson(gaps: list[float], values: list[float]) -> None:
    n = min(len(gaps), len(values))
    x = np.cumsum(gaps[:n])
    y = np.asarray(values[:n])
    m = pchip_slopes(x, y)
    delta = np.diff(y) / np.diff(x)
    for k in range(n - 1):
        if delta[k] == 0:
            assert m[k] == m[k + 1] == 0
            continue
        alpha, beta = m[k] / delta[k], m[k + 1] / delta[k]
        # Same sign as the secant (or flat), and inside the circle of radius 3: a monotone piece.
        assert alpha >= -1e-12 and beta >= -1e-12
        assert math.hypot(alpha, beta) <= 3 + 1e-9


def test_pchip_reproduces_a_straight_line_and_handles_one_knot() -> None:
    assert pchip([1.0, 2.0, 3.0], [30.0, 20.0, 10.0], [1.5, 2.5]) == pytest.approx([25.0, 15.0])
    assert pchip([5.0], [7.0], [5.0, 4.0]) == [7.0, None]
    with pytest.raises(ValueError, match="strictly increasing"):
        pchip([1.0, 1.0], [2.0, 1.0], [1.0])


def _point(label: str, x: float, total: float, concurrency: int) -> Point:
    return Point(
        label=label,
        concurrency=concurrency,
        interactivity_tps=x,
        total_tps_per_gpu=total,
        output_tps_per_gpu=total / 10,
        input_tps_per_gpu=total * 9 / 10,
        num_gpus=8,
        gpus_known=True,
    )


def test_targets_read_the_front_with_their_operating_points_and_no_extrapolation() -> None:
    points = [
        _point("c64", 20.0, 6000.0, 64),
        _point("c32", 40.0, 5000.0, 32),
        _point("c16", 80.0, 3000.0, 16),
        _point("c8", 160.0, 1000.0, 8),
        _point("dominated", 30.0, 4000.0, 48),
    ]
    found = frontier(points, FrontierOptions(targets_tps=(10.0, 40.0, 50.0, 160.0, 300.0)))
    assert [p.label for p in found.front] == ["c64", "c32", "c16", "c8"]
    at = {t.target_tps: t for t in found.at_targets}
    assert at[10.0].total_tps_per_gpu is None and at[10.0].between is None
    assert at[300.0].total_tps_per_gpu is None
    assert at[40.0].total_tps_per_gpu == 5000.0 and at[40.0].between == ("c32", "c32")
    assert at[160.0].total_tps_per_gpu == 1000.0
    middle = at[50.0]
    assert middle.between == ("c32", "c16")
    assert middle.total_tps_per_gpu is not None and 3000.0 < middle.total_tps_per_gpu < 5000.0
    # The output and input variants are interpolated along the same front.
    assert middle.output_tps_per_gpu == pytest.approx(middle.total_tps_per_gpu / 10)
    assert middle.input_tps_per_gpu == pytest.approx(middle.total_tps_per_gpu * 9 / 10)


def test_the_front_follows_the_chosen_basis() -> None:
    a = Point(
        label="a",
        concurrency=1,
        interactivity_tps=10.0,
        total_tps_per_gpu=100.0,
        output_tps_per_gpu=50.0,
        input_tps_per_gpu=50.0,
        num_gpus=1,
        gpus_known=True,
    )
    b = Point(
        label="b",
        concurrency=2,
        interactivity_tps=5.0,
        total_tps_per_gpu=90.0,
        output_tps_per_gpu=60.0,
        input_tps_per_gpu=30.0,
        num_gpus=1,
        gpus_known=True,
    )
    assert [p.label for p in frontier([a, b]).front] == ["a"]
    assert [p.label for p in frontier([a, b], FrontierOptions(basis="output")).front] == ["b", "a"]
