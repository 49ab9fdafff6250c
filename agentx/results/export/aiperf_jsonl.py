"""`profile_export.jsonl`: one AIPerf `MetricRecordInfo` object per record, warmup included, in file order.

**metadata** (AIPerf 0.13.0 `MetricRecordMetadata`; times are wall-clock ns, `wall_epoch_ns` + the offset):

- `session_num`: AIPerf numbers its credits per phase in the order they are issued; agentx numbers the rows
  of each phase by `scheduled_ns` (then `sent_ns`, then file order). `request_num` (agentx only) is the row.
- `x_request_id`: the `X-Request-ID` sent (`request_id`); `"{run_id}:{request_num}"` in files older than
  records 1.5, whose requests carried none. `x_correlation_id`: the agent session's `X-Correlation-ID`
  (`correlation_id`; per play of a tree in files older than 1.5). `root_correlation_id` and
  `parent_correlation_id` (null for a root) are the record's, else (files older than 1.5) the play's id.
- `conversation_id`: the session id for the root, `{session}::{agent}` for a chain split out of the root
  (`fa:NNN`, `aux:…`, `wg:…`), `{session}::sa:{agent}` for any other agent. `turn_index` = `turn`.
- `source_trace_id` = the session id; `source_kind`: `weka_main` (root), `weka_flat` (a chain split out of
  the root), `weka_subagent` (any other agent), whatever the trace's input format.
- `credit_issued_ns` = `credit_received_ns` (agentx only) = `scheduled_ns`; `request_start_ns` = sent;
  `request_ack_ns` = response headers (the first token in files older than records 1.2); `request_end_ns` =
  response fully read. `worker_id` = `lane_<lane>`; `record_processor_id` = `agentx`.
- `benchmark_phase`, `phase_kind`: `warmup` or `profiling`. `phase_name`: `agentic.warmup` for an agentx-mode
  warmup, else `warmup`; `profiling`. `phase_index`/`profiling_index`: 0 for profiling (1 after a warmup
  outside agentx mode, whose warmup is 0), null for the agentic warmup.
- `was_cancelled`, `cancellation_time_ns` (= end): a request cancelled after the grace period.
- `context_overflow_skip`: a context overflow of an agentx-mode run (AIPerf's AGENTIC_REPLAY), which the
  reference keeps out of every metric and export: agentx writes the line, flagged, and
  `profile_export_aiperf.json` leaves it out.
- `agent_depth` = `depth`.
- `agentx_rules` (agentx only): the rule set the run played (agentx.replayer.options.rules).

**metrics**: `{tag: {"value", "unit"}}` by the definitions of `agentx.results.export.aiperf_metrics`; a metric
undefined for the record is absent (a failed request has only `error_isl`); the harness's three full-response
metrics only for a run of its rules.

**error**: null, or `{code, type, message, cause}`: `code` = the HTTP error status (499 for a cancellation, as
the reference; null for a failure with no error status, such as a stream cut after its 200), `type` = the
status's reason phrase (`"Internal Server Error"`), `RequestCancellationError` for a cancellation, else
agentx's error kind (`timeout`, `connection`, `protocol`, `http`); `message` scrubbed again; `cause` null.

**Not exported** (the reference writes them; agentx cannot measure them):

- `metadata.source_outer_idx`, `metadata.source_inner_idx`: the request's position in the trace file;
  agentx's trace model and records do not keep it (chains split out of an agent reorder requests).
- `metrics.http_req_blocked`, `http_req_dns_lookup`, `http_req_connecting`: agentx records only their sum
  (queued → sent, `http_req_connection_overhead`).
- `metrics.http_req_sending`: the request goes out in one write whose duration is not recorded.
- `metrics.http_req_data_sent`, `http_req_data_received`, `http_req_chunks_sent`, `http_req_chunks_received`:
  bytes and transport reads/writes are not counted.
- `metrics.http_req_connection_reused`: not recorded (only `connection_retries`).
- `error.cause_chain`: agentx keeps an error kind and a message, not the exception chain.

No options are copied into the file, so no header or key can leak.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa

from agentx.results.export.aiperf_metrics import (
    RunContext,
    column,
    record_metrics,
    top_level_chain,
)
from agentx.results.summary.columns import strings
from agentx.results.summary.stats import FloatArray, IntArray
from agentx.secrets import scrub

NOT_EXPORTED: Final[dict[str, str]] = {
    "jsonl.metadata.source_outer_idx": "the position in the trace file is not recorded",
    "jsonl.metadata.source_inner_idx": "the position in the trace file is not recorded",
    "jsonl.metrics.http_req_blocked": "only queued → sent is recorded (http_req_connection_overhead)",
    "jsonl.metrics.http_req_dns_lookup": "only queued → sent is recorded (http_req_connection_overhead)",
    "jsonl.metrics.http_req_connecting": "only queued → sent is recorded (http_req_connection_overhead)",
    "jsonl.metrics.http_req_sending": "the request's single write is not timed",
    "jsonl.metrics.http_req_data_sent": "bytes are not counted",
    "jsonl.metrics.http_req_data_received": "bytes are not counted",
    "jsonl.metrics.http_req_chunks_sent": "transport writes are not counted",
    "jsonl.metrics.http_req_chunks_received": "transport reads are not counted",
    "jsonl.metrics.http_req_connection_reused": "connection reuse is not recorded",
    "jsonl.error.cause_chain": "agentx keeps an error kind and a message, not the exception chain",
}
"""`file.part.key` → why agentx leaves it out (see the module docstring)."""

_COLUMNS: Final = (
    "phase",
    "lane",
    "play",
    "session_id",
    "agent_id",
    "depth",
    "turn",
    "correlation_id",
    "root_correlation_id",
    "parent_correlation_id",
    "request_id",
    "scheduled_ns",
    "queued_ns",
    "sent_ns",
    "response_ns",
    "first_token_ns",
    "last_token_ns",
    "end_ns",
    "chunk_times_ns",
    "isl_sent_tokens",
    "isl_server_tokens",
    "osl_recorded_tokens",
    "osl_server_tokens",
    "osl_streamed_tokens",
    "cached_tokens",
    "status",
    "error_kind",
    "error_message",
    "http_status",
    "tpot_s",
)
_ENCODER: Final = msgspec.json.Encoder()
CANCELLED_CODE: Final = 499


def conversation_id(session_id: str, agent_id: str, depth: int = 1) -> str:
    """The reference's session id: the trace id for the root, `trace::<chain>` for a chain split out of the root,
    `trace::sa:<agent_id>` for a subagent."""
    if not agent_id:
        return session_id
    if top_level_chain(agent_id, depth):
        return f"{session_id}::{agent_id}"
    return f"{session_id}::sa:{agent_id}"


def source_kind(agent_id: str, depth: int) -> str:
    if not agent_id:
        return "weka_main"
    return "weka_flat" if top_level_chain(agent_id, depth) else "weka_subagent"


def error_details(kind: str | None, http_status: int | None, message: str | None) -> dict[str, Any]:
    """AIPerf's `ErrorDetails` of a failed record."""
    kind = kind or "unknown"
    if kind == "cancelled":
        code: int | None = CANCELLED_CODE
        name = "RequestCancellationError"
    elif http_status is not None and http_status >= 400:
        code = http_status
        try:
            name = HTTPStatus(http_status).phrase
        except ValueError:
            name = f"HTTP {http_status}"
    else:  # a transport failure, or an error event in a 200 stream: AIPerf reports no status for those
        code, name = None, kind
    return {"code": code, "type": name, "message": scrub(message or kind), "cause": None}


def session_numbers(table: pa.Table) -> IntArray:
    """Each row's rank within its phase by (`scheduled_ns`, `sent_ns`, row): AIPerf's per-phase credit number."""
    n = table.num_rows
    warmup = np.array([phase == "warmup" for phase in strings(table, "phase", "profiling")], dtype=bool)
    order = np.lexsort((np.arange(n), column(table, "sent_ns"), column(table, "scheduled_ns"), warmup))
    ranks = np.empty(n, dtype=np.int64)
    for in_phase in (warmup, ~warmup):
        rows = order[in_phase[order]]
        ranks[rows] = np.arange(len(rows))
    return ranks


def _phase_fields(phase: str, ctx: RunContext, has_warmup: bool) -> dict[str, Any]:
    if phase == "warmup":
        if ctx.agentic:
            return {
                "phase_index": None,
                "profiling_index": None,
                "phase_name": "agentic.warmup",
                "phase_kind": "warmup",
            }
        return {"phase_index": 0, "profiling_index": None, "phase_name": "warmup", "phase_kind": "warmup"}
    index = 1 if has_warmup and not ctx.agentic else 0
    return {"phase_index": index, "profiling_index": 0, "phase_name": "profiling", "phase_kind": "profiling"}


def _int(value: float) -> int | None:
    return None if np.isnan(value) else int(value)


def jsonl_lines(table: pa.Table, ctx: RunContext) -> Iterator[bytes]:
    """The `profile_export.jsonl` lines (newline-terminated) of a records table, a record batch at a time."""
    epoch_ns, run_id, rules = ctx.epoch_ns, ctx.run_id, ctx.rules.name
    numbers = session_numbers(table)
    has_warmup = "warmup" in strings(table, "phase", "profiling")
    columns = [name for name in _COLUMNS if name in table.schema.names]
    request_num = 0
    for batch in table.select(columns).to_batches():
        part = pa.Table.from_batches([batch])
        metrics = record_metrics(part, ctx)
        data = batch.to_pydict()
        times: dict[str, FloatArray] = {
            name: column(part, name) for name in ("scheduled_ns", "sent_ns", "response_ns", "first_token_ns", "end_ns")
        }
        for i, row_metrics in enumerate(metrics.rows()):
            row = {name: data[name][i] for name in columns}
            agent, depth = row["agent_id"], int(row["depth"])
            conversation = conversation_id(row["session_id"], agent, depth)
            cancelled = row.get("error_kind") == "cancelled"
            overflow = ctx.agentic and row.get("error_kind") == "context_overflow"
            ack = _int(times["response_ns"][i])
            if ack is None:
                ack = _int(times["first_token_ns"][i])
            correlation = row.get("correlation_id") or None
            root = row.get("root_correlation_id") or correlation
            if "parent_correlation_id" in row:
                parent = row["parent_correlation_id"] or None
            else:  # older files: one id per play, so a child's parent shares it
                parent = correlation if depth > 0 else None
            scheduled, end = int(times["scheduled_ns"][i]), int(times["end_ns"][i])
            metadata = {
                "session_num": int(numbers[request_num]),
                "x_request_id": row.get("request_id") or f"{run_id}:{request_num}",
                "x_correlation_id": correlation,
                "conversation_id": conversation,
                "turn_index": row["turn"],
                "source_trace_id": row["session_id"],
                "source_kind": source_kind(agent, depth),
                "credit_issued_ns": epoch_ns + scheduled,
                "credit_received_ns": epoch_ns + scheduled,
                "request_start_ns": epoch_ns + int(times["sent_ns"][i]),
                "request_ack_ns": None if ack is None else epoch_ns + ack,
                "request_end_ns": epoch_ns + end,
                "worker_id": f"lane_{row['lane']}",
                "record_processor_id": "agentx",
                "benchmark_phase": row["phase"],
                **_phase_fields(row["phase"], ctx, has_warmup),
                "was_cancelled": cancelled,
                "cancellation_time_ns": epoch_ns + end if cancelled else None,
                "context_overflow_skip": overflow,
                "agent_depth": depth,
                "parent_correlation_id": parent,
                "root_correlation_id": root,
                "request_num": request_num,
                "agentx_rules": rules,
            }
            ok = bool(metrics.ok[i])
            error = (
                None if ok else error_details(row.get("error_kind"), row.get("http_status"), row.get("error_message"))
            )
            document = {"metadata": metadata, "metrics": row_metrics, "error": error}
            yield _ENCODER.encode(document) + b"\n"
            request_num += 1


def write_jsonl(table: pa.Table, ctx: RunContext, path: str | os.PathLike[str]) -> int:
    """Write `profile_export.jsonl` for a records table; returns the lines written."""
    count = 0
    with open(os.fspath(path), "wb") as out:
        for line in jsonl_lines(table, ctx):
            out.write(line)
            count += 1
    return count
