"""`--workers N`: one replay sharded over N processes, each with its own event loop, records merged at the end.

For when one core cannot keep up with the load (bench/README.md, Targets). Worker `i` runs `run_replay` with
`shard=(i, N)`: lanes i, i+N, ... and the trees at positions ≡ i (mod N) of the one shared session order,
so the union of the workers is the single-process run's plan (same plays, same lanes, same seed), only
spread over cores. Each worker loads the trace itself (Arrow loads in well under a second), writes
`workers/<i>/records.arrow` as it goes, and sends its `RunResult` home through its pipe at the end (never through
the disk, which may be the full one); the parent then merges the records into `records.arrow` on one clock
(`merged_records`) and sums the results.

Stopping: the parent alone takes SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`, a closed terminal or ssh session), and
passes each on to every worker once, through its pipe (`WorkerStops`). The workers ignore the signals themselves, so
one that reaches the whole process group (Ctrl-C, a hangup) counts once, not twice, and a hangup cannot kill a worker
before the parent has its records: each worker drains as a single run does (the first stop: the grace period and a
flush; the second: the requests in flight cancelled and recorded), and the parent merges what they wrote. A worker
whose parent is gone stops as on a first stop. A worker whose records file cannot be written (a full disk) stops, the
others are stopped with it (as after any worker's error), and `WriteFailed` carries what they kept. Per-record
callbacks do not cross processes: a sharded run reports progress by its workers' files only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeVar

import msgspec
import pyarrow as pa

from agentx.errors import AgentxError, OutputUnwritable, RunStopped, WorkerFailed, WriteFailed
from agentx.records.record import read_records, run_info
from agentx.records.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.records.writer import RecordWriter, merged_records
from agentx.replayer.options.limits import check_shards
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.run_replay import WRITE_FAILED, run_replay, written_partly
from agentx.replayer.run_result import RunResult, combined
from agentx.replayer.schedule.clock import loop_factory
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import RunStops
from agentx.trace.io import Format, load_trace

T = TypeVar("T")
WORKERS_DIR: Final = "workers"
STOP_SIGNALS: Final = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""What stops a run gracefully (agentx.cli.common.STOP_SIGNALS): taken by the parent, passed on to the workers."""


@contextlib.contextmanager
def stop_signals_to(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """While entered, `handler` takes each stop signal (in the main thread), set with `signal.signal` so that no
    instant between handlers meets the default action; one the process was started with ignored (`nohup`, the
    user's wish) stays ignored. The handlers before are back on exit."""
    previous = {
        number: signal.signal(number, handler)
        for number in STOP_SIGNALS
        if signal.getsignal(number) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for number, before in previous.items():
            if before is not None:
                signal.signal(number, before)


_STOP: Final = b"s"
_GO: Final = b"g"
"""Parent → worker: `_GO` and the start instant (`perf_counter_ns`, 8 bytes): the lanes' agreed start."""
_READY: Final = "ready"
"""Worker → parent: it has built what it sends first and waits for the start (`_StartGate`)."""
START_MARGIN_NS: Final = 20_000_000
"""The agreed start is this long after the last worker was ready: time for the word to reach every worker."""


class WorkerStops:
    """The stops of a `--workers` run: `stop()` passes one to every worker, started or yet to start (a worker started
    later gets those already given). `on_signals()` makes each SIGINT, SIGTERM or SIGHUP of the process one stop
    while it is entered (in the main thread; elsewhere, as a library's thread, the caller calls `stop` itself)."""

    def __init__(self) -> None:
        self.count = 0
        """Stops given so far: 1 is a graceful stop, 2 ends the grace period."""
        self.interrupted = False
        """A stop came from the user (a signal, or the caller's `stop`), not from a worker's failure."""
        self._pipes: list[Connection] = []
        self._lock = threading.Lock()

    def stop(self, *, interrupt: bool = True) -> None:
        """Stop every worker once more (the first time gracefully); `interrupt`: the user's stop, which the run's
        result says (`RunResult.interrupted`)."""
        with self._lock:
            self.count += 1
            self.interrupted = self.interrupted or interrupt
            for pipe in self._pipes:
                _send_stop(pipe)

    def attach(self, pipe: Connection) -> None:
        """A worker's end of the stops, given the stops so far."""
        with self._lock:
            for _ in range(self.count):
                _send_stop(pipe)
            self._pipes.append(pipe)

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[None]:
        """While entered, each stop signal is one `stop()` instead of its default action (KeyboardInterrupt, exit);
        one the process was started with ignored (`nohup`) stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(number: int, frame: FrameType | None) -> None:
            self.stop()

        with stop_signals_to(on_signal):
            yield


def _send_go(pipes: Iterator[Connection]) -> None:
    """The agreed start, `START_MARGIN_NS` from now (`perf_counter_ns` is the system's monotonic clock: the same in
    every process)."""
    start_ns = time.perf_counter_ns() + START_MARGIN_NS
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.send_bytes(_GO + start_ns.to_bytes(8, "little"))


def _send_stop(pipe: Connection) -> None:
    with contextlib.suppress(OSError):  # the worker has ended: nothing to stop
        pipe.send_bytes(_STOP)


def _work(
    trace_path: str, trace_format: Format | None, block_size: int | None, options: ReplayOptions, pipe: Connection
) -> None:
    """A worker process: load the trace, run its shard, send the outcome home through `pipe` (a RunResult, a
    user-facing error, or None when its run was cancelled)."""
    # Started with the stop signals blocked (`_start`): ignored from here on, the parent passes them on (module
    # docstring); one that came meanwhile is dropped with them.
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    outcome: RunResult | Exception | None
    try:
        trace = load_trace(trace_path, format=trace_format, block_size=block_size)
        gate = _StartGate(pipe)
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            hooks = functools.partial(RunHooks, on_ready=gate.ready)
            outcome = runner.run(_stoppable(lambda stops: run_replay(trace, options, hooks(stops=stops)), pipe, gate))
    except (AgentxError, ValueError) as exc:
        outcome = exc  # a user-facing error: the parent raises it, once, instead of N tracebacks
    except asyncio.CancelledError:
        outcome = None
    pipe.send(outcome)


class _StartGate:
    """A worker's side of the agreed start: `ready()` tells the parent the worker has built what it sends first, and
    gives the instant the parent answers once every worker is (`_GO`)."""

    def __init__(self, pipe: Connection) -> None:
        self.pipe = pipe
        self.start: asyncio.Future[int] | None = None

    async def ready(self) -> int:
        self.start = asyncio.get_running_loop().create_future()
        self.pipe.send(_READY)
        return await self.start

    def go(self, message: bytes) -> None:
        if self.start is not None and not self.start.done():
            self.start.set_result(int.from_bytes(message[1:], "little"))


async def _stoppable(work: Callable[[RunStops], Coroutine[Any, Any, T]], pipe: Connection, gate: _StartGate) -> T:
    """Run `work(stops)`, one stop for each the parent sends through `pipe`, and one if the parent is gone; the
    parent's word to start goes to `gate`."""
    stops = RunStops()
    loop = asyncio.get_running_loop()
    handle = pipe.fileno()

    def on_message() -> None:
        try:
            message = pipe.recv_bytes()
        except (EOFError, OSError):  # the parent is gone: stop once, and listen no more
            loop.remove_reader(handle)
            stops.stop()
            return
        if message[:1] == _GO:
            gate.go(message)
        else:
            stops.stop()

    loop.add_reader(handle, on_message)
    try:
        return await work(stops)
    finally:
        loop.remove_reader(handle)


def _start(context: Any, args: tuple[object, ...], name: str) -> multiprocessing.process.BaseProcess:
    """Start a worker with the stop signals blocked, which it inherits until it ignores them: a Ctrl-C or hangup to
    the process group while it boots neither kills it nor raises in it (the parent takes it)."""
    blocked = hasattr(signal, "pthread_sigmask")
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if blocked else set()
    try:
        process: multiprocessing.process.BaseProcess = context.Process(target=_work, args=args, name=name)
        process.start()
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return process


def run_workers(
    trace_path: str | os.PathLike[str],
    options: ReplayOptions,
    workers: int,
    *,
    trace_format: Format | None = None,
    block_size: int | None = None,
    stops: WorkerStops | None = None,
) -> RunResult:
    """Run `options` over `workers` processes (module docstring); returns the merged result. Each worker
    loads `trace_path` with `load_trace(trace_path, format=trace_format, block_size=block_size)`. `stops`: how the
    caller stops the run (made here when not given; its `on_signals` is entered while the workers run).

    Raises `OutputUnwritable` when the run folder cannot be made, `WorkerFailed` when a worker ended without an
    outcome, `WriteFailed` (with the merged `RunResult` and the rows not written) when records could not be
    written, and `RunStopped` when the run was stopped before any worker's run started."""
    check_shards(options.load, workers)
    out_dir = Path(options.out_dir)
    refuse_existing_run(out_dir, options.overwrite)
    run_id = options.runtime.run_id or uuid.uuid4().hex
    stops = stops or WorkerStops()
    context = multiprocessing.get_context("spawn")  # no inherited event loop, sockets or threads
    processes: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    outcomes: dict[int, object] = {}
    with stops.on_signals():
        for index in range(workers):
            if stops.count and not processes:
                raise RunStopped("the run was stopped before any of its workers started: nothing was measured")
            worker_dir = out_dir / WORKERS_DIR / str(index)
            try:
                worker_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputUnwritable.of(exc.filename or worker_dir, exc) from None
            # The shard folders are the run's own scratch space, replaced with it.
            runtime = msgspec.structs.replace(options.runtime, run_id=run_id, shard=(index, workers))
            shard = msgspec.structs.replace(options, out_dir=worker_dir, runtime=runtime, overwrite=True)
            home, away = context.Pipe()
            args = (os.fspath(trace_path), trace_format, block_size, shard, away)
            process = _start(context, args, f"agentx-worker-{index}")
            away.close()  # the worker's end: its exit is then the parent's end of file
            stops.attach(home)
            processes.append((process, home))
        waiting = {home: index for index, (_, home) in enumerate(processes)}
        started: set[int] = set()
        gone = False
        while waiting:
            for ready in wait(list(waiting)):
                assert isinstance(ready, Connection)
                index = waiting[ready]
                try:
                    message = ready.recv()
                except (EOFError, OSError):  # ended without an outcome: said below
                    message = None
                    del waiting[ready]
                else:
                    if message == _READY:
                        started.add(index)
                    else:
                        outcomes[index] = message
                        del waiting[ready]
                if not gone and waiting and started >= set(waiting.values()):
                    # Every worker still running is ready: they start together, lanes due at once going at once.
                    _send_go(iter(waiting))
                    gone = True
                if message != _READY and not isinstance(outcomes.get(index), RunResult) and stops.count == 0:
                    # An error, or no outcome: the run cannot stand without this worker's share (a full disk is the
                    # others' too), so they stop with it, as on an interrupt, and keep what they measured.
                    stops.stop(interrupt=False)
        for process, home in processes:
            process.join()
            home.close()
    return _merged(processes, outcomes, out_dir, run_id, stops)


def _merged(
    processes: list[tuple[multiprocessing.process.BaseProcess, Connection]],
    outcomes: dict[int, object],
    out_dir: Path,
    run_id: str,
    stops: WorkerStops,
) -> RunResult:
    """The workers' outcomes (`outcomes`, in the order they came) as one run, their records merged into `out_dir`'s
    records file."""
    for outcome in outcomes.values():  # the first error to come is the cause: the others were stopped for it
        if isinstance(outcome, Exception) and not (isinstance(outcome, WriteFailed) and outcome.run is not None):
            raise outcome
    for index, (process, _) in enumerate(processes):
        if index not in outcomes:
            records = out_dir / WORKERS_DIR / str(index) / RECORDS_FILE
            raise WorkerFailed(
                f"worker {index} exited with code {process.exitcode} and no result; see its output above "
                f"(its records, if any: {records})"
            )
    results: list[RunResult] = []
    tables: list[pa.Table] = []
    failed: WriteFailed | None = None
    for outcome in (outcomes[index] for index in range(len(processes))):
        if outcome is None:  # stopped before its run started: it measured nothing
            continue
        unwritten: pa.Table | None = None
        if isinstance(outcome, WriteFailed):
            failed = failed or outcome
            unwritten = outcome.unwritten
            outcome = outcome.run
        assert isinstance(outcome, RunResult)
        results.append(outcome)
        table = read_records(outcome.records_path)
        if unwritten is not None and unwritten.num_rows:
            table = pa.concat_tables([table, unwritten.select(table.column_names).cast(table.schema)])
        tables.append(table)
    if not results:
        raise RunStopped("the run was stopped before any of its workers' runs started: nothing was measured")
    records_path = out_dir / RECORDS_FILE
    merged, origin = merged_records(tables)
    run = combined(results, run_id=run_id, records_path=records_path, interrupted=stops.interrupted)
    run.interrupted = stops.interrupted  # a worker stopped for another's failure was not interrupted by the user
    if failed is not None:
        run.cancel_reason = WRITE_FAILED
    try:
        writer = RecordWriter(records_path, origin)
    except OSError as exc:  # not even the schema: every row is in memory, with the earliest worker's metadata
        first = min(tables, key=lambda table: run_info(table).wall_epoch_ns)
        raise written_partly(exc, run, 0, merged.replace_schema_metadata(first.schema.metadata)) from None
    with writer:
        writer.write_table(merged)
    if writer.error is not None:
        raise written_partly(writer.error, run, writer.rows_written, writer.unwritten())
    if failed is not None:
        # Every row reached the merged file, but a worker's file failed first: the run stopped early for it.
        error = OSError(failed.errno, failed.condition, failed.path)
        raise written_partly(error, run, writer.rows_written, None)
    return run
