"""What a trace holds: size, shape of the agent trees, distributions, and prefix-cache hit rates.

Theoretical prefix-cache hit (docs/agentx.md §6): one infinite cache per hash-id namespace (per
session, or one for a global-scope trace); requests in recorded order; a request's hits are the
leading run of its hash ids already available; a block becomes available when a request holding
it ends (`t + api_time`, "causal"), or when it starts with `causal=False` (older reference code).

The LRU figure replays every request of the trace on one shared cache of a given size in tokens,
in order of absolute start time (`Session.start_s + t`: for Weka corpora, every session starting
at once), ids namespaced as the trace's scope says. Its cost is linear in the total number of
hash ids (all prompts, not only the new blocks), unlike the infinite-cache figure.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence

import msgspec
import numpy as np

from agentx.trace.model import Agent, Request, Session, Trace

JOIN_EPSILON_S = 1e-6
"""A subagent joins the first parent request starting at or after its end, within this slack."""


class Distribution(msgspec.Struct, kw_only=True):
    """Summary of one quantity over a population (NaN-free; empty → all zero, count 0)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        data = np.asarray(values, dtype=np.float64)
        data = data[np.isfinite(data)]
        if data.size == 0:
            return cls(count=0, mean=0.0, p50=0.0, p90=0.0, p99=0.0, min=0.0, max=0.0)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(
            count=int(data.size),
            mean=float(data.mean()),
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
            min=float(data.min()),
            max=float(data.max()),
        )


class TreeShape(msgspec.Struct, kw_only=True):
    """How sessions branch into subagents."""

    sessions_with_subagents: int
    subagents: int
    max_depth: int
    spawn_groups: int
    """Spawn points: subagents started after the same parent request form one group."""
    max_fan_out: int
    mean_fan_out: float
    joined: int
    """Subagents some later parent request waits for (the first one at or after the subagent's end)."""
    background: int
    """Subagents no parent request waits for (they end after the parent's last request)."""
    empty: int
    """Subagents with no requests (e.g. launched asynchronously, no telemetry)."""


class CacheHit(msgspec.Struct, kw_only=True):
    """Block-level hit rate: hits / total over every request."""

    hits: int
    total: int

    @property
    def rate(self) -> float:
        return self.hits / self.total if self.total else 0.0


class LruHit(msgspec.Struct, kw_only=True):
    capacity_tokens: int
    hits: int
    total: int

    @property
    def rate(self) -> float:
        return self.hits / self.total if self.total else 0.0


class TraceStats(msgspec.Struct, kw_only=True):
    """Everything `agentx inspect` reports."""

    sessions: int
    agents: int
    requests: int
    block_size: int
    hash_id_scope: str
    models: dict[str, int]
    """Requests per recorded model."""
    input_tokens: int
    output_tokens: int
    shape: TreeShape
    in_tokens: Distribution
    out_tokens: Distribution
    think_time_s: Distribution
    """The recorded think times (count 0: the trace records none). Informational: replay never waits them."""
    turn_gap_s: Distribution
    """Per later turn of an agent: what replay waits after the agent's previous turn completes before sending it,
    unscaled (`--delay-scale` multiplies it): the recorded start minus the previous turn's recorded end, at least 0,
    an unknown API time counting as 0 (agentx.replayer.plan.steps; a trace of start times alone thus gives the gaps
    between them). Over the agents as the trace lists them: replay splits a flattened agent into its chains first."""
    session_start_gap_s: Distribution
    """Between successive session starts, in time order (a session starts at `start_s` plus its first request's `t`):
    what `--mode trace` waits between them, unscaled (`--speedup` divides it; agentx.replayer.plan.arrivals)."""
    api_time_s: Distribution
    requests_per_session: Distribution
    peak_context_tokens: Distribution
    """Per session: the largest `in + out` of any request."""
    session_duration_s: Distribution
    """Per session: last recorded end minus first start."""
    theoretical_hit: CacheHit
    lru_hits: list[LruHit]


def trace_stats(trace: Trace, *, cache_tokens: Sequence[int] = (), causal: bool = True) -> TraceStats:
    """Compute the inspect report; `cache_tokens` lists LRU capacities (in tokens) to simulate."""
    requests = [r for s in trace.sessions for a, _, _ in s.agents() for r in a.requests]
    hits, totals = prefix_cache_hits(trace, causal=causal)
    return TraceStats(
        sessions=len(trace.sessions),
        agents=sum(1 for s in trace.sessions for _ in s.agents()),
        requests=len(requests),
        block_size=trace.block_size,
        hash_id_scope=trace.hash_id_scope,
        models=dict(Counter(r.model for r in requests).most_common()),
        input_tokens=sum(r.in_tokens for r in requests),
        output_tokens=sum(r.out_tokens for r in requests),
        shape=tree_shape(trace.sessions),
        in_tokens=Distribution.of([r.in_tokens for r in requests]),
        out_tokens=Distribution.of([r.out_tokens for r in requests]),
        think_time_s=Distribution.of([r.think_time for r in requests if r.think_time is not None]),
        turn_gap_s=Distribution.of([gap for s in trace.sessions for a, _, _ in s.agents() for gap in _turn_gaps(a)]),
        session_start_gap_s=Distribution.of(np.diff(sorted(_start(s) for s in trace.sessions if s.request_count))),
        api_time_s=Distribution.of([r.api_time for r in requests if r.api_time is not None]),
        requests_per_session=Distribution.of([s.request_count for s in trace.sessions]),
        peak_context_tokens=Distribution.of([_peak_context(s) for s in trace.sessions if s.request_count]),
        session_duration_s=Distribution.of([_duration(s) for s in trace.sessions if s.request_count]),
        theoretical_hit=CacheHit(hits=int(hits.sum()), total=int(totals.sum())),
        lru_hits=[lru_hit(trace, capacity) for capacity in cache_tokens],
    )


def _turn_gaps(agent: Agent) -> Iterator[float]:
    for previous, request in itertools.pairwise(agent.requests):
        yield max(0.0, request.t - previous.end)


def _start(session: Session) -> float:
    return session.start_s + min(r.t for a, _, _ in session.agents() for r in a.requests)


def _peak_context(session: Session) -> int:
    return max(r.in_tokens + r.out_tokens for a, _, _ in session.agents() for r in a.requests)


def _duration(session: Session) -> float:
    requests = [r for a, _, _ in session.agents() for r in a.requests]
    return max(r.end for r in requests) - min(r.t for r in requests)


def join_index(parent: Agent, sub: Agent) -> int | None:
    """The parent request that waits for `sub` (tiered join), or None for a background subagent."""
    end = sub.end
    for index in range(sub.spawn_after, len(parent.requests)):
        if parent.requests[index].t + JOIN_EPSILON_S >= end:
            return index
    return None


def tree_shape(sessions: Sequence[Session]) -> TreeShape:
    groups: Counter[tuple[int, int, int]] = Counter()
    subagents = joined = background = empty = max_depth = with_subagents = 0
    for session_index, session in enumerate(sessions):
        with_subagents += bool(session.root.subagents)
        for agent, parent, depth in session.agents():
            max_depth = max(max_depth, depth)
            if parent is None:
                continue
            subagents += 1
            groups[(session_index, id(parent), agent.spawn_after)] += 1
            if not agent.requests:
                empty += 1
            elif join_index(parent, agent) is None:
                background += 1
            else:
                joined += 1
    sizes = list(groups.values())
    return TreeShape(
        sessions_with_subagents=with_subagents,
        subagents=subagents,
        max_depth=max_depth,
        spawn_groups=len(sizes),
        max_fan_out=max(sizes, default=0),
        mean_fan_out=float(np.mean(sizes)) if sizes else 0.0,
        joined=joined,
        background=background,
        empty=empty,
    )


# ---------------------------------------------------------------------------------------------
# prefix-cache hits


class _Step(msgspec.Struct):
    """One request in a namespace, with what the hit computation needs."""

    start: float
    row: int
    available_at: float
    request: Request
    ids: tuple[int, ...]
    previous: _Step | None
    """The previous request of the same agent."""
    released: bool = False


def _steps(session: Session, first_row: int, causal: bool) -> Iterator[_Step]:
    row = first_row
    for agent, _, _ in session.agents():
        previous: _Step | None = None
        for request, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True):
            start = session.start_s + request.t
            step = _Step(start, row, session.start_s + request.end if causal else start, request, ids, previous)
            previous = step
            row += 1
            yield step


def _namespaces(trace: Trace) -> Iterator[tuple[list[Session], int]]:
    """Groups of sessions sharing hash ids, each with the row number of its first request."""
    if trace.hash_id_scope == "global":
        yield trace.sessions, 0
        return
    row = 0
    for session in trace.sessions:
        yield [session], row
        row += session.request_count


class _InfiniteCache:
    """One hash-id namespace's infinite cache, counting the hits of requests fed in (start, row) order."""

    def __init__(self) -> None:
        self.available: set[int] = set()
        self.pending: list[tuple[float, int, _Step]] = []
        """Requests counted, by when their blocks become available (`_Step.row` is unique)."""

    def count(self, step: _Step) -> tuple[int, int]:
        """(hit blocks, total blocks) of `step`."""
        pending, available = self.pending, self.available
        while pending and pending[0][0] <= step.start:
            _, _, done = heapq.heappop(pending)
            done.released = True
            available.update(done.ids)
        ids, kept = step.ids, step.request.hash_ids_kept
        # The kept prefix came from the agent's previous request; once that one was released
        # its ids are all available, so only the added ids need looking up.
        hit = kept if step.previous is not None and step.previous.released else 0
        while hit < len(ids) and ids[hit] in available:
            hit += 1
        total = len(ids)
        heapq.heappush(pending, (step.available_at, step.row, step))
        if step.previous is not None:
            if step.previous.released:
                # Its kept ids are already available: release only what is new.
                step.ids = ids[kept:]
            step.previous = None  # the chain is not needed once counted: the id tuples can be large
        return hit, total


def prefix_cache_hits(trace: Trace, *, causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per request (in row order: session, agent depth first, request): (hit blocks, total blocks)."""
    rows = trace.request_count
    hits = np.zeros(rows, dtype=np.int64)
    totals = np.zeros(rows, dtype=np.int64)
    for sessions, first_row in _namespaces(trace):
        steps: list[_Step] = []
        row = first_row
        for session in sessions:
            steps.extend(_steps(session, row, causal))
            row = first_row + len(steps)  # one step a request
        steps.sort(key=lambda step: (step.start, step.row))
        cache = _InfiniteCache()
        for step in steps:
            hits[step.row], totals[step.row] = cache.count(step)
    return hits, totals


class StartOrderHits:
    """`prefix_cache_hits(trace, causal=False)` of a global-scope trace, one session at a time: `of(i)` counts
    requests in start order only as far as session `i`'s last one, so a replay's first request does not wait for
    the whole trace (~40 ms for 6,000 Mooncake requests; bench/startup.py).

    `session(i)` gives session `i` as it is replayed; `earliest_s[i]` is a time no request of it starts before.
    Not thread-safe: the caller serializes `of`."""

    def __init__(self, earliest_s: Sequence[float], session: Callable[[int], Session]) -> None:
        self._earliest_s = earliest_s
        self._session = session
        self._order = sorted(range(len(earliest_s)), key=lambda index: (earliest_s[index], index))
        self._added = 0
        self._queue: list[tuple[float, int, int, _Step]] = []
        """Requests not counted yet: (start, session, position in the session, step), i.e. (start, row) order."""
        self._cache = _InfiniteCache()
        self._counting: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        """Sessions with requests still queued: hits, totals and how many are left."""
        self._done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._rows = 0

    def of(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Session `index`'s (hit blocks, total blocks) per request, in its row order."""
        if not 0 <= index < len(self._order):
            raise IndexError(index)
        while index not in self._done:
            self._count_next()
        return self._done[index]

    def _count_next(self) -> None:
        order, queue = self._order, self._queue
        # A session not added yet may hold a request due before (or with) the queue's first: add it first.
        while self._added < len(order) and (not queue or self._earliest_s[order[self._added]] <= queue[0][0]):
            self._add(order[self._added])
            self._added += 1
        if not queue:
            return
        _, index, position, step = heapq.heappop(queue)
        hits, totals, left = self._counting[index]
        hits[position], totals[position] = self._cache.count(step)
        left[0] -= 1
        if not left[0]:
            self._done[index] = hits, totals
            del self._counting[index]

    def _add(self, index: int) -> None:
        session = self._session(index)
        steps = list(_steps(session, self._rows, causal=False))
        self._rows += len(steps)
        if not steps:
            self._done[index] = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
            return
        earliest = self._earliest_s[index]
        for position, step in enumerate(steps):
            if step.start < earliest:
                raise ValueError(f"session {session.session_id!r} has a request at {step.start} s, before {earliest}")
            heapq.heappush(self._queue, (step.start, index, position, step))
        self._counting[index] = np.zeros(len(steps), dtype=np.int64), np.zeros(len(steps), dtype=np.int64), [len(steps)]


def lru_hit(trace: Trace, capacity_tokens: int, *, causal: bool = True) -> LruHit:
    """Block hits of every request on one shared LRU cache holding `capacity_tokens` tokens."""
    capacity_blocks = max(0, capacity_tokens // max(1, trace.block_size))
    events: list[tuple[float, int, Hashable, tuple[int, ...], float]] = []
    row = 0
    for session_index, session in enumerate(trace.sessions):
        namespace: Hashable = 0 if trace.hash_id_scope == "global" else session_index
        for step in _steps(session, row, causal):
            events.append((step.start, step.row, namespace, step.ids, step.available_at))
        row += session.request_count
    events.sort(key=lambda event: (event[0], event[1]))
    cache: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
    pending: list[tuple[float, int, Hashable, tuple[int, ...]]] = []
    hits = total = 0

    def insert(namespace: Hashable, ids: tuple[int, ...]) -> None:
        for block in ids:
            key = (namespace, block)
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)

    for start, row_number, namespace, ids, available_at in events:
        while pending and pending[0][0] <= start:
            _, _, done_namespace, done_ids = heapq.heappop(pending)
            insert(done_namespace, done_ids)
        hit = 0
        while hit < len(ids) and (namespace, ids[hit]) in cache:
            cache.move_to_end((namespace, ids[hit]))
            hit += 1
        hits += hit
        total += len(ids)
        heapq.heappush(pending, (available_at, row_number, namespace, ids))
    return LruHit(capacity_tokens=capacity_tokens, hits=hits, total=total)


def parse_token_counts(text: str) -> list[int]:
    """Parse "1e6,1e7,2.5e8" (token counts, any float notation) into ints."""
    counts = []
    for part in text.split(","):
        value = float(part.strip())
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{part.strip()!r} is not a non-negative token count")
        counts.append(int(value))
    return counts
