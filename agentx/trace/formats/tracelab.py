"""TraceLab round JSONL (uw-syfi/TraceLab: real Claude Code and Codex sessions), read only.

One LLM round per line, sanitized or derived (the derived rows also carry `session_file`, `home` and `user`, which
are ignored): `session_id`, `round_index`, `model`, `input_tokens_total = prefix_tokens + newly_append_tokens` (the
cached prefix and the new part), `output_tokens` (reasoning included), `timing_events[]` (`user_message`,
`tool_result`, `reasoning`, `text`, `tool_call`, Codex's `usage_report`, each timestamped) and `tools[]`. Plain or
gzip. How each field becomes the trace's:

- **Sessions and agents.** Rows sharing a `session_id` form a session, its rounds in `round_index` order, then file
  order (the natural keys are not unique: a subagent's transcript shares its parent's session id and numbers its
  rounds from 0 again). The rows of one `session_file` (derived rows) form one agent; without it (sanitized rows) the
  k-th row of a `round_index`, in that order, belongs to the k-th agent. A thread whose rounds repeat another's
  exactly (the same session ingested twice) is dropped, with one warning for the file. The agent whose first round
  starts first is the root; each other is a subagent of the latest-starting agent whose rounds span its start (its
  `spawn_after` the parent's rounds started by then), or, spanned by none, a session of its own (`<session_id>#2`,
  ...).
- **Tokens and prefix reuse.** `in` = `input_tokens_total`, `out` = `output_tokens`; hash ids by the rule of
  agentx.trace.formats.cached_prefix from `prefix_tokens`: a round shares `prefix_tokens // block_size` whole blocks
  with its agent's previous round (an agent's first round with the first rounds of its model's other sessions, the
  root's and the subagents' apart), 64 tokens a block unless `block_size` says otherwise; scope "global".
- **Time.** A round starts at its last input event (`user_message`, `tool_result`) before its first output event and
  ends at its last event; `api_time` is the difference, `ttft` the first output event's offset (the log stamps a
  whole block, so it is an upper bound; the rounds were streamed: type "s"), `think_time` the gap from the agent's
  previous round's end: what the agent waited on (tools, the user). A round with no input event starts as its agent's
  previous round ended (the first: at its first event). Times are on the session's clock; a session's `start_s` is
  its first round's start after the file's first.
- **Types.** `input_types` from the input events (`text` for a user message, `tool_result`), `output_types` from the
  output events (`thinking`, `text`, `tool_use`), as Weka traces name them.

Dropped: tools (their latencies are in the think times), the Claude cache split, the current-input summaries,
provenance keys and the ids other than the session's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Final

import msgspec

from agentx.trace.findings import Findings
from agentx.trace.formats.cached_prefix import CachedPrefixIds
from agentx.trace.formats.mooncake import bad_length
from agentx.trace.formats.textfile import json_error, jsonl_lines
from agentx.trace.model import Agent, Provenance, Request, Session, Trace
from agentx.trace.validation import MAX_TOKENS_PER_REQUEST, check_session, check_trace_header

DEFAULT_BLOCK_SIZE: Final = 64

_INPUT_TYPES: Final = {"user_message": "text", "tool_result": "tool_result"}
_OUTPUT_TYPES: Final = {"reasoning": "thinking", "text": "text", "tool_call": "tool_use", "usage_report": ""}


class _Event(msgspec.Struct):
    event_type: str = ""
    timestamp: datetime | None = None


class _Row(msgspec.Struct, kw_only=True):
    session_id: str
    round_index: int
    input_tokens_total: int
    output_tokens: int
    prefix_tokens: int = 0
    model: str = ""
    timing_events: list[_Event] = msgspec.field(default_factory=list)
    session_file: str | None = None
    round_id: str | None = None


_DECODER: Final = msgspec.json.Decoder(_Row)


class _Round(msgspec.Struct, array_like=True, gc=False):
    """What a row gives, kept small: a release-sized file has 665k of them."""

    line: int
    order: int
    """The row's place in the file (0-based): the tie-break after `round_index`."""
    round_index: int
    thread: str | None
    round_id: str | None
    model: str
    in_tokens: int
    cached_tokens: int
    out_tokens: int
    start_s: float
    end_s: float
    first_output_s: float | None
    timed: bool
    """Whether the round had an input event to start from."""
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]


def read_tracelab(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    """Read a TraceLab round JSONL file (plain or gzip-compressed): one session per `session_id` (and one per agent
    thread no other spans), subagents where the rows show them.

    Warnings go to `findings`; errors raise one TraceError after the whole file was read.
    """
    path = Path(path)
    sink = findings if findings is not None else Findings()
    sink.file = str(path)
    by_session: dict[str, list[_Round]] = {}
    order = 0
    for line, text in jsonl_lines(path):
        try:
            row = _DECODER.decode(text)
        except msgspec.DecodeError as exc:
            sink.error(json_error(exc), line=line)
            continue
        made = _round(row, line, order, sink)
        order += 1
        if made is not None:
            by_session.setdefault(row.session_id, []).append(made)
    if not order:
        sink.error("the file holds no rows")

    size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    ids = CachedPrefixIds(max(1, size))
    origin = min((r.start_s for rounds in by_session.values() for r in rounds), default=0.0)
    sessions: list[Session] = []
    repeated = 0
    for session_id, rounds in by_session.items():
        threads, dropped = _threads(rounds)
        repeated += dropped
        for session, lines in _sessions(session_id, threads, origin, ids):
            check_session(session, size, sink, line_of=_line_of(lines))
            sessions.append(session)
    if repeated:
        sink.warning(f"{repeated} row(s) repeat another agent's rounds exactly (a session ingested twice): kept once")
    if ids.beyond_previous:
        sink.warning(
            f"{ids.beyond_previous} round(s) had a cached prefix longer than their agent's previous prompt (the "
            "provider cached its own answer too): they share the whole previous prompt"
        )
    trace = Trace(
        sessions=sessions,
        block_size=size,
        hash_id_scope="global",
        provenance=Provenance(source_format="tracelab", source_path=str(path)),
    )
    check_trace_header(trace, sink)
    sink.raise_if_errors()
    return trace


def _round(row: _Row, line: int, order: int, sink: Findings) -> _Round | None:
    """The round a row describes, or None after saying why it cannot be one."""
    where = {"line": line, "session": row.session_id}
    problems = [
        bad_length("input_tokens_total", row.input_tokens_total),
        bad_length("output_tokens", row.output_tokens),
        bad_length("prefix_tokens", row.prefix_tokens),
    ]
    for name, count in (("input_tokens_total", row.input_tokens_total), ("output_tokens", row.output_tokens)):
        if count > MAX_TOKENS_PER_REQUEST:  # before any id is made for it: ids take memory by the token
            problems.append(f"{name}={count} is absurdly large (limit {MAX_TOKENS_PER_REQUEST:,})")
    if row.prefix_tokens > row.input_tokens_total >= 0:
        problems.append(f"prefix_tokens={row.prefix_tokens} exceeds input_tokens_total={row.input_tokens_total}")
    inputs: list[float] = []
    outputs: list[float] = []
    input_types: set[str] = set()
    output_types: set[str] = set()
    for event in row.timing_events:
        if event.timestamp is None:
            continue
        if event.timestamp.tzinfo is None:
            problems.append(f"timing event {event.event_type!r} has a timestamp without a time zone")
            break
        at = event.timestamp.timestamp()
        kind = _INPUT_TYPES.get(event.event_type)
        if kind is not None:
            inputs.append(at)
            input_types.add(kind)
            continue
        outputs.append(at)
        named = _OUTPUT_TYPES.get(event.event_type, "")
        if named:
            output_types.add(named)
    if not inputs and not outputs:
        problems.append("the round has no timestamped timing event")
    if any(problems):
        for problem in filter(None, problems):
            sink.error(problem, **where)
        return None
    first_output = min(outputs) if outputs else None
    started = [at for at in inputs if first_output is None or at <= first_output]
    start = max(started) if started else min(inputs + outputs)
    return _Round(
        line=line,
        order=order,
        round_index=row.round_index,
        thread=row.session_file,
        round_id=row.round_id,
        model=row.model,
        in_tokens=row.input_tokens_total,
        cached_tokens=row.prefix_tokens,
        out_tokens=row.output_tokens,
        start_s=start,
        end_s=max(start, *inputs, *outputs),
        first_output_s=first_output if started else None,
        timed=bool(started),
        input_types=tuple(sorted(input_types)),
        output_types=tuple(sorted(output_types)),
    )


def _threads(rounds: list[_Round]) -> tuple[list[list[_Round]], int]:
    """A session's rounds split into agent threads, each in order; the rows dropped as exact repeats."""
    rounds.sort(key=lambda r: (r.round_index, r.order))
    threads: dict[object, list[_Round]] = {}
    occurrences: dict[int, int] = {}
    for made in rounds:
        key: object = made.thread
        if key is None:
            key = occurrences.get(made.round_index, 0)
            occurrences[made.round_index] = key + 1
        threads.setdefault(key, []).append(made)
    kept: list[list[_Round]] = []
    seen: set[tuple[object, ...]] = set()
    dropped = 0
    for thread in threads.values():
        identity = tuple((r.round_index, r.round_id, r.start_s, r.end_s, r.in_tokens) for r in thread)
        if identity in seen:
            dropped += len(thread)
            continue
        seen.add(identity)
        kept.append(thread)
    kept.sort(key=lambda thread: (thread[0].start_s, thread[0].order))
    return kept, dropped


def _sessions(
    session_id: str, threads: list[list[_Round]], origin: float, ids: CachedPrefixIds
) -> list[tuple[Session, dict[int, list[int]]]]:
    """The sessions of one `session_id`: the first thread's, with the threads it spans as subagents, and one for
    each thread nothing spans."""
    spans = [(thread[0].start_s, max(r.end_s for r in thread)) for thread in threads]
    parent_of: list[int | None] = [None] * len(threads)
    for index in range(1, len(threads)):
        start = spans[index][0]
        spanning = [k for k in range(index) if spans[k][0] <= start <= spans[k][1]]
        parent_of[index] = spanning[-1] if spanning else None  # threads are in start order: the latest to start

    agents = [Agent() for _ in threads]
    results: list[Session] = []
    for index, thread in enumerate(threads):
        parent = parent_of[index]
        root = index
        while parent_of[root] is not None:
            root = parent_of[root]  # type: ignore[assignment]  # the loop's test says it is an int
        origin_s = spans[root][0]
        agent = agents[index]
        agent.requests = _requests(thread, origin_s, ids, preamble=f"{thread[0].model}/{'sub' if parent else 'root'}")
        if parent is None:
            suffix = f"#{len(results) + 1}" if results else ""
            results.append(Session(session_id=session_id + suffix, root=agent, start_s=max(0.0, origin_s - origin)))
        else:
            parent_agent, parent_thread = agents[parent], threads[parent]
            agent.agent_id = f"a{index}"
            agent.t = thread[0].start_s - origin_s
            agent.duration_ms = round((spans[index][1] - spans[index][0]) * 1000)
            agent.spawn_after = sum(1 for r in parent_thread if r.start_s <= thread[0].start_s)
            parent_agent.subagents.append(agent)
    lines = {id(agent): [r.line for r in thread] for agent, thread in zip(agents, threads, strict=True)}
    return [(session, lines) for session in results]


def _requests(thread: list[_Round], origin_s: float, ids: CachedPrefixIds, preamble: str) -> list[Request]:
    """One agent's requests, in order, their times on the clock starting at `origin_s`."""
    requests: list[Request] = []
    previous: tuple[int, ...] = ()
    previous_end: float | None = None
    for made in thread:
        if requests:
            kept, added = ids.next_round(previous, made.in_tokens, made.cached_tokens)
            previous = previous[:kept] + added
        else:
            added = ids.first_round(preamble, made.in_tokens, made.cached_tokens)
            kept, previous = 0, added
        start = made.start_s if made.timed or previous_end is None else previous_end
        end = max(start, made.end_s)
        requests.append(
            Request(
                t=start - origin_s,
                model=made.model,
                in_tokens=made.in_tokens,
                out_tokens=made.out_tokens,
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=None if previous_end is None else max(0.0, start - previous_end),
                api_time=end - start,
                ttft=None if made.first_output_s is None else made.first_output_s - start,
                type="s",
                input_types=made.input_types,
                output_types=made.output_types,
            )
        )
        previous_end = end
    return requests


def _line_of(lines: dict[int, list[int]]) -> Callable[[Agent, int], int | None]:
    """The line of an agent's request, from each agent's lines (keyed by the agent's `id`)."""

    def line_of(agent: Agent, index: int) -> int | None:
        of_agent = lines.get(id(agent), [])
        return of_agent[index] if index < len(of_agent) else None

    return line_of
