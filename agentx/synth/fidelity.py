"""Fidelity: how alike two traces are, for the quantities a server feels.

Two-sample Kolmogorov-Smirnov distances (the largest gap between the two empirical CDFs, 0 to 1)
on `in`, `out`, think time, requests per session and fan-out; and the prefix-cache hit rate as a
function of cache capacity for both (LRU, `agentx.trace.stats.lru_hit`, plus the infinite cache),
with the largest gap between the curves. Capacities are per session: the larger trace is cut into
groups of as many sessions as the smaller one holds, each group simulated on its own LRU of
capacity × sessions tokens, and the hits summed, so a trace and a larger one generated like it
see the same contention. A distance counts as alike below `KS_LIMIT`, or below the 5 % critical
value of the KS test when the samples are too small to resolve `KS_LIMIT` (a 20-session corpus
cannot tell requests-per-session distributions 0.1 apart).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import msgspec
import numpy as np

from agentx.trace.model import Trace
from agentx.trace.stats import lru_hit, prefix_cache_hits

KS_LIMIT = 0.1
HIT_GAP_LIMIT_POINTS = 5.0
CAPACITIES_PER_SESSION = (4_096, 16_384, 65_536, 262_144)
"""Cache tokens per session at which the LRU hit rate is measured (then the infinite cache)."""


class Distance(msgspec.Struct, kw_only=True):
    quantity: str
    ks: float
    count_a: int
    count_b: int
    median_a: float
    median_b: float
    limit: float
    """Alike below this: `KS_LIMIT`, or the 5 % critical value when the samples are small."""


class HitPoint(msgspec.Struct, kw_only=True):
    capacity_tokens_per_session: int | None
    """None: the infinite (theoretical) cache."""
    hit_rate_a: float
    hit_rate_b: float


class Fidelity(msgspec.Struct, kw_only=True):
    distances: list[Distance]
    hit_curve: list[HitPoint]
    max_hit_gap_points: float
    alike: bool
    verdict: str


def ks_distance(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic (1.0 when either sample is empty)."""
    x, y = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    if x.size == 0 or y.size == 0:
        return 0.0 if x.size == y.size else 1.0
    points = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, points, side="right") / x.size
    cdf_y = np.searchsorted(y, points, side="right") / y.size
    return float(np.max(np.abs(cdf_x - cdf_y)))


def _quantities(trace: Trace) -> dict[str, list[float]]:
    requests = [r for s in trace.sessions for a, _, _ in s.agents() for r in a.requests]
    fan_out: list[float] = []
    for session in trace.sessions:
        groups = Counter((id(parent), agent.spawn_after) for agent, parent, _ in session.agents() if parent is not None)
        fan_out.extend(groups.values())
    return {
        "in": [r.in_tokens for r in requests],
        "out": [r.out_tokens for r in requests],
        "think_time_s": [r.think_time for r in requests if r.think_time is not None],
        "requests_per_session": [s.request_count for s in trace.sessions],
        "fan_out": fan_out,
    }


def hit_curve(
    trace: Trace, per_session: Sequence[int] = CAPACITIES_PER_SESSION, *, group_sessions: int = 0
) -> list[float]:
    """Hit rates at each per-session capacity, then the infinite cache's.

    With `group_sessions`, the sessions are simulated in consecutive groups of that many (each on
    its own cache) and the hits summed.
    """
    size = group_sessions or len(trace.sessions)
    groups = [
        msgspec.structs.replace(trace, sessions=trace.sessions[i : i + size])
        for i in range(0, len(trace.sessions), size)
    ]
    if len(groups) > 1 and len(groups[-1].sessions) < size:
        groups.pop()  # a short last group would see less contention than the rest
    rates = []
    for capacity in per_session:
        results = [lru_hit(group, capacity * len(group.sessions)) for group in groups]
        total = sum(r.total for r in results)
        rates.append(sum(r.hits for r in results) / total if total else 0.0)
    hits, totals = prefix_cache_hits(trace)
    rates.append(float(hits.sum() / totals.sum()) if totals.sum() else 0.0)
    return rates


def ks_critical(count_a: int, count_b: int) -> float:
    """The KS distance two samples of these sizes exceed with 5 % chance when drawn alike."""
    if not count_a or not count_b:
        return 1.0
    return 1.358 * math.sqrt((count_a + count_b) / (count_a * count_b))


def compare(a: Trace, b: Trace, *, per_session: Sequence[int] = CAPACITIES_PER_SESSION) -> Fidelity:
    """How alike `a` and `b` are (see the module docstring)."""
    qa, qb = _quantities(a), _quantities(b)
    distances = [
        Distance(
            quantity=name,
            ks=ks_distance(qa[name], qb[name]),
            count_a=len(qa[name]),
            count_b=len(qb[name]),
            median_a=float(np.median(qa[name])) if qa[name] else 0.0,
            median_b=float(np.median(qb[name])) if qb[name] else 0.0,
            limit=max(KS_LIMIT, ks_critical(len(qa[name]), len(qb[name]))),
        )
        for name in qa
    ]
    group = min(len(a.sessions), len(b.sessions))
    curve_a = hit_curve(a, per_session, group_sessions=group)
    curve_b = hit_curve(b, per_session, group_sessions=group)
    capacities: list[int | None] = [*per_session, None]
    curve = [
        HitPoint(capacity_tokens_per_session=c, hit_rate_a=x, hit_rate_b=y)
        for c, x, y in zip(capacities, curve_a, curve_b, strict=True)
    ]
    gap = max(abs(x - y) for x, y in zip(curve_a, curve_b, strict=True)) * 100
    worst = max(distances, key=lambda d: d.ks / d.limit)
    alike = all(d.ks < d.limit for d in distances) and gap < HIT_GAP_LIMIT_POINTS
    verdict = (
        f"{'alike' if alike else 'different'}: largest KS {worst.ks:.3f} ({worst.quantity}; limit {worst.limit:.3f}), "
        f"largest hit-rate gap {gap:.1f} points (limit {HIT_GAP_LIMIT_POINTS:g})"
    )
    return Fidelity(distances=distances, hit_curve=curve, max_hit_gap_points=gap, alike=alike, verdict=verdict)
