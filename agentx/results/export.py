"""AIPerf-compatible exports of a run: `profile_export.jsonl` and `profile_export_aiperf.json` (docs/agentx.md §6, §7).

`profile_export.jsonl` has one object per record, warmup included, in the records file's order:

- `metadata`: AIPerf's `MetricRecordMetadata` fields plus the DAG tags. Times are wall-clock ns
  (`wall_epoch_ns` + the record's offset). `credit_issued_ns` = `credit_received_ns` = when the request was due
  (`scheduled_ns`; agentx has no separate credit hand-off); `request_start_ns` = sent; `request_ack_ns` = the
  response headers (the first token in files older than records 1.2); `request_end_ns` = response fully read (`end_ns`).
  `session_num` numbers the (play, conversation) pairs in order of first appearance; `request_num` is the row
  index; `x_request_id` is synthesized as `"{run_id}:{request_num}"` (agentx sends none). `conversation_id` is
  the session id, `"{session_id}::sa:{agent_id}"` for a subagent (§3b). `x_correlation_id` and
  `root_correlation_id` are the play's correlation id (agentx sends one per tree); `parent_correlation_id` is
  null at depth 0, else that same id.
- `metrics`: `{tag: {"value", "unit"}}`, latencies in ms; a metric that is undefined for the record is absent.
- `error`: null, or `{code, type, message, cause}` with `code` = HTTP status, `type` = `error_kind`.

`profile_export_aiperf.json` holds `{tag: {avg, p50, p75, p90, p95, p99, min, max, std, sum, count, unit}}` over
the records InferenceX keeps (profiling, no error; latencies dropping non-finite and ≤ 0 values, as
`agentx.results.summary`), the counts, `benchmark_duration`, throughputs and `metadata` with the run's validity.
No options are copied into either file, so no header or key can leak; error messages are scrubbed again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agentx.replay.records import read_records, run_info, scrub
from agentx.results.summary import PERCENTILES, percentile
from agentx.results.validity import Validity, validity

JSONL_FILE: Final = "profile_export.jsonl"
SUMMARY_FILE: Final = "profile_export_aiperf.json"
RECORDS_FILE: Final = "records.arrow"
RUN_FILE: Final = "run.json"

MS_PER_S: Final = 1e3
NS_PER_MS: Final = 1e6
NS_PER_S: Final = 1e9

# Only the columns the export reads: the per-chunk lists dominate a batch's size and are not exported.
_JSONL_COLUMNS: Final = (
    "phase",
    "lane",
    "play",
    "session_id",
    "agent_id",
    "depth",
    "turn",
    "correlation_id",
    "scheduled_ns",
    "sent_ns",
    "response_ns",
    "first_token_ns",
    "last_token_ns",
    "end_ns",
    "isl_sent_tokens",
    "isl_server_tokens",
    "osl_server_tokens",
    "osl_streamed_tokens",
    "cached_tokens",
    "status",
    "error_kind",
    "error_message",
    "http_status",
    "ttft_s",
    "e2e_s",
    "itl_s",
)
_ENCODER: Final = msgspec.json.Encoder()


class ExportError(Exception):
    """A run directory that cannot be exported (no records file, an unreadable run.json)."""


def conversation_id(session_id: str, agent_id: str) -> str:
    """The reference's session id: the trace id for the root agent, `trace_id::sa:<agent_id>` for a subagent."""
    return session_id if not agent_id else f"{session_id}::sa:{agent_id}"


def _metric(value: float | int, unit: str) -> dict[str, Any]:
    return {"value": value, "unit": unit}


def _row_metrics(row: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    metrics: dict[str, dict[str, Any]] = {}
    for tag, column in (("time_to_first_token", "ttft_s"), ("request_latency", "e2e_s")):
        if row[column] is not None:
            metrics[tag] = _metric(row[column] * MS_PER_S, "ms")
    if row["itl_s"] is not None:
        metrics["inter_token_latency"] = _metric(row["itl_s"] * MS_PER_S, "ms")
        # AIPerf reports the same per-token figure per user as tokens/s.
        if row["itl_s"] > 0:
            metrics["output_token_throughput_per_user"] = _metric(1.0 / row["itl_s"], "tokens/sec/user")
    if row["first_token_ns"] is not None and row["last_token_ns"] is not None:
        metrics["decode_duration"] = _metric((row["last_token_ns"] - row["first_token_ns"]) / NS_PER_MS, "ms")
    isl = row["isl_server_tokens"] if row["isl_server_tokens"] is not None else row["isl_sent_tokens"]
    metrics["input_sequence_length"] = _metric(isl, "tokens")
    if row["status"] == "ok":
        osl = row["osl_server_tokens"] if row["osl_server_tokens"] is not None else row["osl_streamed_tokens"]
        metrics["output_sequence_length"] = _metric(osl, "tokens")
    if row["isl_server_tokens"] is not None:
        metrics["usage_prompt_tokens"] = _metric(row["isl_server_tokens"], "tokens")
    if row["osl_server_tokens"] is not None:
        metrics["usage_completion_tokens"] = _metric(row["osl_server_tokens"], "tokens")
    if row["cached_tokens"] is not None:
        metrics["usage_prompt_cache_read_tokens"] = _metric(row["cached_tokens"], "tokens")
    return metrics


def _row_error(row: Mapping[str, Any]) -> dict[str, Any] | None:
    if row["status"] == "ok":
        return None
    kind = row["error_kind"] or "unknown"
    return {
        "code": row["http_status"],
        "type": kind,
        "message": scrub(row["error_message"] or kind),
        "cause": None,
    }


def aiperf_jsonl_lines(table: pa.Table) -> Iterator[bytes]:
    """The `profile_export.jsonl` lines (newline-terminated) of a records table, a record batch at a time."""
    info = run_info(table)
    epoch_ns, run_id = info.wall_epoch_ns, info.run_id
    sessions: dict[tuple[int, str], int] = {}
    request_num = 0
    columns = [name for name in _JSONL_COLUMNS if name in table.schema.names]
    for batch in table.select(columns).to_batches():
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            row = {name: data[name][i] for name in columns}
            conversation = conversation_id(row["session_id"], row["agent_id"])
            session_num = sessions.setdefault((row["play"], conversation), len(sessions))
            cancelled = row["error_kind"] == "cancelled"
            ack = row.get("response_ns") or row["first_token_ns"]
            correlation = row["correlation_id"] or None
            metadata = {
                "session_num": session_num,
                "request_num": request_num,
                "x_request_id": f"{run_id}:{request_num}",
                "x_correlation_id": correlation,
                "conversation_id": conversation,
                "turn_index": row["turn"],
                "credit_issued_ns": epoch_ns + row["scheduled_ns"],
                "credit_received_ns": epoch_ns + row["scheduled_ns"],
                "request_start_ns": epoch_ns + row["sent_ns"],
                "request_ack_ns": None if ack is None else epoch_ns + ack,
                "request_end_ns": epoch_ns + row["end_ns"],
                "worker_id": f"lane_{row['lane']}",
                "record_processor_id": "agentx",
                "benchmark_phase": row["phase"],
                "was_cancelled": cancelled,
                "cancellation_time_ns": epoch_ns + row["end_ns"] if cancelled else None,
                "agent_depth": row["depth"],
                "parent_correlation_id": correlation if row["depth"] > 0 else None,
                "root_correlation_id": correlation,
            }
            document = {"metadata": metadata, "metrics": _row_metrics(row), "error": _row_error(row)}
            yield _ENCODER.encode(document) + b"\n"
            request_num += 1


def write_aiperf_jsonl(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write `profile_export.jsonl` for a records table; returns the lines written."""
    count = 0
    with open(os.fspath(path), "wb") as out:
        for line in aiperf_jsonl_lines(table):
            out.write(line)
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# the aggregate file


def _column(table: pa.Table, name: str) -> npt.NDArray[np.float64]:
    """The column as float64 with nulls as NaN; all NaN when absent."""
    if name not in table.schema.names:
        return np.full(table.num_rows, np.nan)
    return np.asarray(pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _coalesced(table: pa.Table, name: str, fallback: str) -> npt.NDArray[np.float64]:
    values = _column(table, name)
    return np.where(np.isnan(values), _column(table, fallback), values)


def _mask(table: pa.Table, name: str, value: str, *, missing: bool) -> npt.NDArray[np.bool_]:
    if name not in table.schema.names:
        return np.full(table.num_rows, missing, dtype=bool)
    mask = pc.fill_null(pc.equal(table.column(name), value), False)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def _stats(values: npt.NDArray[np.float64], unit: str) -> dict[str, Any] | None:
    """AIPerf's statistic block of `values` (None when empty); percentiles by InferenceX's interpolation."""
    if values.size == 0:
        return None
    data = np.sort(values)
    result: dict[str, Any] = {"avg": float(data.mean())}
    for p in PERCENTILES:
        result[f"p{p:g}"] = percentile(data, p)
    result |= {
        "min": float(data[0]),
        "max": float(data[-1]),
        "std": float(data.std()),  # population std (pstdev), as InferenceX
        "sum": float(data.sum()),
        "count": int(data.size),
        "unit": unit,
    }
    return result


def _scalar(value: float | int, unit: str) -> dict[str, Any]:
    return {"avg": value, "unit": unit}


def aiperf_summary(table: pa.Table, run_file: Mapping[str, Any] | msgspec.Struct | None) -> dict[str, Any]:
    """The `profile_export_aiperf.json` document of a records table and its run file (None: no run.json)."""
    profiling = ~_mask(table, "phase", "warmup", missing=False)
    ok = _mask(table, "status", "ok", missing=True)
    kept = profiling & ok
    document: dict[str, Any] = {}

    def positive_ms(column: str) -> npt.NDArray[np.float64]:
        values = _column(table, column)[kept]
        return values[np.isfinite(values) & (values > 0)] * MS_PER_S

    itl_ms = positive_ms("itl_s")
    isl = _coalesced(table, "isl_server_tokens", "isl_sent_tokens")[kept]
    osl = _coalesced(table, "osl_server_tokens", "osl_streamed_tokens")[kept]
    cached = _column(table, "cached_tokens")[kept]
    blocks = {
        "time_to_first_token": _stats(positive_ms("ttft_s"), "ms"),
        "request_latency": _stats(positive_ms("e2e_s"), "ms"),
        "inter_token_latency": _stats(itl_ms, "ms"),
        "output_token_throughput_per_user": _stats(MS_PER_S / itl_ms, "tokens/sec/user"),
        "input_sequence_length": _stats(isl, "tokens"),
        "output_sequence_length": _stats(osl, "tokens"),
        "usage_prompt_cache_read_tokens": _stats(cached[np.isfinite(cached)], "tokens"),
    }
    document |= {tag: block for tag, block in blocks.items() if block is not None}

    hits = _column(table, "theoretical_hit_blocks")[kept]
    totals = _column(table, "theoretical_total_blocks")[kept]
    both = np.isfinite(hits) & np.isfinite(totals)
    hit_sum, total_sum = int(hits[both].sum()), int(totals[both].sum())
    if total_sum > 0:
        document["theoretical_prefix_cache_hit"] = {
            "avg": 100.0 * hit_sum / total_sum,
            "sum": hit_sum,
            "count": total_sum,
            "unit": "%",
        }

    request_count = int(kept.sum())
    error_count = int((profiling & ~ok).sum())
    document["request_count"] = _scalar(request_count, "requests")
    document["error_request_count"] = _scalar(error_count, "requests")
    document["completed_request_count"] = _scalar(request_count + error_count, "requests")
    if request_count:
        start_ns = int(pc.min(table.column("sent_ns").filter(pa.array(kept))).as_py())
        end_ns = int(pc.max(table.column("end_ns").filter(pa.array(kept))).as_py())
        duration_s = (end_ns - start_ns) / NS_PER_S
        document["benchmark_duration"] = _scalar(duration_s, "sec")
        if duration_s > 0:
            isl_sum, osl_sum = float(isl.sum()), float(osl.sum())
            document["request_throughput"] = _scalar(request_count / duration_s, "requests/sec")
            document["input_token_throughput"] = _scalar(isl_sum / duration_s, "tokens/sec")
            document["output_token_throughput"] = _scalar(osl_sum / duration_s, "tokens/sec")
            document["total_token_throughput"] = _scalar((isl_sum + osl_sum) / duration_s, "tokens/sec")

    verdict: Validity = validity(table, run_file)
    document["metadata"] = {
        "submission_valid": verdict.valid,
        "submission_invalid_reasons": verdict.reasons,
        "agentx": {"run_id": run_info(table).run_id, "validity": verdict.details},
    }
    return document


def write_aiperf_summary(
    table: pa.Table, run_file: Mapping[str, Any] | msgspec.Struct | None, path: str | os.PathLike[str]
) -> dict[str, Any]:
    """Write `profile_export_aiperf.json`; returns the document written."""
    document = aiperf_summary(table, run_file)
    data = msgspec.json.format(msgspec.json.encode(document)) + b"\n"
    Path(path).write_bytes(data)
    return document


# ---------------------------------------------------------------------------------------------
# run directories


def load_run(run_dir: str | os.PathLike[str]) -> tuple[pa.Table, dict[str, Any] | None]:
    """The records table of a run directory and its `run.json` as a dict (None when the run wrote none).

    Raises `ExportError` (one line, no traceback needed) for a missing directory or records file, an
    unreadable records file, or a `run.json` that is not a JSON object.
    """
    from agentx.replay.records import RecordsError

    directory = Path(run_dir)
    if not directory.is_dir():
        what = "not a directory" if directory.exists() else "no such run directory"
        raise ExportError(f"{directory}: {what}")
    records = directory / RECORDS_FILE
    if not records.is_file():
        raise ExportError(f"{directory}: not a run directory (it has no {RECORDS_FILE})")
    try:
        table = read_records(records)
    except RecordsError as exc:
        raise ExportError(str(exc)) from None
    run_path = directory / RUN_FILE
    if not run_path.is_file():
        return table, None
    try:
        document = msgspec.json.decode(run_path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ExportError(f"{run_path}: cannot read the run file ({exc})") from None
    if not isinstance(document, dict):
        raise ExportError(f"{run_path}: not a run file (expected a JSON object)")
    return table, document


def export_run(run_dir: str | os.PathLike[str], export_format: str, out: str | os.PathLike[str] | None = None) -> Path:
    """Export a run directory as `aiperf-jsonl` or `aiperf-summary`; returns the file written.

    `out`: the file to write, or an existing directory to write the default file name into (default: the run
    directory). Raises `ExportError` for an unusable run directory, `ValueError` for an unknown format and
    `OSError` when the file cannot be written.
    """
    names = {"aiperf-jsonl": JSONL_FILE, "aiperf-summary": SUMMARY_FILE}
    if export_format not in names:
        raise ValueError(f"unknown export format {export_format!r} (known: {', '.join(names)})")
    table, run_file = load_run(run_dir)
    target = Path(run_dir) / names[export_format] if out is None else Path(out)
    if target.is_dir():
        target = target / names[export_format]
    if export_format == "aiperf-jsonl":
        write_aiperf_jsonl(table, target)
    else:
        write_aiperf_summary(table, run_file, target)
    return target


__all__ = [
    "JSONL_FILE",
    "SUMMARY_FILE",
    "ExportError",
    "aiperf_jsonl_lines",
    "aiperf_summary",
    "conversation_id",
    "export_run",
    "load_run",
    "write_aiperf_jsonl",
    "write_aiperf_summary",
]
