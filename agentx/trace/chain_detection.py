"""Finding the chains in one agent's requests (docs/agentx.md §3b): the preamble, phase 1, phase 2.

A chain is one conversation: each request's hash ids extend, or keep a prefix of, those of the one before it.
`agentx.trace.chain_kinds` names what is found here; `agentx.trace.chains` turns it into agents.

Requests are taken in `(t, index)` order:

- *Preamble* (`find_preamble`): the earliest request is set aside (and re-attached to the main chain
  afterwards) when it shares no first block with any other request and either `out <= preamble_max_out` or
  none of its blocks appears anywhere else (a Claude Code title call must not found the main chain).
- *Phase 1, greedy* (`find_chains`): a request **extends** the chain whose tail ids are a prefix of its ids
  (deepest tail wins, then the lowest chain), if that tail has ended by its start and ran on the same model.
  Otherwise it **forks** a new chain from the tail with the deepest LCP (depth 0: no shared prefix). Requests
  without ids stay on the main chain and never act as tails.
- *Phase 2, seams*: a fork that keeps only a prefix of its tail (compaction) is the same agent going on if
  the longer state is never reused: for each fork-source tail that is still its chain's last request, the
  deepest eligible fork (same model, starts after the tail ends, not "gap > `seam_max_gap_seconds` and kept
  ratio < `seam_min_overlap_ratio`") is spliced onto the chain; the other forks of that tail are re-keyed
  against the new tail so chained compactions collapse too.

**Complexity** per agent of `n` requests with ids of length ≤ `L` and `C` chains: building the full ids is
O(n·L) element copies (C-level tuple slicing); phase 1 is O(n·C) cheap filters (length, last id, model,
end) plus one O(L) tuple comparison per surviving candidate; forks cost O(C·L) each; phase 2 (and the
grouping of `agentx.trace.chain_kinds`) is O(F log F + F·L) for `F` forks. A session without flattened agents
(the usual case: C = 1) is O(n·L).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from agentx.trace.chain_rules import ChainRules
from agentx.trace.model import Request
from agentx.trace.stats import JOIN_EPSILON_S

EPSILON_S = JOIN_EPSILON_S
"""Temporal slack of every "has ended by" test, as in the reference (1e-6 s)."""

HashIds = tuple[int, ...]


@dataclass(slots=True)
class Chain:
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


def common_prefix_len(a: HashIds, b: HashIds) -> int:
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


def find_preamble(
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


def find_chains(
    requests: Sequence[Request], ids: Sequence[HashIds], order: Sequence[int], rules: ChainRules
) -> tuple[list[Chain], dict[int, int], int]:
    """Phases 1 and 2: (chains, chain of each request, seams spliced)."""
    chains: list[Chain] = []
    chain_of: dict[int, int] = {}
    forks_of: dict[int, list[int]] = {}  # fork-source request → chains forked from it (depth > 0)
    # (−len(tail_ids), chain) of every chain with a tail, sorted: the longest tails first. A tail shorter than
    # the best common prefix found so far cannot beat it, so the fork search below stops there, and a
    # session whose every turn forks (a partial last block changes its id) costs ~1 LCP a turn, not one per
    # earlier turn.
    by_length: list[tuple[int, int]] = []
    # (tail key, chain), in lexicographic order: the tails sharing the longest prefix with a request's ids sit
    # next to where those ids would go, so the fork search looks at neighbours, not at every chain. Keys are
    # the ids packed as fixed-width bytes (`sort_key`): compared by memcmp, not id by id.
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
            key = keys[i] = sort_key(ids[i])
        return key

    # The keys in file order, built as the trace stores ids: what a request keeps of its predecessor's,
    # then what it adds (one short conversion each instead of the whole list). A list of ids that does not
    # follow that encoding falls back to `sort_key` per request.
    previous = b""
    for i, request in enumerate(requests):
        key = previous[: request.hash_ids_kept * ID_BYTES] + sort_key(request.hash_ids_added)
        if len(key) == len(ids[i]) * ID_BYTES:
            keys[i] = key
        previous = key

    for i in order:
        h, request = ids[i], requests[i]
        if not h or not chains:
            # No ids: no LCP evidence, so the request rides the main chain (chain 0) and is no tail.
            if not chains:
                chains.append(Chain(members=[]))
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
        parent, depth = deepest_fork(by_ids, key_of(i))
        if parent is None and not any(chain.tail_ids for chain in chains):
            append(0, i)  # the first request with ids after id-less ones: it is the main agent
            continue
        fork_at = chains[parent].tail if parent is not None else None
        chains.append(Chain(members=[], parent=parent, fork_at=fork_at, depth=depth, fork_t=request.t))
        append(len(chains) - 1, i)
        if fork_at is not None and depth > 0:
            forks_of.setdefault(fork_at, []).append(len(chains) - 1)

    seams = _splice_seams(requests, ids, order, chains, chain_of, forks_of, rules)
    return chains, chain_of, seams


ID_BYTES: Final = 8
"""Bytes per id in a tail key: hash ids are int64 (`agentx.trace.validation`)."""


def sort_key(ids: HashIds) -> bytes:
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


def deepest_fork(by_ids: Sequence[tuple[bytes, int]], h: bytes) -> tuple[int | None, int]:
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
    chains: Sequence[Chain], by_length: Sequence[tuple[int, int]], h: HashIds, request: Request
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
    chains: list[Chain],
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

    def last_with_ids(chain: Chain) -> int | None:
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
            depth = common_prefix_len(ids[new_tail], ids[chain.members[0]])
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
    chains: Sequence[Chain],
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
