"""Per-request latency records of a replay run: `RequestRecord`, the Arrow layout of a records file, reading one.

One `RequestRecord` per request sent (warmup included, tagged by `phase`). Times are integer
nanoseconds on the run's monotonic clock, as offsets from the run start; the run's wall-clock epoch
is stored once per file, so wall time = `agentx.wall_epoch_ns` + offset. The derived latencies
(`dispatch_lag_s`, `ttft_s`, `tpot_s`, `e2el_s`) are computed by the record itself from the raw times,
so every consumer gets the same definitions (docs/agentx.md §6).

While a run goes the file is an uncompressed Arrow IPC **stream**: a sequence of self-delimiting
messages, so after a crash (even SIGKILL) every record batch written before it reads back, whereas the IPC
file format is only readable once its footer is written. `RecordWriter` (agentx.records.writer)
buffers rows column-wise and writes a batch every `flush_rows` rows, once `flush_interval_s` (1 s by default)
has passed, and whenever its owner calls `flush`: a replay does once 16 rows wait or 0.5 s passed
(agentx.replayer.schedule.runner, `FLUSH_ROWS`). When the writer closes (any end but a hard kill) it rewrites the
stream as an IPC **file** (with footer, what `polars.read_ipc`, `pyarrow.feather` and Arrow's other file readers
expect) and swaps it in atomically. `read_records` (`RecordsReader`) opens both containers and returns the complete
batches, ignoring a killed run's torn last one; a finished file that reads short (cut short since) is refused
(`RecordsDamaged`).
The layout is described in `schemas/records.arrow.md`, generated from `describe_layout()`.

Secrets cannot enter a record (it has no header or free-form options field; error messages are
scrubbed of bearer tokens and key-like strings); the caller's run options pass through `redact`
(agentx.secrets).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Final, Literal

import msgspec
import pyarrow as pa

from agentx.errors import RecordsDamaged, RecordsError
from agentx.format_version import version_refusal
from agentx.records.ipc_files import META_ROWS, IpcReader, without_rows
from agentx.records.kinds import ErrorKind, TimeoutKind
from agentx.secrets import scrub

FORMAT_NAME: Final = "agentx-records"
FORMAT_VERSION: Final = "1.14"
"""`MAJOR.MINOR`: a reader refuses a newer major version; minor versions add columns or keys, and 1.8 renamed
`itl_s` and `e2e_s` to vLLM's names, `tpot_s` and `e2el_s` (`read_records` renames an older file's); 1.9 added
`worker` and `node`; 1.10 `replayed_hit_blocks`; 1.11 what released each request (`released_by_request_id`,
`think_s`, `idle_cut_s`, `join_wait_s`) and two more cache counts (`seen_any_scope_blocks`, `lru_hit_blocks`);
1.12 `server_notices`; 1.13 the rows a finished file holds (`agentx.rows`, agentx.records.ipc_files.META_ROWS);
1.14 `route`."""
RENAMED_COLUMNS: Final = {"itl_s": "tpot_s", "e2e_s": "e2el_s"}
"""Columns of files before 1.8 and their names since (`itl_s` held the per-request TPOT, not vLLM's ITL)."""

WORKER_LOST: Final = "worker_lost"
"""The reason a request is recorded cancelled when the shard that sent it was lost (`--ray`): the start of its
`error_message`."""
MAX_ERROR_MESSAGE: Final = 500
"""Error messages are cut to this many characters: a server's error page must not bloat the file."""

Phase = Literal["warmup", "profiling"]
Status = Literal["ok", "error"]


class RequestRecord(msgspec.Struct, kw_only=True, gc=False):
    """One request of a replay run. Construct it with the raw fields; the derived ones are computed.

    `dispatch_lag_s`, `ttft_s`, `tpot_s` and `e2el_s` are always recomputed from the raw times in
    `__post_init__` (values passed for them are replaced), and `error_message` is scrubbed and cut
    to `MAX_ERROR_MESSAGE` characters. Change raw fields with `msgspec.structs.replace`, which
    re-derives; assigning an attribute in place would leave the derived fields stale.
    """

    run_id: str
    phase: Phase
    lane: int
    play: int
    session_id: str
    agent_id: str
    depth: int
    turn: int
    model: str
    correlation_id: str = ""
    """The agent session's `X-Correlation-ID` (one per agent of each play of a tree; docs/agentx.md §2d)."""
    root_correlation_id: str = ""
    """The correlation id of the root agent session of the play (equal to `correlation_id` on the root)."""
    parent_correlation_id: str = ""
    """The correlation id of the parent agent session ("" for the root)."""
    request_id: str = ""
    """The request's `X-Request-ID` (a UUID per request)."""
    scheduled_ns: int
    queued_ns: int | None = None
    """When the request was handed to the HTTP client; `sent_ns − queued_ns` is the client's own queueing."""
    sent_ns: int
    response_ns: int | None = None
    """When the response headers arrived."""
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int
    chunk_times_ns: list[int] = []
    chunk_tokens: list[int] = []
    isl_recorded_tokens: int
    isl_sent_tokens: int
    cache_bust_tokens: int = 0
    """Tokens of the tree's cache-bust marker inside `isl_sent_tokens` (not in the trace's `in`)."""
    isl_server_tokens: int | None = None
    osl_recorded_tokens: int
    osl_server_tokens: int | None = None
    osl_streamed_tokens: int = 0
    tokens_estimated: bool = False
    cached_tokens: int | None = None
    theoretical_hit_blocks: int | None = None
    theoretical_total_blocks: int | None = None
    replayed_hit_blocks: int | None = None
    api_time_recorded_s: float | None = None
    ttft_recorded_s: float | None = None
    status: Status = "ok"
    error_kind: ErrorKind | None = None
    timeout_kind: TimeoutKind | None = None
    """With `error_kind == "timeout"`: "connect", "idle" (no bytes for the idle timeout) or "request" (the whole
    request's limit)."""
    error_message: str | None = None
    http_status: int | None = None
    connection_retries: int = 0
    """Times the request was sent again because the server had closed its reused keep-alive connection
    before answering (the client retries that once)."""
    # derived in __post_init__
    dispatch_lag_s: float = 0.0
    ttft_s: float | None = None
    e2el_s: float | None = None
    """End-to-end latency, vLLM's E2EL: the last token − sent (AIPerf's request_latency)."""
    tpot_s: float | None = None
    """Time per output token, vLLM's TPOT: (E2EL − TTFT) / (OSL − 1) (AIPerf's per-request inter_token_latency)."""
    slo_met: bool | None = None
    """Whether the request met every `--slo` target (agentx.replayer.options.slo), set by whoever makes the record (the
    run's targets are not the record's); None when the run had none. `msgspec.structs.replace` keeps it as is."""
    worker: int = 0
    """The shard that sent it (`--workers`, `--ray`; 0 in a run of one process)."""
    node: str = ""
    """The host that sent it: its Ray node id in a `--ray` run, else its host name."""
    route: str = ""
    """How it reached the server: "direct", or "proxy http://host:port" (agentx.replayer.http.proxy); "" in a file
    before 1.14 or a record imported from another tool."""
    released_by_request_id: str = ""
    """The `X-Request-ID` of the request whose completion set its due time (its send, for a subagent's first turn
    dispatched from its parent's send); "" when the play's start or the profiling start did, and for warmup requests.
    `scheduled_ns` = the release + `think_s` − `idle_cut_s`."""
    think_s: float | None = None
    """The delay the schedule applied after the release, before the idle caps: the trace's recorded delay × the delay
    scale (0 when a joined subagent or a barrier released it); None for warmup requests."""
    idle_cut_s: float | None = None
    """How much earlier the idle caps made it due (≥ 0); None for warmup requests."""
    join_wait_s: float | None = None
    """How long past its own agent's due (its anchor's release + think − cut) it waited for the subagents it joins or
    the other streams it waits for (0: its own due came last); None for warmup requests."""
    seen_any_scope_blocks: int | None = None
    """Leading hash-id blocks whose ids the run had sent before in the same hash-id namespace under any cache-bust
    marker (or none): at least `replayed_hit_blocks` (agentx.replayer.plan.sent_blocks)."""
    lru_hit_blocks: int | None = None
    """Leading hash-id blocks an LRU cache of the server's own capacity, fed the run's prompts in send order, held;
    None when the server's `/metrics` did not give its capacity (agentx.replayer.plan.sent_blocks)."""
    server_notices: list[str] = []
    """What the server got wrong in the answer (agentx.replayer.schedule.sanity): `output_over_max_tokens`,
    `prompt_count_differs`, `not_event_stream`, `no_done`, `compressed`; empty for most."""

    def __post_init__(self) -> None:
        self.dispatch_lag_s = (self.sent_ns - self.scheduled_ns) / 1e9
        first, last = self.first_token_ns, self.last_token_ns
        self.ttft_s = None if first is None else (first - self.sent_ns) / 1e9
        self.e2el_s = None if last is None else (last - self.sent_ns) / 1e9
        osl = self.osl_tokens
        # (E2E − TTFT) from the integer times: one rounding instead of three.
        self.tpot_s = None if first is None or last is None or osl < 2 else (last - first) / 1e9 / (osl - 1)
        if self.error_message is not None:
            self.error_message = scrub(self.error_message)[:MAX_ERROR_MESSAGE]

    @property
    def osl_tokens(self) -> int:
        """The OSL the metrics use: the server's `usage.completion_tokens` when reported, else the streamed count."""
        return self.osl_server_tokens if self.osl_server_tokens is not None else self.osl_streamed_tokens

    @property
    def isl_tokens(self) -> int:
        """The ISL the metrics use: the server's `usage.prompt_tokens` when reported, else the tokens sent."""
        return self.isl_server_tokens if self.isl_server_tokens is not None else self.isl_sent_tokens


class RunInfo(msgspec.Struct, kw_only=True):
    """What a records file says about its run, once, in the schema metadata."""

    run_id: str
    wall_epoch_ns: int
    """`time.time_ns()` at the run start: the zero of every `*_ns` column."""
    options: dict[str, Any] = {}
    """The run's options (JSON-serialisable); stored after `redact`."""


_INT32 = pa.int32()
_INT64 = pa.int64()
_FLOAT = pa.float64()
_STR = pa.string()

COLUMNS: list[tuple[pa.Field, str]] = [
    (pa.field("run_id", _STR, nullable=False), "the run (also in the schema metadata)"),
    (pa.field("phase", _STR, nullable=False), '"warmup" or "profiling"; metrics use profiling rows only'),
    (pa.field("lane", _INT32, nullable=False), "concurrency lane (tree slot) that owns the request"),
    (pa.field("play", _INT64, nullable=False), "one replay of a session tree; a recycled lane starts a new play"),
    (pa.field("session_id", _STR, nullable=False), "session (trace) id"),
    (pa.field("agent_id", _STR, nullable=False), 'agent within the session; "" for the root agent'),
    (pa.field("depth", _INT32, nullable=False), "agent depth: 0 for the root, 1 for its subagents, ..."),
    (pa.field("turn", _INT32, nullable=False), "0-based request index within its agent"),
    (pa.field("model", _STR, nullable=False), "model name sent to the server"),
    (
        pa.field("correlation_id", _STR, nullable=False),
        "the agent session's X-Correlation-ID header (one per agent of each play of a tree)",
    ),
    (pa.field("root_correlation_id", _STR, nullable=False), "the root agent session's correlation id in this play"),
    (pa.field("parent_correlation_id", _STR, nullable=False), 'the parent agent session\'s correlation id ("": root)'),
    (pa.field("request_id", _STR, nullable=False), "the request's X-Request-ID header (a UUID per request)"),
    (pa.field("scheduled_ns", _INT64, nullable=False), "when the request was due, ns after the run start"),
    (pa.field("queued_ns", _INT64), "handed to the HTTP client (before the connection pool), ns after the run start"),
    (
        pa.field("sent_ns", _INT64, nullable=False),
        "when its bytes reached the socket (the latency zero), ns after the run start",
    ),
    (pa.field("response_ns", _INT64), "response headers received, ns after the run start; null if none"),
    (pa.field("first_token_ns", _INT64), "first non-empty content chunk (text, reasoning or tool call); null if none"),
    (pa.field("last_token_ns", _INT64), "last non-empty content chunk (a trailing usage-only chunk excluded)"),
    (pa.field("end_ns", _INT64, nullable=False), "response fully read, or the failure, ns after the run start"),
    (
        pa.field("chunk_times_ns", pa.list_(_INT64), nullable=False),
        "arrival of each content chunk, ns after the run start",
    ),
    (pa.field("chunk_tokens", pa.list_(_INT32), nullable=False), "tokens in each content chunk (same length as above)"),
    (pa.field("isl_recorded_tokens", _INT64, nullable=False), "input tokens of the request in the trace"),
    (pa.field("isl_sent_tokens", _INT64, nullable=False), "input tokens of the prompt agentx built and sent"),
    (
        pa.field("cache_bust_tokens", _INT64, nullable=False),
        "tokens of the tree's cache-bust marker included in isl_sent_tokens (0: none)",
    ),
    (pa.field("isl_server_tokens", _INT64), "`usage.prompt_tokens` (includes cached tokens and the chat template)"),
    (pa.field("osl_recorded_tokens", _INT64, nullable=False), "output tokens of the request in the trace"),
    (pa.field("osl_server_tokens", _INT64), "`usage.completion_tokens`; null when the server sent no usage"),
    (pa.field("osl_streamed_tokens", _INT64, nullable=False), "sum of `chunk_tokens`"),
    (pa.field("tokens_estimated", pa.bool_(), nullable=False), "true when `chunk_tokens` were estimated, not counted"),
    (pa.field("cached_tokens", _INT64), "`usage.prompt_tokens_details.cached_tokens`; null when not reported"),
    (
        pa.field("theoretical_hit_blocks", _INT64),
        "theoretical prefix-cache hit: leading hash-id blocks already produced in the trace; null if unset",
    ),
    (pa.field("theoretical_total_blocks", _INT64), "hash-id blocks of the request; null if unset"),
    (
        pa.field("replayed_hit_blocks", _INT64),
        "the replay's own bound: leading hash-id blocks whose content the run had already sent, in send order "
        "(a play without a cache-bust marker hits its earlier plays); null if unset",
    ),
    (pa.field("api_time_recorded_s", _FLOAT), "the trace's recorded server time of the request; null if unknown"),
    (pa.field("ttft_recorded_s", _FLOAT), "the trace's recorded TTFT (streamed requests); null if unknown"),
    (pa.field("status", _STR, nullable=False), '"ok" or "error"'),
    (
        pa.field("error_kind", _STR),
        "http, rate_limited (HTTP 429), timeout, connection, protocol, context_overflow or cancelled; null if ok",
    ),
    (
        pa.field("timeout_kind", _STR),
        "with error_kind timeout: connect, idle (no bytes for --idle-timeout) or request (--request-timeout)",
    ),
    (pa.field("error_message", _STR), f"error text, scrubbed of credentials, at most {MAX_ERROR_MESSAGE} characters"),
    (pa.field("http_status", _INT32), "HTTP status of the response; null if none was received"),
    (
        pa.field("connection_retries", _INT32, nullable=False),
        "times it was sent again because the server closed its reused connection unanswered (at most 1)",
    ),
    (pa.field("dispatch_lag_s", _FLOAT, nullable=False), "derived: (sent − scheduled), seconds"),
    (pa.field("ttft_s", _FLOAT), "derived: (first_token − sent), seconds"),
    (pa.field("e2el_s", _FLOAT), "derived: E2EL, (last_token − sent), seconds (AIPerf's request_latency)"),
    (
        pa.field("tpot_s", _FLOAT),
        "derived: TPOT, (E2EL − TTFT)/(OSL − 1), OSL = server count else streamed; null if OSL < 2",
    ),
    (
        pa.field("slo_met", pa.bool_()),
        "met every --slo target: ok, and each of TTFT, TPOT (if OSL ≥ 2), E2EL at most its target; null: no --slo",
    ),
    (pa.field("worker", _INT32, nullable=False), "the shard that sent it (--workers, --ray); 0 in a one-process run"),
    (pa.field("node", _STR, nullable=False), "the host that sent it: its Ray node id in a --ray run, else its name"),
    (
        pa.field("route", _STR, nullable=False),
        'how it reached the server: "direct", or "proxy http://host:port" (--proxy, the environment\'s proxy)',
    ),
    (
        pa.field("released_by_request_id", _STR, nullable=False),
        "X-Request-ID of the request whose completion (a subagent's first turn sent from its parent's send: whose "
        'send) set its due time; "": the play\'s start or the profiling start did, or a warmup request',
    ),
    (
        pa.field("think_s", _FLOAT),
        "the delay applied after that release before the idle caps: the recorded delay × the delay scale (0 for a "
        "release by a joined subagent or a barrier); scheduled = release + think − idle cut; null: warmup",
    ),
    (pa.field("idle_cut_s", _FLOAT), "how much earlier the idle caps made it due, seconds (≥ 0); null: warmup"),
    (
        pa.field("join_wait_s", _FLOAT),
        "how long past its own agent's due (release + think − cut) it waited for joined subagents or barriers; "
        "null: warmup",
    ),
    (
        pa.field("seen_any_scope_blocks", _INT64),
        "leading hash-id blocks whose ids the run had sent in the same hash-id namespace under any cache-bust marker "
        "(≥ replayed_hit_blocks); null if unset",
    ),
    (
        pa.field("lru_hit_blocks", _INT64),
        "leading hash-id blocks an LRU cache of the server's capacity (vllm:cache_config_info), fed the prompts in "
        "send order, held; null when the capacity was not known",
    ),
    (
        pa.field("server_notices", pa.list_(_STR), nullable=False),
        "what the server got wrong in the answer: output_over_max_tokens, prompt_count_differs, not_event_stream, "
        "no_done, compressed (agentx.replayer.schedule.sanity); empty for most",
    ),
]
SCHEMA = pa.schema([field for field, _ in COLUMNS])
CHUNK_COLUMNS: Final = ("chunk_times_ns", "chunk_tokens")
"""The per-chunk list columns: nearly all of a records file's bytes (12 a streamed chunk, ~150M chunks in an hour at
concurrency 256): what reads a long run's records reads these a batch at a time (`read_records(chunks=False)`)."""
COLUMN_NAMES: Final = [field.name for field in SCHEMA]
"""The columns in order: `RequestRecord`'s fields."""
_FIELD_NAMES = [f.name for f in msgspec.structs.fields(RequestRecord)]
assert COLUMN_NAMES == _FIELD_NAMES, "COLUMNS must list RequestRecord's fields in order"  # the writer relies on it

META_FORMAT = b"agentx.format"
META_VERSION = b"agentx.version"
META_RUN_ID = b"agentx.run_id"
META_EPOCH = b"agentx.wall_epoch_ns"
META_RUN = b"agentx.run"


# ---------------------------------------------------------------------------------------------
# reading


class RecordsReader(IpcReader):
    """An open records file, either container (agentx.records.ipc_files): its schema, then its complete record
    batches, each validated. Raises `RecordsError` when the file cannot be opened, has no complete schema (an IPC
    file cut short before it: `RecordsDamaged`), is not a records file or was written by a newer major format
    version."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, RecordsError, cut=lambda where: RecordsDamaged(where, 0, None))
        try:
            _check_schema(self.path, self.schema)
        except RecordsError:
            self.close()
            raise

    def batches(self, *, validate: bool = True) -> Iterator[pa.RecordBatch]:
        """The complete record batches in file order, validated; stops silently at the first torn or invalid one."""
        return super().batches(validate=validate)


def _check_schema(file: str, schema: pa.Schema) -> None:
    metadata = schema.metadata or {}
    if metadata.get(META_FORMAT) != FORMAT_NAME.encode():
        raise RecordsError(f"{file}: not an agentx records file (schema metadata lacks {META_FORMAT.decode()})")
    version = metadata.get(META_VERSION, b"").decode("utf-8", "replace")
    if (refusal := version_refusal(version, FORMAT_VERSION, "records")) is not None:
        raise RecordsError(f"{file}: {refusal}")


def read_records(path: str | os.PathLike[str], *, partial: bool = False, chunks: bool = True) -> pa.Table:
    """The records of a file (an IPC file or stream) as a table with the writer's schema and metadata.

    A stream cut short (a killed run's) yields its complete record batches; its torn last batch is dropped
    silently. An IPC file (a run that ended) was written whole: one that reads short (cut short or damaged since)
    raises `RecordsDamaged`, which says how many rows it holds and how many could be read, unless `partial`, which
    returns those. Raises `RecordsError` if the file has no complete schema, is not a records file, or was written
    by a newer major format version.

    `chunks=False` leaves out `CHUNK_COLUMNS`, nearly all of a file's bytes, reading it a batch at a time: the table
    then holds a few hundred bytes a request, whatever the run's length.
    """
    with RecordsReader(path) as reader:
        if chunks:
            table = pa.Table.from_batches(list(reader.batches()), schema=without_rows(reader.schema))
        else:
            table = per_request_columns(reader.batches(), without_rows(reader.schema))
        if reader.short and not partial:
            raise RecordsDamaged(reader.path, reader.rows_read, reader.rows_expected)
    return renamed(table)


def per_request_columns(parts: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema) -> pa.Table:
    """The rows of `parts` (in order, each with `schema`'s columns) without `CHUNK_COLUMNS`, with `schema`'s
    metadata. The columns kept are copied a few parts at a time: a part read from an uncompressed stream shares one
    buffer among its columns, which a view of them would keep alive, chunk lists and all."""
    names = [name for name in schema.names if name not in CHUNK_COLUMNS]
    kept = pa.schema([schema.field(name) for name in names], metadata=schema.metadata)
    batches: list[pa.RecordBatch] = []
    pending: list[pa.RecordBatch | pa.Table] = []
    pending_bytes = 0

    def copy() -> None:
        arrays = [pa.concat_arrays([array for part in pending for array in _arrays(part, name)]) for name in names]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=kept))

    for part in parts:
        if not part.num_rows:
            continue
        pending.append(part.select(names))
        pending_bytes += part.nbytes
        if pending_bytes >= _COPY_BYTES:
            copy()
            pending, pending_bytes = [], 0
    if pending:
        copy()
    return pa.Table.from_batches(batches, schema=kept)


_COPY_BYTES: Final = 64 << 20
"""Bytes of parts (chunk lists included) `per_request_columns` holds before copying what it keeps of them."""


def _arrays(part: pa.RecordBatch | pa.Table, name: str) -> list[pa.Array]:
    column = part.column(name)
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def renamed(table: pa.Table) -> pa.Table:
    """A records table with the columns of a file before 1.8 under their names since (`RENAMED_COLUMNS`)."""
    names = table.column_names
    if not any(old in names and new not in names for old, new in RENAMED_COLUMNS.items()):
        return table
    columns = [new if (new := RENAMED_COLUMNS.get(name)) is not None and new not in names else name for name in names]
    return table.rename_columns(columns).replace_schema_metadata(table.schema.metadata)  # renaming drops it


def run_info(table: pa.Table) -> RunInfo:
    """The run a records table belongs to, from its schema metadata."""
    metadata = table.schema.metadata or {}
    try:
        return RunInfo(
            run_id=metadata[META_RUN_ID].decode(),
            wall_epoch_ns=int(metadata[META_EPOCH]),
            options=msgspec.json.decode(metadata.get(META_RUN, b"{}"), type=dict[str, Any]),
        )
    except (KeyError, ValueError, msgspec.DecodeError) as exc:
        raise RecordsError(f"the schema metadata lacks or garbles the run ({exc})") from None


def to_records(table: pa.Table) -> list[RequestRecord]:
    """RequestRecord objects from a records table (derived fields are recomputed, as always)."""
    rows = table.to_pylist()
    try:
        return msgspec.convert(rows, list[RequestRecord])
    except msgspec.ValidationError as exc:
        raise RecordsError(f"a row is not a valid record ({exc})") from None


def describe_layout() -> str:
    """The Arrow layout in Markdown (the source of `schemas/records.arrow.md`)."""
    lines = [
        "# agentx replay records: Arrow layout",
        "",
        f"Generated from `agentx/records/record.py` (format `{FORMAT_NAME}` version {FORMAT_VERSION}); do not edit.",
        "",
        "One row per request sent by a replay run, warmup included. After a run that ended (by itself, or",
        "stopped by Ctrl-C or SIGTERM) the file is an Arrow IPC **file** (zstd buffers, with its footer): it opens",
        "in `pyarrow.ipc.open_file`, `pyarrow.feather.read_table`, `polars.read_ipc` and every Arrow file reader.",
        "While the run goes it is an Arrow IPC **stream** (uncompressed), written a record batch at a time (16",
        "rows or 0.5 s during a replay), so a killed run's file reads back up to its last complete batch: open it with",
        "`agentx.read_records`, `pyarrow.ipc.open_stream` or `polars.read_ipc_stream`, or make it a file with",
        "`agentx export RUN_DIR --format arrow`. The closing writer swaps the file in atomically, so a crash",
        "while it does leaves the whole stream.",
        "",
        "All `*_ns` columns are integer nanoseconds on the run's monotonic clock, counted from the run start;",
        f"wall-clock time = `{META_EPOCH.decode()}` (schema metadata) + the offset. `*_s` columns are seconds.",
        "",
        "| column | Arrow type | meaning |",
        "|---|---|---|",
    ]
    for field, meaning in COLUMNS:
        nullable = "" if field.nullable else ", not null"
        lines.append(f"| `{field.name}` | `{field.type}`{nullable} | {meaning} |")
    lines += [
        "",
        "## Schema metadata",
        "",
        "| key | value |",
        "|---|---|",
        f"| `{META_FORMAT.decode()}` | `{FORMAT_NAME}` |",
        f"| `{META_VERSION.decode()}` | `MAJOR.MINOR`; a reader refuses a newer major version "
        "(agentx.format_version) |",
        f"| `{META_RUN_ID.decode()}` | the run id (also in every row) |",
        f"| `{META_ROWS.decode()}` | the rows the file holds, decimal: only in the IPC file a run's end writes (since "
        "1.13), so that a copy cut short tells how many rows it lost (`agentx.read_records` refuses it) |",
        f"| `{META_EPOCH.decode()}` | wall clock (`time.time_ns()`) at the run start, decimal |",
        f"| `{META_RUN.decode()}` | JSON object: the run's options, with credentials redacted, and what it found: "
        "`trace.block_size` (tokens per hash id), `detected.server_cache` (the server's KV-cache `block_size` and "
        "`num_gpu_blocks`, from its `vllm:cache_config_info`; null when it does not say) |",
        "",
        "## Aggregating (InferenceX conventions)",
        "",
        '- Keep rows with `phase = "profiling"` and `status = "ok"`.',
        "- Latency statistics over `ttft_s`, `tpot_s`, `e2el_s` (non-null, > 0); interactivity = 1/`tpot_s`.",
        "- Duration = (max `end_ns` − min `sent_ns`) / 1e9 over the kept rows; throughput = ΣISL, ΣOSL over it,",
        "  with ISL = `isl_server_tokens` else `isl_sent_tokens` and OSL = `osl_server_tokens` else",
        "  `osl_streamed_tokens` (the OSL `tpot_s` uses).",
        "- Theoretical cache hit rate = Σ`theoretical_hit_blocks` / Σ`theoretical_total_blocks` (the trace's, per",
        "  turn); replayed hit rate = Σ`replayed_hit_blocks` / Σ`theoretical_total_blocks` (the run's own bound);",
        "  LRU hit rate = Σ`lru_hit_blocks` / Σ`theoretical_total_blocks` (a cache of the server's capacity).",
        "- The request that released a row is the row whose `request_id` is its `released_by_request_id`; the",
        "  release happened at `scheduled_ns` − `think_s` + `idle_cut_s` (docs/results.md, \"Where a session's time",
        '  goes"). Files from before format 1.11 have none of these columns.',
        "- Goodput (with `--slo`) = the profiling rows with `slo_met` true, per second of that duration; the fraction",
        "  meeting the SLOs is over the profiling rows not cancelled (`error_kind` ≠ `cancelled`). Files from",
        "  before format 1.7 have no `slo_met`.",
        "",
    ]
    return "\n".join(lines)
