"""AIPerf's per-request records, `profile_export.jsonl` (one `MetricRecordInfo` a line: `metadata`, `metrics`, `error`),
as agentx records (`RequestRecord`), in the file's order (AIPerf writes a record as it is processed, as agentx does).

**Times.** AIPerf's metadata holds wall-clock ns, its metrics durations in display units (`{"value", "unit"}`, ms
as a rule); a record holds ns offsets from the run start. The run start (`wall_epoch_ns`) is the earliest
`credit_issued_ns` or `request_start_ns` of the file, so that no offset is negative.

- `scheduled_ns` = `credit_issued_ns` (else the start), `sent_ns` = `request_start_ns`, `response_ns` =
  `request_ack_ns` (response headers), `end_ns` = `request_end_ns`. AIPerf takes its start before the connection
  is acquired, so its TTFT, and the imported one, includes `http_req_connection_overhead`.
- `first_token_ns` = sent + `time_to_first_token`, `last_token_ns` = sent + `request_latency` (its last content
  chunk): `ttft_s` and `e2el_s` are AIPerf's to the nanosecond.
- `chunk_times_ns`: the first token, then each `inter_chunk_latency` gap (between content chunks) added; one chunk
  at the first token when there is no gap (one content chunk). Without a TTFT (a non-streaming run) the lists stay
  empty.

**Tokens.** `isl_server_tokens` = `usage_prompt_tokens`; `isl_sent_tokens` = `input_sequence_length` (AIPerf's
ISL: the server's count under `--use-server-token-count`, else its tokenizer's), else `error_isl`, else the usage;
`osl_server_tokens` = `usage_completion_tokens`; `osl_streamed_tokens` = `output_sequence_length` (AIPerf's OSL),
else the usage, also for a request without chunk times; `cached_tokens` = `usage_prompt_cache_read_tokens`.
AIPerf counts no tokens per chunk: `chunk_tokens` spread the OSL evenly over the chunks (the first ones take the
remainder), `tokens_estimated` when there are two or more. The trace's counts are not exported:
`isl_recorded_tokens` is the ISL, `osl_recorded_tokens` the `max_tokens` asked, OSL / (1 + `osl_mismatch_diff_pct`
/ 100), else the OSL.

**Identity.** `session_id` = `source_trace_id` (else `conversation_id` up to `::`); `agent_id` = what follows
`::` without its `sa:` ("" for the root); `depth` = `agent_depth`; `turn` = `turn_index`; `correlation_id`,
`root_correlation_id`, `parent_correlation_id`, `request_id` = the `X-Correlation-ID`, root, parent and
`X-Request-ID` AIPerf sent. A play is a root correlation id (else the correlation id, else the line), numbered by
its first start. AIPerf records no lane: a `lane_<n>` worker id (agentx's own export) gives it, else each play, in
the order of its first start, takes the lowest lane whose previous play has ended (`inferred_lanes`). `worker`
numbers AIPerf's worker ids by first appearance. `phase` = `benchmark_phase`.

**Errors.** A record with an `error` (or `was_cancelled`, or `context_overflow_skip`) is `status = "error"`;
`error_kind` (`error_kind`): `cancelled` for a cancellation (`was_cancelled`, or the type `RequestCancellationError`,
as AIPerf marks one; its code 499 alone is not taken for one, as a server may answer 499 itself),
`context_overflow` when its text names one, `rate_limited` for 429 and `http` for another status ≥ 400
(`http_status` = the code), `timeout` and
`connection` by the exception's name and text (`ClientConnectorError`, a reset, `ClientPayloadError`: the stream was
cut), else `protocol`; agentx's own kinds as `type` (its export) are taken as they are. `error_message` = type and
message. AIPerf writes no metric of a failed request but, at most, `error_isl`.

Left None or empty, AIPerf does not record them: `queued_ns`, `http_status` of a success, `timeout_kind`,
`cache_bust_tokens` (0), `theoretical_*` and `replayed_hit_blocks`, `api_time_recorded_s`, `ttft_recorded_s`,
`slo_met`, `node` (""); `connection_retries` is 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, get_args

import msgspec

from agentx.errors import ArtifactError
from agentx.records.kinds import ErrorKind
from agentx.records.record import Phase, RequestRecord
from agentx.replayer.http.exchange import CONTEXT_OVERFLOW_SUBSTRINGS, overflows

NS_PER_UNIT: Final = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9, "sec": 1e9}
"""Nanoseconds in each time unit AIPerf displays a duration in."""
CANCELLATION_TYPE: Final = "RequestCancellationError"
ERROR_KINDS: Final[dict[str, ErrorKind]] = {kind: kind for kind in get_args(ErrorKind)}
"""agentx's error kinds by name: its own export writes a non-HTTP failure's kind as the error's `type`."""
_LANE_WORKER: Final = re.compile(r"lane_(\d+)")
_CONNECTION_WORDS: Final = ("connect", "reset", "disconnect", "payload", "broken pipe", "closed", "oserror", "eof")


class Metric(msgspec.Struct, kw_only=True):
    """One metric of a record: its value in `unit`."""

    value: Any = None
    unit: str = ""


class ErrorDetails(msgspec.Struct, kw_only=True):
    """AIPerf's `ErrorDetails` of a failed record."""

    code: int | None = None
    type: str | None = None
    message: str | None = None
    cause: str | None = None


class Metadata(msgspec.Struct, kw_only=True):
    """The part of AIPerf's `MetricRecordMetadata` an agentx record uses (times: wall-clock ns)."""

    x_request_id: str | None = None
    x_correlation_id: str | None = None
    conversation_id: str | None = None
    turn_index: int | None = None
    source_trace_id: str | None = None
    credit_issued_ns: int | None = None
    request_start_ns: int
    request_ack_ns: int | None = None
    request_end_ns: int
    worker_id: str | None = None
    benchmark_phase: str | None = None
    phase_kind: str | None = None
    was_cancelled: bool = False
    context_overflow_skip: bool = False
    agent_depth: int | None = None
    parent_correlation_id: str | None = None
    root_correlation_id: str | None = None


class Metrics(msgspec.Struct, kw_only=True):
    """The metrics of a record an agentx record uses (the others are not decoded)."""

    time_to_first_token: Metric | None = None
    request_latency: Metric | None = None
    inter_chunk_latency: Metric | None = None
    input_sequence_length: Metric | None = None
    output_sequence_length: Metric | None = None
    usage_prompt_tokens: Metric | None = None
    usage_completion_tokens: Metric | None = None
    usage_prompt_cache_read_tokens: Metric | None = None
    osl_mismatch_diff_pct: Metric | None = None
    error_isl: Metric | None = None

    def get(self, tag: str) -> Metric | None:
        """Metric `tag`, None when the record has none."""
        metric: Metric | None = getattr(self, tag)
        return metric


class AiperfRecord(msgspec.Struct, kw_only=True):
    """One line of `profile_export.jsonl`."""

    metadata: Metadata
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    error: ErrorDetails | None = None

    @property
    def first_ns(self) -> int:
        """Its earliest wall-clock time: the credit's issue, else the start."""
        credit = self.metadata.credit_issued_ns
        start = self.metadata.request_start_ns
        return start if credit is None else min(credit, start)

    @property
    def failed(self) -> bool:
        meta = self.metadata
        return self.error is not None or meta.was_cancelled or meta.context_overflow_skip


_DECODER: Final = msgspec.json.Decoder(AiperfRecord)


class AiperfFile(msgspec.Struct, kw_only=True):
    """The records of a `profile_export.jsonl` and the line each was on."""

    path: str
    records: list[AiperfRecord]
    lines: list[int]

    def where(self, index: int) -> str:
        """`file:line` of record `index`, for an error message."""
        return f"{self.path}:{self.lines[index]}"


def read_aiperf_records(path: Path) -> AiperfFile:
    """The records of a `profile_export.jsonl`, blank lines skipped; ArtifactError names the first line that is not
    AIPerf's (or the file, when it cannot be read or holds no record)."""
    records, numbers = [], []
    try:
        with path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(_DECODER.decode(line))
                except msgspec.DecodeError as exc:
                    raise ArtifactError(f"{path}:{number}: not an AIPerf per-request record ({exc})") from None
                numbers.append(number)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not records:
        raise ArtifactError(f"{path}: holds no record (AIPerf writes one JSON object per request)")
    return AiperfFile(path=str(path), records=records, lines=numbers)


def epoch_ns(records: Sequence[AiperfRecord]) -> int:
    """The run start: the earliest credit issue or request start of `records` (wall-clock ns)."""
    return min(record.first_ns for record in records)


# ---------------------------------------------------------------------------------------------
# one record


def duration_ns(record: AiperfRecord, tag: str, where: str) -> int | None:
    """Metric `tag` in ns (None when absent); ArtifactError for a value that is not a duration."""
    metric = record.metrics.get(tag)
    if metric is None:
        return None
    scale = NS_PER_UNIT.get(metric.unit)
    if scale is None or not _number(metric.value):
        raise ArtifactError(f"{where}: {tag} is not a duration ({metric.value!r} {metric.unit!r})")
    return round(float(metric.value) * scale)


def gaps_ns(record: AiperfRecord, where: str) -> list[int]:
    """The `inter_chunk_latency` gaps in ns ([] when absent)."""
    metric = record.metrics.get("inter_chunk_latency")
    if metric is None:
        return []
    scale = NS_PER_UNIT.get(metric.unit)
    values = metric.value
    if scale is None or not isinstance(values, list) or not all(_number(v) for v in values):
        raise ArtifactError(f"{where}: inter_chunk_latency is not a list of durations ({metric.unit!r})")
    return [round(float(v) * scale) for v in values]


def tokens(record: AiperfRecord, tag: str, where: str) -> int | None:
    """Metric `tag` as a token count (None when absent)."""
    metric = record.metrics.get(tag)
    if metric is None:
        return None
    if not _number(metric.value) or float(metric.value) < 0:
        raise ArtifactError(f"{where}: {tag} is not a token count ({metric.value!r})")
    return round(float(metric.value))


def percent(record: AiperfRecord, tag: str, where: str) -> float | None:
    """Metric `tag` as a number (None when absent)."""
    metric = record.metrics.get(tag)
    if metric is None:
        return None
    if not _number(metric.value):
        raise ArtifactError(f"{where}: {tag} is not a number ({metric.value!r})")
    return float(metric.value)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def spread(total: int, chunks: int) -> list[int]:
    """`total` tokens over `chunks` chunks as evenly as whole tokens go, the first chunks taking the remainder."""
    if chunks <= 0:
        return []
    base, extra = divmod(total, chunks)
    return [base + 1] * extra + [base] * (chunks - extra)


def requested_osl(osl: int, mismatch_pct: float | None) -> int:
    """The `max_tokens` asked, from the OSL and AIPerf's `osl_mismatch_diff_pct` ((OSL − asked) / asked · 100)."""
    if mismatch_pct is None or mismatch_pct <= -100.0:
        return osl
    return round(osl / (1.0 + mismatch_pct / 100.0))


def error_kind(error: ErrorDetails | None, cancelled: bool, overflow: bool) -> tuple[ErrorKind, int | None]:
    """The record's error kind and HTTP status (see the module docstring)."""
    code = error.code if error is not None else None
    status = code if code is not None and 100 <= code <= 599 else None
    kind_name = (error.type or "") if error is not None else ""
    # AIPerf marks its own cancellation by `was_cancelled` and the type; code 499 alone may be a server's answer.
    if cancelled or kind_name == CANCELLATION_TYPE:
        return "cancelled", None
    if (own := ERROR_KINDS.get(kind_name)) is not None:
        return own, status
    text = " ".join(part for part in (kind_name, error.message, error.cause) if part) if error is not None else ""
    if overflow or overflows(text, CONTEXT_OVERFLOW_SUBSTRINGS):
        return "context_overflow", status
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        return "rate_limited", status
    if status is not None and status >= 400:
        return "http", status
    lowered = text.lower()
    if "timeout" in lowered or "timed out" in lowered:
        return "timeout", status
    if any(word in lowered for word in _CONNECTION_WORDS):
        return "connection", status
    return "protocol", status


def error_message(error: ErrorDetails | None) -> str | None:
    if error is None:
        return None
    parts = [part for part in (error.type, error.message) if part]
    return ": ".join(parts) if parts else None


def session_and_agent(meta: Metadata) -> tuple[str, str]:
    """(session id, agent id) of a record: `trace` → (trace, ""), `trace::sa:a` → (trace, "a"), `trace::fa:000` →
    (trace, "fa:000")."""
    conversation = meta.conversation_id or ""
    trace, _, rest = conversation.partition("::")
    return meta.source_trace_id or trace, rest.removeprefix("sa:")


def phase_of(meta: Metadata) -> Phase:
    return "warmup" if "warmup" in (meta.benchmark_phase, meta.phase_kind) else "profiling"


# ---------------------------------------------------------------------------------------------
# plays, lanes, workers


def play_keys(records: Sequence[AiperfRecord]) -> list[str]:
    """Each record's play: its root correlation id, else its correlation id, else its line."""
    return [
        record.metadata.root_correlation_id or record.metadata.x_correlation_id or f"line:{i}"
        for i, record in enumerate(records)
    ]


def play_numbers(records: Sequence[AiperfRecord]) -> list[int]:
    """Each record's play, the plays numbered by their first request start (then by first line)."""
    keys = play_keys(records)
    first_start: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for i, (key, record) in enumerate(zip(keys, records, strict=True)):
        first_line.setdefault(key, i)
        first_start[key] = min(first_start.get(key, record.metadata.request_start_ns), record.metadata.request_start_ns)
    order = {key: n for n, key in enumerate(sorted(first_line, key=lambda key: (first_start[key], first_line[key])))}
    return [order[key] for key in keys]


def inferred_lanes(records: Sequence[AiperfRecord], plays: Sequence[int]) -> list[int]:
    """Each record's lane: each play, in the order of its first start, on the lowest lane whose previous play
    ended by then (AIPerf records no lane; its concurrency slots are held by plays the same way)."""
    spans: dict[int, list[int]] = {}
    for play, record in zip(plays, records, strict=True):
        meta = record.metadata
        span = spans.setdefault(play, [meta.request_start_ns, meta.request_end_ns])
        span[0] = min(span[0], meta.request_start_ns)
        span[1] = max(span[1], meta.request_end_ns)
    free_at: list[int] = []
    lane_of: dict[int, int] = {}
    for play in sorted(spans, key=lambda p: (spans[p][0], p)):
        start, end = spans[play]
        lane = next((lane for lane, until in enumerate(free_at) if until <= start), len(free_at))
        if lane == len(free_at):
            free_at.append(end)
        else:
            free_at[lane] = end
        lane_of[play] = lane
    return [lane_of[play] for play in plays]


def lanes_and_workers(records: Sequence[AiperfRecord], plays: Sequence[int]) -> tuple[list[int], list[int], bool]:
    """(lane, worker) of each record and whether the lanes were inferred: `lane_<n>` worker ids are agentx's lanes;
    other worker ids are AIPerf's worker processes, numbered by first appearance."""
    matches = [_LANE_WORKER.fullmatch(record.metadata.worker_id or "") for record in records]
    if all(match is not None for match in matches):
        return [int(match.group(1)) for match in matches if match is not None], [0] * len(records), False
    workers: dict[str, int] = {}
    numbered = [workers.setdefault(record.metadata.worker_id or "", len(workers)) for record in records]
    return inferred_lanes(records, plays), numbered, True


# ---------------------------------------------------------------------------------------------
# records


class Converted(msgspec.Struct, kw_only=True):
    """The records of a file and what the conversion could not know."""

    records: list[RequestRecord]
    lanes_inferred: bool
    without_chunks: int
    """Successful records without a TTFT (non-streaming): no chunk times."""


def to_records(aiperf: AiperfFile, *, run_id: str, wall_epoch_ns: int, model: str) -> Converted:
    """The agentx records of AIPerf's (see the module docstring); ArtifactError names the line of a metric that is
    not what its tag says."""
    plays = play_numbers(aiperf.records)
    lanes, workers, inferred = lanes_and_workers(aiperf.records, plays)
    records = []
    without_chunks = 0
    for i, record in enumerate(aiperf.records):
        converted = _record(
            record,
            aiperf.where(i),
            run_id=run_id,
            epoch=wall_epoch_ns,
            model=model,
            slot=(plays[i], lanes[i], workers[i]),
        )
        if converted.status == "ok" and converted.first_token_ns is None:
            without_chunks += 1
        records.append(converted)
    return Converted(records=records, lanes_inferred=inferred, without_chunks=without_chunks)


def _record(
    record: AiperfRecord, where: str, *, run_id: str, epoch: int, model: str, slot: tuple[int, int, int]
) -> RequestRecord:
    """One record; `slot`: its (play, lane, worker)."""
    meta = record.metadata
    play, lane, worker = slot
    session, agent = session_and_agent(meta)
    sent = meta.request_start_ns - epoch
    ttft = duration_ns(record, "time_to_first_token", where)
    latency = duration_ns(record, "request_latency", where)
    first = None if ttft is None else sent + ttft
    last = None if latency is None else sent + latency
    chunk_times: list[int] = []
    if first is not None:
        chunk_times = [first]
        for gap in gaps_ns(record, where):
            chunk_times.append(chunk_times[-1] + gap)
    isl_server = tokens(record, "usage_prompt_tokens", where)
    isl = _first_known(tokens(record, "input_sequence_length", where), tokens(record, "error_isl", where), isl_server)
    osl_server = tokens(record, "usage_completion_tokens", where)
    osl = _first_known(tokens(record, "output_sequence_length", where), osl_server)
    chunk_tokens = spread(osl, len(chunk_times))
    failed = record.failed
    kind, status = error_kind(record.error, meta.was_cancelled, meta.context_overflow_skip) if failed else (None, None)
    credit = meta.credit_issued_ns
    return RequestRecord(
        run_id=run_id,
        phase=phase_of(meta),
        lane=lane,
        play=play,
        session_id=session,
        agent_id=agent,
        depth=meta.agent_depth if meta.agent_depth is not None else int(bool(agent)),
        turn=meta.turn_index if meta.turn_index is not None else 0,
        model=model,
        correlation_id=meta.x_correlation_id or "",
        root_correlation_id=meta.root_correlation_id or meta.x_correlation_id or "",
        parent_correlation_id=meta.parent_correlation_id or "",
        request_id=meta.x_request_id or "",
        scheduled_ns=(meta.request_start_ns if credit is None else credit) - epoch,
        sent_ns=sent,
        response_ns=None if meta.request_ack_ns is None else meta.request_ack_ns - epoch,
        first_token_ns=first,
        last_token_ns=last,
        end_ns=meta.request_end_ns - epoch,
        chunk_times_ns=chunk_times,
        chunk_tokens=chunk_tokens,
        isl_recorded_tokens=isl,
        isl_sent_tokens=isl,
        isl_server_tokens=isl_server,
        osl_recorded_tokens=requested_osl(osl, percent(record, "osl_mismatch_diff_pct", where)),
        osl_server_tokens=osl_server,
        osl_streamed_tokens=osl,
        tokens_estimated=len(chunk_tokens) > 1,
        cached_tokens=tokens(record, "usage_prompt_cache_read_tokens", where),
        status="error" if failed else "ok",
        error_kind=kind,
        error_message=error_message(record.error) if failed else None,
        http_status=status,
        worker=worker,
    )


def _first_known(*values: int | None) -> int:
    return next((value for value in values if value is not None), 0)
