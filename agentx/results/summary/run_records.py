"""A run's records as the summary reads them: the per-request columns in memory, the chunk lists a slice at a time.

A records file is nearly all chunk lists (`CHUNK_COLUMNS`: 12 bytes a streamed chunk, ~150M chunks in an hour at
concurrency 256), and the summary never holds them whole. `RunRecords.read` reads the file once, a batch at a time,
keeping the per-request columns (`table`: a few hundred bytes a request) and counting on the way what the
chunk-level figures need (`ChunkScan`: the gaps between chunks, tokens per chunk); the figures that need another
look (the exact percentiles of the gaps: agentx.results.summary.population; the stream's speculative acceptance,
agentx.results.summary.checks.acceptance) read the file again (`slices`). `RunRecords.of(table)` does the same over a
table already in memory, a slice at a time, so that `summarize(table)` never flattens its chunk lists whole either.

Slices hold about `SLICE_STAMPS` chunk timestamps (a request's list is never cut): the chunk-level work holds a few of
them at a time, whatever the run's length.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa

from agentx.errors import RecordsDamaged, RecordsError
from agentx.records.ipc_files import without_rows
from agentx.records.record import CHUNK_COLUMNS, RecordsReader, per_request_columns, renamed
from agentx.results.summary.columns import equals, flat_lists
from agentx.results.summary.population import IntCounts, IntPopulation
from agentx.results.summary.stats import BoolArray, IntArray, Stats

SLICE_STAMPS: Final = 1 << 18
"""Chunk timestamps a slice holds at most (2 MB as int64), unless one request has more."""
SLICE_ROWS: Final = 1 << 16
"""Rows a slice holds at most."""
NS_PER_S: Final = 10**9


def kept_rows(rows: pa.Table) -> BoolArray:
    """The rows the latency metrics keep: profiling (a missing phase counts as profiling) and ok (a missing status
    too)."""
    return ~equals(rows, "phase", "warmup", missing=False) & equals(rows, "status", "ok", missing=True)


def kept_gaps(times_ns: IntArray, offsets: IntArray, kept: BoolArray) -> IntArray:
    """The gaps between consecutive chunks of each kept row, from the rows' chunk times flat (`flat_lists`)."""
    if times_ns.size < 2:
        return np.zeros(0, dtype=np.int64)
    lengths = np.diff(offsets)
    within = np.repeat(kept, lengths)[:-1]
    starts = offsets[1:-1]
    within[starts[(starts > 0) & (starts < times_ns.size)] - 1] = False  # from a row's last chunk to the next row's
    return np.diff(times_ns)[within]


def middle_chunks(offsets: IntArray, rows: BoolArray) -> BoolArray:
    """Which values of the lists (`offsets`) are neither their list's first nor its last, in the lists of `rows`."""
    lengths = np.diff(offsets)
    middle = np.repeat(rows & (lengths > 2), lengths)
    full = lengths > 0
    middle[offsets[:-1][full]] = False
    middle[offsets[1:][full] - 1] = False
    return middle


class ChunkScan:
    """What one pass over the chunk lists gathers, a slice at a time (`add`), for the kept rows (`kept_rows`)."""

    def __init__(self) -> None:
        self.times = False
        """Whether the records have chunk times (`chunk_times_ns`)."""
        self.tokens_column = False
        """Whether they have tokens per chunk (`chunk_tokens`)."""
        self.gaps_ns = IntPopulation()
        """The gaps between consecutive chunks of each kept row: vLLM's ITL population, in ns."""
        self.tokens = IntCounts()
        """Tokens per chunk of the kept rows."""

    def add(self, rows: pa.Table) -> None:
        """Gather one slice of rows (every column)."""
        kept = kept_rows(rows)
        names = rows.schema.names
        if "chunk_times_ns" in names:
            self.times = True
            times, offsets = flat_lists(rows.column("chunk_times_ns"))
            self.gaps_ns.add(kept_gaps(times, offsets, kept))
        if "chunk_tokens" in names:
            self.tokens_column = True
            tokens, offsets = flat_lists(rows.column("chunk_tokens"))
            self.tokens.add(tokens if kept.all() else tokens[np.repeat(kept, np.diff(offsets))])


def slices(batches: Iterable[pa.RecordBatch], stamps: int | None = None) -> Iterator[pa.Table]:
    """The batches' rows again, in order, as tables of at most `stamps` (`SLICE_STAMPS`) chunk timestamps and
    `SLICE_ROWS` rows (a request's list is never cut: one longer is a slice of its own): small batches put together,
    large ones cut."""
    stamps = SLICE_STAMPS if stamps is None else stamps
    pending: list[pa.RecordBatch] = []
    pending_stamps = pending_rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        cumulative = np.cumsum(_lengths(batch))
        start = 0
        while start < batch.num_rows:
            before = int(cumulative[start - 1]) if start else 0
            end = int(np.searchsorted(cumulative, before + stamps, side="right"))
            end = min(max(end, start + 1), start + SLICE_ROWS)
            piece_stamps, piece_rows = int(cumulative[end - 1]) - before, end - start
            if pending and (pending_stamps + piece_stamps > stamps or pending_rows + piece_rows > SLICE_ROWS):
                yield pa.Table.from_batches(pending)
                pending, pending_stamps, pending_rows = [], 0, 0
            pending.append(batch.slice(start, piece_rows))
            pending_stamps += piece_stamps
            pending_rows += piece_rows
            start = end
    if pending:
        yield pa.Table.from_batches(pending)


def _lengths(batch: pa.RecordBatch) -> IntArray:
    """Chunks per row (0 without the chunk columns)."""
    import pyarrow.compute as pc

    name = next((n for n in CHUNK_COLUMNS if n in batch.schema.names), None)
    if name is None:
        return np.zeros(batch.num_rows, dtype=np.int64)
    lengths = pc.fill_null(pc.list_value_length(batch.column(name)), 0)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


class RunRecords:
    """A run's records for the summary (module docstring): `table`, every row with the per-request columns (the
    records' schema metadata kept); `scan`, the chunk lists' one-pass figures; `slices()`, the rows again, chunk
    lists included, a slice at a time."""

    def __init__(
        self,
        table: pa.Table,
        scan: ChunkScan,
        batches: Callable[[], Iterator[pa.RecordBatch]],
        file_rows: int,
        source: str = "the records table",
        path: str | None = None,
    ) -> None:
        self.table = table
        self.scan = scan
        self._batches = batches
        self.file_rows = file_rows
        """Rows read from the records file (`read`; `more`'s not counted)."""
        self.source = source
        """The records file, for messages."""
        self.path = path
        """The records file read (`read`); None for a table in memory. The run's other files sit beside it."""

    @classmethod
    def read(cls, path: str | os.PathLike[str], *, more: pa.Table | None = None, partial: bool = False) -> RunRecords:
        """The records of a file (as `read_records` reads them: `RecordsDamaged` for a finished file that reads
        short, unless `partial`), then the rows of `more` (records that never reached it), a batch at a time."""
        scan = ChunkScan()
        with RecordsReader(path) as reader:
            schema = without_rows(reader.schema)
            ahead = _read_ahead(reader.batches())

            def scanned() -> Iterator[pa.Table]:
                for rows in slices(_with_more(ahead, more, schema)):
                    scan.add(rows)
                    yield rows

            try:
                table = renamed(per_request_columns(scanned(), schema))
            finally:
                ahead.close()  # its reading thread done before the file closes
            if reader.short and not partial:
                raise RecordsDamaged(reader.path, reader.rows_read, reader.rows_expected)
            file_rows = reader.rows_read
        name = os.fspath(path)
        return cls(table, scan, lambda: _reread(Path(path), more, schema, file_rows), file_rows, name, name)

    @classmethod
    def of(cls, records: pa.Table | RunRecords) -> RunRecords:
        """`records` as they are, or a records table already in memory (read a slice at a time all the same)."""
        if isinstance(records, RunRecords):
            return records
        scan = ChunkScan()
        for rows in slices(records.to_batches()):
            scan.add(rows)
        table = records.drop_columns([name for name in CHUNK_COLUMNS if name in records.schema.names])
        return cls(table, scan, lambda: iter(records.to_batches()), records.num_rows)

    def slices(self) -> Iterator[pa.Table]:
        """Every row again (every column, chunk lists included), a slice at a time (`slices`), in `table`'s order."""
        seen = 0
        for rows in slices(self._batches()):
            if seen + rows.num_rows > self.table.num_rows:  # a stream a live run still appends to
                rows = rows.slice(0, self.table.num_rows - seen)
            if rows.num_rows:
                yield rows
            seen += rows.num_rows
            if seen >= self.table.num_rows:
                return
        if seen < self.table.num_rows:
            raise RecordsError(
                f"{self.source}: {seen:,} rows when read again, {self.table.num_rows:,} before: it changed meanwhile"
            )

    def gap_parts(self) -> Iterator[IntArray]:
        """The gaps between consecutive chunks of the kept rows (ns), a slice at a time, as `scan` met them."""
        for rows in self.slices():
            if "chunk_times_ns" in rows.schema.names:
                times, offsets = flat_lists(rows.column("chunk_times_ns"))
                yield kept_gaps(times, offsets, kept_rows(rows))

    def itl_stats(self, percentiles: Iterable[float] = ()) -> Stats | None:
        """vLLM's ITL: the gaps between consecutive chunks of the kept rows, in s, exact (agentx.results.summary.
        population; reads the chunk times again); None without any."""
        return self.scan.gaps_ns.stats(percentiles, self.gap_parts, NS_PER_S)

    def chunk_token_stats(self, percentiles: Iterable[float] = ()) -> Stats | None:
        """Tokens per chunk of the kept rows; None without any."""
        return self.scan.tokens.stats(percentiles)


def request_table(records: pa.Table | RunRecords) -> pa.Table:
    """The per-request columns of records (`RunRecords.table`, or a table without its chunk lists; no copy)."""
    if isinstance(records, RunRecords):
        return records.table
    return records.drop_columns([name for name in CHUNK_COLUMNS if name in records.schema.names])


def _with_more(batches: Iterable[pa.RecordBatch], more: pa.Table | None, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    yield from batches
    if more is not None and more.num_rows:
        yield from more.select(schema.names).cast(schema).to_batches()


def _reread(path: Path, more: pa.Table | None, schema: pa.Schema, file_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's first `file_rows` rows again, then `more`'s."""
    with RecordsReader(path) as reader:
        seen = 0
        ahead = _read_ahead(reader.batches())
        try:
            for batch in ahead:
                if seen + batch.num_rows > file_rows:
                    batch = batch.slice(0, file_rows - seen)
                if batch.num_rows:
                    yield batch
                seen += batch.num_rows
                if seen >= file_rows:
                    break
        finally:
            ahead.close()  # its reading thread done before the file closes
    yield from _with_more((), more, schema)


_END: Final = object()


def _read_ahead(batches: Iterator[pa.RecordBatch]) -> Generator[pa.RecordBatch, None, None]:
    """`batches`, each read (decompressed: Arrow lets go of the GIL) on a thread while the one before it is worked on,
    which takes about half the time off a pass over a long run's records; one batch read ahead at most."""
    ready: queue.Queue[object] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_END)
        except BaseException as exc:  # raised again where the batches are used
            put(exc)
        finally:
            close = getattr(batches, "close", None)  # a generator: its file reads end here, on this thread
            if close is not None:
                close()

    thread = threading.Thread(target=read, name="agentx-records-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()  # before the file is closed under it
