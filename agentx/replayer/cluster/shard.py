"""One shard of a `--ray` run, inside a Ray actor's process (docs/distributed.md).

The driver makes `Shard` a Ray actor (this module does not import Ray, so it reads and tests without it). The actor
loads the trace from the bytes the driver put in the object store, answers clock questions, and runs `run_replay` for
its shard on its own thread and event loop from the agreed instant. Meanwhile it keeps what the driver collects with
`poll()`: the record batches written since the last poll (Arrow IPC bytes), the requests in flight (the records they
keep if the shard is lost), the sends, and at the end its `RunResult` or error.

A record is in the in-flight table from its send until after its batch is queued for the driver, so each poll, which
copies the table before it takes the batches, sees every request in at least one of them (the driver drops a stub
whose record came in the same poll).
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import socket
import tempfile
import threading
import time

import msgspec
import pyarrow as pa

from agentx.records.record import RequestRecord, RunInfo
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule.clock import DispatchClock, loop_factory
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import RunStops
from agentx.trace.formats.arrow import from_arrow_bytes
from agentx.trace.model import Trace

_IN_FLIGHT = msgspec.msgpack.Encoder()


class Place(msgspec.Struct, frozen=True, kw_only=True):
    """Where a shard runs."""

    node_id: str
    hostname: str
    pid: int


class ShardReport(msgspec.Struct, kw_only=True):
    """What one `poll()` collects."""

    records: bytes
    """The record batches written since the last poll, as an Arrow IPC stream (b"": none)."""
    in_flight: bytes
    """msgpack of the `RequestRecord`s the requests in flight keep if the shard is lost."""
    sent: int
    """Requests sent so far."""
    profiling: bool
    """The profiling phase has started."""
    info: RunInfo | None = None
    """The shard's run, once it has started (its options, what its probes detected)."""
    start_late_s: float | None = None
    done: bool = False
    """The run has ended: this report holds its last records and its `result` or `error`."""
    result: RunResult | None = None
    error: BaseException | None = None
    cpu_s: float = 0.0
    """CPU time of the shard's process since `start` (its probes and run, Ray's own threads in it included)."""


def in_flight_records(data: bytes) -> list[RequestRecord]:
    """The in-flight records of a `ShardReport`."""
    return msgspec.msgpack.decode(data, type=list[RequestRecord]) if data else []


class Shard:
    """A Ray actor's state for one shard: `options` already carry its `shard=(i, n)` and run id; `clock_skew_ns` is
    added to every clock reading it gives out and taken off every instant it is given (a test's stand-in for a host
    whose clock reads differently)."""

    def __init__(self, options: ReplayOptions, clock_skew_ns: int = 0) -> None:
        self.options = options
        self.skew_ns = clock_skew_ns
        self.trace: Trace | None = None
        self._batches: collections.deque[bytes] = collections.deque()
        """Record batches written and not yet polled, as Arrow IPC messages (after `_stream_head`, a stream)."""
        self._stream_head = b""
        self._in_flight: dict[str, RequestRecord] = {}
        self._sent = 0
        self._profiling = False
        self._info: RunInfo | None = None
        self._info_sent = False
        self._start_late_s: float | None = None
        self._stops = RunStops()
        self._finished = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._cpu_at_start_s: float | None = None

    def place(self) -> Place:
        import ray  # inside an actor, Ray is there

        context = ray.get_runtime_context()
        return Place(
            node_id=context.get_node_id(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
        )

    def clock_ns(self) -> int:
        return time.perf_counter_ns() + self.skew_ns

    def load(self, trace_arrow: bytes, source: str) -> int:
        """Read the trace from its native Arrow bytes; its request count (a check the driver can make)."""
        self.trace = from_arrow_bytes(trace_arrow, file=source)
        return self.trace.request_count

    def start(self, start_at_ns: int) -> None:
        """Run the shard from `start_at_ns` on this shard's clock, on a thread of its own; returns at once."""
        if self.trace is None or self._thread is not None:
            raise RuntimeError("a shard starts once, after load()")
        self._cpu_at_start_s = time.process_time()
        start_perf_ns = start_at_ns - self.skew_ns
        runtime = msgspec.structs.replace(self.options.runtime, node=self.place().node_id)
        self.options = msgspec.structs.replace(self.options, runtime=runtime)
        self._thread = threading.Thread(target=self._run, args=(start_perf_ns,), name="agentx-shard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the run as Ctrl-C does: the first stop lets in-flight requests finish within the grace period, the
        second cancels them (both are recorded); a stop before the run started stops it as it starts."""
        self._stops.stop()

    def poll(self) -> ShardReport:
        """What happened since the last poll (module docstring: the order of the reads matters)."""
        done = self._finished.is_set()
        in_flight = _IN_FLIGHT.encode(list(self._in_flight.copy().values()))
        chunks = []
        while self._batches:
            chunks.append(self._batches.popleft())
        info = None
        if self._info is not None and not self._info_sent:
            info, self._info_sent = self._info, True
        return ShardReport(
            records=self._stream_head + b"".join(chunks) if chunks else b"",
            in_flight=in_flight,
            sent=self._sent,
            profiling=self._profiling,
            info=info,
            start_late_s=self._start_late_s,
            done=done,
            result=self._result if done else None,
            error=self._error if done else None,
            cpu_s=0.0 if self._cpu_at_start_s is None else time.process_time() - self._cpu_at_start_s,
        )

    # -- the run's thread

    def _run(self, start_perf_ns: int) -> None:
        scratch = tempfile.mkdtemp(prefix="agentx-shard-")
        try:
            options = msgspec.structs.replace(self.options, out_dir=scratch, overwrite=True)
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                self._result = runner.run(self._main(options, start_perf_ns))
        except BaseException as exc:  # the driver raises it
            self._error = exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # every record already went to the driver's queue
            self._finished.set()

    async def _main(self, options: ReplayOptions, start_perf_ns: int) -> RunResult:
        assert self.trace is not None
        hooks = RunHooks(
            stops=self._stops,
            on_sent=self._on_sent,
            on_profiling=self._on_profiling,
            on_start=self._on_start,
            on_batch=self._on_batch,
            on_in_flight=self._on_in_flight,
        )
        return await run_replay(self.trace, options, hooks, start_at_ns=start_perf_ns)

    def _on_start(self, info: RunInfo, start_ns: int, clock: DispatchClock | None) -> None:
        self._start_late_s = max(0.0, (time.perf_counter_ns() - start_ns) / 1e9)
        self._info = info

    def _on_sent(self) -> None:
        self._sent += 1

    def _on_profiling(self) -> None:
        self._profiling = True

    def _on_in_flight(self, record: RequestRecord) -> None:
        self._in_flight[record.request_id] = record

    def _on_batch(self, batch: pa.RecordBatch) -> None:
        # Serialized here, on the loop's thread in a gap between due requests (the writer's flush): in `poll`, on
        # Ray's thread, the same took 4-25 ms a poll at 400 requests/s (GIL contention with the loop), which showed
        # as dispatch lag every poll (bench/ray_scale.py).
        if not self._stream_head:
            self._stream_head = batch.schema.serialize().to_pybytes()
        self._batches.append(batch.serialize().to_pybytes())  # queued first, then out of the table: never in neither
        in_flight = self._in_flight
        for request_id in batch.column("request_id").to_pylist():
            in_flight.pop(request_id, None)
