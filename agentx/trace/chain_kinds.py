"""What each chain found in an agent's requests is, and its name (docs/agentx.md §3b).

`detect` runs `agentx.trace.chain_detection` on one agent's requests. The *main chain* is the one holding the
earliest request; it stays the agent's own requests. The other chains are classified, first match wins
(thresholds are `ChainRules` fields): `aux` (≤ `aux_max_requests` requests and a small first `in` or another
model), `aux:red` (one same-model large-in/short-out request), `wg:GGG_MMM` (forked at depth > 0, ≥
`worker_group_min` chains from one fork point with overlapping `[t0, t1)`), else `fa:NNN`. `NNN` is the chain's
rank among the agent's derived chains by first request; `GGG`/`MMM` number groups by start and members within
a group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from agentx.trace.chain_detection import Chain, HashIds, find_chains, find_preamble
from agentx.trace.chain_rules import ChainCounts, ChainRules
from agentx.trace.model import Request

ChainKind = Literal["fa", "aux", "aux:red", "wg"]

CHAIN_KINDS: Final = frozenset({"fa", "aux", "aux:red", "wg"})
"""`subagent_type` of the agents split out of a flattened root: the root's own turns, not subagents."""


@dataclass(slots=True)
class Detection:
    """One agent's requests sorted into its main chain and its named derived chains."""

    main: list[int]
    """The main chain's requests (preamble included), ascending index."""
    main_first_ids: HashIds
    """The ids of the detected main chain's first request with ids (preamble excluded)."""
    chains: list[tuple[list[int], str]]
    """Derived chains: (requests in (t, index) order, name suffix such as "fa:000"), by first request."""
    counts: ChainCounts = field(default_factory=ChainCounts)


def detect(requests: Sequence[Request], ids: Sequence[HashIds], rules: ChainRules) -> Detection:
    """The chains of one agent's `requests` (`ids`: each one's full hash ids), the main one and the named others."""
    n = len(requests)
    counts = ChainCounts(without_ids=sum(1 for i in range(n) if not ids[i]))
    order = sorted(range(n), key=lambda i: (requests[i].t, i))
    preamble = find_preamble(requests, ids, order, rules)
    if preamble is not None:
        counts.preambles = 1
        order = [i for i in order if i != preamble]
    chains, chain_of, seams = find_chains(requests, ids, order, rules)
    counts.seams = seams
    if not order:
        return Detection(main=list(range(n)), main_first_ids=(), chains=[], counts=counts)
    main_index = chain_of[order[0]]
    rank = {index: position for position, index in enumerate(order)}
    workers = [c for c in range(len(chains)) if chains[c].spliced_into is None and c != main_index]
    if not workers:
        return Detection(main=list(range(n)), main_first_ids=(), chains=[], counts=counts)
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
    return Detection(main=main, main_first_ids=main_first_ids, chains=named, counts=counts)


def _worker_groups(
    requests: Sequence[Request], chains: Sequence[Chain], workers: Sequence[int], rules: ChainRules
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
