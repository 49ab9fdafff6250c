"""Exports of a run: AIPerf's `profile_export.jsonl` and `profile_export_aiperf.json` (docs/agentx.md §6), and the
records as plain tables (Arrow IPC file, Parquet, CSV: agentx.results.export.tables).

The files carry every key AIPerf 0.13.0 writes that agentx can measure, by the reference's definitions
(`aiperf/metrics/types/*.py`, `aiperf/analysis/sweepline*.py`, `aiperf/exporters/metrics_json_exporter.py`):

- `agentx.results.export.aiperf_metrics`: the per-request metrics, computed once for both files;
- `agentx.results.export.aiperf_jsonl`: `profile_export.jsonl`, one object per record, warmup included;
- `agentx.results.export.aiperf_summary`: `profile_export_aiperf.json`, the profiling phase's statistics,
  aggregates, time-weighted metrics and `warmup_metrics`, with `metadata.scenario` and the run's validity;
- `agentx.results.export.time_weighted`: the sweep-line curves behind `effective_*`, `active_*`, `tokens_in_flight`.

What agentx cannot measure is left out, listed with the reason in those modules' docstrings and in
`NOT_EXPORTED` (`"file.part.key"` → reason). `scripts/aiperf_export_keys.py diff` compares a run's exports
with a reference run's key by key; `tests/fixtures/aiperf_export_keys.json` holds the reference's key sets.
The options of a run come from its run.json, else from the records' schema metadata; none is copied into
either file, so no header or key can leak, and error messages are scrubbed again.

`export_run` never replaces an existing file unless told to (`overwrite`), whatever the format; the one exception
is `arrow` into the run's own records.arrow, which only turns a killed run's stream into a file of the same rows.
Nor does it write a short export: records that read fewer rows than run.json says the run recorded (or than the
file itself says it holds) are refused (`RecordsDamaged`, agentx.records.run_folder) before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import pyarrow as pa

from agentx.errors import ExportError, OutputExists, RecordsDamaged, RecordsError, RunInProgress
from agentx.records.run_folder import (
    RECORDS_FILE,
    RUN_FILE,
    count_run_records,
    read_run_records,
    recorded,
    refuse_existing_file,
)
from agentx.results.export import aiperf_jsonl as export_jsonl
from agentx.results.export import aiperf_summary as export_summary
from agentx.results.export.aiperf_jsonl import conversation_id
from agentx.results.export.aiperf_metrics import run_context
from agentx.results.export.tables import TABLE_FILES, Finalized, export_table, finalize_run

JSONL_FILE: Final = "profile_export.jsonl"
SUMMARY_FILE: Final = "profile_export_aiperf.json"

FILES: Final[dict[str, str]] = {"aiperf-jsonl": JSONL_FILE, "aiperf-summary": SUMMARY_FILE, **TABLE_FILES}
"""Every export format → its default file name."""

NOT_EXPORTED: Final[dict[str, str]] = {**export_jsonl.NOT_EXPORTED, **export_summary.NOT_EXPORTED}
"""Every key the reference writes that agentx leaves out (`"jsonl.metrics.http_req_sending"`, ...) → why."""


RunDocument = Mapping[str, Any] | msgspec.Struct | None


def aiperf_jsonl_lines(table: pa.Table, run_file: RunDocument = None) -> Iterator[bytes]:
    """The `profile_export.jsonl` lines (newline-terminated) of a records table, a record batch at a time.

    `run_file`: the run's run.json (its options); None reads them from the records' schema metadata.
    """
    return export_jsonl.jsonl_lines(table, run_context(table, run_file))


def write_aiperf_jsonl(table: pa.Table, path: str | os.PathLike[str], run_file: RunDocument = None) -> int:
    """Write `profile_export.jsonl` for a records table; returns the lines written."""
    return export_jsonl.write_jsonl(table, run_context(table, run_file), path)


def aiperf_summary(table: pa.Table, run_file: RunDocument) -> dict[str, Any]:
    """The `profile_export_aiperf.json` document of a records table and its run file (None: no run.json)."""
    return export_summary.aiperf_summary(table, run_file)


def write_aiperf_summary(table: pa.Table, run_file: RunDocument, path: str | os.PathLike[str]) -> dict[str, Any]:
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
    unreadable records file, or a `run.json` that is not a JSON object; `RecordsDamaged` for records that read
    short (`read_run_records`).
    """
    directory = Path(run_dir)
    records = _records_path(directory)
    document = _run_document(directory)
    try:
        table = read_run_records(records, recorded(document))
    except RecordsDamaged:
        raise
    except RecordsError as exc:
        raise ExportError(str(exc)) from None
    return table, document


def _run_document(directory: Path) -> dict[str, Any] | None:
    """The run.json of `directory` as a dict, None when there is none; ExportError when it is not one."""
    run_path = directory / RUN_FILE
    if not run_path.is_file():
        return None
    try:
        document = msgspec.json.decode(run_path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ExportError(f"{run_path}: cannot read the run file ({exc})") from None
    if not isinstance(document, dict):
        raise ExportError(f"{run_path}: not a run file (expected a JSON object)")
    return document


def export_target(run_dir: str | os.PathLike[str], export_format: str, out: str | os.PathLike[str] | None) -> Path:
    """The file an export writes: `out`, or the format's default name in `out` (a directory) or in the run directory.

    Raises `ValueError` for an unknown format.
    """
    if export_format not in FILES:
        raise ValueError(f"unknown export format {export_format!r} (known: {', '.join(FILES)})")
    target = Path(run_dir) / FILES[export_format] if out is None else Path(out)
    return target / FILES[export_format] if target.is_dir() else target


def is_own_records(run_dir: str | os.PathLike[str], target: Path) -> bool:
    """True when `target` is the run's own records.arrow (an `arrow` export there finalizes it in place)."""
    own = Path(run_dir) / RECORDS_FILE
    return target == own or (target.exists() and own.exists() and target.samefile(own))


def finalize_in_place(run_dir: str | os.PathLike[str]) -> Finalized:
    """Turn the stream a killed run left in `run_dir/records.arrow` into an Arrow IPC file of the same rows.

    Raises `RunInProgress` for a file a replay is still writing, `ExportError` for a missing run directory or
    records file or an unreadable records file, `RecordsDamaged` (the file untouched) for one that reads fewer rows
    than run.json or the file itself says, `OSError` when the file cannot be written (the stream is then untouched).
    """
    from agentx.errors import RecordsInUse

    records = _records_path(run_dir)
    try:
        document = _run_document(Path(run_dir))
    except ExportError:  # an unreadable run.json witnesses nothing; the file's own count still does
        document = None
    try:
        count_run_records(
            records, recorded(document)
        )  # a rewrite of what reads short would lose the torn rest for good
        return finalize_run(records)
    except RecordsInUse as exc:
        raise RunInProgress(str(exc)) from None
    except RecordsDamaged:
        raise
    except RecordsError as exc:
        raise ExportError(str(exc)) from None


def export_run(
    run_dir: str | os.PathLike[str],
    export_format: str,
    out: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Export a run directory as `aiperf-jsonl`, `aiperf-summary`, `arrow`, `parquet` or `csv`; returns the file.

    `out`: the file to write, or an existing directory to write the default file name into (default: the run
    directory). An existing file is replaced only with `overwrite` (`OutputExists` otherwise); `arrow` into the run's
    own records.arrow finalizes it in place (`finalize_in_place`). Raises `ExportError` for an unusable run
    directory, `ValueError` for an unknown format and `OSError` when the file cannot be written.
    """
    target = export_target(run_dir, export_format, out)
    if export_format == "arrow" and is_own_records(run_dir, target):
        return finalize_in_place(run_dir).path
    _records_path(run_dir)  # an unusable run directory is named before an existing output
    refuse_existing_file(target, overwrite, named_by="--out")
    table, run_file = load_run(run_dir)
    if export_format == "aiperf-jsonl":
        write_aiperf_jsonl(table, target, run_file)
    elif export_format == "aiperf-summary":
        write_aiperf_summary(table, run_file, target)
    else:
        export_table(table, export_format, target)
    return target


def _records_path(run_dir: str | os.PathLike[str]) -> Path:
    directory = Path(run_dir)
    if not directory.is_dir():
        what = "not a directory" if directory.exists() else "no such run directory"
        raise ExportError(f"{directory}: {what}")
    records = directory / RECORDS_FILE
    if not records.is_file():
        raise ExportError(f"{directory}: not a run directory (it has no {RECORDS_FILE})")
    return records


__all__ = [
    "FILES",
    "JSONL_FILE",
    "NOT_EXPORTED",
    "SUMMARY_FILE",
    "ExportError",
    "OutputExists",
    "RunInProgress",
    "aiperf_jsonl_lines",
    "aiperf_summary",
    "conversation_id",
    "export_run",
    "export_target",
    "finalize_in_place",
    "is_own_records",
    "load_run",
    "write_aiperf_jsonl",
    "write_aiperf_summary",
]
