"""Arrow IPC files that survive a crash, read either way: records.arrow and server_metrics.arrow are a *stream*
while written (every complete batch reads back after a kill) and an IPC *file* (with its footer) after a clean end.

`IpcReader` opens either container, and an IPC file whose footer is missing or torn (the file was cut short: a copy
in progress, a full disk) as the stream of messages after its magic, which gives back every complete batch before the
cut. An IPC file was written whole, so one that reads short is damaged, and the reader says so (`short`): a finished
file's schema carries the rows it holds (`META_ROWS`), and the schema comes first, so even a file cut to its first
batch tells what it lost. A stream cut short is a killed run's, which holds what was written before the kill.
`fsync_path` makes a written file, or a rename in a directory, reach the disk.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, Self

import pyarrow as pa
import pyarrow.ipc as ipc

FILE_MAGIC: Final = b"ARROW1"
"""The first bytes of an Arrow IPC file (a stream starts with a message length or 0xFFFFFFFF)."""
_FILE_PREFIX_BYTES: Final = 8
"""The magic padded to 8 bytes: an IPC file's messages start here, laid out exactly as a stream's."""
META_ROWS: Final = b"agentx.rows"
"""Schema metadata of a finished IPC file: the rows it holds, in decimal (`with_rows`). A stream has none (its rows
are not known when its schema is written)."""


def with_rows(schema: pa.Schema, rows: int) -> pa.Schema:
    """`schema` saying that its file holds `rows` rows (`META_ROWS`)."""
    return schema.with_metadata({**(schema.metadata or {}), META_ROWS: str(rows).encode()})


def without_rows(schema: pa.Schema) -> pa.Schema:
    """`schema` without `META_ROWS`: the count belongs to one file, not to a table read from it or written elsewhere."""
    metadata = schema.metadata or {}
    if META_ROWS not in metadata:
        return schema
    return schema.with_metadata({key: value for key, value in metadata.items() if key != META_ROWS})


class IpcReader:
    """An open IPC file or stream: its schema, then its complete record batches.

    `error(message)` makes the exception raised when the file cannot be opened or has no complete schema (each file
    kind names its own); `cut(path)`, when given, the one for an IPC file cut short before its schema ends.
    `footer` is True for an IPC file read through its footer, which every Arrow reader opens; `finished` for an IPC
    file, footer or not. Once `batches` (or `count_rows`) has run out, `rows_read` and `short` tell whether the file
    gave back all it holds."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        error: Callable[[str], Exception],
        cut: Callable[[str], Exception] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._file: ipc.RecordBatchFileReader | None = None
        self._stream: ipc.RecordBatchStreamReader | None = None
        self.finished = False
        """True for an IPC file (its magic first), which a clean end writes whole: one that reads short is damaged."""
        self.rows_read = 0
        """The rows of the batches read so far."""
        self.ended = False
        """True once the batches ran to the file's end (the footer's last batch, or the stream's end) unbroken."""
        try:
            self._source = pa.OSFile(self.path, "rb")
        except OSError as exc:
            raise error(f"{self.path}: cannot read the file ({' '.join(str(exc).split())})") from None
        try:
            self.schema = self._open()
        except OSError as exc:
            self.close()
            raise error(f"{self.path}: cannot read the file ({' '.join(str(exc).split())})") from None
        except pa.ArrowException as exc:
            self.close()
            if self.finished and cut is not None:
                raise cut(self.path) from None
            what = (
                "an IPC file cut short before its schema ends" if self.finished else "no readable Arrow stream schema"
            )
            raise error(f"{self.path}: {what} ({' '.join(str(exc).split())})") from None

    @property
    def footer(self) -> bool:
        """True for an IPC file read through its footer; False for a stream (or a file without its footer)."""
        return self._file is not None

    @property
    def rows_expected(self) -> int | None:
        """The rows the file holds by its own account (`META_ROWS`); None when it does not say (a stream, or an IPC
        file written before agentx wrote the count)."""
        text = (self.schema.metadata or {}).get(META_ROWS, b"")
        return int(text) if text.isdigit() else None

    @property
    def short(self) -> bool:
        """Once the batches ran out: True when an IPC file gave back less than it holds: fewer rows than it says
        (`rows_expected`), or, when it does not say, batches that stopped before its end. Always False for a
        stream: one cut short holds the complete batches written before its writer was killed."""
        if not self.finished:
            return False
        expected = self.rows_expected
        return self.rows_read < expected if expected is not None else not self.ended

    def _open(self) -> pa.Schema:
        if self._source.read(len(FILE_MAGIC)) == FILE_MAGIC:
            self.finished = True
            self._source.seek(0)
            try:
                self._file = ipc.open_file(self._source)
            except pa.ArrowException:  # no footer yet: the messages after the magic are a stream
                self._source.seek(_FILE_PREFIX_BYTES)
        else:
            self._source.seek(0)
        if self._file is None:
            self._stream = ipc.open_stream(self._source)
            schema: pa.Schema = self._stream.schema
            return schema
        return self._file.schema

    def batches(self, *, validate: bool = False) -> Iterator[pa.RecordBatch]:
        """The complete record batches in file order (each fully validated when `validate`); stops at the first torn
        or invalid one, which `short` then tells of for an IPC file."""
        if self._file is not None:
            for index in range(self._file.num_record_batches):
                try:
                    batch = self._file.get_batch(index)
                    if validate:
                        batch.validate(full=True)
                except (pa.ArrowException, OSError):
                    return
                self.rows_read += batch.num_rows
                yield batch
            self.ended = True
            return
        assert self._stream is not None
        while True:
            try:
                batch = self._stream.read_next_batch()
                if validate:
                    batch.validate(full=True)
            except StopIteration:
                self.ended = True
                return
            except (pa.ArrowException, OSError):  # the torn tail of a crashed run, or of a file cut short
                return
            self.rows_read += batch.num_rows
            yield batch

    def count_rows(self) -> int:
        """The rows that can be read (`rows_read` after it); through the footer only the batches' headers are read
        (milliseconds for any size), else every batch, as `batches` reads them."""
        if self._file is not None:
            try:
                self.rows_read = self._file.count_rows()
            except (pa.ArrowException, OSError):
                pass  # a batch whose header cannot be read: count what `batches` gives back
            else:
                self.ended = True
                return self.rows_read
        self.rows_read = 0
        for _ in self.batches():
            pass
        return self.rows_read

    def close(self) -> None:
        """Close the file; idempotent."""
        self._source.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file, or a directory's entries (a rename in it), to the disk."""
    handle = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def replace_with_ipc_file(target: Path, table: pa.Table, schema: pa.Schema, compression: str) -> None:
    """Rewrite `target` as an IPC file of `table` (one batch) under `schema`: written beside it, synced and renamed
    over it with its mode, the rename synced too, so that a crash leaves one whole file or the other."""
    handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        options = ipc.IpcWriteOptions(compression=compression)
        with pa.OSFile(temp, "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
            writer.write_table(table.cast(schema).combine_chunks())  # one batch: a row per batch costs ~1 kB
        fsync_path(temp)
        os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_path(target.parent)
