"""`--ray`: one replay sharded over Ray actors, records streamed home to one file on the driver's timeline.

`run_cluster(trace, options)` is `run_replay` for `options.runtime.ray` (docs/distributed.md):

1. Connect (agentx.replayer.cluster.placement), place `workers` one-CPU bundles with a SPREAD placement group, or fail
   in one line before any request.
2. Start one `Shard` actor per bundle with `shard=(i, workers)`: the union of the shards is the one-process plan.
   The trace goes through the object store as native Arrow bytes, so only the driver needs to read its file.
3. Measure each shard's clock against the driver's (agentx.replayer.cluster.clocks) and start every shard at one
   agreed instant, `START_LEAD_S` ahead, given to each on its own clock. A shard's records count from that instant,
   so they are on the driver's timeline as they arrive.
4. Poll every `POLL_INTERVAL_S`: the new record batches go into the one `records.arrow` (and to `on_record`), the
   in-flight requests are kept for a loss. A shard that dies leaves those recorded cancelled for `worker_lost`;
   `on_worker_loss` stops the rest (`abort`) or lets them go on (`continue`).
5. The caller's stops stop every shard as Ctrl-C stops one run (grace period, then a second stop cuts it), and a
   cancellation stops them at once; polling goes on until they have drained, so their records still reach the file.
   A records file the OS stops taking (a full disk) stops them the same way; the rows from then on are kept in
   memory, and `WriteFailed` carries them with the run (agentx.replayer.run_replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import pyarrow as pa

from agentx.errors import ClusterError, ConfigError, OutputUnwritable, RunStopped
from agentx.records.record import WORKER_LOST, RequestRecord, RunInfo, to_records
from agentx.records.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.records.writer import RecordWriter
from agentx.replayer.cluster.clocks import CLOCK_WARN_NS, ClockOffset, measure
from agentx.replayer.cluster.placement import place_shards, ray_session, remove_group
from agentx.replayer.cluster.shard import Place, Shard, ShardReport, in_flight_records
from agentx.replayer.options.limits import check_shards
from agentx.replayer.options.replay import ReplayOptions, checked, flat_options
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.run_replay import WRITE_FAILED, written_partly
from agentx.replayer.run_result import RunResult, ShardInfo, combined
from agentx.replayer.schedule.hooks import NO_HOOKS, RunHooks
from agentx.trace.formats.arrow import arrow_bytes
from agentx.trace.model import Trace

POLL_INTERVAL_S: Final = 0.5
"""How often the driver collects each shard's records: a lost node costs at most this much of them (and its
in-flight requests are still recorded, cancelled)."""
POLL_TIMEOUT_S: Final = 30.0
"""A shard that does not answer a poll for this long is taken for lost (a hung or partitioned node)."""
START_LEAD_S: Final = 2.0
"""The agreed start is this far after the clocks are measured: time for every shard's server probes (a shard that
needs longer starts late, which its records show as dispatch lag and run.json as `start_late_s`)."""
HANGUPS: Final = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM") if hasattr(signal, name))
"""Signals that reach a whole process group (a closed terminal or ssh session, a scheduler's stop) and kill a process
that does not handle them: blocked in the processes of a local Ray cluster, which Ray blocks SIGINT in already."""
_log = logging.getLogger(__name__)


@contextlib.contextmanager
def _hangups_blocked() -> Iterator[None]:
    """Block `HANGUPS` in this thread while a local Ray cluster starts: its processes (the GCS, the raylet, the shards'
    workers) inherit the mask and outlive a hangup of the process group, which the driver takes as a stop (the
    command line's STOP_SIGNALS) and passes on to the shards (`_Driver._stopped`); a signal that came meanwhile
    reaches the driver when unblocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANGUPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


async def run_cluster(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    hooks: RunHooks = NO_HOOKS,
    *,
    clock_skews_ns: Mapping[int, int] = {},
) -> RunResult:
    """Replay `trace` over `options.runtime.workers` Ray actors on the cluster `options.runtime.ray` (module
    docstring), calling `hooks` as `run_replay` does. `clock_skews_ns` (shard → ns) makes a shard's clock read that much
    off, for tests of the clock model."""
    options = checked(options)
    address, workers = options.runtime.ray, options.runtime.workers
    if address is None:
        raise ConfigError("run_cluster needs options.runtime.ray: a Ray cluster's address, auto or local")
    check_shards(options.load, workers)
    refuse_existing_run(options.out_dir, options.overwrite)
    run_id = options.runtime.run_id or uuid.uuid4().hex
    dropped: list[str] = []
    if isinstance(trace, PreparedTrace):
        dropped = trace.sessions.dropped
        trace = trace.trace  # the sessions kept: the shards drop none again
    with contextlib.ExitStack() as session:
        with _hangups_blocked():
            ray = session.enter_context(ray_session(address))
        group = await place_shards(ray, workers, options.runtime.ray_placement_timeout_s)
        driver = _Driver(ray, options, run_id, hooks)
        try:
            await driver.launch(group, trace, clock_skews_ns)
            await driver.follow()
        finally:
            driver.close()
            remove_group(group)
    return driver.result(dropped)


class _Remote:
    """The driver's view of one shard."""

    def __init__(self, index: int, actor: Any) -> None:
        self.index = index
        self.actor = actor
        self.place = Place(node_id="", hostname="", pid=0)
        self.node_ip = ""
        self.offset = ClockOffset(offset_ns=0, error_ns=0, rounds=0)
        self.in_flight: list[RequestRecord] = []
        self.sent = 0
        self.finished = False
        self.report: ShardReport | None = None
        self.info: ShardInfo | None = None


class _Driver:
    def __init__(
        self,
        ray: Any,
        options: ReplayOptions,
        run_id: str,
        hooks: RunHooks,
    ) -> None:
        self.ray = ray
        self.options = options
        self.run_id = run_id
        self.hooks = hooks
        self.records_path = Path(options.out_dir) / RECORDS_FILE
        self.shards: list[_Remote] = []
        self.start_ns = 0
        self.wall_epoch_ns = 0
        self.writer: RecordWriter | None = None
        self.profiling = False
        self.interrupts = 0
        self.cancelled = False
        """The caller's task was cancelled while the shards ran (its caller raises once the run is written)."""
        self.cancel_reason: str | None = None
        self.failure: BaseException | None = None
        self.notices: list[str] = []
        self.counts = {"requests": 0, "errors": 0, "cancelled": 0, "warmup": 0}
        self.ended_ns = 0

    # -- start

    async def launch(self, group: Any, trace: Trace, clock_skews_ns: Mapping[int, int]) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        workers = self.options.runtime.workers
        remote = self.ray.remote(num_cpus=1, max_concurrency=4, max_restarts=0)(Shard)
        for index in range(workers):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
            actor = remote.options(scheduling_strategy=strategy).remote(
                self._shard_options(index), clock_skews_ns.get(index, 0)
            )
            self.shards.append(_Remote(index, actor))
        places = await asyncio.gather(*(shard.actor.place.remote() for shard in self.shards))
        addresses = {node["NodeID"]: node.get("NodeManagerAddress", "") for node in self.ray.nodes()}
        for shard, place in zip(self.shards, places, strict=True):
            shard.place, shard.node_ip = place, addresses.get(place.node_id, "")
        # One copy in the object store, fetched by each node once: the trace file need exist on the driver only.
        trace_ref = self.ray.put(arrow_bytes(trace))
        source = f"the trace sent by the driver ({len(trace.sessions)} sessions)"
        await asyncio.gather(*(shard.actor.load.remote(trace_ref, source) for shard in self.shards))
        for shard in self.shards:
            shard.offset = await measure(shard.actor.clock_ns.remote)
        # Read the two clocks back to back: the driver's wall time at the agreed instant.
        now_ns, wall_now_ns = time.perf_counter_ns(), time.time_ns()
        self.start_ns = now_ns + int(START_LEAD_S * 1e9)
        self.wall_epoch_ns = wall_now_ns + (self.start_ns - now_ns)
        await asyncio.gather(*(s.actor.start.remote(s.offset.to_shard(self.start_ns)) for s in self.shards))
        for shard in self.shards:
            shard.info = ShardInfo(
                index=shard.index,
                node_id=shard.place.node_id,
                node_ip=shard.node_ip,
                hostname=shard.place.hostname,
                clock_offset_ns=shard.offset.offset_ns,
                clock_error_ns=shard.offset.error_ns,
            )
            if shard.offset.error_ns > CLOCK_WARN_NS:
                self._notice(
                    f"shard {shard.index}'s clock is known to ±{shard.offset.error_ns / 1e6:.2f} ms only (the "
                    f"quickest of {shard.offset.rounds} round trips to {shard.node_ip}): its timestamps may be "
                    "off by as much against the other shards'"
                )

    def _shard_options(self, index: int) -> ReplayOptions:
        runtime = msgspec.structs.replace(
            self.options.runtime,
            run_id=self.run_id,
            shard=(index, self.options.runtime.workers),
            ray=None,
            metrics_interval_s=None,  # the driver scrapes the server and the GPUs, once for the run
            gpu_metrics_url=None,
        )
        return msgspec.structs.replace(self.options, runtime=runtime)

    # -- the run

    async def follow(self) -> None:
        """Poll until every shard has ended or been lost. The caller's stops (`hooks.stops`) stop the shards as they
        stop one run; a cancellation of the caller stops them at once (its caller raises once the run is written), a
        second one propagates."""
        loop = asyncio.get_running_loop()
        stops = self.hooks.stops

        def on_stop(count: int) -> None:
            loop.call_soon_threadsafe(self._stopped)

        with stops.listening(on_stop) if stops is not None else contextlib.nullcontext():
            while not all(shard.finished for shard in self.shards):
                polling = asyncio.ensure_future(self._poll_all())
                while not polling.done():
                    try:
                        await asyncio.shield(polling)  # a poll's records must not be dropped by a cancellation
                    except asyncio.CancelledError:
                        if polling.cancelled() or self.cancelled:
                            raise
                        self.cancelled = True
                        self._stopped(at_once=True)
                polling.result()
                if all(shard.finished for shard in self.shards):
                    break
                try:
                    await asyncio.sleep(POLL_INTERVAL_S)
                except asyncio.CancelledError:
                    if self.cancelled:
                        raise
                    self.cancelled = True
                    self._stopped(at_once=True)
        self.ended_ns = time.perf_counter_ns()
        await self._measure_drift()

    def _stopped(self, *, at_once: bool = False) -> None:
        """A stop (Ctrl-C) or, `at_once`, a cancellation: stop every shard, gracefully the first time, at once the
        second (each shard counts them)."""
        self.interrupts += 1
        self.cancel_reason = self.cancel_reason or "interrupted"
        self._stop_all()
        if at_once:
            self._stop_all()

    def _stop_all(self) -> None:
        for shard in self.shards:
            if not shard.finished:
                shard.actor.stop.remote()

    async def _poll_all(self) -> None:
        live = [shard for shard in self.shards if not shard.finished]
        answers = await asyncio.gather(*(self._answer(shard.actor.poll.remote()) for shard in live))
        for shard, answer in zip(live, answers, strict=True):
            if isinstance(answer, ShardReport):
                self._take(shard, answer)
            else:
                self._lose(shard, answer)

    async def _answer(self, ref: Any) -> ShardReport | str:
        """A shard's report, or why it is lost."""
        exceptions = self.ray.exceptions
        # A dead actor, or one whose node is gone (Ray before 2.3x says both with RayActorError).
        lost = (exceptions.RayActorError, getattr(exceptions, "ActorUnavailableError", exceptions.RayActorError))
        try:
            report: ShardReport = await asyncio.wait_for(asyncio.wrap_future(ref.future()), POLL_TIMEOUT_S)
        except TimeoutError:
            return f"it did not answer for {POLL_TIMEOUT_S:g} s"
        except lost as exc:
            return " ".join(str(exc).split())[:300]
        return report

    def _take(self, shard: _Remote, report: ShardReport) -> None:
        if report.info is not None and self.writer is None and self.failure is None:
            self._open(report.info)
        seen: set[str] = set()
        if report.records:
            table = pa.ipc.open_stream(report.records).read_all()
            seen = set(table.column("request_id").to_pylist())
            self._write(table)
        shard.in_flight = [r for r in in_flight_records(report.in_flight) if r.request_id not in seen]
        if self.hooks.on_sent is not None:
            for _ in range(report.sent - shard.sent):
                self.hooks.on_sent()
        shard.sent = report.sent
        if report.profiling and not self.profiling:
            self.profiling = True
            if self.hooks.on_profiling is not None:
                self.hooks.on_profiling()
        shard.report = report
        if report.info is not None and shard.info is not None:
            shard.info.wall_clock_offset_ns = report.info.wall_epoch_ns - self.wall_epoch_ns
        if shard.info is not None:
            shard.info.start_late_s = report.start_late_s
            shard.info.cpu_s = report.cpu_s
        if report.done:
            shard.finished = True
            error = report.error
            if error is not None and not isinstance(error, asyncio.CancelledError) and self.failure is None:
                self.failure = error  # raised once every shard has stopped
                self._stop_all()
                self._stop_all()  # at once: the run cannot stand

    def _open(self, info: RunInfo) -> None:
        """The one records file, on the driver's timeline, once the first shard has started (its probes' findings
        go into the file's metadata)."""
        metadata = {**info.options, **flat_options(self.options)}
        run = RunInfo(run_id=self.run_id, wall_epoch_ns=self.wall_epoch_ns, options=metadata)
        try:
            self.records_path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = RecordWriter(self.records_path, run, on_error=self._write_failed)
        except OSError as exc:  # nothing can be kept: the shards are stopped at once
            self.failure = self.failure or OutputUnwritable.of(exc.filename or self.records_path, exc)
            self._stop_all()
            self._stop_all()
            return
        if self.hooks.on_start is not None:
            self.hooks.on_start(run, self.start_ns, None)

    def _write_failed(self, error: OSError) -> None:
        """The records file takes no more rows: the shards stop as on an interrupt; the rest is kept in memory."""
        self.cancel_reason = self.cancel_reason or WRITE_FAILED
        # Kept in run.json, not logged: the command's last line says it, with what was kept.
        self.notices.append(f"{error.filename}: cannot write the records ({error.strerror}): the shards were stopped")
        self._stop_all()

    def _write(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        if self.writer is None:  # the records file could not be made (`_open`): the run fails with that
            return
        self.writer.write_table(table)
        counts = self.counts
        counts["requests"] += table.num_rows
        counts["errors"] += pc.sum(pc.equal(table.column("status"), "error")).as_py() or 0
        counts["cancelled"] += pc.sum(pc.equal(table.column("error_kind"), "cancelled")).as_py() or 0
        counts["warmup"] += pc.sum(pc.equal(table.column("phase"), "warmup")).as_py() or 0
        if self.hooks.on_record is not None:
            for record in to_records(table):
                self.hooks.on_record(record)

    def _count(self, record: RequestRecord) -> None:
        """Count a record written one at a time (`_write` counts its tables by column)."""
        counts = self.counts
        counts["requests"] += 1
        counts["errors"] += record.status == "error"
        counts["cancelled"] += record.error_kind == "cancelled"
        counts["warmup"] += record.phase == "warmup"
        if self.hooks.on_record is not None:
            self.hooks.on_record(record)

    def _lose(self, shard: _Remote, reason: str) -> None:
        """`shard` died: its in-flight requests are recorded cancelled for `worker_lost`, then the rest stop
        (`abort`) or go on (`continue`)."""
        shard.finished = True
        with contextlib.suppress(Exception):  # it is gone already, or going
            self.ray.kill(shard.actor)
        at_ns = time.perf_counter_ns() - self.start_ns
        place = shard.place
        where = f"shard {shard.index} on node {shard.node_ip} ({place.node_id[:12]})"
        message = f"{WORKER_LOST}: {where} was lost: {reason}"
        if self.writer is not None:
            for stub in shard.in_flight:
                record = msgspec.structs.replace(stub, end_ns=max(at_ns, stub.sent_ns), error_message=message)
                self.writer.append(record)
                self._count(record)
        if shard.info is not None:
            shard.info.lost, shard.info.lost_reason = True, reason
            shard.info.lost_at_s = at_ns / 1e9
            shard.info.lost_in_flight = len(shard.in_flight)
        then = "the others were stopped (--on-worker-loss abort)"
        if self.options.runtime.on_worker_loss == "continue":
            then = "the others go on (--on-worker-loss continue): the load is lower from here"
        self._notice(
            f"{where} was lost at {at_ns / 1e9:.1f} s ({reason}); {len(shard.in_flight)} requests in flight "
            f"recorded cancelled ({WORKER_LOST}); {then}"
        )
        shard.in_flight = []
        if self.options.runtime.on_worker_loss == "abort":
            self.cancel_reason = self.cancel_reason or WORKER_LOST
            self._stop_all()

    async def _measure_drift(self) -> None:
        for shard in self.shards:
            if shard.info is None or shard.info.lost:
                continue
            try:
                again = await measure(shard.actor.clock_ns.remote)
            except Exception:  # the run is over: a shard gone now costs only this figure
                continue
            shard.info.clock_drift_ns = drift = again.offset_ns - shard.offset.offset_ns
            if abs(drift) > CLOCK_WARN_NS + again.error_ns + shard.offset.error_ns:
                self._notice(
                    f"shard {shard.index}'s clock drifted {drift / 1e6:+.2f} ms against the driver's over the run: "
                    "its late timestamps may be off by up to as much"
                )

    def _notice(self, text: str) -> None:
        _log.warning(text)
        self.notices.append(text)

    # -- the end

    def close(self) -> None:
        for shard in self.shards:
            with contextlib.suppress(Exception):  # the actor is gone already
                self.ray.kill(shard.actor)
        if self.writer is not None:
            self.writer.close()

    def result(self, dropped: list[str]) -> RunResult:
        """The run, once the shards have ended and the writer is closed; raises a shard's error, or `WriteFailed` (with
        this run) when the records file stopped taking rows."""
        if self.failure is not None:
            raise self.failure
        results = [s.report.result for s in self.shards if s.report is not None and s.report.result is not None]
        if self.writer is None:
            if self.cancelled:  # before any shard started: nothing to summarize
                raise asyncio.CancelledError
            if self.interrupts:
                raise RunStopped("the run was stopped before any of its shards started: nothing was measured")
            raise ClusterError("every shard was lost before the run started: see the warnings above")
        interrupted = self.interrupts > 0
        elapsed_s = (self.ended_ns - self.start_ns) / 1e9
        if results:
            run = combined(results, run_id=self.run_id, records_path=self.records_path, interrupted=interrupted)
        else:
            run = RunResult(
                run_id=self.run_id,
                records_path=self.records_path,
                requests=0,
                errors=0,
                trees_started=0,
                trees_finished=0,
                interrupted=interrupted,
                elapsed_s=elapsed_s,
            )
        counts = self.counts
        run.requests, run.errors = counts["requests"], counts["errors"]
        run.cancelled, run.warmup_requests = counts["cancelled"], counts["warmup"]
        run.elapsed_s = elapsed_s
        run.interrupted = interrupted  # the shards this driver stopped say they were interrupted: only a user's counts
        run.cancel_reason = self.cancel_reason or run.cancel_reason
        run.dropped_sessions = len(dropped) or run.dropped_sessions
        run.notices = [*run.notices, *self.notices]
        run.shards = [shard.info for shard in self.shards if shard.info is not None]
        if self.writer.error is not None:
            raise written_partly(self.writer.error, run, self.writer.rows_written, self.writer.unwritten())
        return run
