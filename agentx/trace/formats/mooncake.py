"""Mooncake JSONL: one request per line, described by lengths and KV-block hash ids only.

Two shapes are read, and may be mixed in one file:
- plain rows (Mooncake FAST'25) `{"timestamp": ms, "input_length", "output_length", "hash_ids"}`: each row
  is a session `mc-<1-based line>` of one request, starting at `timestamp / 1000` s;
- AIPerf's session variant: rows sharing a `session_id` form one session, in file order. The first row's
  `timestamp` is the session start; a later row's `timestamp` places it that many ms after the first one;
  a `delay` (ms to wait after the previous request of the session ends) places it `delay` after the
  previous request's start, since the recorded end is unknown, and becomes its `think_time`. A later row
  with neither starts with the previous one (think_time 0, as AIPerf sends it right away).

Hash ids are global (scope "global"), 512 tokens per block unless `block_size` says otherwise; a row's
ids are kept as written, full prompt or only the new blocks.

Reading drops the content keys AIPerf accepts (`text_input`, `messages`, `payload`, `tools`, `extra`,
`context_mode`, `message_mode`, `type`, `priority`) and unknown keys, with one warning per key name; of
the optional keys only `model` is kept (as the request model).

Writing keeps, per request, the start time to the millisecond, `input_length`, `output_length` and the
full hash ids. If every session is a single request, rows are plain (no session ids); otherwise every
session is written in the session variant: `session_id` on each row, `timestamp` on its first row and
`delay = max(0, t - previous request's end)` in whole ms on the others (the end uses `api_time`, 0 when
unknown), so a re-read request starts that delay after the previous request's start. Mooncake ids are
global, so a session-scoped trace (Weka `local`) has its ids renumbered in order of first use, each
session from fresh numbers: equal ids in different sessions must not become a prefix they never shared.
The file cannot state its block size; read it back with `block_size=` unless that is 512. Dropped:
model names (plain Mooncake has no model key), the agent tree (subagent requests join their session in
start-time order), think_time, api_time, ttft, type, input/output types, stop, acceptance_length,
session models and totals, sessions without requests, and session ids when rows are plain.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from agentx.trace.findings import Findings
from agentx.trace.formats.textfile import json_error, jsonl_lines
from agentx.trace.model import Agent, Provenance, Request, Session, Trace, delta_encode
from agentx.trace.validation import check_session, check_trace_header

DEFAULT_BLOCK_SIZE = 512

_CONTENT_KEYS = frozenset(
    {"text_input", "messages", "payload", "tools", "extra", "context_mode", "message_mode", "type", "priority"}
)
_SESSION_ID_PATTERN = re.compile(rb'"session_id"\s*:\s*"([^"\\]{1,200})"')

RowT = TypeVar("RowT", bound=msgspec.Struct)
_Relabel = Callable[[Iterable[int]], list[int]]


class _Row(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None
    timestamp: float | None = None
    delay: float | None = None
    session_id: str | None = None
    model: str | None = None


_DECODER = msgspec.json.Decoder(_Row)
_KNOWN_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(_Row))


# ---------------------------------------------------------------------------------------------
# JSONL helpers shared with the Bailian reader


class KeyTally:
    """Keys dropped from rows: the first line each appeared on and how many rows had it."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[int, int]] = {}

    def add(self, key: str, line: int) -> None:
        first, count = self.keys.get(key, (line, 0))
        self.keys[key] = (first, count + 1)


def decode_row(
    text: bytes, decoder: msgspec.json.Decoder[RowT], known: frozenset[str], dropped: KeyTally, line: int
) -> RowT | str:
    """The decoded row, or a message saying why it cannot be; keys outside `known` go to `dropped`."""
    try:
        return decoder.decode(text)
    except msgspec.ValidationError as exc:
        if "unknown field" not in str(exc):
            return json_error(exc)
    except msgspec.DecodeError as exc:
        return json_error(exc)
    # Slow path, only for rows with keys the wire struct forbids: strip them and convert the rest.
    try:
        generic = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        return json_error(exc)
    if not isinstance(generic, dict):
        return "a row must be a JSON object"
    for key in [k for k in generic if k not in known]:
        dropped.add(key, line)
        del generic[key]
    try:
        return msgspec.convert(generic, decoder.type)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        return json_error(exc)


def bad_number(name: str, value: float | None, unit: str) -> str | None:
    """Why `value` is not a usable non-negative finite number, if it is not."""
    if value is None or (math.isfinite(value) and value >= 0):
        return None
    return f"{name}={value} must be finite and >= 0 ({unit})"


def bad_length(name: str, value: int) -> str | None:
    """Why a token count is unusable, if it is."""
    return f"{name}={value} is negative" if value < 0 else None


# ---------------------------------------------------------------------------------------------
# reading


class _SessionRows:
    """One session as its rows arrive: the agent being filled and the line of each request."""

    def __init__(self, session_id: str) -> None:
        self.session = Session(session_id=session_id, root=Agent())
        self.lines: list[int] = []
        self.origin_ms = 0.0
        self.previous_ids: list[int] = []

    def add(self, row: _Row, line: int, sink: Findings) -> None:
        requests = self.session.root.requests
        problems = [
            bad_length("input_length", row.input_length),
            bad_length("output_length", row.output_length),
            bad_number("timestamp", row.timestamp, "milliseconds"),
            bad_number("delay", row.delay, "milliseconds"),
        ]
        if any(problems):
            for problem in filter(None, problems):
                sink.error(problem, line=line, session=self.session.session_id, request=len(requests))
            return
        previous_t = requests[-1].t if requests else 0.0
        if not requests:
            self.origin_ms = row.timestamp or 0.0
            self.session.start_s = self.origin_ms / 1000
        if row.timestamp is not None:
            t = (row.timestamp - self.origin_ms) / 1000
        elif row.delay is not None:
            t = previous_t + row.delay / 1000
        else:
            t = previous_t
        think_time: float | None = None
        if requests and row.delay is not None:
            think_time = row.delay / 1000
        elif requests and row.timestamp is None:
            think_time = 0.0
        ids = row.hash_ids or []
        kept, added = delta_encode(self.previous_ids, ids)
        self.previous_ids = ids
        requests.append(
            Request(
                t=t,
                model=row.model or "",
                in_tokens=row.input_length,
                out_tokens=row.output_length,
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=think_time,
            )
        )
        self.lines.append(line)
        if row.model and row.model not in self.session.models:
            self.session.models.append(row.model)

    def line_of(self, _agent: Agent, index: int) -> int | None:
        return self.lines[index] if index < len(self.lines) else None


def read_mooncake(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    """Read a Mooncake JSONL file (plain or gzip-compressed), plain rows or AIPerf's session variant.

    `block_size` overrides the default of 512 tokens per hash id. Warnings go to `findings`; errors
    raise one TraceError after the whole file was read.
    """
    path = Path(path)
    sink = findings if findings is not None else Findings()
    sink.file = str(path)
    ordered: list[_SessionRows] = []
    named: dict[str, _SessionRows] = {}
    dropped = KeyTally()
    for line, text in jsonl_lines(path):
        row = decode_row(text, _DECODER, _KNOWN_KEYS, dropped, line)
        session_id = row.session_id if isinstance(row, _Row) else _guess_session_id(text)
        if session_id is None:
            rows = _SessionRows(f"mc-{line}")
            ordered.append(rows)
        else:
            found = named.get(session_id)
            if found is None:
                found = named[session_id] = _SessionRows(session_id)
                ordered.append(found)
            rows = found
        if isinstance(row, str):
            sink.error(row, line=line, session=rows.session.session_id, request=len(rows.session.root.requests))
        else:
            rows.add(row, line, sink)
    _warn_dropped(dropped, sink)
    size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    sessions = [rows.session for rows in ordered if rows.session.root.requests]
    for rows in ordered:
        check_session(rows.session, size, sink, line_of=rows.line_of)
    if not ordered:
        sink.error("the file holds no rows")
    trace = Trace(
        sessions=sessions,
        block_size=size,
        hash_id_scope="global",
        provenance=Provenance(source_format="mooncake", source_path=str(path)),
    )
    check_trace_header(trace, sink)
    sink.raise_if_errors()
    return trace


def _guess_session_id(text: bytes) -> str | None:
    match = _SESSION_ID_PATTERN.search(text[:4096])
    return match.group(1).decode("utf-8", "replace") if match else None


def _warn_dropped(dropped: KeyTally, sink: Findings) -> None:
    for key, (first_line, count) in dropped.keys.items():
        rows = f"{count} row{'s' if count > 1 else ''}"
        if key in _CONTENT_KEYS:
            sink.warning(f'"{key}" dropped from {rows}: agentx replays Mooncake rows by length only', line=first_line)
        else:
            sink.warning(f'unknown key "{key}" ignored ({rows})', line=first_line)


# ---------------------------------------------------------------------------------------------
# writing


def write_mooncake(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write Mooncake JSONL: plain rows if every session is one request, else AIPerf's session variant.

    See the module docstring for what the format cannot hold.
    """
    sessions = [session for session in trace.sessions if session.request_count]
    plain = all(len(session.root.requests) == 1 and not session.root.subagents for session in sessions)
    to_rows: Callable[[Session, _Relabel], list[dict[str, Any]]] = _plain_rows if plain else _session_rows
    counter = itertools.count()
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        for session in sessions:
            relabel = list if trace.hash_id_scope == "global" else _renumbering(counter)
            for row in to_rows(session, relabel):
                # json.dumps spacing is the one of Mooncake's own files, so plain files round-trip byte for byte.
                out.write(json.dumps(row) + "\n")


def _renumbering(counter: Iterator[int]) -> _Relabel:
    """Maps one session's ids to fresh numbers from `counter`, the same id always to the same number."""
    numbers: dict[int, int] = {}

    def relabel(ids: Iterable[int]) -> list[int]:
        out = []
        for hash_id in ids:
            number = numbers.get(hash_id)
            if number is None:
                number = numbers[hash_id] = next(counter)
            out.append(number)
        return out

    return relabel


def _plain_rows(session: Session, relabel: _Relabel) -> list[dict[str, Any]]:
    request = session.root.requests[0]
    return [
        {
            "timestamp": round((session.start_s + request.t) * 1000),
            "input_length": request.in_tokens,
            "output_length": request.out_tokens,
            "hash_ids": relabel(next(session.root.iter_hash_ids())),
        }
    ]


def _session_rows(session: Session, relabel: _Relabel) -> list[dict[str, Any]]:
    entries = [
        (request, ids)
        for agent, _, _ in session.agents()
        for request, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True)
    ]
    entries.sort(key=lambda entry: entry[0].t)  # stable: ties keep the depth-first agent order
    rows: list[dict[str, Any]] = []
    previous: Request | None = None
    for request, ids in entries:
        row: dict[str, Any] = {"session_id": session.session_id}
        if previous is None:
            row["timestamp"] = round((session.start_s + request.t) * 1000)
        else:
            row["delay"] = round(1000 * max(0.0, request.t - previous.end))
        row.update(input_length=request.in_tokens, output_length=request.out_tokens, hash_ids=relabel(ids))
        rows.append(row)
        previous = request
    return rows
