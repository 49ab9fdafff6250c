"""`gpu_metrics.arrow`: the GPUs' power over a run (agentx.replayer.telemetry.gpu), written as the run goes.

One row per GPU per scrape (long layout: a run's GPU count is known only at its first scrape): `time_ns` on the
run's clock, the scrape's round trip, the GPU's key, its power gauge in watts and its energy counter in joules, each
null when the exporter did not give it. Like server_metrics.arrow (agentx.replayer.telemetry.arrow_file): an
uncompressed Arrow IPC stream while the run goes, one record batch per scrape written through to the OS, so a killed
run keeps its samples up to the last scrape; an IPC file (zstd) once closed, its times moved onto the records' clock
when asked.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc

from agentx.errors import ServerMetricsError, os_condition
from agentx.records.ipc_files import IpcReader, replace_with_ipc_file
from agentx.replayer.telemetry.arrow_file import FILE_COMPRESSION, META_FORMAT, META_VERSION, check_format

GPU_METRICS_FILE: Final = "gpu_metrics.arrow"
FORMAT_NAME: Final = "agentx-gpu-metrics"
FORMAT_VERSION: Final = "1.0"
META_INFO: Final = b"agentx.gpu_metrics"
"""JSON of `GpuMetricsInfo`."""

SCHEMA: Final = pa.schema(
    [
        pa.field("time_ns", pa.int64(), nullable=False),
        pa.field("scrape_s", pa.float64(), nullable=False),
        pa.field("gpu", pa.string(), nullable=False),
        pa.field("power_w", pa.float64()),
        pa.field("energy_j", pa.float64()),
    ]
)


class GpuMetricsInfo(msgspec.Struct, kw_only=True):
    """What the schema metadata says about the scrapes."""

    run_id: str
    wall_epoch_ns: int
    """Wall clock at the file's time origin: the records' `agentx.wall_epoch_ns` once the run has ended."""
    url: str
    """The endpoint scraped, without its credentials."""
    power_metric: str
    energy_metric: str | None
    interval_s: float


class GpuSample(msgspec.Struct, frozen=True):
    """One GPU at one scrape."""

    gpu: str
    power_w: float | None
    energy_j: float | None


class GpuMetricsWriter:
    """Appends one batch per scrape to `path` (an IPC stream written through); `close` makes it an IPC file. A write
    the OS refuses raises an OSError naming the file, and the writer is closed from then on (the rows before it
    stay readable)."""

    def __init__(self, path: str | os.PathLike[str], info: GpuMetricsInfo) -> None:
        self.path = Path(path)
        self.info = info
        self.rows = 0
        self._schema = SCHEMA.with_metadata(_metadata(info))
        try:
            self._sink = pa.OSFile(os.fspath(self.path), "wb")
        except OSError as exc:
            raise OSError(exc.errno, os_condition(exc), os.fspath(self.path)) from None
        self._writer: ipc.RecordBatchStreamWriter | None = ipc.new_stream(self._sink, self._schema)

    def append(self, time_ns: int, scrape_s: float, samples: list[GpuSample]) -> None:
        """Write one scrape's rows now."""
        if self._writer is None:
            raise ValueError("append to a closed GpuMetricsWriter")
        n = len(samples)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([time_ns] * n, pa.int64()),
                pa.array([scrape_s] * n, pa.float64()),
                pa.array([s.gpu for s in samples], pa.string()),
                pa.array([s.power_w for s in samples], pa.float64()),
                pa.array([s.energy_j for s in samples], pa.float64()),
            ],
            schema=self._schema,
        )
        try:
            self._writer.write_batch(batch)
        except OSError as exc:
            self._writer = None
            self._sink.close()
            raise OSError(exc.errno, os_condition(exc), os.fspath(self.path)) from None
        self.rows += n

    def close(self, *, epoch_ns: int | None = None) -> None:
        """End the stream and rewrite it as an IPC file in place, its times moved onto `epoch_ns` (wall clock) when
        given; idempotent. A failed rewrite leaves the complete stream, which reads the same."""
        if self._writer is None:
            return
        try:
            self._writer.close()
        finally:
            self._writer = None
            self._sink.close()
        with contextlib.suppress(OSError, pa.ArrowException, ServerMetricsError):
            _finalize(self.path, epoch_ns)


def _metadata(info: GpuMetricsInfo) -> dict[bytes, bytes]:
    return {
        META_FORMAT: FORMAT_NAME.encode(),
        META_VERSION: FORMAT_VERSION.encode(),
        META_INFO: msgspec.json.encode(info),
    }


def _finalize(path: Path, epoch_ns: int | None) -> None:
    """Rewrite the stream as an IPC file beside it, synced and renamed over it: a crash leaves one or the other."""
    table, info = _read(path)
    if epoch_ns is not None and epoch_ns != info.wall_epoch_ns:
        shift_ns = info.wall_epoch_ns - epoch_ns
        moved = pa.array([t + shift_ns for t in table.column("time_ns").to_pylist()], pa.int64())
        table = table.set_column(0, SCHEMA.field("time_ns"), moved)
        info.wall_epoch_ns = epoch_ns
    schema = SCHEMA.with_metadata(_metadata(info))
    replace_with_ipc_file(path, table, schema, FILE_COMPRESSION)


def gpu_metrics_info(schema: pa.Schema) -> GpuMetricsInfo:
    """The scrapes' description from a gpu_metrics schema; ServerMetricsError if it is not one agentx reads."""
    metadata = schema.metadata or {}
    check_format(metadata, FORMAT_NAME, FORMAT_VERSION, "gpu-metrics")
    try:
        return msgspec.json.decode(metadata[META_INFO], type=GpuMetricsInfo)
    except (KeyError, msgspec.DecodeError) as exc:
        raise ServerMetricsError(f"the schema metadata lacks or garbles the scrapes ({exc})") from None


def _read(path: Path) -> tuple[pa.Table, GpuMetricsInfo]:
    with IpcReader(path, ServerMetricsError) as reader:
        info = gpu_metrics_info(reader.schema)
        table = pa.Table.from_batches(list(reader.batches()), schema=reader.schema)
    return table, info


def read_gpu_metrics(path: str | os.PathLike[str]) -> pa.Table:
    """A gpu_metrics file (IPC file, or the stream of a killed run) as a table with its schema metadata;
    ServerMetricsError if it is not one."""
    return _read(Path(path))[0]


def load_gpu_metrics(run_dir: str | os.PathLike[str]) -> pa.Table | None:
    """A run folder's gpu_metrics.arrow, or None when it has none or it cannot be read."""
    path = Path(run_dir) / GPU_METRICS_FILE
    if not path.is_file():
        return None
    try:
        return read_gpu_metrics(path)
    except ServerMetricsError:
        return None


def aligned_gpu_times_ns(table: pa.Table, records_epoch_ns: int) -> list[int]:
    """The scrapes' times on a records file's clock (a killed `--workers` run's file keeps its own origin)."""
    shift_ns = gpu_metrics_info(table.schema).wall_epoch_ns - records_epoch_ns
    return [t + shift_ns for t in table.column("time_ns").to_pylist()]
