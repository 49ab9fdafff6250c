"""Writing Weka / AgentX trace JSON (the wire format is `agentx.trace.formats.weka`): keys as the reference writes them,
legacy subagents' relative times and the defaults a source wrote explicitly restored as read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from agentx.trace.formats.weka import WekaRequest, WekaStreamedRequest, WekaSubagent, WekaTrace
from agentx.trace.model import Agent, Request, Session, Trace

_ENCODER = msgspec.json.Encoder()


def write_weka(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write one trace per line (JSONL); a `.json` path with a single session gets one object.

    Written keys are the reference's own, so AIPerf loads the file, except that a global-scope
    trace says `hash_id_scope: "global"`. Dropped: `Session.start_s`, `acceptance_length`.
    """
    path = Path(path)
    single = path.suffix == ".json" and len(trace.sessions) == 1
    with open(path, "wb") as out:
        for session in trace.sessions:
            out.write(_ENCODER.encode(weka_object(session, trace)))
            if not single:
                out.write(b"\n")


def weka_object(session: Session, trace: Trace) -> WekaTrace:
    """The Weka wire form of one session."""
    root = session.root
    return WekaTrace(
        id=session.session_id,
        models=list(session.models),
        block_size=trace.block_size,
        hash_id_scope="global" if trace.hash_id_scope == "global" else "local",
        tool_tokens=root.tool_tokens,
        system_tokens=root.system_tokens,
        requests=_wire_entries(root),
        totals=session.totals,
    )


def _wire_entries(agent: Agent) -> list[WekaRequest | WekaStreamedRequest | WekaSubagent]:
    calls: list[WekaRequest | WekaStreamedRequest | WekaSubagent] = []
    offset = agent.t if agent.relative_times and agent.t is not None else None
    for request, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True):
        kind = WekaStreamedRequest if request.type == "s" else WekaRequest
        calls.append(
            kind(
                t=request.t if offset is None else round(request.t - offset, 9),
                model=request.model,
                in_tokens=request.in_tokens,
                out_tokens=request.out_tokens,
                hash_ids=msgspec.Raw(_ENCODER.encode(ids)),
                input_types=_written(list(request.input_types), "input_types", request),
                output_types=_written(list(request.output_types), "output_types", request),
                stop=_written(request.stop, "stop", request),
                api_time=request.api_time,
                ttft=request.ttft,
                think_time=request.think_time,
            )
        )
    entries: list[WekaRequest | WekaStreamedRequest | WekaSubagent] = []
    subagents = iter(agent.subagents)
    pending = next(subagents, None)
    for index in range(len(calls) + 1):
        while pending is not None and pending.spawn_after == index:
            entries.append(_wire_subagent(pending))
            pending = next(subagents, None)
        if index < len(calls):
            entries.append(calls[index])
    while pending is not None:  # spawn_after out of range: keep it rather than lose it
        entries.append(_wire_subagent(pending))
        pending = next(subagents, None)
    return entries


_T = TypeVar("_T", list[str], str)


def _written(value: _T, key: str, request: Request) -> _T | UnsetType:
    """The value, or UNSET (left out) where it is the default and the source did not write it."""
    return value if value or key in request.explicit_defaults else UNSET


def _wire_subagent(agent: Agent) -> WekaSubagent:
    return WekaSubagent(
        t=agent.t if agent.t is not None else (agent.requests[0].t if agent.requests else 0.0),
        agent_id=agent.agent_id,
        subagent_type=agent.subagent_type,
        duration_ms=agent.duration_ms,
        total_tokens=agent.total_tokens,
        tool_use_count=agent.tool_use_count,
        status=agent.status,
        requests=_wire_entries(agent),
        models=list(agent.models),
        tool_tokens=agent.tool_tokens,
        system_tokens=agent.system_tokens,
    )
