"""A run's records as plain tables: `agentx export RUN_DIR --format arrow|parquet|csv`.

- **arrow**: an Arrow IPC file (zstd, with its footer), the records' columns and schema metadata unchanged.
  Without `--out` the run's own `records.arrow` is finalized in place (`finalize_run`): the stream a killed run
  left becomes the file a clean end leaves (agentx.records.writer, `finalize_records`), written beside it
  and swapped in atomically; a file that already has its footer is left alone.
- **parquet**: zstd, the same columns and types; the schema metadata (the run id, wall-clock epoch and options)
  travels in Parquet's key-value metadata, as pyarrow stores it, so `pyarrow.parquet.read_table` gives it back.
- **csv**: one header row (the column names, in the records' order), one row per record. Strings are quoted, an empty
  string as `""`; a null is an empty field; booleans are `true`/`false`; floats are written to the shortest text that
  reads back to the same value. The list columns (`chunk_times_ns`, `chunk_tokens`, `server_notices`) are JSON arrays in
  one field (`"[52000000,1052000000]"`, `"[]"`, `"[""not_event_stream""]"`), so the file keeps one row per request and
  every value. No metadata: the run's options are in run.json.

`export_table` writes beside its target and renames (`os.replace`), so a failure never leaves half a file and a
file replaced with `--overwrite` stays whole until the new one is.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec
import pyarrow as pa

from agentx.records.ipc_files import with_rows
from agentx.records.record import RecordsReader
from agentx.records.writer import finalize_records, write_records_file

TABLE_FILES: Final[dict[str, str]] = {"arrow": "records.arrow", "parquet": "records.parquet", "csv": "records.csv"}
"""Each format's default file name in the target directory."""
LIST_COLUMNS: Final = ("chunk_times_ns", "chunk_tokens", "server_notices")


class Finalized(msgspec.Struct, frozen=True):
    """What `finalize_run` did to a run's records file."""

    path: Path
    rewritten: bool
    """True when a stream was rewritten as an IPC file; False when the file already was one."""
    rows: int


def finalize_run(records: str | os.PathLike[str]) -> Finalized:
    """Make a run's records file an Arrow IPC file in place (see `finalize_records`); RecordsError if unusable."""
    path = Path(records)
    rewritten = finalize_records(path)
    with RecordsReader(path) as reader:
        rows = sum(batch.num_rows for batch in reader.batches())
    return Finalized(path=path, rewritten=rewritten, rows=rows)


def csv_table(table: pa.Table) -> pa.Table:
    """The records table with each list column as JSON array text (`[1,2]`), as the CSV export writes it."""
    import pyarrow.compute as pc

    for name in LIST_COLUMNS:
        index = table.schema.get_field_index(name)
        if index < 0:
            continue
        column = table.column(index)
        if pa.types.is_string(column.type.value_type):  # JSON strings: quoted (the kinds hold no quote or escape)
            joined = pc.binary_join(column, '","')
            quoted = pc.binary_join_element_wise('["', joined, '"]', "")
            text = pc.if_else(pc.equal(pc.list_value_length(column), 0), "[]", quoted)
        else:
            joined = pc.binary_join(pc.cast(column, pa.list_(pa.string())), ",")
            text = pc.binary_join_element_wise("[", joined, "]", "")
        table = table.set_column(index, pa.field(name, pa.string(), nullable=column.null_count > 0), text)
    return table


def write_csv(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write the records as CSV (header row, list columns as JSON arrays); returns the rows written."""
    import pyarrow.csv as csv

    csv.write_csv(csv_table(table), os.fspath(path), write_options=csv.WriteOptions(include_header=True))
    rows: int = table.num_rows
    return rows


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write the records as Parquet (zstd; schema metadata kept); returns the rows written."""
    import pyarrow.parquet as pq

    pq.write_table(table, os.fspath(path), compression="zstd")
    rows: int = table.num_rows
    return rows


def write_arrow(table: pa.Table, path: str | os.PathLike[str]) -> int:
    """Write the records as an Arrow IPC file (zstd, schema metadata kept); returns the rows written."""
    return write_records_file(table.to_batches(), with_rows(table.schema, table.num_rows), path)


WRITERS: Final[dict[str, Callable[[pa.Table, str], int]]] = {
    "arrow": write_arrow,
    "parquet": write_parquet,
    "csv": write_csv,
}


def export_table(table: pa.Table, export_format: str, target: Path) -> int:
    """Write `table` to `target` as `arrow`, `parquet` or `csv` through a temporary file beside it; returns the rows.

    Raises `ValueError` for another format, `OSError` when the file cannot be written (the target is then untouched).
    """
    if export_format not in WRITERS:
        raise ValueError(f"unknown table format {export_format!r} (known: {', '.join(WRITERS)})")
    temp = str(target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp")
    # Created as a plain file would be (0666 less the umask), not mkstemp's 0600: the export is for others too.
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        rows = WRITERS[export_format](table, temp)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return rows


__all__ = [
    "LIST_COLUMNS",
    "TABLE_FILES",
    "Finalized",
    "csv_table",
    "export_table",
    "finalize_run",
    "write_arrow",
    "write_csv",
    "write_parquet",
]
