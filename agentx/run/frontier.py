"""A frontier search: concurrency levels chosen one at a time to bracket each interactivity target, until throughput
per GPU at every reachable target is known within a relative half-width or a budget is spent.

The rule (`decide`, pure: the levels measured so far in, the next level or "done" out, each with its reason):

1. Probe `start`. Grow ×2 from the highest level while its interactivity is at or above the lowest target, it did
   not fail and throughput still grows (by more than `saturation` over the highest level at most half as high).
2. Halve from the lowest level (down to 1) while its interactivity is below the highest target.
3. Bisect (the integer nearest the geometric mean) the two levels around each target not yet resolved, the widest
   first, while an integer lies between them.

A target's value is the report's: the monotone interpolant along the Pareto front of the levels' point estimates
(agentx.results.report.frontier). Its half-width (`_propagated`) is noise plus model, from the two levels a, b
whose interactivities straddle the target, at weight w = (x_a − target) / (x_a − x_b) on b:
- noise: √(((1 − w)·e_a)² + (w·e_b)²), e = h + |slope|·g for a level whose throughput interval has half-width h and
  interactivity interval half-width g (its bootstrap intervals, over sessions and over stretches of its window:
  `measure_level`), slope the secant's throughput per unit interactivity (how far the crossing may move). Within a
  level the two share sessions, so they add; the levels are separate runs, so theirs add in quadrature;
- model: |interpolant − secant| at the target, what the curve's bend within the bracket leaves uncertain; bisecting
  shrinks it.
A target is resolved when the sum, over the value, is at most `half_width`. When the noise alone exceeds it, or
the bracket is two adjacent integers, another level cannot narrow it: "limited" (longer levels would).

The budget: at most `max_levels` levels, and no level started that would take the GPU-hours spent (each level's
duration × GPUs) past `max_gpu_hours` (a level expected to last as long as the longest so far).

`search_frontier` runs it against a server: each level an ordinary run folder of an ordinary sweep folder
(agentx.run.sweep), so `agentx report` and `agentx compare` read it as they read a sweep.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from agentx.errors import SweepError
from agentx.records.record import read_records
from agentx.records.run_folder import RECORDS_FILE
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.preparation import prepare_trace
from agentx.replayer.schedule.hooks import RunHooks
from agentx.results.compare.bootstrap import draw_weights, interval
from agentx.results.compare.sample import Repeat, RunSample, over_time
from agentx.results.compare.sweeps import level_replicates
from agentx.results.folders.sweep_index import read_index
from agentx.results.report.frontier import (
    DEFAULT_TARGETS_TPS,
    Basis,
    FrontierOptions,
    Point,
    Statistic,
    frontier,
    point,
)
from agentx.results.summary.summarize import Summary
from agentx.run.sweep import LevelResult, LevelServer, OnLevel, OnLevelDone, SweepOptions, sweep
from agentx.trace.model import Trace

TargetStatus = Literal["resolved", "open", "limited", "above reach", "below reach", "unmeasured"]
"""resolved: within the half-width; open: bisecting may narrow it; limited: bracketed, but another level cannot
narrow it; above reach: faster per user than the server is at the lowest level; below reach: slower per user than
the server gets before it fails or saturates; unmeasured: the search has not got there (the budget ran out)."""


class Interval(msgspec.Struct, frozen=True):
    """An estimate with its interval (low ≤ value ≤ high)."""

    value: float
    low: float
    high: float

    def relative_half_width(self) -> float:
        """The larger distance from the value to an end, over the value (inf for a value of 0)."""
        spread = max(self.value - self.low, self.high - self.value)
        return spread / self.value if self.value > 0 else math.inf


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """A level as the search reads it; `interactivity` and `throughput` None when it failed or kept no request."""

    concurrency: int
    interactivity: Interval | None
    """Tokens/s per user at the statistic."""
    throughput: Interval | None
    """Tokens/s per GPU of the basis."""
    gpu_hours: float = 0.0
    """The level's duration × GPUs."""

    @property
    def ok(self) -> bool:
        return self.interactivity is not None and self.throughput is not None


class SearchOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The targets, the first level, the stopping rule and the budget."""

    targets_tps: tuple[float, ...] = DEFAULT_TARGETS_TPS
    start: int = 4
    half_width: float = 0.05
    """Relative: 0.05 stops a target once its interval is within ±5% of its value."""
    max_levels: int = 16
    max_gpu_hours: float | None = None
    saturation: float = 0.02
    """Growth stops once a doubling raises throughput by no more than this fraction."""


class TargetReading(msgspec.Struct, frozen=True, kw_only=True):
    """Throughput per GPU at one target as far as the levels measured so far tell."""

    target_tps: float
    status: TargetStatus
    throughput: Interval | None = None
    between: tuple[int, int] | None = None
    """The concurrencies whose interactivities straddle the target."""
    note: str = ""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The next level (None: done) and why, with every target's reading."""

    next_level: int | None
    reason: str
    targets: tuple[TargetReading, ...]


def _points(levels: Sequence[Measured]) -> list[Point]:
    return [
        Point(
            label=str(level.concurrency),
            concurrency=level.concurrency,
            interactivity_tps=level.interactivity.value,
            total_tps_per_gpu=level.throughput.value,
            output_tps_per_gpu=level.throughput.value,
            input_tps_per_gpu=level.throughput.value,
            num_gpus=1,
            gpus_known=True,
        )
        for level in levels
        if level.interactivity is not None and level.throughput is not None
    ]


def _bracket(ok: Sequence[Measured], target: float) -> tuple[Measured, Measured] | None:
    """The first two consecutive levels (by concurrency) whose interactivities straddle `target`, or a level alone
    that sits on it (the only one measured, say, when every level above it failed)."""
    for low, high in itertools.pairwise(ok):
        assert low.interactivity is not None and high.interactivity is not None
        if low.interactivity.value >= target >= high.interactivity.value:
            return low, high
    on_it = next((m for m in ok if m.interactivity is not None and m.interactivity.value == target), None)
    return None if on_it is None else (on_it, on_it)


def _propagated(a: Measured, b: Measured, target: float, value: float) -> tuple[float, float]:
    """The noise and model parts of the half-width (absolute) at `target` between the levels `a` and `b`."""
    assert a.interactivity is not None and b.interactivity is not None
    assert a.throughput is not None and b.throughput is not None
    xa, xb, ya, yb = a.interactivity.value, b.interactivity.value, a.throughput.value, b.throughput.value
    span = xa - xb
    w = (xa - target) / span if span > 0 else 0.0
    slope = (yb - ya) / span if span > 0 else 0.0
    # Within a level, throughput and interactivity come from the same sessions: their errors may share a sign, so they
    # add. The two levels are separate runs, so theirs are independent: they add in quadrature.
    at_a = (1 - w) * (_spread(a.throughput) + abs(slope) * _spread(a.interactivity))
    at_b = w * (_spread(b.throughput) + abs(slope) * _spread(b.interactivity))
    model = abs(value - (ya + w * (yb - ya)))
    return math.hypot(at_a, at_b), model


def _spread(estimate: Interval) -> float:
    return max(estimate.value - estimate.low, estimate.high - estimate.value)


def read_targets(levels: Sequence[Measured], options: SearchOptions, growth_stopped: str | None) -> list[TargetReading]:
    """Every target's reading from `levels`; `growth_stopped` says why no higher level will run (None: one may)."""
    ok = sorted((m for m in levels if m.ok), key=lambda m: m.concurrency)
    if not ok:
        return [TargetReading(target_tps=t, status="unmeasured", note="no level measured") for t in options.targets_tps]
    found = frontier(_points(ok), FrontierOptions(targets_tps=options.targets_tps))
    fastest = max(ok, key=lambda m: m.interactivity.value if m.interactivity else 0.0)
    # The front's slowest point: past it throughput no longer grows, so the report reads nothing slower.
    slowest = next(m for m in ok if m.concurrency == found.front[0].concurrency)
    readings = []
    for target, at in zip(options.targets_tps, found.at_targets, strict=True):
        bracket = _bracket(ok, target)
        value = at.total_tps_per_gpu
        if bracket is None or value is None:
            readings.append(_unbracketed(target, fastest, slowest, growth_stopped))
            continue
        a, b = bracket
        noise, model = _propagated(a, b, target, value)
        reading = Interval(value, value - noise - model, value + noise + model)
        between = (a.concurrency, b.concurrency)
        if reading.relative_half_width() <= options.half_width:
            readings.append(TargetReading(target_tps=target, status="resolved", throughput=reading, between=between))
            continue
        limit = _limit(a, b, noise / value if value > 0 else math.inf, options.half_width)
        status: TargetStatus = "open" if limit is None else "limited"
        readings.append(
            TargetReading(target_tps=target, status=status, throughput=reading, between=between, note=limit or "")
        )
    return readings


def _unbracketed(target: float, fastest: Measured, slowest: Measured, growth_stopped: str | None) -> TargetReading:
    assert fastest.interactivity is not None and slowest.interactivity is not None
    best = fastest.interactivity.value
    if best < target:
        note = f"best interactivity {best:.4g} tok/s/user, at c{fastest.concurrency}"
        status: TargetStatus = "above reach" if fastest.concurrency == 1 else "unmeasured"
        return TargetReading(target_tps=target, status=status, note=note)
    least = slowest.interactivity.value
    note = f"the front's interactivity falls only to {least:.4g} tok/s/user, at c{slowest.concurrency}"
    if growth_stopped is not None:
        return TargetReading(target_tps=target, status="below reach", note=f"{note}; {growth_stopped}")
    return TargetReading(target_tps=target, status="unmeasured", note=note)


def _limit(a: Measured, b: Measured, noise: float, half_width: float) -> str | None:
    """Why no level between `a` and `b` can bring the target within `half_width` (`noise`: the relative half-width
    the levels' own intervals give); None when one may."""
    if b.concurrency - a.concurrency < 2:
        return f"c{a.concurrency} and c{b.concurrency} are adjacent"
    if noise > half_width:
        return (
            f"the levels' own intervals give ±{noise:.1%}, wider than ±{half_width:.0%}: a level between them would "
            "not narrow it; longer levels would"
        )
    return None


def _growth(levels: Sequence[Measured], options: SearchOptions) -> tuple[int | None, str]:
    """The next level up and why, or None and why growth stopped."""
    top = max(levels, key=lambda m: m.concurrency)
    if not top.ok:
        return None, f"c{top.concurrency} failed"
    ok = sorted((m for m in levels if m.ok), key=lambda m: m.concurrency)
    assert top.interactivity is not None and top.throughput is not None
    lowest = min(options.targets_tps)
    if top.interactivity.value < lowest:
        return None, f"c{top.concurrency} is below the lowest target ({top.interactivity.value:.4g} < {lowest:g})"
    # Against the level half as high or lower: a doubling's gain, not a bisection's.
    half = [m for m in ok if 2 * m.concurrency <= top.concurrency]
    if half:
        previous = half[-1]
        assert previous.throughput is not None
        if top.throughput.value <= previous.throughput.value * (1 + options.saturation):
            return None, (
                f"throughput saturated: c{top.concurrency} {top.throughput.value:.4g} tok/s/GPU, "
                f"c{previous.concurrency} {previous.throughput.value:.4g}"
            )
    return 2 * top.concurrency, (
        f"grow: c{top.concurrency} runs at {top.interactivity.value:.4g} tok/s/user, still at or above the lowest "
        f"target {lowest:g}"
    )


def _descent(levels: Sequence[Measured], options: SearchOptions) -> tuple[int | None, str]:
    """The next level down and why, or None."""
    ok = [m for m in levels if m.ok]
    if not ok:
        lowest = min(m.concurrency for m in levels)
        if lowest == 1:
            return None, ""
        return lowest // 2, f"descend: c{lowest} failed and no level ran"
    bottom = min(ok, key=lambda m: m.concurrency)
    assert bottom.interactivity is not None
    highest = max(options.targets_tps)
    measured = {m.concurrency for m in levels}
    below = max(1, bottom.concurrency // 2)
    if bottom.interactivity.value >= highest or below in measured:
        return None, ""
    return below, (
        f"descend: c{bottom.concurrency} runs at {bottom.interactivity.value:.4g} tok/s/user, below the highest "
        f"target {highest:g}"
    )


def _midpoint(low: int, high: int) -> int:
    """The integer nearest the geometric mean strictly between `low` and `high` (high − low ≥ 2)."""
    return min(max(round(math.sqrt(low * high)), low + 1), high - 1)


def _budget_spent(levels: Sequence[Measured], options: SearchOptions) -> str | None:
    if len(levels) >= options.max_levels:
        return f"the level budget is spent ({len(levels)} of {options.max_levels})"
    if options.max_gpu_hours is not None and levels:
        spent = sum(m.gpu_hours for m in levels)
        expected = max(m.gpu_hours for m in levels)
        if spent + expected > options.max_gpu_hours:
            return (
                f"the GPU-hour budget is spent ({spent:.3g} of {options.max_gpu_hours:g}; a level takes about "
                f"{expected:.3g})"
            )
    return None


def decide(levels: Sequence[Measured], options: SearchOptions) -> Decision:
    """The next level to measure given `levels` (any order, distinct concurrencies), or None with why the search is
    done; never a level already measured."""
    if not levels:
        return Decision(next_level=options.start, reason=f"probe: the first level, c{options.start}", targets=())
    grow, grow_reason = _growth(levels, options)
    readings = tuple(read_targets(levels, options, None if grow is not None else grow_reason))
    spent = _budget_spent(levels, options)
    if spent is not None:
        return Decision(next_level=None, reason=f"done: {spent}", targets=readings)
    measured = {m.concurrency for m in levels}
    if grow is not None and grow not in measured:
        return Decision(next_level=grow, reason=grow_reason, targets=readings)
    down, down_reason = _descent(levels, options)
    if down is not None:
        return Decision(next_level=down, reason=down_reason, targets=readings)
    open_targets = sorted(
        (r for r in readings if r.status == "open" and r.between is not None and r.throughput is not None),
        key=lambda r: -(r.throughput.relative_half_width() if r.throughput else 0.0),
    )
    for reading in open_targets:
        assert reading.between is not None and reading.throughput is not None
        low, high = reading.between
        middle = _midpoint(low, high)
        if middle not in measured:
            return Decision(
                next_level=middle,
                reason=f"bisect c{low}..c{high} for {reading.target_tps:g} tok/s/user: "
                f"±{reading.throughput.relative_half_width():.1%} > ±{options.half_width:.0%}",
                targets=readings,
            )
    return Decision(next_level=None, reason=f"done: {_done_reason(readings)}", targets=readings)


def _done_reason(readings: Sequence[TargetReading]) -> str:
    counts = {status: sum(r.status == status for r in readings) for status in dict.fromkeys(r.status for r in readings)}
    return "no level left that narrows a target (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


# The search against a server.


class MeasureOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a level is read: the report's statistic and basis, and the bootstrap's replicates, level and seed."""

    statistic: Statistic = "p90"
    basis: Basis = "total"
    replicates: int = 1000
    level: float = 0.95
    seed: int = 0
    time_stretches: int = 10
    """The equal parts of a level's window that its time bootstrap draws (`measure_level`): enough for a percentile
    interval, few enough that each holds many requests; 0: sessions only."""


def measure_level(
    run_dir: Path, summary: Summary | None, num_gpus: int | None, options: MeasureOptions
) -> tuple[Interval | None, Interval | None]:
    """A level's interactivity and throughput per GPU: the report's point (`point`) with a bootstrap interval that
    holds both the one over its sessions and the one over `options.time_stretches` stretches of its window
    (`over_time`); None, None when the level has no point.

    Sessions drawn across the whole window see the run's sampling noise; stretches drawn see how far its figures
    wander with time, as a loaded machine's do, which the sessions average out and a second run of the level would
    show."""
    if summary is None or summary.throughput is None:
        return None, None
    found = point(summary, run_dir.name, num_gpus=num_gpus, statistic=options.statistic)
    if found is None:
        return None, None
    gpus = num_gpus if num_gpus is not None else summary.throughput.num_gpus
    records = read_records(run_dir / RECORDS_FILE)
    sample = RunSample([Repeat(records=records, duration_s=summary.throughput.duration_s, num_gpus=gpus)])
    rng = np.random.default_rng(options.seed)
    bounds: list[tuple[tuple[float, float] | None, tuple[float, float] | None]] = []
    views = [sample] if options.time_stretches < 1 else [sample, over_time(sample, options.time_stretches)]
    for view in views:
        weights = draw_weights(rng, len(view.clusters), options.replicates)
        x, y = level_replicates(view, weights, options.statistic, options.basis)
        bounds.append((interval(x, options.level), interval(y, options.level)))
    return (
        _around(found.interactivity_tps, [x for x, _ in bounds]),
        _around(found.throughput(options.basis), [y for _, y in bounds]),
    )


def _around(value: float, bounds: Sequence[tuple[float, float] | None]) -> Interval:
    """`value` with the widest of `bounds` around it (the bootstrap's mean need not be the report's point); a
    degenerate interval when the bootstraps had none."""
    lows = [low for low, _ in (b for b in bounds if b is not None)]
    highs = [high for _, high in (b for b in bounds if b is not None)]
    return Interval(value, min([*lows, value]), max([*highs, value]))


class SearchResult(msgspec.Struct, kw_only=True):
    out_dir: Path
    levels: list[Measured]
    decisions: list[Decision]
    final: Decision
    ran: list[int]
    """The levels this call ran (not those a resume kept)."""
    interrupted: bool = False


OnDecision = Callable[[Decision], None]


async def search_frontier(
    trace: Trace | PreparedTrace,
    base: ReplayOptions,
    sweep_options: SweepOptions,
    options: SearchOptions,
    measure: MeasureOptions | None = None,
    hooks: RunHooks | None = None,
    *,
    on_decision: OnDecision | None = None,
    on_level_start: OnLevel | None = None,
    on_level_done: OnLevelDone | None = None,
    level_server: LevelServer | None = None,
) -> SearchResult:
    """Search the frontier of the server `base` names: each level `decide` chooses is run as a one-level sweep into
    `sweep_options.out_dir` (its `concurrency` ignored), the index extended each time. With `sweep_options.resume`,
    the levels already in the folder's sweep.json are resumed first (kept when finished with these settings: the
    sweep's resume checks) and the search goes on from them. `level_server`, when given, names each level's server
    (as `sweep`'s)."""
    measure = measure or MeasureOptions()
    prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, base)
    levels: list[Measured] = []
    decisions: list[Decision] = []
    ran: list[int] = []
    out_dir = sweep_options.out_dir
    earlier = read_index(out_dir) if sweep_options.resume else None
    resumed = tuple(entry.concurrency for entry in earlier.levels if entry.status != "failed") if earlier else ()
    extend = False
    if resumed:
        again = msgspec.structs.replace(sweep_options, concurrency=resumed)
        done = await sweep(
            prepared,
            base,
            again,
            hooks,
            on_level_start=on_level_start,
            on_level_done=on_level_done,
            level_server=level_server,
        )
        levels += [_measured(result, sweep_options.num_gpus, measure) for result in done.levels]
        ran += [r.entry.concurrency for r in done.levels if r.entry.status != "kept"]
        if done.interrupted:
            final = decide(levels, options)
            return SearchResult(
                out_dir=out_dir, levels=levels, decisions=decisions, final=final, ran=ran, interrupted=True
            )
        extend = True
    if earlier is not None and not resumed:
        extend = True  # an index with failed levels only: add to it
    while True:
        decision = decide(levels, options)
        decisions.append(decision)
        if on_decision is not None:
            on_decision(decision)
        if decision.next_level is None:
            return SearchResult(out_dir=out_dir, levels=levels, decisions=decisions, final=decision, ran=ran)
        level = decision.next_level
        one = msgspec.structs.replace(
            sweep_options,
            concurrency=(level,),
            resume=False,
            resume_anyway=False,
            overwrite=sweep_options.overwrite and not extend,
            extend=extend,
        )
        done = await sweep(
            prepared,
            base,
            one,
            hooks,
            on_level_start=on_level_start,
            on_level_done=on_level_done,
            level_server=level_server,
        )
        extend = True
        ran.append(level)
        levels = [m for m in levels if m.concurrency != level]
        levels.append(_measured(done.levels[0], sweep_options.num_gpus, measure))
        if done.interrupted:
            final = decide(levels, options)
            return SearchResult(
                out_dir=out_dir, levels=levels, decisions=decisions, final=final, ran=ran, interrupted=True
            )


def _measured(result: LevelResult, num_gpus: int | None, measure: MeasureOptions) -> Measured:
    entry = result.entry
    gpus = num_gpus or 1
    hours = entry.elapsed_s * gpus / 3600.0
    if entry.status in ("failed", "interrupted"):
        return Measured(concurrency=entry.concurrency, interactivity=None, throughput=None, gpu_hours=hours)
    try:
        x, y = measure_level(result.run_dir, result.summary, num_gpus, measure)
    except (OSError, ValueError) as exc:
        raise SweepError(f"{result.run_dir}: cannot read the level's records ({exc})") from None
    return Measured(concurrency=entry.concurrency, interactivity=x, throughput=y, gpu_hours=hours)
