"""Hidden agents: split "flattened" subagents out of an agent's request list (docs/agentx.md §3b).

Some traces (Weka/AgentX corpora converted from proxy logs) record subagents flattened into one request
list: a session's top-level requests interleave several independent conversations. The reference finds
them by hash-id longest-common-prefix (LCP) chains; `split_flattened_agents` does the same as a pure
trace transformation, on the root's requests and, separately, on each subagent's.

**Detection** (one agent's requests, in `(t, index)` order):

- *Preamble*: the earliest request is set aside (and re-attached to the main chain afterwards) when it
  shares no first block with any other request and either `out <= preamble_max_out` or none of its
  blocks appears anywhere else (a Claude Code title call must not found the main chain).
- *Phase 1, greedy*: a request **extends** the chain whose tail ids are a prefix of its ids (deepest tail
  wins, then the lowest chain), if that tail has ended by its start and ran on the same model. Otherwise it
  **forks** a new chain from the tail with the deepest LCP (depth 0: no shared prefix). Requests without
  ids stay on the main chain and never act as tails.
- *Phase 2, seams*: a fork that keeps only a prefix of its tail (compaction) is the same agent going on if
  the longer state is never reused: for each fork-source tail that is still its chain's last request, the
  deepest eligible fork (same model, starts after the tail ends, not "gap > `seam_max_gap_seconds` and kept
  ratio < `seam_min_overlap_ratio`") is spliced onto the chain; the other forks of that tail are re-keyed
  against the new tail so chained compactions collapse too.
- *Main chain*: the one holding the earliest request; it stays the agent's own requests.

**Classification** of the other chains, first match wins (thresholds are `ChainRules` fields):
`aux` (≤ `aux_max_requests` requests and a small first `in` or another model), `aux:red` (one same-model
large-in/short-out request), `wg:GGG_MMM` (forked at depth > 0, ≥ `worker_group_min` chains from one fork
point with overlapping `[t0, t1)`), else `fa:NNN`. `NNN` is the chain's rank among the agent's derived
chains by first request; `GGG`/`MMM` number groups by start and members within a group.

**Placement.** A top-level chain becomes a subagent of the root with `agent_id` `fa:NNN` (`aux:NNN`,
`aux:red:NNN`, `wg:GGG_MMM`), spawned after the last main request before its first request (SPAWN) and
spawn time = its first request's `t`, with no `duration_ms`, so `stats.join_index` joins it at the first
later main request with `t >= chain end` (JOIN). A chain found inside subagent `X` is named `X:fa:NNN`
etc. By default (`subagent_chains="sibling"`, the reference) it becomes a *sibling* of `X`: same parent,
`spawn_after`, spawn `t` and `duration_ms`, so the plan puts it in `X`'s branch, dispatched at its recorded
offset from the branch start and joined with `X`. `"child"` makes it a subagent of `X` placed like a
top-level chain instead. Derived chains get their agent's declared tool/system tokens only if their first
ids start with the same `ceil((tool + system) / block_size)` blocks as the main chain's.

Requests are only moved: `t`, sizes, times and full hash ids are unchanged; hash ids are re-encoded
against each request's new predecessor (requests whose predecessor did not change keep their object).

**Complexity** per agent of `n` requests with ids of length ≤ `L` and `C` chains: building the full ids is
O(n·L) element copies (C-level tuple slicing); phase 1 is O(n·C) cheap filters (length, last id, model,
end) plus one O(L) tuple comparison per surviving candidate; forks cost O(C·L) each; phase 2 and grouping
are O(F log F + F·L) for `F` forks. A session without flattened agents (the usual case: C = 1) is O(n·L).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec
import numpy as np

from agentx.trace.model import Agent, Request, Session, Trace, delta_encode
from agentx.trace.stats import JOIN_EPSILON_S

EPSILON_S = JOIN_EPSILON_S
"""Temporal slack of every "has ended by" test, as in the reference (1e-6 s)."""

ChainKind = Literal["fa", "aux", "aux:red", "wg"]
SubagentChains = Literal["sibling", "child"]
HashIds = tuple[int, ...]


CHAIN_KINDS: Final = frozenset({"fa", "aux", "aux:red", "wg"})
"""`subagent_type` of the agents split out of a flattened root: the root's own turns, not subagents."""


class ChainRules(msgspec.Struct, frozen=True, kw_only=True):
    """Thresholds of flattened-agent detection (§3b); defaults are the reference's
    (`AIPERF_DATASET_WEKA_*` environment variables in brackets)."""

    aux_max_requests: int = 1
    """A chain of at most this many requests may be an `aux` sidecar [AUX_MAX_REQUESTS]; 0 disables `aux`."""
    aux_isl_floor: int = 16384
    """`aux`: first `in` below max(this, `aux_isl_ratio` × main-chain peak `in`) [AUX_ISL_FLOOR]; also the
    minimum `in` of an `aux:red` reduction."""
    aux_isl_ratio: float = 0.10
    """`aux`: see `aux_isl_floor` [AUX_ISL_RATIO]."""
    aux_cross_model: bool = True
    """`aux`: a short chain on another model than the main chain's first request [AUX_CROSS_MODEL]."""
    aux_reduction_osl_max: int = 4000
    """`aux:red`: one same-model request with 0 < `out` < this [AUX_REDUCTION_OSL_MAX]; 0 disables it."""
    aux_reduction_ratio: float = 20.0
    """`aux:red`: and `in / out` above this [AUX_REDUCTION_RATIO]."""
    worker_group_min: int = 3
    """`wg`: at least this many overlapping chains forked from one point [WORKER_GROUP_MIN]; 0 disables."""
    seam_max_gap_seconds: float = 3600.0
    """Seam guard: a compaction continuation starting more than this after its tail ends… [SEAM_MAX_GAP_SECONDS]"""
    seam_min_overlap_ratio: float = 0.5
    """…and keeping less than this fraction of the tail's ids spawns instead [SEAM_MIN_OVERLAP_RATIO]."""
    preamble_max_out: int = 64
    """A prefix-disjoint earliest request with `out` at most this is a preamble (title generation)."""
    subagent_chains: SubagentChains = "sibling"
    """Where chains found inside a subagent go: next to it in its branch (the reference) or under it."""


DEFAULT_RULES = ChainRules()
"""The reference's thresholds."""


class ChainCounts(msgspec.Struct, kw_only=True):
    """What detection found in one session (root and subagents together)."""

    fa: int = 0
    aux: int = 0
    aux_red: int = 0
    wg: int = 0
    seams: int = 0
    """Compaction continuations spliced back onto their chain."""
    preambles: int = 0
    """Earliest requests set aside as preambles (and kept on their main chain)."""
    without_ids: int = 0
    """Requests without hash ids (kept on their main chain)."""

    @property
    def chains(self) -> int:
        """Derived chains: new agents created."""
        return self.fa + self.aux + self.aux_red + self.wg

    def add(self, other: ChainCounts) -> None:
        for name in self.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class ChainReport(msgspec.Struct, kw_only=True):
    """Per-session counts of a `split_trace` run, in trace order (every session, split or not)."""

    sessions: dict[str, ChainCounts] = msgspec.field(default_factory=dict)

    @property
    def total(self) -> ChainCounts:
        total = ChainCounts()
        for counts in self.sessions.values():
            total.add(counts)
        return total

    @property
    def sessions_split(self) -> int:
        return sum(1 for counts in self.sessions.values() if counts.chains)


def split_trace(trace: Trace, rules: ChainRules = DEFAULT_RULES) -> tuple[Trace, ChainReport]:
    """`split_flattened_agents` on every session; unchanged sessions are kept as the same objects."""
    report = ChainReport()
    sessions: list[Session] = []
    for session in trace.sessions:
        counts = ChainCounts()
        sessions.append(_split_session(session, rules, trace.block_size, counts))
        report.sessions[session.session_id] = counts
    return msgspec.structs.replace(trace, sessions=sessions), report


def split_flattened_agents(
    session: Session, rules: ChainRules = DEFAULT_RULES, *, block_size: int = 64, counts: ChainCounts | None = None
) -> Session:
    """The session with every hidden agent turned into a subagent (module docstring); the same object
    when no agent holds more than one chain. `block_size` only matters for the tool/system prefix rule;
    `counts`, when given, is added what was found."""
    return _split_session(session, rules, block_size, counts if counts is not None else ChainCounts())


# ---------------------------------------------------------------------------------------------
# detection


@dataclass(slots=True)
class _Chain:
    """One chain of phase 1/2; requests are indices into the agent's request list."""

    members: list[int]
    parent: int | None = None
    """The chain this one forked from (None: the first chain, or no shared prefix)."""
    fork_at: int | None = None
    """The request (the parent's tail then) this chain diverged from."""
    depth: int = 0
    """Ids shared with that request."""
    fork_t: float = 0.0
    spliced_into: int | None = None
    tail: int = -1
    """The last request with ids (phase 1 only)."""
    tail_ids: HashIds = ()
    tail_end: float = 0.0
    tail_model: str = ""


@dataclass(slots=True)
class _Detection:
    main: list[int]
    """The main chain's requests (preamble included), ascending index."""
    main_first_ids: HashIds
    """The ids of the detected main chain's first request with ids (preamble excluded)."""
    chains: list[tuple[list[int], str]]
    """Derived chains: (requests in (t, index) order, name suffix such as "fa:000"), by first request."""
    counts: ChainCounts = field(default_factory=ChainCounts)


def _lcp(a: HashIds, b: HashIds) -> int:
    """Longest common prefix length, by C-level slice comparisons (O(L log L) worst case, O(L) usually)."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    low, high = 1, n - 1  # a prefix of length `low` matches, one of length `high + 1` does not
    while low < high:
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _detect(requests: Sequence[Request], ids: Sequence[HashIds], rules: ChainRules) -> _Detection:
    n = len(requests)
    counts = ChainCounts(without_ids=sum(1 for i in range(n) if not ids[i]))
    order = sorted(range(n), key=lambda i: (requests[i].t, i))
    preamble = _preamble(requests, ids, order, rules)
    if preamble is not None:
        counts.preambles = 1
        order = [i for i in order if i != preamble]
    chains, chain_of, seams = _find_chains(requests, ids, order, rules)
    counts.seams = seams
    if not order:
        return _Detection(main=list(range(n)), main_first_ids=(), chains=[], counts=counts)
    main_index = chain_of[order[0]]
    rank = {index: position for position, index in enumerate(order)}
    workers = [c for c in range(len(chains)) if chains[c].spliced_into is None and c != main_index]
    if not workers:
        return _Detection(main=list(range(n)), main_first_ids=(), chains=[], counts=counts)
    for chain in chains:
        chain.members.sort(key=rank.__getitem__)
    workers.sort(key=lambda c: rank[chains[c].members[0]])

    detected_main = chains[main_index].members
    main_model = requests[detected_main[0]].model
    main_peak_in = max(requests[i].in_tokens for i in detected_main)
    groups = _worker_groups(requests, chains, workers, rules)
    named: list[tuple[list[int], str]] = []
    for number, c in enumerate(workers):
        members = chains[c].members
        kind = _kind(requests, members, main_model, main_peak_in, c in groups, rules)
        if kind == "aux":
            counts.aux += 1
            suffix = f"aux:{number:03d}"
        elif kind == "aux:red":
            counts.aux_red += 1
            suffix = f"aux:red:{number:03d}"
        elif kind == "wg":
            counts.wg += 1
            group, member = groups[c]
            suffix = f"wg:{group:03d}_{member:03d}"
        else:
            counts.fa += 1
            suffix = f"fa:{number:03d}"
        named.append((members, suffix))
    main = sorted(detected_main + ([preamble] if preamble is not None else []))
    main_first_ids = next((ids[i] for i in detected_main if ids[i]), ())
    return _Detection(main=main, main_first_ids=main_first_ids, chains=named, counts=counts)


def _preamble(
    requests: Sequence[Request], ids: Sequence[HashIds], order: Sequence[int], rules: ChainRules
) -> int | None:
    """The earliest request if it is a preamble (module docstring), else None.

    Two requests share a prefix iff their first ids are equal, so the LCP test is O(n). And when the
    candidate shares no prefix with anyone, one of its ids appears in another request's full list iff it
    appears in some other request's *added* ids (an id kept from the candidate itself would make that
    request share the candidate's prefix), so the block test reads only the delta-encoded additions.
    """
    if len(order) < 2:
        return None
    first = order[0]
    head = ids[first]
    if not head:
        return None
    if any(ids[i] and ids[i][0] == head[0] for i in order[1:]):
        return None
    if requests[first].out_tokens <= rules.preamble_max_out:
        return first
    blocks = set(head)
    if any(not blocks.isdisjoint(requests[i].hash_ids_added) for i in order[1:]):
        return None
    return first


def _find_chains(
    requests: Sequence[Request], ids: Sequence[HashIds], order: Sequence[int], rules: ChainRules
) -> tuple[list[_Chain], dict[int, int], int]:
    """Phases 1 and 2: (chains, chain of each request, seams spliced)."""
    chains: list[_Chain] = []
    chain_of: dict[int, int] = {}
    forks_of: dict[int, list[int]] = {}  # fork-source request → chains forked from it (depth > 0)
    # (−len(tail_ids), chain) of every chain with a tail, sorted: the longest tails first. A tail shorter than
    # the best common prefix found so far cannot beat it, so the fork search below stops there, and a
    # session whose every turn forks (a partial last block changes its id) costs ~1 LCP a turn, not one per
    # earlier turn.
    by_length: list[tuple[int, int]] = []
    # (tail key, chain), in lexicographic order: the tails sharing the longest prefix with a request's ids sit
    # next to where those ids would go, so the fork search looks at neighbours, not at every chain. Keys are
    # the ids packed as fixed-width bytes (`_key`): compared by memcmp, not id by id.
    by_ids: list[tuple[bytes, int]] = []
    keys: dict[int, bytes] = {}

    def append(c: int, i: int) -> None:
        chain = chains[c]
        chain.members.append(i)
        chain_of[i] = c
        if ids[i]:
            request = requests[i]
            if chain.tail_ids:
                del by_length[bisect.bisect_left(by_length, (-len(chain.tail_ids), c))]
                del by_ids[bisect.bisect_left(by_ids, (keys[chain.tail], c))]
            chain.tail, chain.tail_ids, chain.tail_end, chain.tail_model = i, ids[i], request.end, request.model
            bisect.insort(by_length, (-len(ids[i]), c))
            bisect.insort(by_ids, (key_of(i), c))

    def key_of(i: int) -> bytes:
        key = keys.get(i)
        if key is None:
            key = keys[i] = _key(ids[i])
        return key

    # The keys in file order, built as the trace stores ids: what a request keeps of its predecessor's,
    # then what it adds (one short conversion each instead of the whole list). A list of ids that does not
    # follow that encoding falls back to `_key` per request.
    previous = b""
    for i, request in enumerate(requests):
        key = previous[: request.hash_ids_kept * ID_BYTES] + _key(request.hash_ids_added)
        if len(key) == len(ids[i]) * ID_BYTES:
            keys[i] = key
        previous = key

    for i in order:
        h, request = ids[i], requests[i]
        if not h or not chains:
            # No ids: no LCP evidence, so the request rides the main chain (chain 0) and is no tail.
            if not chains:
                chains.append(_Chain(members=[]))
            if h:
                append(0, i)
            else:
                chains[0].members.append(i)
                chain_of[i] = 0
            continue
        target = _extension_target(chains, by_length, h, request)
        if target is not None:
            append(target, i)
            continue
        parent, depth = _deepest_fork(by_ids, key_of(i))
        if parent is None and not any(chain.tail_ids for chain in chains):
            append(0, i)  # the first request with ids after id-less ones: it is the main agent
            continue
        fork_at = chains[parent].tail if parent is not None else None
        chains.append(_Chain(members=[], parent=parent, fork_at=fork_at, depth=depth, fork_t=request.t))
        append(len(chains) - 1, i)
        if fork_at is not None and depth > 0:
            forks_of.setdefault(fork_at, []).append(len(chains) - 1)

    seams = _splice_seams(requests, ids, order, chains, chain_of, forks_of, rules)
    return chains, chain_of, seams


ID_BYTES: Final = 8
"""Bytes per id in a tail key: hash ids are int64 (`agentx.trace.validate`)."""


def _key(ids: HashIds) -> bytes:
    """`ids` as fixed-width bytes: bytes order is an order of id sequences, element by element."""
    try:
        return np.asarray(ids, dtype=">i8").tobytes()
    except OverflowError:  # an id out of int64 (the trace was not validated): wrapped, still one width
        return np.asarray([i & 0xFFFF_FFFF_FFFF_FFFF for i in ids], dtype=">u8").tobytes()


def _key_lcp(a: bytes, b: bytes) -> int:
    """Common prefix of two keys, in ids."""
    n = min(len(a), len(b)) // ID_BYTES
    if n == 0 or a[:ID_BYTES] != b[:ID_BYTES]:
        return 0
    low, high = 1, n  # a prefix of `low` ids matches; one of `high + 1` does not
    while low < high:
        mid = (low + high + 1) // 2
        if a[low * ID_BYTES : mid * ID_BYTES] == b[low * ID_BYTES : mid * ID_BYTES]:
            low = mid
        else:
            high = mid - 1
    return low


def _deepest_fork(by_ids: Sequence[tuple[bytes, int]], h: bytes) -> tuple[int | None, int]:
    """(chain, common prefix in ids) of the tail sharing the longest prefix with key `h` (at least its first
    id), then the longest tail, then the lowest chain; (None, 0) when no tail starts like `h`."""
    position = bisect.bisect_left(by_ids, (h, -1))
    depth = max(
        (_key_lcp(by_ids[k][0], h) for k in (position - 1, position) if 0 <= k < len(by_ids)),
        default=0,
    )
    if depth == 0:
        return None, 0
    # Every tail starting with h's first `depth` ids (all share exactly that many): a contiguous run around
    # `position`.
    prefix = h[: depth * ID_BYTES]
    start = position
    while start > 0 and by_ids[start - 1][0].startswith(prefix):
        start -= 1
    best, parent = -1, None
    for k in range(start, len(by_ids)):
        tail, c = by_ids[k]
        if not tail.startswith(prefix):
            break
        if len(tail) > best or (len(tail) == best and parent is not None and c < parent):
            best, parent = len(tail), c
    return parent, depth


def _extension_target(
    chains: Sequence[_Chain], by_length: Sequence[tuple[int, int]], h: HashIds, request: Request
) -> int | None:
    """The chain whose tail is a prefix of `h`, ended by `request.t`, same model; deepest, then lowest
    (`by_length` lists the tails longest first, ties by chain: the first one that fits is the answer)."""
    n = len(h)
    for negative_length, c in by_length:
        length = -negative_length
        if length > n:
            continue
        chain = chains[c]
        tail = chain.tail_ids
        # Cheap filters first; the O(L) prefix comparison runs only for survivors.
        if tail[-1] != h[length - 1] or chain.tail_model != request.model or chain.tail_end > request.t + EPSILON_S:
            continue
        if h[:length] == tail:
            return c
    return None


def _splice_seams(
    requests: Sequence[Request],
    ids: Sequence[HashIds],
    order: Sequence[int],
    chains: list[_Chain],
    chain_of: dict[int, int],
    forks_of: dict[int, list[int]],
    rules: ChainRules,
) -> int:
    """Phase 2: splice compaction continuations onto tails whose longer state is never reused."""
    rank = {index: position for position, index in enumerate(order)}
    alias: dict[int, int] = {}

    def resolve(c: int) -> int:
        while c in alias:
            c = alias[c]
        return c

    def last_with_ids(chain: _Chain) -> int | None:
        return next((i for i in reversed(chain.members) if ids[i]), None)

    seams = 0
    queue = [(rank[i], i) for i in forks_of]  # fork sources in time order
    heapq.heapify(queue)
    done: set[int] = set()
    while queue:
        _, source = heapq.heappop(queue)
        if source in done:
            continue
        done.add(source)
        owner = resolve(chain_of[source])
        if last_with_ids(chains[owner]) != source:
            continue  # the longer state was extended later: every fork from it is a spawn
        registered = [c for c in forks_of[source] if chains[c].spliced_into is None]
        elected = _elect(requests, ids, chains, registered, source, rules)
        if elected is None:
            continue
        target = chains[elected]
        chains[owner].members.extend(target.members)
        for i in target.members:
            chain_of[i] = owner
        target.spliced_into = owner
        alias[elected] = owner
        seams += 1
        new_tail = last_with_ids(chains[owner])
        if new_tail is None:
            continue
        # Re-key the tail's other forks against the merged chain's new tail: a fork relates to the evolving
        # conversation, and phase 1 may have registered a later compaction under the consumed tail.
        rekeyed = False
        for c in registered:
            chain = chains[c]
            if c == elected or chain.spliced_into is not None:
                continue
            depth = _lcp(ids[new_tail], ids[chain.members[0]])
            if depth > 0:
                chain.fork_at, chain.depth, chain.parent = new_tail, depth, owner
                forks_of.setdefault(new_tail, []).append(c)
                rekeyed = True
        if rekeyed:
            done.discard(new_tail)
            heapq.heappush(queue, (rank[new_tail], new_tail))
    for chain in chains:
        if chain.spliced_into is None and chain.parent is not None:
            chain.parent = resolve(chain.parent)
    return seams


def _elect(
    requests: Sequence[Request],
    ids: Sequence[HashIds],
    chains: Sequence[_Chain],
    registered: Sequence[int],
    source: int,
    rules: ChainRules,
) -> int | None:
    """The continuation among the forks of a dead tail: deepest, then earliest, then lowest chain."""
    tail = requests[source]
    tail_end, tail_len = tail.end, len(ids[source])
    best: int | None = None
    best_key = (0, 0.0, 0)
    for c in registered:
        chain = chains[c]
        first = requests[chain.members[0]]
        if chain.depth <= 0 or tail_end > first.t + EPSILON_S or first.model != tail.model:
            continue
        # Seam guard: a compaction continues promptly; a far, low-overlap resume is a new conversation.
        if (
            tail_len
            and first.t - tail_end > rules.seam_max_gap_seconds
            and chain.depth / tail_len < rules.seam_min_overlap_ratio
        ):
            continue
        key = (chain.depth, -chain.fork_t, -c)
        if best is None or key > best_key:
            best, best_key = c, key
    return best


def _worker_groups(
    requests: Sequence[Request], chains: Sequence[_Chain], workers: Sequence[int], rules: ChainRules
) -> dict[int, tuple[int, int]]:
    """{chain: (group, member)} for chains of parallel fan-outs: forked at depth > 0 from one point, in
    connected components of overlapping `[t0, t1)` with at least `worker_group_min` members."""
    if rules.worker_group_min <= 0:
        return {}
    buckets: dict[tuple[int, int], list[tuple[float, int, float, int]]] = {}
    for c in workers:
        chain = chains[c]
        if chain.depth <= 0 or chain.parent is None or chain.fork_at is None:
            continue
        first = chain.members[0]
        t1 = max(requests[i].end for i in chain.members)
        buckets.setdefault((chain.parent, chain.fork_at), []).append((requests[first].t, first, t1, c))
    components: list[list[tuple[float, int, float, int]]] = []
    for bucket in buckets.values():
        bucket.sort()
        reach = -math.inf
        for item in bucket:
            # Sorted by start, an interval overlaps the current component iff it starts before the
            # component's furthest end (touching intervals do not overlap).
            if item[0] < reach:
                components[-1].append(item)
                reach = max(reach, item[2])
            else:
                components.append([item])
                reach = item[2]
    groups = sorted((comp for comp in components if len(comp) >= rules.worker_group_min), key=lambda g: g[0][:2])
    return {c: (group, member) for group, comp in enumerate(groups) for member, (_, _, _, c) in enumerate(comp)}


def _kind(
    requests: Sequence[Request],
    members: Sequence[int],
    main_model: str,
    main_peak_in: int,
    grouped: bool,
    rules: ChainRules,
) -> ChainKind:
    first = requests[members[0]]
    if 0 < len(members) <= rules.aux_max_requests and (
        (rules.aux_cross_model and first.model != main_model)
        or first.in_tokens < max(rules.aux_isl_floor, int(rules.aux_isl_ratio * main_peak_in))
    ):
        return "aux"
    if (
        rules.aux_reduction_osl_max > 0
        and len(members) == 1
        and 0 < first.out_tokens < rules.aux_reduction_osl_max
        and first.in_tokens >= rules.aux_isl_floor
        and first.in_tokens > rules.aux_reduction_ratio * first.out_tokens
    ):
        return "aux:red"
    return "wg" if grouped else "fa"


# ---------------------------------------------------------------------------------------------
# rebuilding the tree


def _split_session(session: Session, rules: ChainRules, block_size: int, counts: ChainCounts) -> Session:
    used = {agent.agent_id for agent, _, _ in session.agents()}
    root, _ = _split_agent(session.root, 0, rules, block_size, counts, used)  # no siblings at depth 0
    return session if root is session.root else msgspec.structs.replace(session, root=root)


def _split_agent(
    agent: Agent, depth: int, rules: ChainRules, block_size: int, counts: ChainCounts, used: set[str]
) -> tuple[Agent, list[Agent]]:
    """(the agent with its chains split off, chains to place next to it in its parent)."""
    requests = agent.requests
    ids = list(agent.iter_hash_ids())
    detection = _detect(requests, ids, rules)
    counts.add(detection.counts)
    chains = detection.chains

    # Subtrees first: they only need spawn positions remapped onto the main chain's requests.
    main = detection.main
    subagents: list[Agent] = []
    changed = bool(chains)
    for sub in agent.subagents:
        new_sub, sub_siblings = _split_agent(sub, depth + 1, rules, block_size, counts, used)
        if chains:
            new_sub = msgspec.structs.replace(new_sub, spawn_after=bisect.bisect_left(main, new_sub.spawn_after))
        changed = changed or new_sub is not sub or bool(sub_siblings)
        subagents.append(new_sub)
        for sibling in sub_siblings:
            subagents.append(msgspec.structs.replace(sibling, spawn_after=new_sub.spawn_after))
    if not changed:
        return agent, []

    prefix = f"{agent.agent_id}:" if agent.agent_id else ""
    main_first_ids = detection.main_first_ids
    declared = agent.tool_tokens + agent.system_tokens
    declared_blocks = -(-declared // block_size) if declared > 0 and block_size > 0 else 0
    main_keys = [(requests[i].t, i) for i in main]
    keys_sorted = all(a < b for a, b in itertools.pairwise(main_keys))
    here = depth == 0 or rules.subagent_chains == "child"
    derived: list[Agent] = []
    for members, suffix in chains:
        first = members[0]
        first_ids = ids[first]
        inherits = (
            declared_blocks > 0
            and len(first_ids) >= declared_blocks
            and len(main_first_ids) >= declared_blocks
            and first_ids[:declared_blocks] == main_first_ids[:declared_blocks]
        )
        spawn_after = 0
        if here:
            # SPAWN after the last main request before the chain's first one in (t, index) order. A chain
            # never starts before the main chain, whose first request is the earliest, so this is >= 1.
            key = (requests[first].t, first)
            if keys_sorted:
                spawn_after = bisect.bisect_left(main_keys, key)
            else:
                spawn_after = max((j + 1 for j, k in enumerate(main_keys) if k < key), default=0)
        derived.append(
            Agent(
                agent_id=_unique(prefix + suffix, used),
                requests=_reencode(requests, ids, members),
                spawn_after=spawn_after,
                t=requests[first].t,
                subagent_type=suffix.rsplit(":", 1)[0],
                models=list(dict.fromkeys(requests[i].model for i in members)),
                tool_tokens=agent.tool_tokens if inherits else 0,
                system_tokens=agent.system_tokens if inherits else 0,
            )
        )

    new_agent = msgspec.structs.replace(agent, requests=_reencode(requests, ids, main) if chains else list(requests))
    siblings: list[Agent] = []
    if here:
        subagents.extend(derived)
    else:
        # Same branch as the agent: same spawn point, spawn time and recorded end (hence the same join).
        siblings = [
            msgspec.structs.replace(
                chain_agent,
                t=agent.t,
                duration_ms=agent.duration_ms,
                subagent_type=agent.subagent_type,
                status=agent.status,
            )
            for chain_agent in derived
        ]
    subagents.sort(key=_spawn_key)  # stable: explicit subagents keep their order
    new_agent.subagents = subagents
    return new_agent, siblings


def _spawn_key(agent: Agent) -> tuple[int, float]:
    first_t = agent.t if agent.t is not None else (agent.requests[0].t if agent.requests else math.inf)
    return agent.spawn_after, first_t


def _unique(agent_id: str, used: set[str]) -> str:
    """`agent_id`, or with a `~k` suffix if the session already has it (agent ids must stay unique)."""
    candidate, k = agent_id, 1
    while candidate in used:
        k += 1
        candidate = f"{agent_id}~{k}"
    used.add(candidate)
    return candidate


def _reencode(requests: Sequence[Request], ids: Sequence[HashIds], members: Sequence[int]) -> list[Request]:
    """The requests `members`, delta-encoded against their new predecessors."""
    out: list[Request] = []
    previous = -1
    for i in members:
        request = requests[i]
        if previous == i - 1:
            out.append(request)  # the same predecessor as before (or none): the encoding holds
        else:
            kept, added = delta_encode(ids[previous] if previous >= 0 else (), ids[i])
            out.append(msgspec.structs.replace(request, hash_ids_kept=kept, hash_ids_added=added))
        previous = i
    return out
