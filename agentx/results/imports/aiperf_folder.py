"""An AIPerf artifact folder (`aiperf profile`, agentx-harness's `agentx profile`) made an agentx run folder:
`import_aiperf(artifact_dir, out_dir)` writes `records.arrow` and `run.json` as `agentx replay` does, so that
`agentx report`, `agentx export` and the summary read the run.

It reads `profile_export.jsonl` (required: the records, agentx.results.imports.aiperf_records),
`profile_export_aiperf.json` (the options, rule set and cancellation, agentx.results.imports.aiperf_config) and
`server_metrics_export.json` (the server telemetry, agentx.results.imports.aiperf_server_metrics) when present;
nothing else (the CSV files repeat the JSON's figures; the timeslices and logs are not needed).

run.json: `options` as `aiperf_config.run_options` names them; `run` a `RunResult` (requests, errors, cancelled and
warmup requests counted from the records; `trees_started` the plays; `interrupted` AIPerf's `was_cancelled`;
`elapsed_s` first credit → last end; `trace_path` the dataset; `profiling_start_ns` AIPerf's profiling phase
start, when the server metrics export gives it; `notices` what the import could not know); `summary` from
`summarize` with the server telemetry, validity and audit filled in, as a replay's. `trees_finished` is not
recorded (0), nor `stream_usage`, `calibration`, `server` (the engine's identity), `loop_lag_s`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Final

import msgspec

from agentx.errors import ArtifactError
from agentx.records.record import RunInfo, read_records
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE, refuse_existing_run
from agentx.records.writer import RecordWriter
from agentx.replayer.run_result import RunResult
from agentx.results.folders.run_file import RunFile, write_run_file
from agentx.results.imports import aiperf_config, aiperf_records
from agentx.results.imports.aiperf_server_metrics import (
    ImportedTelemetry,
    import_telemetry,
    read_server_metrics,
    window_ns,
)
from agentx.results.summary.checks.audit import audit
from agentx.results.summary.checks.validity import validity
from agentx.results.summary.server_telemetry import profiling_window_ns
from agentx.results.summary.summarize import Summary, summarize

JSONL_FILE: Final = "profile_export.jsonl"
SUMMARY_FILE: Final = "profile_export_aiperf.json"
SERVER_METRICS_FILE: Final = "server_metrics_export.json"

ALWAYS_MISSING: Final = (
    "AIPerf does not record the trace's ISL, OSL, API time or TTFT: isl_recorded_tokens is the ISL, "
    "osl_recorded_tokens the max_tokens asked, api_time_recorded_s and ttft_recorded_s are null (no slowdown)",
    "AIPerf counts no tokens per chunk: chunk_tokens spread each request's OSL over its chunks (tokens_estimated)",
    "not in AIPerf's export: queued_ns, a success's http_status, timeout_kind, cache-bust tokens, theoretical and "
    "replayed prefix-cache blocks, slo_met, trees finished, the server's identity",
)
"""What no AIPerf export carries (run.json's `run.notices` of every import)."""


class ImportedRun(msgspec.Struct, kw_only=True):
    """An imported run: its folder, what run.json holds, and what the import could not know (`run.notices`)."""

    run_dir: Path
    tool: str
    tool_version: str | None
    options: dict[str, Any]
    run: RunResult
    summary: Summary
    files: list[str]
    """The artifact files read."""


def _run_id(summary: dict[str, Any] | None, jsonl: Path) -> str:
    """AIPerf's benchmark id, else a digest of the records file: one artifact folder is one run id."""
    benchmark = summary.get("benchmark_id") if summary is not None else None
    if isinstance(benchmark, str) and benchmark:
        return benchmark
    return hashlib.sha256(jsonl.read_bytes()).hexdigest()[:32]


def _notes(
    converted: aiperf_records.Converted,
    summary: dict[str, Any] | None,
    options: dict[str, Any],
    telemetry: ImportedTelemetry | None,
) -> list[str]:
    notes = list(ALWAYS_MISSING)
    if converted.lanes_inferred:
        notes.append("AIPerf records no lane: each play is put on the lowest lane free when it starts")
    if converted.without_chunks:
        notes.append(
            f"{converted.without_chunks} successful requests have no time_to_first_token (a non-streaming run): "
            "no chunk times, TTFT, TPOT or ITL"
        )
    if summary is None:
        notes.append(f"no {SUMMARY_FILE}: the model, URL, concurrency, duration and rule set are unknown")
    elif "rules" not in options:
        version, played = options.get("tool_version"), options.get("scenario")
        notes.append(
            f"{options['tool']} {version} (scenario {played}) is not a reference agentx has rules for: validity is "
            "judged under AIPerf 0.13.0's"
        )
    if telemetry is None:
        notes.append(f"no {SERVER_METRICS_FILE}: no server telemetry")
    elif telemetry.telemetry is None:
        notes.append(f"{SERVER_METRICS_FILE}: no engine's metrics agentx maps, or no profiling window")
    if telemetry is not None and telemetry.left_out:
        notes.append(f"gauges of several series left out of the telemetry: {', '.join(telemetry.left_out)}")
    return notes


def import_aiperf(
    artifact_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    num_gpus: int | None = None,
) -> ImportedRun:
    """Import the AIPerf artifact folder `artifact_dir` as the run folder `out_dir` (see the module docstring).

    Everything is read and checked before anything is written. Raises ArtifactError for a folder without a readable
    `profile_export.jsonl` or with an unreadable summary, naming the file (and line); RunExists when `out_dir`
    holds a run and `overwrite` is off; OSError when the run folder cannot be written.
    """
    source = Path(artifact_dir)
    target = Path(out_dir)
    jsonl = source / JSONL_FILE
    if not source.is_dir():
        raise ArtifactError(f"{source}: no such directory (pass the folder AIPerf wrote, its --artifact-dir)")
    if not jsonl.is_file():
        raise ArtifactError(
            f"{source}: no {JSONL_FILE} (AIPerf writes it with its default export level, records; a folder of "
            "summaries only cannot be imported)"
        )
    aiperf = aiperf_records.read_aiperf_records(jsonl)
    summary = aiperf_config.read_summary(source / SUMMARY_FILE)
    server_document = read_server_metrics(source / SERVER_METRICS_FILE)
    options = aiperf_config.run_options(summary, source)
    run_id = _run_id(summary, jsonl)
    epoch = aiperf_records.epoch_ns(aiperf.records)
    converted = aiperf_records.to_records(
        aiperf, run_id=run_id, wall_epoch_ns=epoch, model=aiperf_config.model_name(summary)
    )
    refuse_existing_run(target, overwrite)
    target.mkdir(parents=True, exist_ok=True)
    records_path = target / RECORDS_FILE
    with RecordWriter(records_path, RunInfo(run_id=run_id, wall_epoch_ns=epoch, options=options)) as writer:
        for record in converted.records:
            writer.append(record)
    table = read_records(records_path)

    telemetry = (
        None
        if server_document is None
        else import_telemetry(server_document, epoch, profiling_window_ns(table) if table.num_rows else None)
    )
    window = None if server_document is None else window_ns(server_document, epoch)
    records = converted.records
    run = RunResult(
        run_id=run_id,
        records_path=records_path.resolve(),
        requests=len(records),
        errors=sum(record.status == "error" for record in records),
        cancelled=sum(record.error_kind == "cancelled" for record in records),
        trees_started=len({record.play for record in records}),
        trees_finished=0,
        interrupted=aiperf_config.cancelled(summary),
        elapsed_s=(max(r.end_ns for r in records) - min(r.scheduled_ns for r in records)) / 1e9,
        warmup_requests=sum(record.phase == "warmup" for record in records),
        trace_path=aiperf_config.trace_path(summary),
        profiling_start_ns=None if window is None else window[0],
        notices=_notes(converted, summary, options, telemetry),
    )
    result = summarize(table, num_gpus=num_gpus, server_metrics=telemetry.counters if telemetry is not None else None)
    result.server_telemetry = telemetry.telemetry if telemetry is not None else None
    run_document = {"options": options, "run": msgspec.to_builtins(run, enc_hook=str)}
    result.validity = validity(table, run_document)
    result.audit = audit(table, result)  # again: the telemetry is known now
    write_run_file(target / RUN_FILE, RunFile(options=options, run=run, summary=result))
    files = [name for name in (JSONL_FILE, SUMMARY_FILE, SERVER_METRICS_FILE) if (source / name).is_file()]
    return ImportedRun(
        run_dir=target,
        tool=str(options["tool"]),
        tool_version=options.get("tool_version"),
        options=options,
        run=run,
        summary=result,
        files=files,
    )
