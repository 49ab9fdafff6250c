"""Traces for tests, built in one place: a change to `agentx.trace.model` reaches the suite here."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from agentx.trace.model import Agent, HashScope, Request, RequestType, Session, Trace

if TYPE_CHECKING:
    import pyarrow as pa


class RequestExtras(TypedDict, total=False):
    """The `Request` fields `make_request` does not name, each at the model's default when left out."""

    think_time: float | None
    ttft: float | None
    type: RequestType
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    stop: str
    acceptance_length: float | None
    explicit_defaults: frozenset[str]


def make_request(
    t: float = 0.0,
    in_tokens: int = 16,
    out_tokens: int = 4,
    *,
    model: str = "m",
    api_time: float | None = None,
    kept: int = 0,
    added: tuple[int, ...] = (),
    **extras: Unpack[RequestExtras],
) -> Request:
    """A request at `t`: `kept` is `hash_ids_kept`, `added` is `hash_ids_added`."""
    return Request(
        t=t,
        model=model,
        in_tokens=in_tokens,
        out_tokens=out_tokens,
        api_time=api_time,
        hash_ids_kept=kept,
        hash_ids_added=added,
        **extras,
    )


def make_agent(
    agent_id: str,
    requests: Iterable[Request],
    *,
    spawn_after: int = 0,
    t: float | None = None,
    subagents: Iterable[Agent] = (),
) -> Agent:
    """A subagent spawned after `spawn_after` of its parent's requests, at recorded time `t`."""
    return Agent(agent_id=agent_id, requests=list(requests), subagents=list(subagents), spawn_after=spawn_after, t=t)


def make_session(session_id: str, requests: Iterable[Request], *, subagents: Iterable[Agent] = ()) -> Session:
    """A session whose root agent makes `requests` and spawns `subagents`."""
    return Session(session_id=session_id, root=Agent(requests=list(requests), subagents=list(subagents)))


def make_trace(*sessions: Session, block_size: int = 16, hash_id_scope: HashScope = "session") -> Trace:
    """A trace of `sessions`, in order."""
    return Trace(sessions=list(sessions), block_size=block_size, hash_id_scope=hash_id_scope)


def growing_chain(
    n: int,
    *,
    start: float = 0.0,
    gap_s: float = 1.0,
    first_in_tokens: int = 40,
    in_tokens_step: int = 37,
    out: int = 4,
    api_time: float = 0.5,
    base: int = 0,
    block_size: int = 16,
) -> list[Request]:
    """`n` requests `gap_s` apart from `start`, request i of `first_in_tokens + in_tokens_step * i` tokens over ids
    `base + 0, …` (one per block, a partial last block counted): each keeps every id of the one before and adds the
    rest."""
    requests = []
    kept = 0
    for i in range(n):
        in_tokens = first_in_tokens + in_tokens_step * i
        blocks = -(-in_tokens // block_size)
        added = tuple(range(base + kept, base + blocks))
        requests.append(make_request(start + i * gap_s, in_tokens, out, api_time=api_time, kept=kept, added=added))
        kept = blocks
    return requests


def write_trace_table(table: pa.Table, path: Path, **metadata: bytes | None) -> Path:
    """Write `table` (a native trace table, `agentx.trace.formats.arrow.to_table`, perhaps edited) as an Arrow IPC
    file, each `agentx.<key>` of its schema metadata set to the value given, or removed for None."""
    import pyarrow as pa  # only for the tests that write tables
    import pyarrow.ipc as ipc

    kept = dict(table.schema.metadata or {})
    for key, value in metadata.items():
        name = f"agentx.{key}".encode()
        if value is None:
            kept.pop(name, None)
        else:
            kept[name] = value
    table = table.replace_schema_metadata(kept)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path
