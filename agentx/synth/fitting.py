"""Fitting the session model to a trace (`generate --like`).

One profile per recorded session, so the mixture keeps the corpus's spread of session kinds
(short chats next to 100-turn runs): its length, first prompt, per-turn growth, outputs, gaps,
compaction point and spawn rate come from that session; subagent shapes, fan-out and the
server-time model are pooled over the whole trace (single sessions hold too few of them).
Distributions are quantile tables of the recorded values (see agentx.synth.dist), so generated
values follow the recorded shapes without repeating them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from agentx.synth.dist import Dist
from agentx.synth.session_model import AgentShape, ApiTime, Profile, SessionModel
from agentx.trace.model import Agent, Trace
from agentx.trace.stats import join_index

LENGTH_JITTER = 0.15
"""Generated sessions are up to this much shorter or longer than the session they follow."""
MIN_USER_TOKENS = 16


def _point(value: float, spread: float = LENGTH_JITTER) -> Dist:
    return Dist(quantiles=(value * (1 - spread), value, value * (1 + spread)), log=True)


def _dist(values: Sequence[float], fallback: Dist, *, log: bool = True) -> Dist:
    return Dist.fit(values, log=log) if len(values) else fallback


COMPACTION_SHRINK = 0.8
"""A restart that leaves the prompt below this share of the previous one is a compaction; above, an edit."""


def _restarts(agent: Agent, block_size: int) -> list[int]:
    """Indices of requests that keep less than their predecessor's full blocks (a block of slack)."""
    requests = agent.requests
    return [
        i
        for i in range(1, len(requests))
        if requests[i].hash_ids_kept < requests[i - 1].in_tokens // block_size - 1
        or requests[i].in_tokens < requests[i - 1].in_tokens
    ]


def _compactions(agent: Agent, restarts: list[int]) -> list[int]:
    requests = agent.requests
    return [i for i in restarts if requests[i].in_tokens < COMPACTION_SHRINK * requests[i - 1].in_tokens]


def _added(agent: Agent, restarts: set[int]) -> list[int]:
    requests = agent.requests
    return [
        requests[i].in_tokens - requests[i - 1].in_tokens
        for i in range(1, len(requests))
        if i not in restarts and requests[i].in_tokens > requests[i - 1].in_tokens
    ]


def _gaps(agent: Agent) -> tuple[list[float], list[float]]:
    """The agent's own gaps (start minus its previous request's end) after tool_use responses, and
    after others (a person's turn); gaps with a spawn in them are left out (joins are modelled)."""
    spawned = {sub.spawn_after for sub in agent.subagents}
    tool: list[float] = []
    human: list[float] = []
    for index in range(1, len(agent.requests)):
        previous, request = agent.requests[index - 1], agent.requests[index]
        if index in spawned or previous.api_time is None:
            continue
        (human if previous.stop == "end_turn" else tool).append(max(0.0, request.t - previous.end))
    return tool, human


def _system_tokens(agent: Agent, block_size: int, restarts: list[int], default: float) -> int:
    first = agent.requests[0].in_tokens
    if agent.system_tokens or agent.tool_tokens:
        recorded = agent.system_tokens + agent.tool_tokens
    elif restarts:
        recorded = min(agent.requests[i].hash_ids_kept for i in restarts) * block_size
    else:
        recorded = round(default * first)
    return max(0, min(recorded, first - MIN_USER_TOKENS))


def _api(trace: Trace) -> ApiTime:
    """Least squares of api_time on new prompt, whole prompt and output tokens (non-negative terms only)."""
    rows, times = [], []
    for session in trace.sessions:
        for agent, _, _ in session.agents():
            for request in agent.requests:
                if request.api_time is not None:
                    new = max(0, request.in_tokens - request.hash_ids_kept * trace.block_size)
                    rows.append((1.0, float(new), float(request.in_tokens), float(request.out_tokens)))
                    times.append(request.api_time)
    if len(rows) < 4:
        return ApiTime()
    matrix, target = np.asarray(rows), np.asarray(times)
    columns = [0, 1, 2, 3]
    coefficients = np.zeros(4)
    while columns:  # drop terms that come out negative and refit
        solution = np.linalg.lstsq(matrix[:, columns], target, rcond=None)[0]
        coefficients = np.zeros(4)
        coefficients[columns] = solution
        negative = [c for c in columns if coefficients[c] < 0]
        if not negative:
            break
        columns = [c for c in columns if c not in negative]
        coefficients = np.zeros(4)
    base, per_new, per_context, per_out = (float(c) for c in coefficients)
    return ApiTime(
        base_s=base,
        prefill_tokens_per_s=1.0 / per_new if per_new > 1e-12 else None,
        context_tokens_per_s=1.0 / per_context if per_context > 1e-12 else None,
        decode_tokens_per_s=1.0 / per_out if per_out > 1e-12 else None,
    )


def fit(trace: Trace, *, source: str = "") -> SessionModel:
    """A session model resembling `trace` (ValueError if it has no requests)."""
    size = trace.block_size
    roots = [s.root for s in trace.sessions if s.root.requests]
    if not roots:
        raise ValueError("the trace has no root requests to fit")
    families = [[a for a, parent, _ in s.agents() if parent is not None and a.requests] for s in trace.sessions]
    every = [r for s in trace.sessions for a, _, _ in s.agents() for r in a.requests]
    tool_all: list[float] = []
    human_all: list[float] = []
    for root in roots:
        tool, human = _gaps(root)
        tool_all += tool
        human_all += human
    tool_fallback = _dist(tool_all, Dist.constant(5.0))
    human_fallback = _dist(human_all, tool_fallback)
    out_fallback = Dist.fit([r.out_tokens for r in every])
    recorded = [
        (r.system_tokens + r.tool_tokens) / r.requests[0].in_tokens
        for r in roots
        if (r.system_tokens or r.tool_tokens) and r.requests[0].in_tokens
    ]
    system_share = float(np.median(recorded)) if recorded else 0.8
    added_all = [a for r in roots for a in _added(r, set(_compactions(r, _restarts(r, size))))]
    added_fallback = _dist(added_all, Dist.constant(500.0))

    sub_shape = _sub_shape(families, size, tool_fallback, out_fallback) if any(families) else None
    # Spawn points: a lone subagent nothing joins is a background spawn; the rest are joined groups.
    groups: Counter[tuple[int, int]] = Counter()
    lone_background: set[tuple[int, int]] = set()
    for session in trace.sessions:
        for agent, parent, _ in session.agents():
            if parent is not None:
                groups[(id(parent), agent.spawn_after)] += 1
    for session in trace.sessions:
        for agent, parent, _ in session.agents():
            point = (id(parent), agent.spawn_after)
            if parent is not None and groups[point] == 1 and agent.requests and join_index(parent, agent) is None:
                lone_background.add(point)
    joined_sizes = [size for point, size in groups.items() if point not in lone_background]
    fan_out = Dist.fit(joined_sizes, discrete=True) if joined_sizes else Dist.constant(1)
    background_share = len(lone_background) / len(groups) if groups else 0.0

    profiles = []
    for root in roots:
        restarts = _restarts(root, size)
        system = _system_tokens(root, size, restarts, system_share)
        requests = root.requests
        tool, human = _gaps(root)
        stops = [r.stop for r in requests[:-1]]
        spawns = len({sub.spawn_after for sub in root.subagents})
        compact_at = 0
        summary = Dist.constant(8000)
        compactions = _compactions(root, restarts)
        if compactions:
            compact_at = round(float(np.median([requests[i - 1].in_tokens for i in compactions])))
            summary = _dist([max(MIN_USER_TOKENS, requests[i].in_tokens - system) for i in compactions], summary)
        added = _added(root, set(compactions))
        shape = AgentShape(
            model=Counter(r.model for r in requests).most_common(1)[0][0],
            requests=_point(len(requests)),
            system_tokens=system,
            first_user_tokens=_point(max(MIN_USER_TOKENS, requests[0].in_tokens - system), 0.1),
            added_tokens=_dist(added, added_fallback),
            context_tokens=Dist.fit([r.in_tokens for r in requests]),
            edit_share=len(restarts) / max(1, len(requests) - 1),
            out_tokens=_dist([r.out_tokens for r in requests], out_fallback),
            tool_gap_s=_dist(tool, tool_fallback),
            human_gap_s=_dist(human, human_fallback),
            end_turn_share=stops.count("end_turn") / len(stops) if stops else 0.0,
            compact_at_tokens=compact_at,
            summary_tokens=summary,
        )
        profiles.append(
            Profile(
                root=shape,
                sub=sub_shape,
                spawn_share=min(1.0, spawns / max(1, len(requests) - 1)),
                fan_out=fan_out,
                background_share=background_share,
            )
        )
    starts = sorted(s.start_s for s in trace.sessions)
    span = starts[-1] - starts[0]
    return SessionModel(
        name="like",
        source=source or "fitted to a trace",
        block_size=size,
        profiles=tuple(profiles),
        api=_api(trace),
        session_rate_per_s=(len(starts) - 1) / span if span > 0 else 0.0,
    )


def _sub_shape(families: list[list[Agent]], size: int, tool_fallback: Dist, out_fallback: Dist) -> AgentShape:
    subs = [agent for family in families for agent in family]
    recorded = [a.system_tokens + a.tool_tokens for a in subs if a.system_tokens or a.tool_tokens]
    firsts = [a.requests[0].in_tokens for a in subs]
    if recorded:
        system = int(np.median(recorded))
    else:  # siblings share their system prompt: the blocks their first prompts have in common
        shared = []
        for siblings in families:
            ids = [a.hash_ids(0) for a in siblings]
            for a, b in pairwise(ids):
                n = 0
                while n < min(len(a), len(b)) and a[n] == b[n]:
                    n += 1
                shared.append(n * size)
        system = int(np.median(shared)) if shared else 0
    system = max(0, min(system, min(firsts) - MIN_USER_TOKENS))
    added = [x for a in subs for x in _added(a, set(_restarts(a, size)))]
    tool = [gap for a in subs for gaps in _gaps(a) for gap in gaps]
    return AgentShape(
        model=Counter(r.model for a in subs for r in a.requests).most_common(1)[0][0],
        requests=Dist.fit([len(a.requests) for a in subs], discrete=True),
        system_tokens=system,
        first_user_tokens=Dist.fit([max(MIN_USER_TOKENS, f - system) for f in firsts]),
        added_tokens=_dist(added, Dist.constant(500.0)),
        out_tokens=_dist([r.out_tokens for a in subs for r in a.requests], out_fallback),
        tool_gap_s=_dist(tool, tool_fallback),
        human_gap_s=_dist(tool, tool_fallback),
    )
