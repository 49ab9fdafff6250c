"""The trace model: Trace → Session → Agent (tree) → Request.

All times are seconds on the session's own clock unless a name says otherwise; `Session.start_s`
places a session on the trace's clock (0 for Weka traces, the arrival time for Mooncake rows).

Hash ids are stored delta-encoded against the previous request of the same agent: a request
keeps the first `hash_ids_kept` ids of its predecessor and appends `hash_ids_added`. Agentic
contexts grow turn by turn, so this holds a ~100k-request corpus in megabytes instead of the
gigabytes its ~150M full id lists would take. `Agent.hash_ids(i)` and `Agent.iter_hash_ids()`
give the full lists back.

Invariants (checked by `agentx.trace.validation`):
- `0 <= hash_ids_kept <= len(previous request's hash_ids)`, and 0 on an agent's first request;
- times are finite and non-negative; `in`/`out` are non-negative;
- agent ids are unique within a session; the root agent's id is `""`;
- `Agent.spawn_after` is in `[0, len(parent.requests)]`; subagents are listed in spawn order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec

FORMAT_NAME = "agentx-trace"
FORMAT_VERSION = "1.1"
"""1.1: the `explicit_defaults` column."""

HashScope = Literal["session", "global"]
RequestType = Literal["n", "s"]


class Request(msgspec.Struct, kw_only=True, frozen=True):
    """One LLM call.

    `t` is the start, `think_time` the recorded gap from the previous row's end across the whole
    session (None on the first row), `api_time` the recorded server duration and `ttft` the
    recorded time to first token (streamed requests only); all seconds, None when unknown.
    `type` is the recording transport ("n" plain, "s" streamed); replay ignores it.
    """

    t: float
    model: str
    in_tokens: int
    out_tokens: int
    hash_ids_kept: int = 0
    hash_ids_added: tuple[int, ...] = ()
    think_time: float | None = None
    api_time: float | None = None
    ttft: float | None = None
    type: RequestType = "n"
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    stop: str = ""
    acceptance_length: float | None = None
    """Forced speculative acceptance length for this request (counting the bonus token)."""
    explicit_defaults: frozenset[str] = frozenset()
    """Optional keys the source wrote although at their default value (`input_types: []`,
    `output_types: []`, `stop: ""`), which a Weka writer would otherwise leave out: written back as
    read. Names a key only where the value is the default."""

    @property
    def hash_ids_len(self) -> int:
        return self.hash_ids_kept + len(self.hash_ids_added)

    @property
    def end(self) -> float:
        """Recorded end: `t + api_time`, with an unknown api_time counted as 0."""
        return self.t + (self.api_time or 0.0)


class Agent(msgspec.Struct, kw_only=True):
    """The root agent of a session or one of its subagents (which may nest).

    For a subagent, `spawn_after` is how many of its parent's requests precede it in the
    recorded order (where the Weka `subagent` entry stood), `t` its recorded spawn time and
    `duration_ms` its recorded run time. The root has `agent_id == ""`, `spawn_after == 0`.
    """

    agent_id: str = ""
    requests: list[Request] = msgspec.field(default_factory=list)
    subagents: list[Agent] = msgspec.field(default_factory=list)
    spawn_after: int = 0
    t: float | None = None
    subagent_type: str = ""
    status: str = ""
    duration_ms: int | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None
    models: list[str] = msgspec.field(default_factory=list)
    tool_tokens: int = 0
    system_tokens: int = 0
    relative_times: bool = False
    """The source recorded this subagent's request times relative to its spawn (legacy Weka);
    `Request.t` is absolute regardless, and the Weka writer restores the relative form."""

    def hash_ids(self, index: int) -> tuple[int, ...]:
        """The full hash ids of request `index` (O(index) to rebuild)."""
        ids: tuple[int, ...] = ()
        for i, ids in enumerate(self.iter_hash_ids()):
            if i == index:
                return ids
        raise IndexError(index)

    def iter_hash_ids(self) -> Iterator[tuple[int, ...]]:
        """The full hash ids of every request, in order."""
        ids: tuple[int, ...] = ()
        for request in self.requests:
            ids = ids[: request.hash_ids_kept] + request.hash_ids_added
            yield ids

    def walk(self, depth: int = 0, parent: Agent | None = None) -> Iterator[tuple[Agent, Agent | None, int]]:
        """This agent and its descendants, depth first: (agent, parent, depth)."""
        yield self, parent, depth
        for sub in self.subagents:
            yield from sub.walk(depth + 1, self)

    @property
    def end(self) -> float:
        """Recorded end: spawn + duration, else the last request's end, else the spawn time."""
        if self.t is not None and self.duration_ms is not None and self.duration_ms >= 0:
            return self.t + self.duration_ms / 1000.0
        if self.requests:
            return max(r.end for r in self.requests)
        return self.t if self.t is not None else 0.0


class Session(msgspec.Struct, kw_only=True):
    """One recorded agent run (a Weka "trace"): its root agent and the tree under it.

    `totals` is the producer's opaque summary, kept only so conversions lose nothing.
    """

    session_id: str
    root: Agent
    start_s: float = 0.0
    models: list[str] = msgspec.field(default_factory=list)
    totals: dict[str, object] | None = None

    def agents(self) -> Iterator[tuple[Agent, Agent | None, int]]:
        """Every agent of the session, depth first: (agent, parent, depth)."""
        return self.root.walk()

    @property
    def request_count(self) -> int:
        if not self.root.subagents:  # most sessions of a Mooncake-size trace: no tree to walk
            return len(self.root.requests)
        return sum(len(agent.requests) for agent, _, _ in self.agents())


class Provenance(msgspec.Struct, kw_only=True):
    """Where a trace came from."""

    source_format: str = ""
    source_path: str = ""
    notes: list[str] = msgspec.field(default_factory=list)


class Trace(msgspec.Struct, kw_only=True):
    """Many sessions sharing one block size and hash-id scope.

    `hash_id_scope == "session"`: equal ids in different sessions are unrelated (Weka `local`);
    `"global"`: ids mean the same block everywhere (Mooncake, Bailian).
    """

    sessions: list[Session]
    block_size: int
    hash_id_scope: HashScope = "session"
    format_name: str = FORMAT_NAME
    format_version: str = FORMAT_VERSION
    provenance: Provenance = msgspec.field(default_factory=Provenance)

    @property
    def request_count(self) -> int:
        return sum(s.request_count for s in self.sessions)


def delta_encode(previous: Sequence[int], current: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """Split `current` into (ids kept from `previous`, ids added) by their longest common prefix."""
    prev = previous if isinstance(previous, list) else list(previous)
    cur = current if isinstance(current, list) else list(current)
    n = min(len(prev), len(cur))
    # Growing contexts extend the previous prompt: one C-level comparison settles the common case.
    if cur[:n] == prev[:n]:
        return n, tuple(cur[n:])
    low, high = 0, n - 1  # a prefix of length `low` matches; one of length `high + 1` does not
    while low < high:
        mid = (low + high + 1) // 2
        if cur[low:mid] == prev[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low, tuple(cur[low:])
