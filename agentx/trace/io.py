"""Loading and saving traces in any supported format: read as the content says, written as the file's suffix (or
`format=`) says; a file name is never guessed from."""

from __future__ import annotations

import contextlib
import gc
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

import msgspec

from agentx.errors import ConfigError, TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats import bailian, mooncake, otlp, tracelab, weka, weka_reader, weka_writer
from agentx.trace.formats.textfile import open_bytes, read_errors
from agentx.trace.model import Trace
from agentx.trace.validation import MAX_BLOCK_SIZE

_OTLP_OPENING: Final = re.compile(rb'\s*\{\s*"resourceSpans"\s*:')

Format = Literal["arrow", "parquet", "weka", "mooncake", "bailian", "tracelab", "otlp"]
FORMATS: tuple[Format, ...] = ("arrow", "parquet", "weka", "mooncake", "bailian", "tracelab", "otlp")
OUTPUT_SUFFIXES: Final[dict[str, Format]] = {
    ".arrow": "arrow",
    ".ipc": "arrow",
    ".feather": "arrow",
    ".parquet": "parquet",
    ".jsonl": "weka",
    ".json": "weka",
}
"""The output format a file's last suffix names (any case); Mooncake JSONL, also `.jsonl`, is written only when asked
for by name (`format="mooncake"`, `--to mooncake`)."""


def detect_format(path: str | os.PathLike[str]) -> Format:
    """The format of a trace file or directory, from its first bytes (not its name)."""
    path = Path(path)
    if path.is_dir():
        return "weka"
    with read_errors(path):
        with open(path, "rb") as probe:
            head = probe.read(8)
        with open_bytes(path) as stream:
            first_line = stream.readline(1 << 16)
            opening = first_line + stream.read(256)
    if head[:6] == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    if head[:4] == b"PAR1":
        return "parquet"
    text = first_line.strip()
    if text.startswith(b"{") and text.endswith(b"}"):
        try:
            obj = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):  # absurd nesting must not escape as a crash
            obj = None
        if isinstance(obj, dict):
            if weka.is_weka_object(obj):
                return "weka"
            if "chat_id" in obj:
                return "bailian"
            if "prefix_tokens" in obj and "newly_append_tokens" in obj:
                return "tracelab"
            if "resourceSpans" in obj:
                return "otlp"
            if "input_length" in obj or "hash_ids" in obj or "session_id" in obj:
                return "mooncake"
    if _OTLP_OPENING.match(opening):
        return "otlp"  # an export written pretty-printed (or a first line too long to read whole)
    if text.startswith(b"{"):
        return "weka"  # a pretty-printed single trace: its first line is just "{"
    if not text:
        raise TraceError.at("the file is empty", file=str(path))
    unrecognised = (
        "unrecognised trace format (expected Arrow, Parquet, Weka JSON/JSONL, Mooncake, Bailian or TraceLab JSONL, or "
        "OTLP JSON spans)"
    )
    raise TraceError.at(
        f"{unrecognised}; pass format= to force one",
        cli_message=f"{unrecognised}; pass --format to force one",
        file=str(path),
    )


def load_trace(
    path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    block_size: int | None = None,
    findings: Findings | None = None,
) -> Trace:
    """Read a trace; `format` forces a reader, `block_size` overrides the file's.

    Raises TraceError (one paragraph naming file, session and request) for unusable input;
    warnings are added to `findings` when given.
    """
    if not Path(path).exists():
        raise TraceError.at("no such file or directory", file=str(path))
    fmt = format or detect_format(path)
    with _collector_paused():
        return _load(path, fmt, block_size, findings)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Automatic garbage collection off while a trace is built: it makes millions of objects and no reference
    cycles, so every collection it triggers is pure cost (0.4 s of 1.0 s for the AgentX-size corpus)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(path: str | os.PathLike[str], fmt: str, block_size: int | None, findings: Findings | None) -> Trace:
    if block_size is not None and not 0 < block_size <= MAX_BLOCK_SIZE:
        raise TraceError.at(
            f"block_size={block_size} must be in [1, {MAX_BLOCK_SIZE}]",
            cli_message=f"--block-size {block_size} must be in [1, {MAX_BLOCK_SIZE}]",
            file=str(path),
        )
    if fmt in ("arrow", "parquet"):
        from agentx.trace.formats import arrow  # pyarrow (and numpy) load only for these formats

        trace = arrow.read_arrow(path, findings=findings)
        if block_size is not None:
            trace.block_size = block_size
        return trace
    if fmt == "weka":
        return weka_reader.read_weka(path, block_size=block_size, findings=findings)
    if fmt == "mooncake":
        return mooncake.read_mooncake(path, block_size=block_size, findings=findings)
    if fmt == "bailian":
        return bailian.read_bailian(path, block_size=block_size, findings=findings)
    if fmt == "tracelab":
        return tracelab.read_tracelab(path, block_size=block_size, findings=findings)
    if fmt == "otlp":
        return otlp.read_otlp(path, block_size=block_size, findings=findings)
    raise TraceError.at(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}", file=str(path))


def suffix_format(path: str | os.PathLike[str]) -> Format | None:
    """The output format `path`'s last suffix names (`OUTPUT_SUFFIXES`), or None when it names none."""
    return OUTPUT_SUFFIXES.get(Path(path).suffix.lower())


def unknown_suffix(path: str | os.PathLike[str]) -> str:
    """Why `path`'s suffix says no output format, naming the ones that do."""
    suffix = Path(path).suffix
    said = f"its suffix {suffix!r}" if suffix else "it has no suffix, which"
    known = ".arrow, .ipc, .feather (Arrow), .parquet (Parquet), .jsonl, .json (Weka JSONL)"
    return f"{path}: {said} names no trace format (known: {known})"


def format_for_path(path: str | os.PathLike[str]) -> Format:
    """The output format `path`'s suffix names (`suffix_format`); ConfigError naming the known suffixes otherwise."""
    fmt = suffix_format(path)
    if fmt is None:
        raise ConfigError(
            f"{unknown_suffix(path)}; use one of those suffixes, or name the format: format= (arrow, parquet, weka or "
            "mooncake)"
        ).worded_for_cli(f"{unknown_suffix(path)}; use one of those suffixes")
    return fmt


def save_trace(trace: Trace, path: str | os.PathLike[str], *, format: Format | None = None) -> None:
    """Write a trace; the format defaults to what the file's suffix names (`format_for_path`)."""
    fmt = format or format_for_path(path)
    if fmt == "arrow":
        from agentx.trace.formats.arrow import write_arrow  # pyarrow (and numpy) load only for these formats

        write_arrow(trace, path)
    elif fmt == "parquet":
        from agentx.trace.formats.arrow import write_parquet

        write_parquet(trace, path)
    elif fmt == "weka":
        weka_writer.write_weka(trace, path)
    elif fmt == "mooncake":
        mooncake.write_mooncake(trace, path)
    else:
        raise ValueError(f"no writer for format {fmt!r}; writers: arrow, parquet, weka, mooncake")
