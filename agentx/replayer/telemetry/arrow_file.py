"""`server_metrics.arrow`: the server's telemetry over a run, one row per scrape, written as the run goes.

The layout (`SCHEMA`, `describe_layout`, schemas/server_metrics.arrow.md): `time_ns` on the run's clock (the records'
origin), the scrape's round trip, then one float64 column per series of agentx.replayer.telemetry.series, null when
the server does not expose it. The file follows records.arrow's convention: an uncompressed Arrow IPC stream while
the run goes, one record batch per scrape written through to the OS, so a killed run's file reads back up to its
last scrape; when the writer closes, the stream is rewritten as an Arrow IPC file (zstd, with its footer) beside it
and renamed over it, so a crash meanwhile leaves the whole stream. `read_server_metrics` reads either.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc

from agentx.engines import Engine
from agentx.errors import ServerMetricsError, os_condition
from agentx.format_version import version_refusal
from agentx.records.ipc_files import IpcReader, replace_with_ipc_file
from agentx.records.run_folder import SERVER_METRICS_FILE
from agentx.replayer.telemetry.series import TELEMETRY, TELEMETRY_NAMES

FORMAT_NAME: Final = "agentx-server-metrics"
FORMAT_VERSION: Final = "1.0"

META_FORMAT: Final = b"agentx.format"
META_VERSION: Final = b"agentx.version"
META_RUN_ID: Final = b"agentx.run_id"
META_EPOCH: Final = b"agentx.wall_epoch_ns"
META_ENGINE: Final = b"agentx.engine"
META_ENDPOINT: Final = b"agentx.endpoint"
META_INTERVAL: Final = b"agentx.interval_s"
META_SOURCES: Final = b"agentx.sources"

_FIXED: Final = [
    (
        pa.field("time_ns", pa.int64(), nullable=False),
        "the scrape, ns after the run start on the records' clock: the midpoint of sending it and its answer's arrival",
    ),
    (pa.field("scrape_s", pa.float64(), nullable=False), "the scrape's round trip, s (how precise `time_ns` is)"),
]
COLUMNS: Final = [
    *_FIXED,
    *((pa.field(s.name, pa.float64()), f"{s.kind}, {s.unit}: {s.meaning}") for s in TELEMETRY),
]
SCHEMA: Final = pa.schema([field for field, _ in COLUMNS])
FILE_COMPRESSION: Final = "zstd"
_log = logging.getLogger(__name__)


class ServerMetricsInfo(msgspec.Struct, kw_only=True):
    """What the schema metadata says about the scrapes."""

    run_id: str
    wall_epoch_ns: int
    """Wall clock at the file's time origin: the records' `agentx.wall_epoch_ns` once the run has ended."""
    engine: str
    endpoint: str
    """The path scraped (`/metrics`, or TensorRT-LLM's `/prometheus/metrics`)."""
    interval_s: float
    sources: dict[str, list[str]]
    """Series → the engine's names it was read from (at the first scrape)."""


class TelemetryWriter:
    """Appends one row per scrape to `path` as an Arrow IPC stream (uncompressed, written through on every row);
    `close` makes it an IPC file (when that fails, a full disk, the complete stream stays and a warning says so).
    Created at the first scrape that found series: a server without them leaves none. A write the OS refuses (a full
    disk) ends the file at its last whole row, which readers read, and raises an OSError naming the file; the writer
    is closed from then on.
    """

    def __init__(self, path: str | os.PathLike[str], info: ServerMetricsInfo) -> None:
        self.path = Path(path)
        self.info = info
        self.rows = 0
        self.finalized = False
        self._schema = SCHEMA.with_metadata(_metadata(info))
        try:
            self._sink = pa.OSFile(os.fspath(self.path), "wb")
        except OSError as exc:
            raise OSError(exc.errno, os_condition(exc), os.fspath(self.path)) from None
        self._writer: ipc.RecordBatchStreamWriter | None = ipc.new_stream(self._sink, self._schema)

    def append(self, time_ns: int, scrape_s: float, values: Mapping[str, float]) -> None:
        """Write one scrape's row now (a few tens of µs: one small record batch)."""
        if self._writer is None:
            raise ValueError("append to a closed TelemetryWriter")
        arrays = [pa.array([time_ns], pa.int64()), pa.array([scrape_s], pa.float64())]
        arrays += [pa.array([values.get(name)], pa.float64()) for name in TELEMETRY_NAMES]
        offset = self._sink.tell()
        try:
            self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self._schema))
        except OSError as exc:
            self._abandon(offset)
            raise OSError(exc.errno, os_condition(exc), os.fspath(self.path)) from None
        self.rows += 1

    def _abandon(self, offset: int) -> None:
        """A write failed: the file ends at `offset`, after its last whole row (or is removed if it has none)."""
        self._writer = None
        self._sink.close()
        with contextlib.suppress(OSError):
            if self.rows:
                os.truncate(self.path, offset)
            else:  # not even the schema: no file rather than one no reader opens
                os.unlink(self.path)

    def close(self, *, epoch_ns: int | None = None) -> None:
        """End the stream and rewrite it as an IPC file in place; idempotent. `epoch_ns`: move the time origin to
        this wall-clock instant (a `--workers` run's records are merged onto the earliest worker's clock)."""
        if self._writer is None:
            return
        offset = self._sink.tell()
        try:
            self._writer.close()
        except OSError as exc:  # the rows are all there; without its end marker the stream reads the same
            with contextlib.suppress(OSError):
                os.truncate(self.path, offset)
            _log.warning("%s stays an Arrow IPC stream: %s", self.path, os_condition(exc))
            return
        finally:
            self._writer = None
            self._sink.close()
        try:
            self.finalized = finalize(self.path, info=self.info, epoch_ns=epoch_ns)
        except (OSError, pa.ArrowException, ServerMetricsError) as exc:
            # The stream is complete and agentx reads it: losing the footer loses no scrape.
            why = os_condition(exc) if isinstance(exc, OSError) else exc
            _log.warning("%s stays an Arrow IPC stream: writing the IPC file failed (%s)", self.path, why)


def _metadata(info: ServerMetricsInfo) -> dict[bytes, bytes]:
    return {
        META_FORMAT: FORMAT_NAME.encode(),
        META_VERSION: FORMAT_VERSION.encode(),
        META_RUN_ID: info.run_id.encode(),
        META_EPOCH: str(info.wall_epoch_ns).encode(),
        META_ENGINE: info.engine.encode(),
        META_ENDPOINT: info.endpoint.encode(),
        META_INTERVAL: repr(info.interval_s).encode(),
        META_SOURCES: msgspec.json.encode(info.sources),
    }


def finalize(
    path: str | os.PathLike[str], *, info: ServerMetricsInfo | None = None, epoch_ns: int | None = None
) -> bool:
    """Rewrite a server_metrics stream as an Arrow IPC file (zstd) in place, with `info` as its metadata when given
    (series seen after the first scrape) and its times moved onto `epoch_ns` when given; False when there was nothing
    to do. Written beside it, synced and renamed over it: a crash leaves one or the other."""
    target = Path(path)
    with _Reader(target) as reader:
        written = reader.info
        info = msgspec.structs.replace(info or written, wall_epoch_ns=written.wall_epoch_ns)
        shift_ns = 0 if epoch_ns is None else written.wall_epoch_ns - epoch_ns
        if reader.footer and not shift_ns and info == written:
            return False
        table = pa.Table.from_batches(list(reader.batches()), schema=reader.schema)
    if epoch_ns is not None and shift_ns:
        moved = pa.array([t + shift_ns for t in table.column("time_ns").to_pylist()], pa.int64())
        table = table.set_column(0, SCHEMA.field("time_ns"), moved)
        info.wall_epoch_ns = epoch_ns
    schema = SCHEMA.with_metadata(_metadata(info))
    replace_with_ipc_file(target, table, schema, FILE_COMPRESSION)
    return True


class _Reader(IpcReader):
    """An open server_metrics file, IPC file or stream (a killed run's: up to its last complete batch), with the
    scrapes' description from its metadata."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ServerMetricsError)
        try:
            self.info = server_metrics_info(self.schema)
        except ServerMetricsError as exc:
            self.close()
            raise ServerMetricsError(f"{path}: {exc}") from None


def check_format(metadata: Mapping[bytes, bytes], format_name: str, reads: str, what: str) -> None:
    """ServerMetricsError unless a telemetry file's schema `metadata` names the format `format_name` in a version a
    reader of version `reads` reads (`what`: "server-metrics", "gpu-metrics")."""
    if metadata.get(META_FORMAT) != format_name.encode():
        raise ServerMetricsError(f"not an agentx {what} file")
    version = metadata.get(META_VERSION, b"").decode("utf-8", "replace")
    if (refusal := version_refusal(version, reads, what)) is not None:
        raise ServerMetricsError(refusal)


def server_metrics_info(schema: pa.Schema) -> ServerMetricsInfo:
    """The scrapes' description from a server_metrics schema; ServerMetricsError if it is not one agentx reads."""
    metadata = schema.metadata or {}
    check_format(metadata, FORMAT_NAME, FORMAT_VERSION, "server-metrics")
    try:
        return ServerMetricsInfo(
            run_id=metadata[META_RUN_ID].decode(),
            wall_epoch_ns=int(metadata[META_EPOCH]),
            engine=metadata[META_ENGINE].decode(),
            endpoint=metadata[META_ENDPOINT].decode(),
            interval_s=float(metadata[META_INTERVAL]),
            sources=msgspec.json.decode(metadata[META_SOURCES], type=dict[str, list[str]]),
        )
    except (KeyError, ValueError, msgspec.DecodeError) as exc:
        raise ServerMetricsError(f"the schema metadata lacks or garbles the scrapes ({exc})") from None


def read_server_metrics(path: str | os.PathLike[str]) -> pa.Table:
    """A server_metrics file (IPC file or stream) as a table with its schema metadata; ServerMetricsError if it is
    not one. Columns a newer minor version adds are kept; series an older file lacks are added as nulls."""
    with _Reader(Path(path)) as reader:
        table = pa.Table.from_batches(list(reader.batches()), schema=reader.schema)
    for field in SCHEMA:
        if field.name not in table.schema.names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table


def load_server_metrics(run_dir: str | os.PathLike[str]) -> pa.Table | None:
    """A run folder's server_metrics.arrow, or None when it has none (or one that cannot be read, which is logged)."""
    path = Path(run_dir) / SERVER_METRICS_FILE
    if not path.is_file():
        return None
    try:
        return read_server_metrics(path)
    except ServerMetricsError as exc:
        _log.warning("server telemetry left out: %s", exc)
        return None


def aligned_times_ns(table: pa.Table, records_epoch_ns: int) -> list[int]:
    """The scrapes' times on a records file's clock: the same numbers after a clean end; a killed `--workers`
    run's file, still on its own origin, is moved by the difference of the two wall-clock epochs."""
    shift_ns = server_metrics_info(table.schema).wall_epoch_ns - records_epoch_ns
    return [t + shift_ns for t in table.column("time_ns").to_pylist()]


def describe_layout() -> str:
    """The layout in Markdown (the source of `schemas/server_metrics.arrow.md`)."""
    lines = [
        "# agentx server telemetry: Arrow layout",
        "",
        f"Generated from `agentx/replayer/telemetry/arrow_file.py` (format `{FORMAT_NAME}` version {FORMAT_VERSION}); "
        "do not edit.",
        "",
        f"`{SERVER_METRICS_FILE}` sits beside `records.arrow` in a run folder: the server's `/metrics` scraped every",
        "`--metrics-interval` seconds (1 s by default) while the run goes, warmup included, one row per scrape that",
        "the server answered. Each engine's names (vLLM, SGLang, llama.cpp, TensorRT-LLM, ATOM) are mapped onto one",
        "set of series (`agentx/replayer/telemetry/series.py`); a series the server does not expose is null, and no",
        "other metric is kept. A server without `/metrics` (404) or without any of these names leaves no file.",
        "",
        "Like records.arrow, the file is an Arrow IPC **file** (zstd, with its footer) after a run that ended, and an",
        "uncompressed IPC **stream** while the run goes, written through to the OS at every scrape, so a killed",
        "run's file reads back up to its last scrape (`agentx.replayer.telemetry.arrow_file.read_server_metrics`,",
        "`pyarrow.ipc.open_stream`, `polars.read_ipc_stream`).",
        "",
        "`time_ns` is on the run's clock, counted from the run start like the records' `*_ns` columns: wall-clock",
        f"time = `{META_EPOCH.decode()}` + `time_ns`. After a clean end the epoch equals the records' own; the file",
        "of a killed `--workers` run keeps its own epoch, and the difference of the two aligns it.",
        "",
        "Gauges are levels at the scrape, summed over the engine's label sets (data-parallel engines, several models),",
        "ratios averaged over them. Counters are what the server counted since it started: differences between rows",
        "are what happened in between (a counter that falls was reset by a restart).",
        "",
        "| column | Arrow type | meaning |",
        "|---|---|---|",
    ]
    for field, meaning in COLUMNS:
        nullable = "" if field.nullable else ", not null"
        lines.append(f"| `{field.name}` | `{field.type}`{nullable} | {meaning} |")
    lines += ["", "## Each engine's names", "", "| series | " + " | ".join(_ENGINE_TITLES.values()) + " |"]
    lines.append("|---|" + "---|" * len(_ENGINE_TITLES))
    for series in TELEMETRY:
        cells = [
            " or ".join(" + ".join(f"`{name}`" for name in alt) for alt in series.sources.get(engine, ())) or "–"
            for engine in _ENGINE_TITLES
        ]
        lines.append(f"| `{series.name}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Schema metadata",
        "",
        "| key | value |",
        "|---|---|",
        f"| `{META_FORMAT.decode()}` | `{FORMAT_NAME}` |",
        f"| `{META_VERSION.decode()}` | `MAJOR.MINOR`; a reader refuses a newer major version "
        "(agentx.format_version) |",
        f"| `{META_RUN_ID.decode()}` | the run id (the records' own) |",
        f"| `{META_EPOCH.decode()}` | wall clock (`time.time_ns()`) at the time origin, decimal |",
        f"| `{META_ENGINE.decode()}` | whose names the server uses: `vllm`, `sglang`, `llamacpp`, `trtllm` or `atom` |",
        f"| `{META_ENDPOINT.decode()}` | the path scraped: `/metrics`, or TensorRT-LLM's `/prometheus/metrics` |",
        f"| `{META_INTERVAL.decode()}` | seconds between scrapes |",
        f"| `{META_SOURCES.decode()}` | JSON object: series → the engine's names it was read from |",
        "",
    ]
    return "\n".join(lines)


_ENGINE_TITLES: Final[dict[Engine, str]] = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llamacpp": "llama.cpp",
    "trtllm": "TensorRT-LLM",
    "atom": "ATOM",
}
