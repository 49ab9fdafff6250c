"""The frontier search: its rule on synthetic monotone frontiers (hypothesis), and `agentx frontier` end to end against
the simulator (a sweep folder `agentx report` reads, `--resume` going on without re-running a level)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from small_sweep import ENGINE, small_trace

from agentx.cli import main
from agentx.records.run_folder import RUN_FILE, SWEEP_FILE
from agentx.run.frontier import Decision, Interval, Measured, SearchOptions, decide
from agentx.sim.process import SimServer
from agentx.trace.io import save_trace

pytestmark = pytest.mark.slow  # the end-to-end tests start the simulator (tests/project/test_tiers.py)

TARGETS = (30.0, 50.0, 75.0, 100.0, 150.0, 200.0)
Curve = Callable[[int], Measured]


def synthetic(peak: float, knee: float, capacity: float, noise: float, fail_above: int | None = None) -> Curve:
    """Interactivity peak/(1 + c/knee), falling; throughput c × interactivity capped at `capacity`, rising then flat;
    both with relative intervals ±`noise`; levels above `fail_above` fail."""

    def level(concurrency: int) -> Measured:
        if fail_above is not None and concurrency > fail_above:
            return Measured(concurrency=concurrency, interactivity=None, throughput=None, gpu_hours=1.0)
        x = peak / (1 + concurrency / knee)
        y = min(concurrency * x, capacity)
        return Measured(
            concurrency=concurrency,
            interactivity=Interval(x, x * (1 - noise), x * (1 + noise)),
            throughput=Interval(y, y * (1 - noise), y * (1 + noise)),
            gpu_hours=1.0,
        )

    return level


def searched(curve: Curve, options: SearchOptions) -> tuple[list[Measured], Decision]:
    levels: list[Measured] = []
    for _ in range(1000):
        decision = decide(levels, options)
        if decision.next_level is None:
            return levels, decision
        assert decision.next_level >= 1
        assert decision.next_level not in {m.concurrency for m in levels}, decision
        levels.append(curve(decision.next_level))
    raise AssertionError("the search did not end")


frontiers = st.builds(
    synthetic,
    peak=st.floats(20.0, 2000.0),
    knee=st.floats(0.5, 64.0),
    capacity=st.floats(100.0, 50_000.0),
    noise=st.sampled_from([0.0, 0.005, 0.02, 0.1]),
    fail_above=st.none() | st.integers(1, 512),
)


@settings(max_examples=300, deadline=None)
@given(
    curve=frontiers,
    start=st.integers(1, 64),
    half_width=st.sampled_from([0.01, 0.05, 0.2]),
    max_levels=st.integers(1, 30),
    max_gpu_hours=st.none() | st.floats(1.0, 40.0),
)
def test_the_search_ends_within_its_budget_and_never_repeats_a_level(
    curve: Curve, start: int, half_width: float, max_levels: int, max_gpu_hours: float | None
) -> None:
    options = SearchOptions(
        targets_tps=TARGETS, start=start, half_width=half_width, max_levels=max_levels, max_gpu_hours=max_gpu_hours
    )
    levels, decision = searched(curve, options)
    assert 1 <= len(levels) <= max_levels
    if max_gpu_hours is not None:
        assert sum(m.gpu_hours for m in levels) <= max(max_gpu_hours, 1.0)  # the first level always runs
    assert decision.reason.startswith("done")
    assert len(decision.targets) == len(TARGETS)


@settings(max_examples=300, deadline=None)
@given(curve=frontiers, start=st.integers(1, 64), noise_free=st.booleans())
def test_every_reachable_target_is_bracketed_and_the_others_said(curve: Curve, start: int, noise_free: bool) -> None:
    options = SearchOptions(targets_tps=TARGETS, start=start, max_levels=60)
    levels, decision = searched(curve, options)
    ok = sorted((m for m in levels if m.ok), key=lambda m: m.concurrency)
    if not ok:  # every level failed, down to c1
        assert 1 in {m.concurrency for m in levels}
        assert {r.status for r in decision.targets} == {"unmeasured"}
        return
    for reading in decision.targets:
        target = reading.target_tps
        if reading.status in ("resolved", "open", "limited"):
            assert reading.between is not None and reading.throughput is not None
            low, high = (next(m for m in ok if m.concurrency == c) for c in reading.between)
            assert low.interactivity is not None and high.interactivity is not None
            assert low.interactivity.value >= target >= high.interactivity.value
            assert reading.throughput.low <= reading.throughput.value <= reading.throughput.high
            assert reading.status != "open"  # the search stopped with levels left that would narrow it
        elif reading.status == "above reach":
            assert min(m.concurrency for m in ok) == 1
            assert all(m.interactivity is not None and m.interactivity.value < target for m in ok)
            assert "best interactivity" in reading.note
        else:
            assert reading.status == "below reach", reading
            assert any(m.interactivity is not None and m.interactivity.value > target for m in ok)
            assert "interactivity falls only to" in reading.note


def test_a_lone_level_exactly_on_a_target_reads_it() -> None:
    """Only c1 measured (every level above fails), its interactivity exactly 75: the target 75 is read at c1 alone,
    not called below reach (hypothesis found it)."""
    levels, decision = searched(synthetic(150.0, 1.0, 100.0, 0.0, fail_above=1), SearchOptions(targets_tps=TARGETS))
    assert [m.concurrency for m in levels if m.ok] == [1]
    by_target = {r.target_tps: r for r in decision.targets}
    assert by_target[75.0].status == "resolved" and by_target[75.0].between == (1, 1)
    assert by_target[75.0].throughput is not None and by_target[75.0].throughput.value == 75.0
    assert [by_target[t].status for t in (30.0, 50.0, 100.0)] == ["below reach", "below reach", "above reach"]


def test_a_target_reachable_before_saturation_is_bracketed() -> None:
    """Interactivity 600/(1 + c/3), throughput up to 4,000: every target crossed below c64, all six bracketed."""
    levels, decision = searched(synthetic(600.0, 3.0, 4000.0, 0.01), SearchOptions(targets_tps=TARGETS))
    assert [r.status for r in decision.targets] == ["resolved"] * 6
    assert len(levels) <= 8


@given(knee=st.floats(1.0, 16.0), fraction=st.floats(0.1, 0.9))
@settings(max_examples=100, deadline=None)
def test_targets_crossed_before_the_throughput_caps_are_all_bracketed(knee: float, fraction: float) -> None:
    peak = 400.0
    capacity = fraction * peak * knee  # below the uncapped curve's asymptote, so the cap is met
    curve = synthetic(peak, knee, capacity, 0.01)
    levels, decision = searched(curve, SearchOptions(targets_tps=TARGETS, start=4, max_levels=60))
    # The first concurrency at the cap: below it throughput grows, so growth cannot stop before it.
    capped = next(c for c in range(1, 100_000) if c * peak / (1 + c / knee) >= capacity)
    for reading in decision.targets:
        x_capped = peak / (1 + capped / knee)
        if peak / (1 + 1 / knee) >= reading.target_tps >= x_capped:
            assert reading.between is not None, (reading, sorted(m.concurrency for m in levels))


def test_a_target_faster_than_the_server_is_said_unreachable_with_the_best_reached() -> None:
    levels, decision = searched(synthetic(120.0, 4.0, 4000.0, 0.01), SearchOptions(targets_tps=TARGETS, start=8))
    assert 1 in {m.concurrency for m in levels}
    by_target = {r.target_tps: r for r in decision.targets}
    assert by_target[150.0].status == by_target[200.0].status == "above reach"
    assert "best interactivity 96" in by_target[200.0].note and "c1" in by_target[200.0].note


def test_a_failing_level_stops_the_growth_and_leaves_the_slow_targets_below_reach() -> None:
    levels, decision = searched(synthetic(600.0, 3.0, 1e6, 0.01, fail_above=20), SearchOptions(targets_tps=TARGETS))
    assert max(m.concurrency for m in levels) == 32
    by_target = {r.target_tps: r for r in decision.targets}
    assert by_target[30.0].status == "below reach" and "c32 failed" in by_target[30.0].note


def test_the_level_budget_stops_the_search_with_what_it_has() -> None:
    levels, decision = searched(synthetic(600.0, 3.0, 4000.0, 0.01), SearchOptions(targets_tps=TARGETS, max_levels=3))
    assert [m.concurrency for m in levels] == [4, 8, 16]
    assert "level budget" in decision.reason
    assert {r.status for r in decision.targets} >= {"unmeasured"}


def test_bisection_resolves_a_bent_frontier_and_noise_is_limited() -> None:
    """Throughput that bends (√c) needs levels between the doublings; a level too noisy is said limited."""

    def bent(noise: float) -> Curve:
        def level(c: int) -> Measured:
            x, y = 400.0 / (1 + c / 4), 1000 * math.sqrt(c)
            return Measured(
                concurrency=c,
                interactivity=Interval(x, x * (1 - noise), x * (1 + noise)),
                throughput=Interval(y, y * (1 - noise), y * (1 + noise)),
            )

        return level

    levels, decision = searched(bent(0.005), SearchOptions(targets_tps=TARGETS, half_width=0.02))
    assert any(m.concurrency & (m.concurrency - 1) for m in levels)  # not only powers of two: it bisected
    assert all(r.status in ("resolved", "limited") for r in decision.targets), decision.targets
    _, noisy = searched(bent(0.1), SearchOptions(targets_tps=TARGETS, half_width=0.02))
    assert {r.status for r in noisy.targets} == {"limited"}
    assert "longer levels" in noisy.targets[0].note


# End to end: `agentx frontier` against the simulator.


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(ENGINE) as server:
        yield server


def _frontier(trace: Path, url: str, out: Path, *extra: str) -> tuple[int, str]:
    args = ["frontier", str(trace), "--url", url, "--targets", "100,150", "--start", "4", "--gpus", "2"]
    args += ["--mode", "closed", "--duration", "1.2", "--delay-scale", "0", "--grace", "5", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, *extra])
    return result.exit_code, result.output


def test_a_search_writes_a_sweep_that_report_reads_and_resume_goes_on(sim: SimServer, tmp_path: Path) -> None:
    trace = tmp_path / "small.arrow"
    save_trace(small_trace(), trace)
    out = tmp_path / "search"
    code, output = _frontier(trace, sim.url, out, "--max-levels", "3")
    assert code == 0, output
    assert "next c4: probe" in output and "next c8: grow" in output and "next c16: grow" in output
    assert "level budget is spent (3 of 3)" in output
    # Per user ~330 tok/s at c4, ~200 at c8, ~110 at c16 (ENGINE): 150 lies between c8 and c16.
    assert "target tok/s/user" in output and "c8..c16" in output
    index = json.loads((out / SWEEP_FILE).read_text())
    assert [(e["concurrency"], e["status"]) for e in index["levels"]] == [(4, "ok"), (8, "ok"), (16, "ok")]
    assert index["concurrency"] == [4, 8, 16] and index["num_gpus"] == 2
    first = {c: (out / f"c{c}" / RUN_FILE).stat().st_mtime_ns for c in (4, 8, 16)}

    code, output = _frontier(trace, sim.url, out, "--resume", "--max-levels", "5")
    assert code == 0, output
    assert {c: (out / f"c{c}" / RUN_FILE).stat().st_mtime_ns for c in (4, 8, 16)} == first  # not run again
    index = json.loads((out / SWEEP_FILE).read_text())
    statuses = {e["concurrency"]: e["status"] for e in index["levels"]}
    assert statuses[4] == statuses[8] == statuses[16] == "kept" and len(statuses) > 3, statuses
    assert index["concurrency"] == sorted(statuses)
    assert "next c32: grow" in output and not any(f"next c{c}:" in output for c in (4, 8, 16))
    assert "3 kept" in output

    report = CliRunner().invoke(main, ["report", str(out), "--targets", "100,150", "--json"])
    assert report.exit_code == 0, report.output
    assert str(out) in report.output or "c16" in report.output


def test_a_search_refuses_a_used_folder_without_resume_or_overwrite(sim: SimServer, tmp_path: Path) -> None:
    trace = tmp_path / "small.arrow"
    save_trace(small_trace(), trace)
    out = tmp_path / "used"
    out.mkdir()
    (out / SWEEP_FILE).write_text('{"levels": []}')
    code, output = _frontier(trace, sim.url, out)
    assert code == 2 and "already holds a sweep" in output and "--resume" in output
