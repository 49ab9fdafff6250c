"""Bailian / Qwen JSONL (alibaba-edu/qwen-bailian-usagetraces-anon), read only.

One request per line: `chat_id`, `parent_chat_id` (-1 for a root), `timestamp` (seconds),
`input_length`, `output_length`, `type` (`text`, `search`, `image`, `file`), `turn` and `hash_ids`
(16-token blocks, ids global across the file). Rows linked by `parent_chat_id` to the same root form
one session `str(root chat_id)`, in `turn` order (ties in file order), starting at the root's
timestamp. Every row is a complete request: its `input_length` and `hash_ids` already cover the
history the service kept, so requests are taken as they are. `type` becomes the request's
`input_types`; `turn` only orders the session. Sessions appear in the order of their first row.

A `parent_chat_id` missing from the file makes its row a root, with one warning for the file: the
published traces are time windows cut from production, so conversations that began before the window
lose their first turns, and AIPerf's loader treats such rows as roots too. Rejecting them would
reject real files. Duplicate `chat_id`s and cycles of parent links are errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from agentx.trace.findings import Findings
from agentx.trace.formats.mooncake import KeyTally, bad_length, bad_number, decode_row
from agentx.trace.formats.textfile import jsonl_lines
from agentx.trace.links import ABSENT, IN_CYCLE, NO_PARENT, follow
from agentx.trace.model import Agent, Provenance, Request, Session, Trace, delta_encode
from agentx.trace.validation import check_session, check_trace_header

DEFAULT_BLOCK_SIZE = 16
ROOT_PARENT = -1


class _Row(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    chat_id: int
    timestamp: float
    input_length: int
    output_length: int
    parent_chat_id: int = ROOT_PARENT
    type: str | None = None
    turn: int = 1
    hash_ids: list[int] | None = None


_DECODER = msgspec.json.Decoder(_Row)
_KNOWN_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(_Row))


def read_bailian(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    """Read a Bailian JSONL file (plain or gzip-compressed) into one session per conversation.

    `block_size` overrides the default of 16 tokens per hash id. Warnings go to `findings`; errors
    raise one TraceError after the whole file was read.
    """
    path = Path(path)
    sink = findings if findings is not None else Findings()
    sink.file = str(path)
    rows: list[tuple[int, _Row]] = []
    by_chat: dict[int, int] = {}  # chat_id -> index in rows
    dropped = KeyTally()
    seen_lines = False
    for line, text in jsonl_lines(path):
        seen_lines = True
        row = decode_row(text, _DECODER, _KNOWN_KEYS, dropped, line)
        if isinstance(row, str):
            sink.error(row, line=line)
            continue
        first = by_chat.get(row.chat_id)
        if first is not None:
            sink.error(f"chat_id {row.chat_id} appears again (first on line {rows[first][0]})", line=line)
            continue
        by_chat[row.chat_id] = len(rows)
        rows.append((line, row))
    for key, (first_line, count) in dropped.keys.items():
        sink.warning(f'unknown key "{key}" ignored ({count} row{"s" if count > 1 else ""})', line=first_line)
    if not seen_lines:
        sink.error("the file holds no rows")

    groups: dict[int, list[int]] = {}  # root row -> its rows, in file order; dicts keep first-row order
    for index, root in enumerate(_roots(rows, by_chat, sink)):
        if root != IN_CYCLE:
            groups.setdefault(root, []).append(index)
    size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    sessions: list[Session] = []
    for root, members in groups.items():
        members.sort(key=lambda index: rows[index][1].turn)
        session, lines = _session(rows[root][1], [rows[index] for index in members], sink)
        check_session(session, size, sink, line_of=_line_of(lines))
        sessions.append(session)
    trace = Trace(
        sessions=sessions,
        block_size=size,
        hash_id_scope="global",
        provenance=Provenance(source_format="bailian", source_path=str(path)),
    )
    check_trace_header(trace, sink)
    sink.raise_if_errors()
    return trace


def _line_of(lines: list[int]) -> Callable[[Agent, int], int | None]:
    return lambda _agent, index: lines[index] if index < len(lines) else None


def _roots(rows: list[tuple[int, _Row]], by_chat: dict[int, int], sink: Findings) -> list[int]:
    """The index of each row's root row, or IN_CYCLE; reports cycles and counts orphans."""
    parents = [
        NO_PARENT if row.parent_chat_id == ROOT_PARENT else by_chat.get(row.parent_chat_id, ABSENT) for _, row in rows
    ]
    links = follow(parents)
    for cycle in links.cycles:
        described = " -> ".join(f"{rows[i][1].chat_id} (line {rows[i][0]})" for i in cycle)
        sink.error(f"parent_chat_id links form a cycle: {described}", line=rows[cycle[0]][0])
    if links.orphans:
        line, row = rows[links.orphans[0]]
        sink.warning(
            f"{len(links.orphans)} row(s) name a parent_chat_id that is not in the file (first: chat_id {row.chat_id}, "
            f"parent {row.parent_chat_id}); each starts its own session",
            line=line,
        )
    return links.roots


def _session(root: _Row, members: list[tuple[int, _Row]], sink: Findings) -> tuple[Session, list[int]]:
    """The session of one conversation, and the line of each of its requests."""
    session_id = str(root.chat_id)
    agent = Agent()
    lines: list[int] = []
    previous_ids: list[int] = []
    for line, row in members:
        problems = [
            bad_number("timestamp", row.timestamp, "seconds"),
            bad_length("input_length", row.input_length),
            bad_length("output_length", row.output_length),
        ]
        if any(problems):
            for problem in filter(None, problems):
                sink.error(problem, line=line, session=session_id, request=len(agent.requests))
            continue
        ids = row.hash_ids or []
        kept, added = delta_encode(previous_ids, ids)
        previous_ids = ids
        agent.requests.append(
            Request(
                t=row.timestamp - root.timestamp,
                model="",
                in_tokens=row.input_length,
                out_tokens=row.output_length,
                hash_ids_kept=kept,
                hash_ids_added=added,
                input_types=(row.type,) if row.type else (),
            )
        )
        lines.append(line)
    start_s = root.timestamp if bad_number("timestamp", root.timestamp, "seconds") is None else 0.0
    return Session(session_id=session_id, root=agent, start_s=start_s), lines
