"""A run folder's file names, which every layer shares, the rule that a run (or a file a command writes) is never
replaced silently, and reading its records whole: run.json says how many rows the run recorded, which a records file
cut short since falls short of.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from agentx.errors import OutputExists, RecordsDamaged, RecordsError, RunExists

if TYPE_CHECKING:
    import pyarrow as pa

RECORDS_FILE: Final = "records.arrow"
"""The run's records (agentx.records.record), written as the run goes."""
RUN_FILE: Final = "run.json"
"""Written into the run folder at the end of every run (interrupted ones too): options, run, summary."""
SERVER_METRICS_FILE: Final = "server_metrics.arrow"
"""The server's telemetry scraped while the run went (agentx.replayer.telemetry.arrow_file)."""
SWEEP_FILE: Final = "sweep.json"
"""A sweep folder's index of its levels, each a run folder (agentx.results.folders.sweep_index)."""
REPEATS_FILE: Final = "repeats.json"
"""A folder of repeats' index: r1 ... rN, each a run or a sweep folder (agentx.results.folders.repeat_index)."""


RUN_FILES: Final = (RECORDS_FILE, RUN_FILE)
"""Either says a folder holds a run (an import writes both; a run killed before its end, records alone)."""


def refuse_existing_run(out_dir: Path, overwrite: bool) -> None:
    """Raise RunExists when `out_dir` holds a run's files and `overwrite` is off: a run is never replaced silently.
    The one rule for every way a run folder is written (a replay in any mode, an import, the command line's check
    before anything starts)."""
    held = [name for name in RUN_FILES if (out_dir / name).exists()]
    if held and not overwrite:
        said = f"{out_dir} already holds a run ({', '.join(held)})"
        raise RunExists(f"{said}; pass overwrite=True to replace it").worded_for_cli(
            f"{said}; choose another --out, or pass --overwrite to replace it"
        )


def refuse_existing_file(path: Path, overwrite: bool, *, named_by: str) -> None:
    """Raise OutputExists when `path` exists and `overwrite` is off: a file a command writes (an export, a converted
    trace) never replaces one silently either. `named_by`: what names `path` on the command line (`--out`,
    `DESTINATION`), which the command line's message offers to change."""
    if path.exists() and not overwrite:
        said = f"{path} already exists"
        raise OutputExists(f"{said}; pass overwrite=True to replace it").worded_for_cli(
            f"{said}; pass --overwrite to replace it, or choose another {named_by}"
        )


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through `<path>.partial`, renamed over it: a reader sees the old file or the new one,
    never half of one. An OSError (naming the file) leaves no partial file behind."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


def write_json_atomically(path: Path, document: Any, enc_hook: Any = None) -> None:
    """`document` as indented JSON, one line feed at the end, written atomically (`write_atomically`)."""
    write_atomically(path, msgspec.json.format(msgspec.json.encode(document, enc_hook=enc_hook)) + b"\n")


class Recorded(msgspec.Struct, frozen=True):
    """What run.json says of its run's records file: the rows the run left in it at its end (its summary's
    `counts.rows`, or `run.records_kept` when some could not be written), and the run (`run_id`; None: it does not
    say)."""

    rows: int
    run_id: str | None = None


def recorded(run_file: object) -> Recorded | None:
    """What a run.json (a decoded document) says of its records file; None when it does not say (no run.json:
    None, another layout)."""
    summary = run_file.get("summary") if isinstance(run_file, dict) else None
    counts = summary.get("counts") if isinstance(summary, dict) else None
    rows = counts.get("rows") if isinstance(counts, dict) else None
    run = run_file.get("run") if isinstance(run_file, dict) else None
    kept = run.get("records_kept") if isinstance(run, dict) else None
    if isinstance(kept, int) and not isinstance(kept, bool):
        rows = kept  # the disk took fewer rows than the run measured: the file holds these
    if not isinstance(rows, int) or isinstance(rows, bool):
        return None
    run_id = summary.get("run_id") if isinstance(summary, dict) else None
    return Recorded(rows, run_id if isinstance(run_id, str) else None)


def read_run_records(records: Path, said: Recorded | None) -> pa.Table:
    """The records of a run folder's `records` file, whole: `RecordsDamaged` when fewer rows can be read than its
    run.json `said` the run recorded (None: there is none), or than the file itself says.

    The error names run.json's count when there is one (a stream cut short, a killed run's, has no count of its
    own, and run.json is the witness a user knows); run.json of another run (one that a killed `--overwrite` run
    left behind) witnesses nothing."""
    from agentx.records.record import read_records, run_info

    try:
        table = read_records(records)
    except RecordsDamaged as exc:
        rows = _rows_of(said, _run_id(records))
        if rows is None:
            raise
        raise RecordsDamaged(exc.path, exc.rows_read, rows, RUN_FILE) from None
    _check(records, table.num_rows, _rows_of(said, run_info(table).run_id))
    return table


def count_run_records(records: Path, said: Recorded | None) -> int:
    """The rows of a run folder's `records` file that can be read, cheaply (through its footer only the batches'
    headers are read); `RecordsDamaged` as `read_run_records` raises it, `RecordsError` when the file cannot be
    read at all."""
    from agentx.records.record import RecordsReader

    try:
        reader = RecordsReader(records)
    except RecordsDamaged as exc:  # cut before its schema ends: whose it is cannot be told
        if (rows := _rows_of(said, None)) is None:
            raise
        raise RecordsDamaged(exc.path, 0, rows, RUN_FILE) from None
    with reader:
        count = reader.count_rows()
        rows = _rows_of(said, _schema_run_id(reader.schema))
        if reader.short:
            if rows is None:
                raise RecordsDamaged(reader.path, count, reader.rows_expected)
            raise RecordsDamaged(reader.path, count, rows, RUN_FILE)
    _check(records, count, rows)
    return count


def _rows_of(said: Recorded | None, run_id: str | None) -> int | None:
    """run.json's count, unless it is another run's (`run_id` None: a file cut before it says whose it is)."""
    if said is None or (None not in (said.run_id, run_id) and said.run_id != run_id):
        return None
    return said.rows


def _check(records: Path, rows_read: int, rows: int | None) -> None:
    if rows is not None and rows_read < rows:
        raise RecordsDamaged(str(records), rows_read, rows, RUN_FILE)


def _run_id(records: Path) -> str | None:
    from agentx.records.record import RecordsReader

    try:
        with RecordsReader(records) as reader:
            return _schema_run_id(reader.schema)
    except RecordsError:
        return None


def _schema_run_id(schema: pa.Schema) -> str:
    from agentx.records.record import META_RUN_ID

    run_id: bytes = (schema.metadata or {}).get(META_RUN_ID, b"")
    return run_id.decode("utf-8", "replace")
