"""Reading trace text files, plain or gzip-compressed, with read failures as TraceErrors."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from agentx.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"


def open_bytes(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed when it is gzip (by content, not by name), after a UTF-8 byte-order mark if it
    starts with one (editors on Windows write it; JSON parsers refuse it)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    # Returned open: the caller closes it (a `with` block).
    stream: IO[bytes] = gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")  # type: ignore[assignment]  # noqa: SIM115
    if stream.read(len(UTF8_BOM)) != UTF8_BOM:
        stream.seek(0)
    return stream


@contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """Turn the ways reading a file fails (I/O, truncated or corrupt gzip) into a TraceError."""
    try:
        yield
    except OSError as exc:
        raise TraceError.at(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    except (EOFError, zlib.error) as exc:
        raise TraceError.at(f"cannot read the gzip data (truncated or corrupt file?): {exc}", file=str(path)) from None


def jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line, text) for every non-blank line of a plain or gzip-compressed file."""
    with read_errors(path), open_bytes(path) as stream:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line


def json_error(exc: Exception, unit: str = "line") -> str:
    """Why a JSON `unit` (a line, a file) does not decode, in one line."""
    if isinstance(exc, RecursionError):
        return "the JSON is nested too deeply"
    message = str(exc).replace(" - at `$", " at `$")
    if "truncated" in message:
        return f"the JSON ends early (truncated {unit}?): {message}"
    return message
