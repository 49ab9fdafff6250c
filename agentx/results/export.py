"""AIPerf-compatible exports of a run: `profile_export.jsonl` and `profile_export_aiperf.json` (docs/agentx.md §6).

The files carry every key AIPerf 0.13.0 writes that agentx can measure, by the reference's definitions
(`metrics/types/*.py`, `analysis/sweepline*.py`, `exporters/metrics_json_exporter.py`):

- `agentx.results.export_metrics`: the per-request metrics, computed once for both files;
- `agentx.results.export_jsonl`: `profile_export.jsonl`, one object per record, warmup included;
- `agentx.results.export_summary`: `profile_export_aiperf.json`, the profiling phase's statistics,
  aggregates, time-weighted metrics and `warmup_metrics`, with `metadata.scenario` and the run's validity;
- `agentx.results.export_sweeps`: the sweep-line curves behind `effective_*`, `active_*`, `tokens_in_flight`.

What agentx cannot measure is left out, listed with the reason in those modules' docstrings and in
`NOT_EXPORTED` (`"file.part.key"` → reason). `scripts/aiperf_export_keys.py diff` compares a run's exports
with a reference run's key by key; `tests/fixtures/aiperf_export_keys.json` holds the reference's key sets.
The options of a run come from its run.json, else from the records' schema metadata; none is copied into
either file, so no header or key can leak, and error messages are scrubbed again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import pyarrow as pa

from agentx.errors import ConfigError
from agentx.replayer.records import read_records
from agentx.results import export_jsonl, export_summary
from agentx.results.export_jsonl import conversation_id
from agentx.results.export_metrics import run_context

JSONL_FILE: Final = "profile_export.jsonl"
SUMMARY_FILE: Final = "profile_export_aiperf.json"
RECORDS_FILE: Final = "records.arrow"
RUN_FILE: Final = "run.json"

NOT_EXPORTED: Final[dict[str, str]] = {**export_jsonl.NOT_EXPORTED, **export_summary.NOT_EXPORTED}
"""Every key the reference writes that agentx leaves out (`"jsonl.metrics.http_req_sending"`, ...) → why."""


class ExportError(ConfigError):
    """A run directory that cannot be exported (no records file, an unreadable run.json)."""


RunFile = Mapping[str, Any] | msgspec.Struct | None


def aiperf_jsonl_lines(table: pa.Table, run_file: RunFile = None) -> Iterator[bytes]:
    """The `profile_export.jsonl` lines (newline-terminated) of a records table, a record batch at a time.

    `run_file`: the run's run.json (its options); None reads them from the records' schema metadata.
    """
    return export_jsonl.jsonl_lines(table, run_context(table, run_file))


def write_aiperf_jsonl(table: pa.Table, path: str | os.PathLike[str], run_file: RunFile = None) -> int:
    """Write `profile_export.jsonl` for a records table; returns the lines written."""
    return export_jsonl.write_jsonl(table, run_context(table, run_file), path)


def aiperf_summary(table: pa.Table, run_file: RunFile) -> dict[str, Any]:
    """The `profile_export_aiperf.json` document of a records table and its run file (None: no run.json)."""
    return export_summary.aiperf_summary(table, run_file)


def write_aiperf_summary(table: pa.Table, run_file: RunFile, path: str | os.PathLike[str]) -> dict[str, Any]:
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
    from agentx.replayer.records import RecordsError

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
        write_aiperf_jsonl(table, target, run_file)
    else:
        write_aiperf_summary(table, run_file, target)
    return target


__all__ = [
    "JSONL_FILE",
    "NOT_EXPORTED",
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
