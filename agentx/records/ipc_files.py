"""Arrow IPC files that survive a crash, read either way: records.arrow and server_metrics.arrow are a *stream*
while written (every complete batch reads back after a kill) and an IPC *file* (with its footer) after a clean end.

`IpcReader` opens either container, and an IPC file whose footer is missing or torn (a copy in progress) as the
stream of messages after its magic; `fsync_path` makes a written file, or a rename in a directory, reach the disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Final, Self

import pyarrow as pa
import pyarrow.ipc as ipc

FILE_MAGIC: Final = b"ARROW1"
"""The first bytes of an Arrow IPC file (a stream starts with a message length or 0xFFFFFFFF)."""
_FILE_PREFIX_BYTES: Final = 8
"""The magic padded to 8 bytes: an IPC file's messages start here, laid out exactly as a stream's."""


class IpcReader:
    """An open IPC file or stream: its schema, then its complete record batches.

    `error(message)` makes the exception raised when the file cannot be opened or has no complete schema (each file
    kind names its own). `footer` is True for an IPC file read through its footer, which every Arrow reader opens."""

    def __init__(self, path: str | os.PathLike[str], error: Callable[[str], Exception]) -> None:
        self.path = os.fspath(path)
        self._file: ipc.RecordBatchFileReader | None = None
        self._stream: ipc.RecordBatchStreamReader | None = None
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
            raise error(f"{self.path}: no readable Arrow stream schema ({' '.join(str(exc).split())})") from None

    @property
    def footer(self) -> bool:
        """True for an IPC file read through its footer; False for a stream (or a file without its footer)."""
        return self._file is not None

    def _open(self) -> pa.Schema:
        if self._source.read(len(FILE_MAGIC)) == FILE_MAGIC:
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
        """The complete record batches in file order (each fully validated when `validate`); stops silently at the
        first torn or invalid one."""
        if self._file is not None:
            for index in range(self._file.num_record_batches):
                try:
                    batch = self._file.get_batch(index)
                    if validate:
                        batch.validate(full=True)
                except (pa.ArrowException, OSError):
                    return
                yield batch
            return
        assert self._stream is not None
        while True:
            try:
                batch = self._stream.read_next_batch()
                if validate:
                    batch.validate(full=True)
            except StopIteration:
                return
            except (pa.ArrowException, OSError):  # the torn tail of a crashed run
                return
            yield batch

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
