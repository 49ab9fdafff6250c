"""Replay and summarize in one call: the public API's composition of replay/ and results/.

- `await replay(trace, options)` runs the replay, summarizes its records and writes `run.json` next to them.
- `replay_sync(trace, options)` is the same for code without an event loop.
- `stream_replay(trace, options)` yields each `RequestRecord` as its request finishes, for harnesses that
  react to a run while it goes; `stream.result` holds the `ReplayResult` once the run has ended.

A run folder that cannot be written at the start raises `OutputUnwritable` (nothing was sent). A file of the run that
the OS refuses to write once it has started (a full disk, a read-only file system, no permission, an I/O error)
stops it as an interrupt does; the summary is computed from the records on disk and those held in memory, run.json is
written if the disk takes it (room for it is reserved from the start, `RESERVE_FILE`), and `WriteFailed` is raised
with all of that (`result`, `records_kept`, `records_unwritten`, `run_file`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import msgspec

from agentx.errors import ConfigError, OutputUnwritable, RecordsError, WriteFailed, os_condition
from agentx.records.record import RequestRecord, RunInfo, read_records
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE, refuse_existing_run
from agentx.replayer.cluster.driver import run_cluster
from agentx.replayer.http.client import Client
from agentx.replayer.options.replay import ReplayOptions, flat_options
from agentx.replayer.options.server_client import server_client
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.preparation import dropped_notices
from agentx.replayer.run_replay import WRITE_FAILED, run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule.clock import DispatchClock
from agentx.replayer.schedule.hooks import NO_HOOKS, RunHooks
from agentx.replayer.schedule.stops import Cancellation, RunStops
from agentx.replayer.telemetry.arrow_file import load_server_metrics
from agentx.replayer.telemetry.metrics import METRIC_LABELS, SCRAPED_METRICS, ServerMetrics, parse_counters
from agentx.replayer.telemetry.scrape import TelemetryTask, TelemetryThread, records_epoch_ns, start_telemetry
from agentx.replayer.workers import WORKERS_DIR, WorkerStops, run_workers
from agentx.results.folders.run_file import RunFile, write_run_file
from agentx.results.summary.checks.acceptance import run_acceptance
from agentx.results.summary.checks.audit import audit
from agentx.results.summary.checks.validity import validity
from agentx.results.summary.shards import shards_summary
from agentx.results.summary.summarize import RunRecords, Summary, summarize_run
from agentx.run.progress import ProgressLog
from agentx.run.sync import run_sync
from agentx.trace.io import save_trace
from agentx.trace.model import Trace


class ReplayResult(msgspec.Struct, kw_only=True):
    """A finished (or interrupted) run: where its records are, and their summary."""

    run: RunResult
    summary: Summary


async def scrape_counters(client: Client) -> dict[str, float] | None:
    """The server's `SCRAPED_METRICS` from `/metrics`, or None when it has none to give (`Client.metrics_text`
    warns when that is not for want of metrics), through `client`: with its credentials, headers and TLS settings."""
    text = await client.metrics_text()
    return (parse_counters(text, SCRAPED_METRICS, METRIC_LABELS) or None) if text is not None else None


async def _scrape(options: ReplayOptions) -> dict[str, float] | None:
    """`scrape_counters` through a client made as the run's own is (`server_client`)."""
    async with server_client(options.server, options.connection, limit=1) as client:
        return await scrape_counters(client)


RESERVE_FILE: Final = ".run.json.reserve"
"""Disk room held for run.json in the run folder while the run goes, released just before run.json is written: a run
whose records fill the disk still leaves its run.json. A run killed outright may leave it behind (safe to delete)."""
RESERVE_BYTES: Final = (1 << 20, 1 << 18, 1 << 16)
"""The room held: the first of these that the disk allows and that is at most 1/`RESERVE_SHARE` of its free space (the
last is tried whatever it is). A run.json is ~50 kB; an hour's event-loop lag samples add ~0.7 MB."""
RESERVE_SHARE: Final = 4
"""On an almost full disk the records come first: the room held for run.json takes at most a quarter of it."""


def reserve_room(folder: Path) -> Path | None:
    """Hold `RESERVE_BYTES` in `folder` (`RESERVE_FILE`); its path, or None when the disk has no room or refuses."""
    path = folder / RESERVE_FILE
    try:
        stats = os.statvfs(folder)
        free_bytes: int | None = stats.f_bavail * stats.f_frsize
    except (OSError, AttributeError):  # no statvfs (Windows): the disk says by refusing
        free_bytes = None
    for size in RESERVE_BYTES:
        if free_bytes is not None and size * RESERVE_SHARE > free_bytes and size != RESERVE_BYTES[-1]:
            continue
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return None
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(handle, 0, size)
            else:  # allocated by writing it
                os.write(handle, bytes(size))
            return path
        except OSError:
            continue
        finally:
            os.close(handle)
    release_room(path)
    return None


def release_room(reserved: Path | None) -> None:
    """Give the room `reserve_room` held back to the disk."""
    if reserved is not None:
        with contextlib.suppress(OSError):
            reserved.unlink(missing_ok=True)


async def replay(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    hooks: RunHooks | None = None,
    *,
    num_gpus: int | None = None,
    trace_path: str | os.PathLike[str] | None = None,
) -> ReplayResult:
    """Drive the server at `options.server.url` with `trace` (or a `prepare_trace` result, shared by several runs), then
    summarize the records it wrote and write run.json; `trace_path`, the file `trace` was read from, is kept in
    run.json (`run.trace_path`). The one way to run a replay: the library, repeats, sweeps and the command line all
    come through here.

    The run goes the way `options.runtime` says: in this process; over `workers` processes on this machine (the trace
    saved once for them to load; records meet in records.arrow at the end, so `hooks` that hear of each request are
    refused); or over a Ray cluster (`ray`). `hooks` (`RunHooks`): `on_record(record)` as each request finishes,
    `on_sent()` as each is sent, `on_profiling()` once as the profiling phase starts (progress displays: the
    window's clock starts then).

    The server's prefix-cache and speculative-decoding metrics are scraped as the profiling phase starts (after the
    warmup, whose primers would count otherwise) and after the run, so the summary carries its own hit rate next to
    the one from usage, and the realized acceptance next to `spec_al`. At the end, interrupted runs included,
    run.json (`RunFile`) is written into the run directory.

    To end a run early and get its partial result, stop it with `hooks.stops` (`RunStops`: the first stop acts like
    reaching the deadline, the second ends the grace period). Cancelling the caller ends the run at once (the
    requests in flight recorded cancelled), writes its files, and raises `CancelledError` (`TimeoutError` under
    `asyncio.timeout`), as asyncio's contract asks.
    """
    hooks = hooks or NO_HOOKS
    cancellation = Cancellation()
    if over_processes(options):
        result = await _over_processes(trace, options, hooks, num_gpus, trace_path)
    else:
        result = await _in_one_run(trace, options, hooks, num_gpus, trace_path, cancellation)
    if cancellation.requested:
        # The caller was cancelled while the run went: it ended at once and its files are written; asyncio's
        # contract (timeouts, task groups, shutdown) wants the cancellation to go on.
        raise asyncio.CancelledError
    return result


def over_processes(options: ReplayOptions) -> bool:
    """Whether a run with `options` goes over `--workers` processes of this machine (its records meet at its end)."""
    return options.runtime.workers > 1 and options.runtime.ray is None


async def _in_one_run(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    hooks: RunHooks,
    num_gpus: int | None,
    trace_path: str | os.PathLike[str] | None,
    cancellation: Cancellation,
) -> ReplayResult:
    """`replay` in this process, or driven from it over a Ray cluster (`run_cluster`): its records reach this
    process as they are written."""
    scrapes: list[asyncio.Task[dict[str, float] | None]] = []
    on_profiling = hooks.on_profiling

    def scrape_at_profiling_start() -> None:
        scrapes.append(asyncio.ensure_future(_scrape(options)))
        if on_profiling is not None:
            on_profiling()

    telemetry: list[TelemetryTask] = []
    room: list[Path] = []

    def start_scraping(info: RunInfo, start_ns: int, clock: DispatchClock | None) -> None:
        reserved = reserve_room(Path(options.out_dir))
        if reserved is not None:
            room.append(reserved)
        task = start_telemetry(
            options, run_id=info.run_id, wall_epoch_ns=info.wall_epoch_ns, start_ns=start_ns, clock=clock
        )
        if task is not None:
            telemetry.append(task)

    progress = ProgressLog(options, len(trace.trace.sessions if isinstance(trace, PreparedTrace) else trace.sessions))
    run_hooks = progress.hooks(
        msgspec.structs.replace(hooks, on_profiling=scrape_at_profiling_start, on_start=start_scraping)
    )
    engine = run_cluster if options.runtime.ray is not None else run_replay
    failed: WriteFailed | None = None
    ended = "the run failed"
    try:
        try:
            run = await engine(trace, options, run_hooks)
            ended = "interrupted" if run.interrupted else "done"
        except WriteFailed as exc:
            if exc.run is None:  # a `--ray` shard's own scratch file: the run has nothing of it to summarize
                raise
            run, failed = exc.run, exc
            ended = "stopped: its records could not be written"
        finally:
            progress.close(ended)
            for task in telemetry:
                await task.stop()
        for task in telemetry:
            run.notices += task.notices
        before: dict[str, float] | None = None
        after: dict[str, float] | None = None
        # A caller that cancels wants out: run.json without the counters, at once (`replay` raises after it).
        if not cancellation.requested:
            with contextlib.suppress(asyncio.CancelledError):
                before = await scrapes[0] if scrapes else None
                after = await _scrape(options) if before is not None else None
        if cancellation.requested:
            before = after = None
        for scrape in scrapes:
            scrape.cancel()
        held = room[0] if room else None
        not_served = any(task.not_served for task in telemetry)
        return _finish(
            options, run, before, after, num_gpus, trace_path, failed=failed, room=held, metrics_not_served=not_served
        )
    finally:
        release_room(room[0] if room else None)


async def _over_processes(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    hooks: RunHooks,
    num_gpus: int | None,
    trace_path: str | os.PathLike[str] | None,
) -> ReplayResult:
    """`replay` over `options.runtime.workers` processes (agentx.replayer.workers), blocking a thread of its own; the
    caller's stops and cancellation reach the workers as they reach one run."""
    if hooks.per_request:
        raise ConfigError(
            f"workers={options.runtime.workers}: per-request callbacks (on_record, on_sent, on_profiling) need "
            "the run in this process; records of a run over processes meet in records.arrow at its end"
        )
    dropped = _Dropped()
    if isinstance(trace, PreparedTrace):  # the workers get the sessions kept: they drop none again
        dropped = _Dropped(sessions=len(trace.sessions.dropped), notices=dropped_notices(trace.sessions, options))
        trace = trace.trace
    stops = WorkerStops()
    progress = ProgressLog(options, len(trace.sessions))
    progress.start(ticking=False)
    work = asyncio.ensure_future(asyncio.to_thread(_replay_saved, trace, options, num_gpus, trace_path, dropped, stops))
    with hooks.stops.listening(lambda count: stops.stop()) if hooks.stops is not None else contextlib.nullcontext():
        try:
            result = await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.done():
                raise
            stops.stop()  # a cancellation: the workers stop gracefully, then at once, and write what they measured
            stops.stop()
            result = await work  # the caller's task stays cancelling: `replay` raises once the run is written
    counts = result.summary.counts
    progress.close("interrupted" if result.run.interrupted else "done", (counts.rows, counts.errors + counts.cancelled))
    return result


class _Dropped(msgspec.Struct, frozen=True):
    """The sessions preparing a trace left out before its workers got it: how many, and the notices saying so."""

    sessions: int = 0
    notices: list[str] = []


def _finish(
    options: ReplayOptions,
    run: RunResult,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    num_gpus: int | None,
    trace_path: str | os.PathLike[str] | None,
    *,
    failed: WriteFailed | None = None,
    room: Path | None = None,
    metrics_not_served: bool = False,
) -> ReplayResult:
    """Summarize a run's records and write its `run.json`. `failed`: the records file stopped short, and its other
    rows are in `failed.unwritten`; `room`: the disk room held for run.json (`reserve_room`), released first;
    `metrics_not_served`: the telemetry found no `/metrics` on the server, which the audit says. Raises
    `WriteFailed`, with the result, when `failed` is given or run.json cannot be written."""
    if trace_path is not None:
        run.trace_path = os.path.abspath(trace_path)  # readable wherever run.json is read
    metrics = ServerMetrics(before=before, after=after) if before is not None and after is not None else None
    # Read a batch at a time: the chunk lists, nearly all of a long run's records, are never held whole.
    more = failed.unwritten if failed is not None else None
    try:
        records = RunRecords.read(run.records_path, more=more)
        kept = records.file_rows
    except RecordsError:
        if more is None:
            raise
        records, kept = RunRecords.of(more), 0  # the file could not even be made: every row is in memory
    summary = summarize_run(
        records,
        num_gpus=num_gpus,
        server_metrics=metrics,
        loop_lag_s=run.loop_lag_s,
        telemetry=load_server_metrics(Path(run.records_path).parent),
        percentiles=options.scenario.percentiles,
        trees_cut=run.trees_finished < run.trees_started,
    )
    if failed is not None:
        run.records_kept = kept  # what the file holds, the witness of a later read (agentx.records.run_folder)
    summary.stream_usage = run.stream_usage or None
    summary.rules = options.scenario.rules
    summary.calibration = msgspec.to_builtins(run.calibration) if run.calibration is not None else None
    run_file = {"options": flat_options(options), "run": msgspec.to_builtins(run, enc_hook=str)}
    summary.acceptance = run_acceptance(
        records,
        before,
        after,
        forced_al=options.speculative.al,
        spec_k=options.speculative.k,
        tolerance=options.speculative.al_tolerance,
        stream_interval=options.speculative.stream_interval,
    )
    summary.validity = validity(records.table, run_file, summary.acceptance)
    summary.shards = shards_summary(run.shards)
    summary.audit = audit(records, summary, metrics_not_served=metrics_not_served)  # the acceptance is known now
    result = ReplayResult(run=run, summary=summary)
    release_room(room)
    run_path = Path(run.records_path).parent / RUN_FILE
    try:
        write_run_file(run_path, RunFile(options=flat_options(options), run=run, summary=summary))
    except OSError as exc:
        raise kept_failure(result, failed, exc, kept, run_path) from None
    if failed is not None:
        raise kept_failure(result, failed, None, kept, run_path)
    return result


def kept_failure(
    result: ReplayResult, failed: WriteFailed | None, run_error: OSError | None, kept: int, run_path: Path
) -> WriteFailed:
    """The `WriteFailed` of a run whose records stopped short (`failed`) or whose run.json could not be written
    (`run_error`), saying in one line what it kept: the `kept` rows of its records file, run.json or not."""
    run = result.run
    total = result.summary.counts.rows
    records = Path(run.records_path)
    if failed is not None:
        path, condition, code = failed.path, failed.condition, failed.errno
        head = f"{path}: cannot write ({condition})"
        if run.cancel_reason == WRITE_FAILED:
            head += f": the run stopped early, {run.elapsed_s:,.1f} s in"
        lost = total - kept
        held = f"{records.name} keeps {kept:,} of the {total:,} records measured"
        held += f" ({lost:,} more in the summary only)" if lost else ""
        shards = sorted((records.parent / WORKERS_DIR).glob(f"*/{records.name}"))
        if shards and lost:  # a `--workers` run: its workers' own files may hold more than the merged one
            held += f", {WORKERS_DIR}/*/{records.name} keep {sum(_rows(path) for path in shards):,} of them"
    else:
        assert run_error is not None
        path, condition, code = str(run_path), os_condition(run_error), run_error.errno
        head = f"{run_path}: cannot write ({condition})"
        held = f"{records.name} keeps all {total:,} records"
    if run_error is None:
        file = f"{RUN_FILE} was written, with the summary of all {total:,}"
    elif failed is not None:
        file = f"{RUN_FILE} could not be written either ({os_condition(run_error)})"
    else:
        file = f"{RUN_FILE} is missing"
    return WriteFailed(
        f"{head}; {held}; {file}",
        path=path,
        condition=condition,
        errno=code,
        records_path=records,
        records_kept=kept,
        records_unwritten=total - kept,
        run_file=run_path if run_error is None else None,
        result=result,
    )


def _rows(path: Path) -> int:
    """The rows a records file holds (0 when it cannot be read)."""
    try:
        rows: int = read_records(path, partial=True, chunks=False).num_rows
    except RecordsError:
        return 0
    return rows


def _replay_saved(
    trace: Trace,
    options: ReplayOptions,
    num_gpus: int | None,
    trace_path: str | os.PathLike[str] | None,
    dropped: _Dropped,
    stops: WorkerStops,
) -> ReplayResult:
    """`trace` over `options.runtime.workers` processes, saved once as Arrow for the workers to load; `dropped`: what
    preparing it left out, counted and said in the run's result."""
    with tempfile.TemporaryDirectory(prefix="agentx-trace-") as folder:
        saved = Path(folder) / "trace.arrow"
        save_trace(trace, saved)
        before = asyncio.run(_scrape(options))
        # The parent scrapes the telemetry while its workers replay: the run's id is fixed here so the file carries it.
        runtime = msgspec.structs.replace(options.runtime, run_id=options.runtime.run_id or uuid.uuid4().hex)
        options = msgspec.structs.replace(options, runtime=runtime)
        out_dir = Path(options.out_dir)
        refuse_existing_run(out_dir, options.overwrite)  # before the telemetry touches the folder
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputUnwritable.of(exc.filename or out_dir, exc) from None
        room = reserve_room(out_dir)
        try:
            telemetry = TelemetryThread(options, runtime.run_id or "")
            telemetry.start()
            failed: WriteFailed | None = None
            try:
                run = run_workers(saved, options, runtime.workers, stops=stops)
            except WriteFailed as exc:
                if exc.run is None:
                    raise
                run, failed = exc.run, exc
            finally:
                records = out_dir / RECORDS_FILE
                telemetry.stop(records_epoch_ns(records) if records.is_file() else None)
            run.notices = dropped.notices + run.notices + telemetry.notices
            run.dropped_sessions += dropped.sessions
            after = asyncio.run(_scrape(options)) if before is not None else None
            return _finish(
                options,
                run,
                before,
                after,
                num_gpus,
                trace_path,
                failed=failed,
                room=room,
                metrics_not_served=telemetry.not_served,
            )
        finally:
            release_room(room)


def replay_sync(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    *,
    num_gpus: int | None = None,
    trace_path: str | os.PathLike[str] | None = None,
) -> ReplayResult:
    """`replay` for code without an event loop."""
    return run_sync(replay(trace, options, num_gpus=num_gpus, trace_path=trace_path), "agentx.replay")


_END: Final = object()


class ReplayStream:
    """The records of a replay as they happen: an async iterator of `RequestRecord`, one per finished request.

    Made by `stream_replay`. The run starts on the first `__anext__` (or on entering `async with`) and the
    iteration ends when the run has ended; then `result` holds its `ReplayResult` (summary included, `run.json`
    written). Records are queued, never dropped: a slow consumer delays only itself, not the run.

    Stopping early: `await stream.aclose()`, leaving the `async with` block, or cancelling the task that iterates
    (while it waits for the next record, or anywhere inside `async with`) stops the run the way a deadline does:
    no new request starts, in-flight ones get the grace period, the records are flushed, and `result` is the
    partial result with `run.interrupted` set. An error of the run (`ServerUnreachable`, `ModelNotServed`, a bad
    option) is raised from the iteration.
    """

    def __init__(self, trace: Trace, options: ReplayOptions, *, num_gpus: int | None = None) -> None:
        self.trace = trace
        self.options = options
        self.num_gpus = num_gpus
        self.result: ReplayResult | None = None
        """The run's result once the iteration has ended (None before, or when the run failed)."""
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[ReplayResult] | None = None
        self._stops = RunStops()
        self._finished = False

    def _start(self) -> asyncio.Task[ReplayResult]:
        if self._task is None:
            hooks = RunHooks(on_record=self._queue.put_nowait, stops=self._stops)
            self._task = asyncio.create_task(replay(self.trace, self.options, hooks, num_gpus=self.num_gpus))
            self._task.add_done_callback(self._done)
        return self._task

    def _done(self, task: asyncio.Task[ReplayResult]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.result = task.result()
        self._queue.put_nowait(_END)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> RequestRecord:
        if self._finished:
            raise StopAsyncIteration
        task = self._start()
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            await self._stop(task)
            raise
        if item is _END:
            self._finished = True
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
            raise StopAsyncIteration
        record: RequestRecord = item
        return record

    async def _stop(self, task: asyncio.Task[ReplayResult]) -> None:
        """Stop the run as a deadline would and wait for it; a second cancellation of ours cancels it (its files
        written at once).

        A consumer that merely breaks out of `async for` without `async with` or `aclose()` leaves the run going
        to its natural end (an async iterator is not told about a `break`).
        """
        self._finished = True
        if task.done():
            return
        if self._stops.count == 0:
            self._stops.stop()
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def aclose(self) -> None:
        """Stop the run now (if it still runs) and wait until it has flushed its records and written run.json."""
        if self._task is None:
            self._finished = True
            return
        await self._stop(self._task)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([self._task])

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def stream_replay(trace: Trace, options: ReplayOptions, *, num_gpus: int | None = None) -> ReplayStream:
    """Replay `trace` and iterate over its records as requests finish (see `ReplayStream`).

    ```python
    async with agentx.stream_replay(trace, options) as stream:
        async for record in stream:
            print(record.session_id, record.turn, record.ttft_s)
    print(stream.result.summary.throughput)
    ```
    """
    return ReplayStream(trace, options, num_gpus=num_gpus)
