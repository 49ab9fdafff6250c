"""The native trace file: Arrow IPC (`.arrow`, zstd-compressed) or Parquet, one row per request.

Rows are grouped by session, then by agent (depth first), then in request order, and open in
pyarrow, polars or duckdb as a plain table. Hash ids are delta-encoded against the previous
request of the same agent (`hash_ids_kept` leading ids of that request, then `hash_ids_added`),
which makes the file ~50× smaller than Weka JSONL and loads in a fraction of the time.
Session and agent attributes that are not per request live as JSON in the schema metadata
(`agentx.sessions`), next to the format version, block size, hash-id scope and provenance.
The layout is described in `schemas/trace.arrow.md`, generated from `describe_layout()`. The rows' own session, agent,
parent, depth and request index columns must agree with the metadata, which the reader checks (`arrow_rows`) before it
builds anything from them.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable
from typing import Annotated, Any, Final

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc

from agentx.errors import TraceError
from agentx.format_version import version_refusal
from agentx.trace.findings import Findings
from agentx.trace.formats.arrow_rows import Layout, check_rows
from agentx.trace.model import FORMAT_NAME, FORMAT_VERSION, Agent, Provenance, Request, Session, Trace
from agentx.trace.validation import check_session, check_trace_header

_STRING = pa.dictionary(pa.int32(), pa.string())

COLUMNS: list[tuple[pa.Field, str]] = [
    (pa.field("session_id", _STRING, nullable=False), "session (a recorded agent run)"),
    (pa.field("session_start_s", pa.float64(), nullable=False), "session start on the trace clock, seconds"),
    (pa.field("agent_id", _STRING, nullable=False), 'agent within the session; "" for the root agent'),
    (pa.field("parent_agent_id", _STRING), "the agent that spawned this one; null for the root"),
    (pa.field("agent_depth", pa.int16(), nullable=False), "0 for the root, 1 for its subagents, ..."),
    (pa.field("request_index", pa.int32(), nullable=False), "0-based position of the request in its agent"),
    (pa.field("t", pa.float64(), nullable=False), "request start, seconds on the session clock"),
    (pa.field("think_time", pa.float64()), "recorded gap from the previous row's end in the session, seconds"),
    (pa.field("api_time", pa.float64()), "recorded server duration, seconds"),
    (pa.field("ttft", pa.float64()), "recorded time to first token, seconds (streamed requests)"),
    (pa.field("type", _STRING, nullable=False), '"n" (plain) or "s" (streamed): the recording transport'),
    (pa.field("model", _STRING, nullable=False), "recorded model name"),
    (pa.field("in", pa.int64(), nullable=False), "input tokens"),
    (pa.field("out", pa.int64(), nullable=False), "output tokens"),
    (pa.field("hash_ids_len", pa.int32(), nullable=False), "number of KV-block hash ids of the full prompt"),
    (pa.field("hash_ids_kept", pa.int32(), nullable=False), "leading hash ids taken from the agent's previous request"),
    (pa.field("hash_ids_added", pa.list_(pa.int64()), nullable=False), "hash ids after the kept ones"),
    (pa.field("input_types", pa.list_(pa.string()), nullable=False), 'content kinds of the new input ("text", ...)'),
    (pa.field("output_types", pa.list_(pa.string()), nullable=False), "content kinds of the output"),
    (pa.field("stop", _STRING, nullable=False), 'recorded stop reason ("tool_use", "end_turn", "")'),
    (pa.field("acceptance_length", pa.float64()), "forced speculative acceptance length, if any"),
    (
        pa.field("explicit_defaults", _STRING, nullable=False),
        'keys the source wrote at their default value, comma-separated ("input_types,output_types,stop"), '
        'written back as read; "" for none (since version 1.1; absent: none)',
    ),
]
SCHEMA = pa.schema([field for field, _ in COLUMNS])
_FIELDS = {field.name: field for field in SCHEMA}

META_FORMAT = b"agentx.format"
META_VERSION = b"agentx.version"
META_BLOCK_SIZE = b"agentx.block_size"
META_SCOPE = b"agentx.hash_id_scope"
META_PROVENANCE = b"agentx.provenance"
META_SESSIONS = b"agentx.sessions"


class _AgentHeader(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An agent without its requests (those are rows), and how many rows it owns."""

    agent_id: str = ""
    request_count: Annotated[int, msgspec.Meta(ge=0)] = 0
    subagents: list[_AgentHeader] = []
    spawn_after: int = 0
    t: float | None = None
    subagent_type: str = ""
    status: str = ""
    duration_ms: int | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None
    models: list[str] = []
    tool_tokens: int = 0
    system_tokens: int = 0
    relative_times: bool = False


class _SessionHeader(msgspec.Struct, kw_only=True, omit_defaults=True):
    session_id: str
    root: _AgentHeader
    start_s: float = 0.0
    models: list[str] = []
    totals: dict[str, Any] | None = None


_AGENT_FIELDS = [f.name for f in msgspec.structs.fields(_AgentHeader) if f.name not in ("request_count", "subagents")]


# ---------------------------------------------------------------------------------------------
# writing


BATCH_ROWS: Final = 1 << 16
"""Rows of each record batch of the native file."""


def to_table(trace: Trace) -> pa.Table:
    """The trace as an Arrow table with the schema and metadata of the native file."""
    columns, schema = _columns(trace)
    return pa.Table.from_arrays([pa.array(columns[field.name], type=field.type) for field in SCHEMA], schema=schema)


def _columns(trace: Trace) -> tuple[dict[str, list[Any]], pa.Schema]:
    """The table's columns as Python lists, and its schema with the native file's metadata."""
    columns: dict[str, list[Any]] = {field.name: [] for field in SCHEMA}
    headers: list[_SessionHeader] = []
    for session in trace.sessions:
        headers.append(
            _SessionHeader(
                session_id=session.session_id,
                root=_header(session.root),
                start_s=session.start_s,
                models=list(session.models),
                totals=session.totals,
            )
        )
        for agent, parent, depth in session.agents():
            for index, request in enumerate(agent.requests):
                columns["session_id"].append(session.session_id)
                columns["session_start_s"].append(session.start_s)
                columns["agent_id"].append(agent.agent_id)
                columns["parent_agent_id"].append(None if parent is None else parent.agent_id)
                columns["agent_depth"].append(depth)
                columns["request_index"].append(index)
                columns["t"].append(request.t)
                columns["think_time"].append(request.think_time)
                columns["api_time"].append(request.api_time)
                columns["ttft"].append(request.ttft)
                columns["type"].append(request.type)
                columns["model"].append(request.model)
                columns["in"].append(request.in_tokens)
                columns["out"].append(request.out_tokens)
                columns["hash_ids_len"].append(request.hash_ids_len)
                columns["hash_ids_kept"].append(request.hash_ids_kept)
                columns["hash_ids_added"].append(request.hash_ids_added)
                columns["input_types"].append(request.input_types)
                columns["output_types"].append(request.output_types)
                columns["stop"].append(request.stop)
                columns["acceptance_length"].append(request.acceptance_length)
                columns["explicit_defaults"].append(",".join(sorted(request.explicit_defaults)))
    metadata = {
        META_FORMAT: trace.format_name.encode(),
        META_VERSION: FORMAT_VERSION.encode(),
        META_BLOCK_SIZE: str(trace.block_size).encode(),
        META_SCOPE: trace.hash_id_scope.encode(),
        META_PROVENANCE: msgspec.json.encode(trace.provenance),
        META_SESSIONS: msgspec.json.encode(headers),
    }
    return columns, SCHEMA.with_metadata(metadata)


def _header(agent: Agent) -> _AgentHeader:
    values = {name: getattr(agent, name) for name in _AGENT_FIELDS}
    return _AgentHeader(
        request_count=len(agent.requests), subagents=[_header(sub) for sub in agent.subagents], **values
    )


def write_arrow(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write the native Arrow IPC file (zstd-compressed)."""
    with pa.OSFile(os.fspath(path), "wb") as sink:
        _write_ipc(trace, sink)


def arrow_bytes(trace: Trace) -> bytes:
    """The native Arrow IPC file's bytes, in memory (a `--ray` run ships them to its actors)."""
    sink = pa.BufferOutputStream()
    _write_ipc(trace, sink)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _write_ipc(trace: Trace, sink: pa.NativeFile) -> None:
    columns, schema = _columns(trace)
    rows = len(columns["t"])
    # Dictionary columns whole, so that every batch shares one dictionary (an IPC file holds one per field); the
    # others a batch at a time, so that a corpus of tens of millions of hash ids is never an Arrow array whole
    # beside the trace (TraceLab's release: bench/tracelab_read.py).
    whole = {
        field.name: pa.array(columns[field.name], type=field.type)
        for field in SCHEMA
        if pa.types.is_dictionary(field.type)
    }
    options = ipc.IpcWriteOptions(compression="zstd")
    with ipc.new_file(sink, schema, options=options) as writer:
        for start in range(0, rows, BATCH_ROWS):
            arrays = [
                whole[field.name].slice(start, BATCH_ROWS)
                if field.name in whole
                else pa.array(columns[field.name][start : start + BATCH_ROWS], type=field.type)
                for field in SCHEMA
            ]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))


def from_arrow_bytes(data: bytes, *, file: str) -> Trace:
    """A trace from `arrow_bytes`' output; `file` names its origin in errors."""
    try:
        with ipc.open_file(pa.BufferReader(data)) as reader:
            table = reader.read_all()
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise TraceError.at(f"not a readable Arrow trace ({' '.join(str(exc).split())})", file=file) from None
    return from_table(table, file=file)


def write_parquet(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write the same table as Parquet (zstd)."""
    import pyarrow.parquet as pq  # only for Parquet: it loads more of pyarrow

    pq.write_table(to_table(trace), os.fspath(path), compression="zstd")


# ---------------------------------------------------------------------------------------------
# reading


def read_arrow(path: str | os.PathLike[str], *, findings: Findings | None = None) -> Trace:
    """Read a native `.arrow` (IPC file or stream) or `.parquet` trace."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as probe:
            magic = probe.read(6)
        if magic[:4] == b"PAR1":
            import pyarrow.parquet as pq

            table = pq.read_table(file)
        elif magic == b"ARROW1":
            with ipc.open_file(file) as reader:
                table = reader.read_all()
        else:
            with ipc.open_stream(file) as stream:
                table = stream.read_all()
        # Corrupt buffers must fail here: unchecked, they crash the interpreter when converted.
        table.validate(full=True)
        table.schema.names  # noqa: B018 (field names must decode as UTF-8)
    except OSError as exc:  # pyarrow's messages can span lines: keep the error one paragraph
        raise TraceError.at(f"cannot read the file: {' '.join(str(exc.strerror or exc).split())}", file=file) from None
    except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError) as exc:
        raise TraceError.at(f"not a readable Arrow/Parquet file ({' '.join(str(exc).split())})", file=file) from None
    try:
        return from_table(table, file=file, findings=findings)
    finally:
        # The table's buffers (~90 MB for the AgentX-size corpus) go back to the system, not to Arrow's pool, where
        # they would stay for the whole replay: nothing else of the run allocates there as much.
        del table
        pa.default_memory_pool().release_unused()


def from_table(table: pa.Table, *, file: str = "", findings: Findings | None = None) -> Trace:
    """Rebuild a Trace from a table with the native schema and metadata."""
    sink = findings if findings is not None else Findings()
    sink.file = file
    metadata = table.schema.metadata or {}
    fmt = metadata.get(META_FORMAT, b"").decode("utf-8", "replace")
    version = metadata.get(META_VERSION, b"").decode("utf-8", "replace")
    if fmt != FORMAT_NAME or not version:
        raise TraceError.at(f"not an agentx trace table (schema metadata lacks {META_FORMAT.decode()})", file=file)
    if (refusal := version_refusal(version, FORMAT_VERSION, "trace")) is not None:
        raise TraceError.at(refusal, file=file)
    missing = [
        name
        for name in ("t", "model", "in", "out", "hash_ids_kept", "hash_ids_added")
        if name not in table.column_names
    ]
    if missing:
        raise TraceError.at(f"the table lacks column(s) {', '.join(missing)}", file=file)
    try:
        headers = msgspec.json.decode(metadata.get(META_SESSIONS, b"[]"), type=list[_SessionHeader])
        provenance = msgspec.json.decode(metadata.get(META_PROVENANCE, b"{}"), type=Provenance)
        block_size = int(metadata.get(META_BLOCK_SIZE, b"0"))
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise TraceError.at(f"the schema metadata is corrupt ({exc})", file=file) from None
    scope = metadata.get(META_SCOPE, b"session").decode("utf-8", "replace")
    table = _conform(table, file)

    layout = _layout(headers)
    if layout.rows != table.num_rows:
        raise TraceError.at(
            f"the session metadata accounts for {layout.rows} rows but the table has {table.num_rows}", file=file
        )
    check_rows(table, layout, sink)
    # Rows out of place would be requests of the wrong agents: every check of those requests would mislead.
    sink.raise_if_errors()
    rows = _Rows(table)
    sessions: list[Session] = []
    cursor = 0
    for header in headers:
        first_row = cursor
        root, cursor = _build_agent(header.root, rows, cursor)
        session = Session(
            session_id=header.session_id, root=root, start_s=header.start_s, models=header.models, totals=header.totals
        )
        check_session(session, block_size, sink, line_of=_row_numbers(session, first_row))
        sessions.append(session)
    trace = Trace(
        sessions=sessions,
        block_size=block_size,
        hash_id_scope=scope,
        format_name=fmt,
        format_version=version,
        provenance=provenance,
    )
    check_trace_header(trace, sink)
    sink.raise_if_errors()
    return trace


def _conform(table: pa.Table, file: str) -> pa.Table:
    """The table with its known columns in their native types; refuses nulls the schema forbids."""
    names = table.column_names
    for index, name in enumerate(names):
        field = _FIELDS.get(name)
        if field is None:
            continue
        if names.count(name) > 1:
            raise TraceError.at(f'the table has {names.count(name)} columns named "{name}"', file=file)
        column = table.column(index)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except pa.ArrowException as exc:
                reason = " ".join(str(exc).split())
                raise TraceError.at(
                    f'column "{name}" has type {column.type}, expected {field.type} ({reason})', file=file
                ) from None
            table = table.set_column(index, field, column)
        nulls = column.null_count if not field.nullable else 0
        if pa.types.is_list(field.type):
            nulls += sum(chunk.flatten().null_count for chunk in column.chunks)  # the lists' items
        if nulls:
            raise TraceError.at(f'column "{name}" holds {nulls} null value(s) where none are allowed', file=file)
    return table


def _layout(headers: list[_SessionHeader]) -> Layout:
    """The rows the headers describe, agent by agent in row order."""
    layout = Layout()
    for index, header in enumerate(headers):
        layout.session_ids.append(header.session_id)
        root = header.root
        if not root.subagents:  # most sessions of a Mooncake-size trace: no tree to walk
            layout.session.append(index)
            layout.agent_ids.append(root.agent_id)
            layout.parent_ids.append(None)
            layout.depths.append(0)
            layout.counts.append(root.request_count)
            continue
        # Iterative: a deeply nested (corrupt) header must not exhaust the interpreter's recursion limit.
        pending: list[tuple[_AgentHeader, str | None, int]] = [(root, None, 0)]
        while pending:
            agent, parent, depth = pending.pop()
            layout.session.append(index)
            layout.agent_ids.append(agent.agent_id)
            layout.parent_ids.append(parent)
            layout.depths.append(depth)
            layout.counts.append(agent.request_count)
            if agent.subagents:
                pending += [(sub, agent.agent_id, depth + 1) for sub in reversed(agent.subagents)]
    return layout


def _row_numbers(session: Session, first_row: int) -> Callable[[Agent, int], int | None]:
    """Maps (agent, request index) to the request's 1-based row in the table."""
    first_rows: dict[int, int] = {}
    row = first_row + 1
    for agent, _, _ in session.agents():
        first_rows[id(agent)] = row
        row += len(agent.requests)
    return lambda agent, index: first_rows[id(agent)] + index


class _Rows:
    """The table's columns as Python lists, converted once."""

    def __init__(self, table: pa.Table) -> None:
        def column(name: str) -> list[Any]:
            if name not in table.column_names:
                return [None] * table.num_rows
            chunked = table.column(name)
            if pa.types.is_dictionary(chunked.type) and chunked.null_count == 0:
                # to_pylist makes a str per row; the dictionary holds the few distinct ones.
                values: list[Any] = []
                for chunk in chunked.chunks:
                    words = chunk.dictionary.to_pylist()
                    values += [words[i] for i in chunk.indices.to_numpy(zero_copy_only=False).tolist()]
                return values
            return chunked.to_pylist()  # type: ignore[no-any-return]

        def interned(values: list[Any]) -> list[Any]:
            # Output lengths and kept-id counts repeat (2.7k distinct of 103k in the AgentX-size corpus): one int
            # object per distinct value, not one per row. (Floats are left as read: -0.0 would pass for 0.0.)
            seen: dict[Any, Any] = {}
            return [seen.setdefault(value, value) for value in values]

        self.t = column("t")
        self.think_time = column("think_time")
        self.api_time = column("api_time")
        self.ttft = column("ttft")
        self.type = column("type")
        self.model = column("model")
        self.in_tokens = column("in")
        self.out_tokens = interned(column("out"))
        self.kept = interned(column("hash_ids_kept"))
        self.input_types = _shared_string_lists(table, "input_types")
        self.output_types = _shared_string_lists(table, "output_types")
        self.stop = column("stop")
        self.acceptance_length = column("acceptance_length")
        explicit = column("explicit_defaults")  # None throughout in files older than version 1.1
        # Few distinct values: one shared set each, not one per row.
        shared = {keys: frozenset(keys.split(",")) if keys else frozenset() for keys in set(explicit)}
        self.explicit_defaults = [shared[keys] for keys in explicit]
        self._added = _AddedIds(table.column("hash_ids_added"))

    def request(self, row: int) -> Request:
        return Request(
            t=self.t[row],
            model=self.model[row],
            in_tokens=self.in_tokens[row],
            out_tokens=self.out_tokens[row],
            hash_ids_kept=self.kept[row],
            hash_ids_added=self._added.of(row),
            think_time=self.think_time[row],
            api_time=self.api_time[row],
            ttft=self.ttft[row],
            type=self.type[row] or "n",
            input_types=tuple(self.input_types[row] or ()),
            output_types=tuple(self.output_types[row] or ()),
            stop=self.stop[row] or "",
            acceptance_length=self.acceptance_length[row],
            explicit_defaults=self.explicit_defaults[row],
        )


def _shared_string_lists(table: pa.Table, name: str) -> list[Any]:
    """Column `name` (lists of strings) as one tuple per row, the rows with equal lists sharing one tuple of shared
    strings: a few distinct lists (`["text"]`, `["thinking", "tool_use"]`) repeat over ~100k rows, where a list of
    fresh strings per row came to ~27 MB of the AgentX-size corpus, and left as much scattered in the heap once
    turned into tuples. None for a null row."""
    if name not in table.column_names:
        return [None] * table.num_rows
    import pyarrow.compute as pc

    shared: dict[tuple[str, ...], tuple[str, ...]] = {}
    rows: list[Any] = []
    for chunk in table.column(name).chunks:
        # Each chunk's words are numbered by its own dictionary: a row's numbers mean nothing in another chunk.
        of_chunk: dict[tuple[int, ...], tuple[str, ...]] = {}
        if chunk.values.null_count:  # a null string in a list: rare enough for the plain conversion
            rows += [None if value is None else tuple(value) for value in chunk.to_pylist()]
            continue
        encoded = pc.dictionary_encode(chunk.values)
        words = encoded.dictionary.to_pylist()
        indices = encoded.indices.to_numpy(zero_copy_only=False).tolist()
        offsets = chunk.offsets.to_numpy().tolist()
        valid = chunk.is_valid().to_pylist() if chunk.null_count else None
        for row in range(len(chunk)):
            if valid is not None and not valid[row]:
                rows.append(None)
                continue
            key = tuple(indices[offsets[row] : offsets[row + 1]])
            found = of_chunk.get(key)
            if found is None:
                value = tuple(words[index] for index in key)
                found = of_chunk[key] = shared.setdefault(value, value)
            rows.append(found)
    return rows


_GATHER_CHUNK = 1 << 20
_WINDOW_ROWS = 1 << 14
"""Rows whose added ids are made Python ints at a time."""


class _AddedIds:
    """The `hash_ids_added` column as one tuple of ints per row, made a window of rows at a time (rows are read in
    order), with one int object per distinct id, shared by every tuple that holds it.

    The ids of a session-scoped trace repeat from session to session (the AgentX-size corpus: 4.4M ids added, 57k
    distinct), and an int object of its own for each (32 bytes, beside the tuple's 8-byte slot) was over half of the
    loaded trace's size; ids spread wider than there are ids are converted as they are. The column is read where it
    lies, a record batch's chunk at a time: one contiguous copy of it, and a list of every id beside the requests' own
    tuples, were half the load's peak memory for TraceLab's release size (bench/tracelab_read.py)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        import numpy as np
        import pyarrow.compute as pc

        self._chunks = [chunk for chunk in column.chunks if len(chunk)]
        self._first_rows = list(itertools.accumulate((len(chunk) for chunk in self._chunks), initial=0))
        bounds = [pc.min_max(chunk.flatten()).as_py() for chunk in self._chunks]
        lows = [bound["min"] for bound in bounds if bound["min"] is not None]
        highs = [bound["max"] for bound in bounds if bound["max"] is not None]
        count = sum(len(chunk.flatten()) for chunk in self._chunks)
        self._low = min(lows, default=0)
        self._shared: Any = None
        if lows and max(highs) - self._low < count:
            self._shared = np.empty(max(highs) - self._low + 1, dtype=object)
            self._shared[:] = range(self._low, max(highs) + 1)
        self._rows = (0, 0)
        """The rows of the window."""
        self._offsets: list[int] = []
        self._ids: list[int] = []

    def of(self, row: int) -> tuple[int, ...]:
        """Row `row`'s ids."""
        first, stop = self._rows
        if not first <= row < stop:
            self._load(row)
            first = row
        return tuple(self._ids[self._offsets[row - first] : self._offsets[row - first + 1]])

    def _load(self, row: int) -> None:
        index = bisect.bisect_right(self._first_rows, row) - 1
        chunk, local = self._chunks[index], row - self._first_rows[index]
        piece = chunk.slice(local, _WINDOW_ROWS)
        offsets = piece.offsets.to_numpy()
        self._offsets = (offsets - offsets[0]).tolist()
        values = piece.flatten().to_numpy(zero_copy_only=False)
        if self._shared is None:
            self._ids = values.tolist()
        else:
            self._ids = []
            for begin in range(0, len(values), _GATHER_CHUNK):  # in pieces: the temporary arrays stay a few MB
                self._ids += self._shared[values[begin : begin + _GATHER_CHUNK] - self._low].tolist()
        self._rows = (row, row + len(piece))


def _build_agent(header: _AgentHeader, rows: _Rows, cursor: int) -> tuple[Agent, int]:
    requests = [rows.request(row) for row in range(cursor, cursor + header.request_count)]
    cursor += header.request_count
    subagents: list[Agent] = []
    for sub_header in header.subagents:
        sub, cursor = _build_agent(sub_header, rows, cursor)
        subagents.append(sub)
    values = {name: getattr(header, name) for name in _AGENT_FIELDS}
    return Agent(requests=requests, subagents=subagents, **values), cursor


def describe_layout() -> str:
    """The Arrow layout in Markdown (the source of `schemas/trace.arrow.md`)."""
    lines = [
        "# agentx trace: Arrow layout",
        "",
        f"Generated from `agentx/trace/formats/arrow.py` (format `{FORMAT_NAME}` version {FORMAT_VERSION}); "
        "do not edit.",
        "",
        "One row per request; rows grouped by session, then agent (depth first), then request order, sessions and",
        "agents in the order `agentx.sessions` lists them. A reader gives the rows to agents by that order and refuses",
        "a file whose `session_id`, `agent_id`, `parent_agent_id`, `agent_depth` or `request_index` disagree with it",
        "(rows re-sorted, a parent that is not there, a loop of parents, a depth off its parent chain, an id twice).",
        "Files: Arrow IPC with zstd buffers (`.arrow`) or Parquet (`.parquet`).",
        "",
        "| column | Arrow type | meaning |",
        "|---|---|---|",
    ]
    for field, meaning in COLUMNS:
        nullable = "" if field.nullable else ", not null"
        lines.append(f"| `{field.name}` | `{field.type}`{nullable} | {meaning} |")
    lines += [
        "",
        "Full hash ids of a request = the first `hash_ids_kept` ids of the previous request of the same agent,",
        "followed by `hash_ids_added`.",
        "",
        "## Schema metadata",
        "",
        "| key | value |",
        "|---|---|",
        f"| `{META_FORMAT.decode()}` | `{FORMAT_NAME}` |",
        f"| `{META_VERSION.decode()}` | `MAJOR.MINOR`; a reader refuses a newer major version |",
        f"| `{META_BLOCK_SIZE.decode()}` | tokens per hash id |",
        f"| `{META_SCOPE.decode()}` | `session` (ids namespaced per session) or `global` |",
        f"| `{META_PROVENANCE.decode()}` | JSON: `source_format`, `source_path`, `notes` |",
        f"| `{META_SESSIONS.decode()}` | JSON list, one object per session in row order (below) |",
        "",
        "Session object: `session_id`, `start_s`, `models`, `totals`, `root` (an agent object).",
        "Agent object: `request_count` (its rows), `subagents` (agent objects, in spawn order), and",
        ", ".join(f"`{name}`" for name in _AGENT_FIELDS) + "; fields at their default are omitted.",
        "",
    ]
    return "\n".join(lines)
