"""Reading Weka / AgentX trace JSON: one trace per file, a directory of files, or JSONL (one per line).

Every field of docs/agentx.md §1 is read. Beyond the reference we accept nested subagents, `hash_id_scope: "global"`,
and unknown keys (dropped with a warning; the reference fails on them). Legacy subagents whose inner `t` is relative to
the spawn are stored with absolute times (and written back in their original form by
`agentx.trace.formats.weka_writer`). The wire format is `agentx.trace.formats.weka`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats.textfile import json_error, open_bytes, read_errors
from agentx.trace.formats.weka import WekaCall, WekaRequest, WekaStreamedRequest, WekaSubagent, WekaTrace
from agentx.trace.model import Agent, Provenance, Request, Session, Trace, delta_encode
from agentx.trace.validation import MAX_BLOCK_SIZE, check_session

DEFAULT_BLOCK_SIZE = 64
_LEGACY_EPSILON_S = 1e-6

_DECODER = msgspec.json.Decoder(WekaTrace)
_IDS_DECODER = msgspec.json.Decoder(list[int])
_ENCODER = msgspec.json.Encoder()
_KNOWN_KEYS = {
    "trace": {f.encode_name for f in msgspec.structs.fields(WekaTrace)},
    "request": {f.encode_name for f in msgspec.structs.fields(WekaCall)} | {"type"},
    "subagent": {f.encode_name for f in msgspec.structs.fields(WekaSubagent)} | {"type"},
}
_ID_PATTERN = re.compile(rb'"id"\s*:\s*"([^"\\\x00-\x1f]{1,200})"')
_DEFAULTED = ("input_types", "output_types", "stop")
"""Optional keys whose reference default ([], [], "") the writer leaves out unless the source wrote it."""
_EXPLICIT = {
    flags: frozenset(key for key, flag in zip(_DEFAULTED, flags, strict=True) if flag)
    for flags in itertools.product((False, True), repeat=len(_DEFAULTED))
}
"""One shared set per combination, rather than one per request."""


def read_weka(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    """Read a Weka JSON file, a JSONL file of traces, or a directory of either.

    `block_size` overrides the files' own (the reference's precedence: user > file > 64).
    Warnings go to `findings`; errors raise one TraceError after the whole input was read.
    """
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl", ".gz")) if path.is_dir() else [path]
    if not files:
        raise TraceError.at("the directory holds no .json or .jsonl files", file=str(path))
    sink = findings if findings is not None else Findings()
    if block_size is not None and not 0 < block_size <= MAX_BLOCK_SIZE:
        sink.file = str(path)
        sink.error(f"block_size={block_size} must be in [1, {MAX_BLOCK_SIZE}]")
        sink.raise_if_errors()
    sessions: list[Session] = []
    first_seen: dict[str, str] = {}
    block_sizes: dict[int, str] = {}
    scopes: dict[str, str] = {}
    for file in files:
        sink.file = str(file)
        for line, text in _documents(file):
            wire = _decode(text, line, sink)
            if wire is None:
                continue
            where = f"{file}:{line}"
            if not 0 < wire.block_size <= MAX_BLOCK_SIZE:
                sink.error(f"block_size={wire.block_size} must be in [1, {MAX_BLOCK_SIZE}]", line=line, session=wire.id)
            block_sizes.setdefault(wire.block_size, where)
            if wire.id in first_seen:
                quoted = msgspec.json.encode(wire.id).decode()
                sink.error(
                    f"session id {quoted} appears twice (first at {first_seen[wire.id]})",
                    line=line,
                    session=wire.id,
                )
            first_seen.setdefault(wire.id, where)
            scope = _scope_of(wire, line, sink)
            if scope:
                scopes.setdefault(scope, where)
            session = _session_from_wire(wire, line, sink)
            check_session(session, block_size or wire.block_size, sink, line_of=_constant(line))
            sessions.append(session)
    sink.file = str(path)
    if len(block_sizes) > 1 and block_size is None:
        listed = ", ".join(f"{size} ({where})" for size, where in block_sizes.items())
        sink.error(f"traces disagree on block_size: {listed}; pass a block size to override")
    if len(scopes) > 1:
        sink.error(f"traces mix hash-id scopes: {', '.join(f'{s} ({w})' for s, w in scopes.items())}")
    sink.raise_if_errors()
    return Trace(
        sessions=sessions,
        block_size=block_size or next(iter(block_sizes), DEFAULT_BLOCK_SIZE),
        hash_id_scope="global" if "global" in scopes else "session",
        provenance=Provenance(source_format="weka", source_path=str(path)),
    )


def _constant(line: int) -> Callable[[Agent, int], int | None]:
    # A JSONL line holds a whole session: every request in it is on that line.
    return lambda _agent, _index: line


def _documents(file: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line, JSON text) for each trace: the whole file, or each line of a JSONL file."""
    with read_errors(file), open_bytes(file) as stream:
        first, start = stream.readline(), 1
        while first and not first.strip():  # leading blank lines: the layout is decided by the first document
            first, start = stream.readline(), start + 1
        stripped = first.strip()
        if stripped.startswith(b"{") and stripped.endswith(b"}"):
            yield start, first
            for number, line in enumerate(stream, start=start + 1):
                if line.strip():
                    yield number, line
        else:
            yield start, first + stream.read()


def _scope_of(wire: WekaTrace, line: int, sink: Findings) -> str | None:
    if wire.hash_id_scope in ("local", "session"):
        return "session"
    if wire.hash_id_scope == "global":
        return "global"
    # The value is the file's: JSON-quote it, so a stray newline or quote cannot break the one-line message.
    scope = msgspec.json.encode(wire.hash_id_scope).decode()
    sink.error(f'hash_id_scope {scope} is not "local" (or "global")', line=line, session=wire.id)
    return None


def _decode(text: bytes, line: int, sink: Findings) -> WekaTrace | None:
    try:
        return _DECODER.decode(text)
    except msgspec.ValidationError as exc:
        if "unknown field" not in str(exc):
            sink.error(json_error(exc, "file"), line=line, session=_guess_id(text))
            return None
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: absurdly nested subagents
        sink.error(json_error(exc, "file"), line=line, session=_guess_id(text))
        return None
    # Slow path, only for files with keys the reference would reject: drop them with a warning.
    try:
        generic = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:  # a syntax error past an unknown key; absurd nesting
        sink.error(json_error(exc, "file"), line=line, session=_guess_id(text))
        return None
    unknown: dict[str, int] = {}
    _strip_unknown(generic, "trace", unknown)
    for key, count in sorted(unknown.items()):
        sink.warning(f"unknown key {key} ignored ({count}×)", line=line, session=_guess_id(text))
    try:
        return _DECODER.decode(_ENCODER.encode(generic))
    except msgspec.ValidationError as exc:
        sink.error(json_error(exc, "file"), line=line, session=_guess_id(text))
        return None


def _strip_unknown(obj: Any, level: str, unknown: dict[str, int]) -> None:
    if not isinstance(obj, dict):
        return
    known = _KNOWN_KEYS[level]
    for key in [k for k in obj if k not in known]:
        name = f'"{key}"' if level == "trace" else f'"{key}" in a {level}'
        unknown[name] = unknown.get(name, 0) + 1
        del obj[key]
    for entry in obj.get("requests", []) if isinstance(obj.get("requests"), list) else []:
        if isinstance(entry, dict):
            _strip_unknown(entry, "subagent" if entry.get("type") == "subagent" else "request", unknown)


def _guess_id(text: bytes) -> str | None:
    match = _ID_PATTERN.search(text[:4096])
    return match.group(1).decode("utf-8", "replace") if match else None


def _session_from_wire(wire: WekaTrace, line: int, sink: Findings) -> Session:
    root = Agent(agent_id="", tool_tokens=wire.tool_tokens, system_tokens=wire.system_tokens)
    _fill_agent(
        root,
        wire.requests,
        None,
        lambda message, **where: sink.error(message, line=line, session=wire.id, **where),
        "$.requests",
    )
    return Session(session_id=wire.id, root=root, models=list(wire.models), totals=wire.totals)


def _fill_agent(
    agent: Agent,
    entries: Iterable[WekaRequest | WekaStreamedRequest | WekaSubagent],
    spawn_t: float | None,
    error: Callable[..., None],
    json_path: str,
) -> None:
    """Add `entries` (found at `json_path` in the document) to `agent` as requests and subagents."""
    previous_ids, previous_count = b"[]", 0
    for position, entry in enumerate(entries):
        if isinstance(entry, WekaSubagent):
            sub = Agent(
                agent_id=entry.agent_id,
                spawn_after=len(agent.requests),
                t=entry.t,
                subagent_type=entry.subagent_type,
                status=entry.status,
                duration_ms=entry.duration_ms,
                total_tokens=entry.total_tokens,
                tool_use_count=entry.tool_use_count,
                models=list(entry.models),
                tool_tokens=entry.tool_tokens,
                system_tokens=entry.system_tokens,
            )
            _fill_agent(sub, entry.requests, entry.t, error, f"{json_path}[{position}].requests")
            agent.subagents.append(sub)
            continue
        t = entry.t
        if spawn_t is not None and t < spawn_t - _LEGACY_EPSILON_S:
            t = spawn_t + t
            agent.relative_times = True
        ids = bytes(entry.hash_ids)
        try:
            kept, added = _delta_encode_json(previous_ids, previous_count, ids)
        except msgspec.ValidationError as exc:
            where = f"{json_path}[{position}].hash_ids"
            message = str(_full_decode_error(ids) or exc)
            message = (
                message.replace(" - at `$", f" at `{where}") if " - at `$" in message else f"{message} at `{where}`"
            )
            error(message, agent=agent.agent_id, request=len(agent.requests))
            ids, kept, added = b"[]", 0, ()
        previous_ids, previous_count = ids, kept + len(added)
        in_tokens = entry.in_tokens if entry.in_tokens is not None else entry.input_length
        out_tokens = entry.out_tokens if entry.out_tokens is not None else entry.output_length
        if in_tokens is None or out_tokens is None:
            missing = " and ".join(k for k, v in (("in", in_tokens), ("out", out_tokens)) if v is None)
            error(
                f"request lacks {missing} (or input_length/output_length)",
                agent=agent.agent_id,
                request=len(agent.requests),
            )
        agent.requests.append(
            Request(
                t=t,
                model=entry.model,
                in_tokens=0 if in_tokens is None else in_tokens,
                out_tokens=0 if out_tokens is None else out_tokens,
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=entry.think_time,
                api_time=entry.api_time,
                ttft=entry.ttft,
                type="s" if isinstance(entry, WekaStreamedRequest) else "n",
                input_types=tuple(entry.input_types or ()),
                output_types=tuple(entry.output_types or ()),
                stop=entry.stop or "",
                explicit_defaults=_EXPLICIT[entry.input_types == [], entry.output_types == [], entry.stop == ""],
            )
        )


def _full_decode_error(ids: bytes) -> msgspec.ValidationError | None:
    """The error of decoding the whole id list: its path indexes the full list, not a suffix."""
    try:
        _IDS_DECODER.decode(ids)
    except msgspec.ValidationError as exc:
        return exc
    return None


def _delta_encode_json(previous: bytes, previous_count: int, current: bytes) -> tuple[int, tuple[int, ...]]:
    """`delta_encode` of two JSON arrays of ints given as text; `previous` holds `previous_count` ids.

    Identical text means identical ids, so a prefix test on the text settles the common cases (all
    previous ids kept, or all but a partial last block) and only the appended ids are decoded.
    Anything else is decoded in full. Raises msgspec.ValidationError if `current` is not ints.
    """
    if previous_count:
        body = previous[: previous.rindex(b"]")].rstrip()
        if current.startswith(body):
            rest = current[len(body) :].lstrip()
            if rest[:1] == b"]":
                return previous_count, ()
            if rest[:1] == b",":
                return previous_count, tuple(_IDS_DECODER.decode(b"[" + rest[1:]))
        last_comma = body.rfind(b",")
        head = body[:last_comma]
        if last_comma > 0 and current.startswith(head) and current[len(head) :].lstrip()[:1] == b",":
            added = tuple(_IDS_DECODER.decode(b"[" + current[len(head) :].lstrip()[1:]))
            if not added or added[0] != int(body[last_comma + 1 :]):
                return previous_count - 1, added
        return delta_encode(_IDS_DECODER.decode(previous), _IDS_DECODER.decode(current))
    return 0, tuple(_IDS_DECODER.decode(current))
