"""Writing records files: `RecordWriter` streams a run's records to disk as the run goes, crash-safe, and leaves an
Arrow IPC file when it closes (`finalize_records`; the layout is agentx.records.record'); `merge_records` joins the
files of a `--workers` run; `write_jsonl` writes JSON Lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final, Self

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc

from agentx.errors import RecordsDamaged, RecordsError, RecordsInUse, os_condition
from agentx.records.ipc_files import META_ROWS, fsync_path, with_rows
from agentx.records.record import (
    COLUMN_NAMES,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_EPOCH,
    META_FORMAT,
    META_RUN,
    META_RUN_ID,
    META_VERSION,
    SCHEMA,
    RecordsReader,
    RequestRecord,
    RunInfo,
    read_records,
    run_info,
)
from agentx.secrets import redact

_log = logging.getLogger(__name__)


STREAM_COMPRESSION: Final[str | None] = None
"""The running stream is not compressed: Arrow compresses each buffer of each batch on its own, and a run's
batches are small (16 rows or 0.5 s each), so zstd saved under half the bytes (1.9 vs 3.6 kB a row of 256 chunks)
for 3-5x the flush time on the event loop (20 rows: 5.7 vs 2.0 ms) and ~30x the time to read the stream back
(1-row batches: 1.8 ms vs 0.06 ms each), which `finalize_records` and a killed run's readers pay."""
FILE_COMPRESSION: Final = "zstd"
"""The finalized file is zstd, in batches of `FINAL_BATCH_ROWS` (1.6 kB a row of 256 chunks)."""


class RecordWriter:
    """Streams records to an Arrow IPC stream file, a record batch at a time; leaves an IPC file when closed.

    `append` only buffers (a list append per column) and writes a batch when `flush_rows` rows are
    pending or `flush_interval_s` has passed since the last write; `maybe_flush` does the time check
    alone, for an engine loop that may go quiet (call it at least once a second: there is no
    background thread). `close` (or leaving the `with` block, whatever ends it) writes the rest and the
    end-of-stream marker, then rewrites the stream as an IPC file in place (`finalize_records`), which every
    Arrow reader opens; if that fails (a full disk) the complete stream stays, a warning is logged and
    `finalized` is False. Batches reach the OS on every flush (no user-space buffering), so a killed process
    leaves a stream holding all but the rows since the last flush; a machine crash may lose what the OS had not
    yet written.
    A write the OS refuses (a full disk, a read-only file system, an I/O error) does not raise: the file is cut back
    to its last whole batch, which every reader reads, `error` keeps the OSError (the path in it), `on_error(error)`
    is called once, and every row from then on is kept in memory (`unwritten`) instead; `close` then ends the file
    there, as a stream.
    A flush runs on the caller's thread and costs ~14 µs a row with 256 chunks (the chunk lists
    dominate): `flush_rows` bounds that pause to ~15 ms even when more than 1,000 requests end a second.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: RunInfo,
        *,
        flush_interval_s: float = 1.0,
        flush_rows: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[pa.RecordBatch], None] | None = None,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        """Create the file and write its schema; an OSError naming the file if the OS refuses (nothing is left)."""
        self.path = os.fspath(path)
        self.on_batch = on_batch
        """Called with each batch of records as it is written (a `--ray` shard ships them to the driver)."""
        self.on_error = on_error
        self.error: OSError | None = None
        """The OS's refusal of a write, which ended the file there (None: every batch reached the OS)."""
        self._unwritten: list[pa.RecordBatch] = []
        self.run_id = run.run_id
        self._interval = flush_interval_s
        self._max_rows = flush_rows
        self._clock = clock
        self._columns: list[list[Any]] = [[] for _ in COLUMN_NAMES]
        self._pending = 0
        self.rows_written = 0
        self.finalized = False
        """True once `close` has turned the stream into an IPC file."""
        metadata = {
            META_FORMAT: FORMAT_NAME.encode(),
            META_VERSION: FORMAT_VERSION.encode(),
            META_RUN_ID: run.run_id.encode(),
            META_EPOCH: str(run.wall_epoch_ns).encode(),
            META_RUN: msgspec.json.encode(redact(run.options)),
        }
        self._schema = SCHEMA.with_metadata(metadata)
        # The stream starts under another name and is renamed into place once its schema is written: a reader
        # polling a live run never finds the file empty. The descriptor (and its lock) follows the rename.
        starting = self.path + ".partial"
        try:
            self._sink = pa.OSFile(starting, "wb")
        except OSError as exc:
            raise _located(exc, self.path) from None
        # Held while the stream is written: `finalize_records` refuses a file a live run still appends to.
        self._lock: int | None = None
        with contextlib.suppress(OSError):
            self._lock = _lock(starting)
        try:
            self._writer: ipc.RecordBatchStreamWriter | None = ipc.new_stream(
                self._sink, self._schema, options=ipc.IpcWriteOptions(compression=STREAM_COMPRESSION)
            )
            # pyarrow writes the schema lazily with the first batch: an empty batch puts the run's
            # metadata on disk now, so even a run killed before its first flush leaves a readable file.
            self._writer.write_batch(_empty_batch(self._schema))
            os.replace(starting, self.path)
        except BaseException as exc:
            self._sink.close()
            _unlock(self._lock)
            with contextlib.suppress(OSError):  # a file without its schema is no run's: not left to pass for one
                os.unlink(starting)
            if not isinstance(exc, OSError):
                raise
            raise _located(exc, self.path) from None
        self._last_flush = clock()

    def append(self, record: RequestRecord) -> None:
        """Buffer one record; write a batch if one is due."""
        if self._writer is None:
            raise ValueError("append to a closed RecordWriter")
        if record.run_id != self.run_id:
            raise ValueError(f"record of run {record.run_id!r} appended to the file of run {self.run_id!r}")
        for column, value in zip(self._columns, msgspec.structs.astuple(record), strict=True):
            column.append(value)
        self._pending += 1
        if self._pending >= self._max_rows:
            self.flush()
        else:
            self.maybe_flush()

    def write_table(self, table: pa.Table) -> None:
        """Write a table of whole records (this file's columns) after the pending rows."""
        if self._writer is None:
            raise ValueError("write to a closed RecordWriter")
        self.flush()
        if table.num_rows:
            cast = table.select(COLUMN_NAMES).cast(self._schema)
            self._write(cast.to_batches(max_chunksize=self._max_rows))

    @property
    def pending(self) -> int:
        """Rows appended and not written yet."""
        return self._pending

    def maybe_flush(self) -> bool:
        """Write the pending rows if `flush_interval_s` has passed since the last write; True if written."""
        if self._pending and self._clock() - self._last_flush >= self._interval:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Write the pending rows as one record batch now."""
        self._last_flush = self._clock()
        if not self._pending or self._writer is None:
            return
        arrays = [pa.array(column, type=field.type) for column, field in zip(self._columns, SCHEMA, strict=True)]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        self._columns = [[] for _ in COLUMN_NAMES]
        self._pending = 0
        self._write([batch])
        if self.on_batch is not None:
            self.on_batch(batch)

    def _write(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Write `batches` to the stream, or keep them in memory once a write has failed (class docstring)."""
        assert self._writer is not None
        for batch in batches:
            if self.error is not None:
                self._unwritten.append(batch)
                continue
            offset = self._sink.tell()
            try:
                self._writer.write_batch(batch)
            except OSError as exc:
                self._fail(exc, offset)
                self._unwritten.append(batch)
                continue
            self.rows_written += batch.num_rows

    def _fail(self, exc: OSError, offset: int) -> None:
        """The OS refused a write: end the file at `offset`, its last whole batch, and say so once."""
        self.error = _located(exc, self.path)
        self._sink.close()  # the stream's writer is not used again: its state after a torn write is unknown
        with contextlib.suppress(OSError):  # a read-only remount refuses this too: readers stop at the torn batch
            os.truncate(self.path, offset)
        _unlock(self._lock)
        self._lock = None
        if self.on_error is not None:
            self.on_error(self.error)

    @property
    def rows_unwritten(self) -> int:
        """Rows kept in memory since a write failed (`error`), not in the file."""
        rows: int = sum(batch.num_rows for batch in self._unwritten)
        return rows + self._pending

    def unwritten(self) -> pa.Table | None:
        """The rows that did not reach the file (after a failed write; pending ones included), None when none."""
        if self.error is None:
            return None
        self.flush()
        return pa.Table.from_batches(self._unwritten, schema=self._schema)

    def close(self) -> None:
        """Write the pending rows and the end of the stream, then make the stream an IPC file; idempotent."""
        if self._writer is None:
            return
        try:
            self.flush()
            if self.error is not None:
                return  # the file ends at its last whole batch, a stream without its end marker: nothing to add
            offset = self._sink.tell()
            try:
                self._writer.close()
            except OSError:  # every row is in the file, which readers read without its end marker
                with contextlib.suppress(OSError):
                    os.truncate(self.path, offset)
        finally:
            self._writer = None
            self._sink.close()
            _unlock(self._lock)
            self._lock = None
        try:
            self.finalized = finalize_records(self.path)
        except (OSError, pa.ArrowException, RecordsError) as exc:
            # The stream is complete and every agentx reader opens it: losing the footer loses nothing measured.
            why = os_condition(exc) if isinstance(exc, OSError) else exc
            _log.warning("%s stays an Arrow IPC stream: writing the IPC file failed (%s)", self.path, why)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _located(error: OSError, path: str) -> OSError:
    """`error` as an OSError of its kind naming `path` (pyarrow's name no file) in the OS's words (`os_condition`)."""
    if error.errno is None:
        return OSError(None, os_condition(error), path)
    return OSError(error.errno, os_condition(error), path)  # the errno picks the subclass (PermissionError, ...)


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=field.type) for field in schema], schema=schema)


# ---------------------------------------------------------------------------------------------
# finalizing: the crash-safe stream becomes an IPC file, which every Arrow reader opens

FINAL_BATCH_ROWS: Final = 1024
"""Rows per record batch of the IPC file. A run's flushes leave many small batches, which zstd compresses
worse and readers handle slower (20-row batches: 1.92 kB a row and 1.2 s to read 20,000 rows of 256 chunks, against
1.57 kB and 0.15 s for 1,024); beyond 1,024 rows neither gains (4,096: 1.57 kB, 0.12 s). A batch is what a torn
file loses: one cut short gives back every batch before the cut, so a smaller batch loses fewer rows past the cut
(at most 1,023), and 1,024 rows of 256 chunks are ~3 MB in memory at a time."""


def finalize_records(path: str | os.PathLike[str]) -> bool:
    """Rewrite a records stream as an Arrow IPC file in place; False when it already is one (nothing written).

    The file is written beside the stream (`.records.arrow.*.tmp`, same folder, zstd, the same schema and
    metadata, the rows in the same order), synced to disk, given the stream's permissions and renamed over it:
    a crash at any point leaves either the whole stream or the whole file (and perhaps the temporary file).
    A torn last batch of a killed run's stream, which no reader can read, is not carried over. An IPC file that lost
    only its footer is rewritten whole; one that lost rows is refused (`RecordsDamaged`): the rewrite would drop its
    torn bytes for good. A stream that a `RecordWriter` still holds (a live run, whose later rows would go to the
    replaced file) is refused. Raises `RecordsInUse` for a file still being written, `RecordsError` for one that is
    not a readable records file, `OSError` when it cannot be written.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    try:
        lock = _lock(target)
    except BlockingIOError:
        raise RecordsInUse(
            f"{target}: a process is still writing it (a replay still running?); finalize it after that ends"
        ) from None
    except OSError:  # no such file (the reader says so), or a file system without flock
        lock = None
    temp: str | None = None
    try:
        with RecordsReader(target) as reader:
            if reader.footer:
                return False
            rows = reader.count_rows()  # first: the new file's schema, written before its rows, says how many
            if reader.short:
                raise RecordsDamaged(target, rows, reader.rows_expected)
        with RecordsReader(target) as reader:
            handle, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
            os.close(handle)
            write_records_file(reader.batches(), with_rows(reader.schema, rows), temp)
        # Renamed once the stream is closed: some systems refuse to replace a file that is open.
        os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temp, target)
        temp = None
    finally:
        if temp is not None:  # failed or interrupted: the stream stays as it was
            with contextlib.suppress(OSError):
                os.unlink(temp)
        _unlock(lock)
    fsync_path(directory)  # the rename itself must reach the disk before the file counts as written
    return True


def _lock(path: str) -> int | None:
    """An exclusive advisory lock (flock) on the file; raises BlockingIOError if another holder has one."""
    if sys.platform == "win32":  # no flock: nothing tells a live run's file from a killed one's there
        return None
    import fcntl

    handle = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(handle)
        raise
    return handle


def _unlock(handle: int | None) -> None:
    if handle is not None:
        os.close(handle)  # closing the descriptor releases its flock


def write_records_file(batches: Iterable[pa.RecordBatch], schema: pa.Schema, path: str | os.PathLike[str]) -> int:
    """Write record batches as an Arrow IPC file (zstd, `FINAL_BATCH_ROWS` rows a batch, the last one fewer) synced
    to disk; returns the rows.

    `schema` says the rows the batches hold (`with_rows`: a reader of the file cut short compares it with what it
    could read); RecordsError when they held another count."""
    said = (schema.metadata or {}).get(META_ROWS)
    options = ipc.IpcWriteOptions(compression=FILE_COMPRESSION)
    total = 0
    with pa.OSFile(os.fspath(path), "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            if batch.num_rows:
                pending.append(batch)
                rows += batch.num_rows
            if rows >= FINAL_BATCH_ROWS:  # whole batches now; the rest waits for the next rows
                table = pa.Table.from_batches(pending, schema=schema)
                whole = rows - rows % FINAL_BATCH_ROWS
                writer.write_table(table.slice(0, whole).combine_chunks(), max_chunksize=FINAL_BATCH_ROWS)
                total += whole
                pending, rows = [rest for rest in table.slice(whole).to_batches() if rest.num_rows], rows - whole
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema=schema).combine_chunks())
            total += rows
    if said is not None and said != str(total).encode():
        raise RecordsError(f"{os.fspath(path)}: {total} rows written where its schema says {said.decode()}")
    fsync_path(path)
    return total


_JSON = msgspec.json.Encoder()


def write_jsonl(records: Iterable[RequestRecord], path: str | os.PathLike[str]) -> int:
    """Write records as JSON Lines (one object per record, the columns as keys); returns the count."""
    count = 0
    with open(os.fspath(path), "wb") as out:
        for record in records:
            out.write(_JSON.encode(record) + b"\n")
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# merging (a `--workers` run writes one file per process)

TIME_COLUMNS: Final = (
    "scheduled_ns",
    "queued_ns",
    "sent_ns",
    "response_ns",
    "first_token_ns",
    "last_token_ns",
    "end_ns",
)


def merge_records(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str]) -> int:
    """Merge records files of one run into `out`, on the earliest file's clock (`merged_records`); returns the rows
    written. An OSError naming `out` when the OS refuses a write."""
    merged, origin = merged_records([read_records(path) for path in paths])
    with RecordWriter(out, origin) as writer:
        writer.write_table(merged)
    if writer.error is not None:
        raise writer.error
    rows: int = merged.num_rows
    return rows


def merged_records(tables: list[pa.Table]) -> tuple[pa.Table, RunInfo]:
    """The records of one run's files (as `read_records` gives them) on the earliest file's clock, and that file's
    run: the table to write.

    Each file's times are offsets from its own start; shifting them by the difference of the files'
    wall-clock epochs puts them on one clock (epochs come from one system clock, so the error is its
    read jitter, microseconds). The merged file keeps the earliest file's metadata. Rows are ordered
    by `sent_ns`.
    """
    import pyarrow.compute as pc  # only here: a run writes its records without it

    if not tables:
        raise ValueError("merge_records needs at least one file")
    infos = [run_info(table) for table in tables]
    if len({info.run_id for info in infos}) != 1:
        raise RecordsError(f"files of different runs cannot be merged: {sorted({i.run_id for i in infos})}")
    origin = min(infos, key=lambda info: info.wall_epoch_ns)
    shifted = []
    for table, info in zip(tables, infos, strict=True):
        shift = info.wall_epoch_ns - origin.wall_epoch_ns
        table = table.select(COLUMN_NAMES).cast(SCHEMA)
        for name in TIME_COLUMNS:
            index = table.schema.get_field_index(name)
            table = table.set_column(index, SCHEMA.field(name), pc.add(table.column(name), shift))
        chunks = table.column("chunk_times_ns").combine_chunks()
        moved = pa.ListArray.from_arrays(chunks.offsets, pc.add(chunks.flatten(), shift))
        index = table.schema.get_field_index("chunk_times_ns")
        table = table.set_column(index, SCHEMA.field("chunk_times_ns"), moved.cast(SCHEMA.field("chunk_times_ns").type))
        shifted.append(table)
    return pa.concat_tables(shifted).sort_by("sent_ns"), origin
