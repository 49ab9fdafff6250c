"""Hidden agents: split "flattened" subagents out of an agent's request list (docs/agentx.md §3b).

Some traces (Weka/AgentX corpora converted from proxy logs) record subagents flattened into one request
list: a session's top-level requests interleave several independent conversations. The reference finds
them by hash-id longest-common-prefix (LCP) chains; `split_flattened_agents` does the same as a pure
trace transformation, on the root's requests and, separately, on each subagent's.

**Detection** (`agentx.trace.chain_detection`): a preamble is set aside, then each request extends the chain
whose tail its ids extend, or forks a new one from the deepest common prefix; compaction continuations are
spliced back onto their chain. **Classification** (`agentx.trace.chain_kinds`): the chain holding the earliest
request stays the agent's own requests; the others are `aux`, `aux:red`, `wg` or `fa`. The thresholds and the
counts of what was found are in `agentx.trace.chain_rules` (importable from here too).

**Placement** (this module). A top-level chain becomes a subagent of the root with `agent_id` `fa:NNN`
(`aux:NNN`, `aux:red:NNN`, `wg:GGG_MMM`), spawned after the last main request before its first request (SPAWN)
and spawn time = its first request's `t`, with no `duration_ms`, so `stats.join_index` joins it at the first
later main request with `t >= chain end` (JOIN). A chain found inside subagent `X` is named `X:fa:NNN`
etc. By default (`subagent_chains="sibling"`, the reference) it becomes a *sibling* of `X`: same parent,
`spawn_after`, spawn `t` and `duration_ms`, so the plan puts it in `X`'s branch, dispatched at its recorded
offset from the branch start and joined with `X`. `"child"` makes it a subagent of `X` placed like a
top-level chain instead. Derived chains get their agent's declared tool/system tokens only if their first
ids start with the same `ceil((tool + system) / block_size)` blocks as the main chain's.

Requests are only moved: `t`, sizes, times and full hash ids are unchanged; hash ids are re-encoded
against each request's new predecessor (requests whose predecessor did not change keep their object).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import msgspec

from agentx.trace.chain_detection import HashIds
from agentx.trace.chain_kinds import CHAIN_KINDS, detect
from agentx.trace.chain_rules import DEFAULT_RULES, ChainCounts, ChainReport, ChainRules, SubagentChains
from agentx.trace.model import Agent, Request, Session, Trace, delta_encode

__all__ = [
    "CHAIN_KINDS",
    "DEFAULT_RULES",
    "ChainCounts",
    "ChainReport",
    "ChainRules",
    "SubagentChains",
    "split_flattened_agents",
    "split_trace",
]


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
    detection = detect(requests, ids, rules)
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
