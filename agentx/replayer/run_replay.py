"""Running a replay: lanes of session trees over one client, records streamed to disk.

- `ReplayOptions`: one immutable options object for a run.
- `await run_replay(trace, options, hooks) -> RunResult`: drives the server with the trace's (or a `prepare_trace`
  result's) sessions and returns where the records went; `hooks` (`RunHooks`, agentx.replayer.schedule.hooks) are
  called as requests go out and finish (progress displays, harnesses).
  Raises `ServerUnreachable` / `ModelNotServed` (agentx.replayer.http.client) or `CalibrationError`
  (agentx.replayer.prompts.calibrate) before any request when the server cannot be used.
- `RunResult` (agentx.replayer.run_result): the run id, the records file, counts, whether the run was
  interrupted, and what the run detected (stream usage, chat calibration, event-loop lag samples).

The parts, one module each: preparation (agentx.replayer.plan.preparation), bodies (agentx.replayer.plan.bodies),
sending and records (agentx.replayer.schedule.sending), the AgentX warmup (agentx.replayer.schedule.warmup) and the
schedule (agentx.replayer.schedule.runner).

How a run goes (docs/agentx.md §4d–§4e, §8; docs/replay.md):

- `GET /v1/models` first; nothing is created on disk if it fails. Then the stream-usage probe
  (agentx.replayer.http.probe) unless `stream_usage` is forced, for `api="chat"` the calibration, unless the telemetry
  is off the server's KV-cache shape from `/metrics` (`vllm:cache_config_info`, kept in the records' metadata as
  `detected.server_cache`), and the trace as replayed (`prepare_trace`, unless given one): over-long sessions
  dropped; flattened agents are split and plans built per session when a tree first draws it
  (agentx.replayer.plan.sessions).
- agentx mode: each lane draws its first tree and its snapshot at t* (agentx.replayer.plan.tstar), the primers go
  out (spread so that every t* coincides), then the optional cache-pressure stage; the profiling start is
  when that ends. Open-loop modes (`trace`, `rate`) start trees at their arrival times instead of on lanes.
- `concurrency` lanes draw trees from one shared `session_order(...)` stream (lane i waits
  `i/concurrency × ramp_s` first). A lane plans its session (cached per session index, with every step's
  full hash ids), then runs one task per step inside a TaskGroup: a step waits for its anchor and joins,
  sleeps `delay_s × delay_scale` (agentx.replayer.schedule.idle: a timer that idle caps move earlier and the stop
  event wakes early), and POSTs a
  streamed request forcing `out` output tokens (at least 1). Its body is built while its anchor is still in
  flight. The lane recycles only when every step of the tree, background subagents included, has
  settled; the next tree starts at turn 0.
- End: after `sessions` trees have started (default with no duration and no request cap: one pass,
  `len(trace.sessions)` trees) the lanes drain and stop. Once `num_requests` profiling requests have been sent, no
  new request or tree starts and the run ends when those in flight have finished. At `duration_s` (or on a
  stop, `RunHooks.stops`) no new tree or step starts, in-flight requests get `grace_s`, then are cancelled
  and recorded as errors of kind `cancelled`; steps never sent are counted in `RunResult.skipped`, not recorded.
- A failed request still completes its step: its dependents go on (the error is in its record).
- Records stream to `out_dir/records.arrow`; a ticker flushes the writer every `FLUSH_EVERY_S` (50 ms), in a gap
  between due requests, and the writer is closed on every exit path. In agentx mode every play carries its own
  cache-bust marker.
- The run folder or its records file that cannot be written at the start raises `OutputUnwritable` before any
  request of the run. A write the OS refuses later (a full disk, a read-only file system) stops the run as a
  cancellation does (grace, then cancel; `cancel_reason` "write_failed"): the records file ends at its last whole
  batch, the rows after it are kept in memory, and `WriteFailed` is raised at the end with the `RunResult` and
  those rows (`run`, `unwritten`).
- `shard=(i, n)` runs lanes i, i+n, ... and the trees at positions ≡ i (mod n) of the order: one process of
  a `--workers n` run (agentx.replayer.workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import pyarrow as pa

from agentx.distribution import installed_version
from agentx.errors import OutputUnwritable, RunStopped, WriteFailed
from agentx.records.record import RunInfo
from agentx.records.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.records.writer import RecordWriter
from agentx.replayer.http.client import Client, ModelNotServed
from agentx.replayer.http.identity import ServerIdentity, identify_server
from agentx.replayer.http.probe import STREAM_OPTIONS, StreamUsage
from agentx.replayer.options.locks import locks_broken
from agentx.replayer.options.replay import ReplayOptions, checked, flat_options, lanes
from agentx.replayer.options.server_client import server_client
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.preparation import (
    chat_calibration,
    dropped_notices,
    preparation_key,
    prepare_trace,
    stream_usage_probe,
)
from agentx.replayer.plan.sessions import ReplaySessions
from agentx.replayer.prompts.calibrate import ChatCalibration
from agentx.replayer.prompts.chat import ChatRenderer
from agentx.replayer.prompts.tokens import TokenSpace
from agentx.replayer.run_result import CalibrationSummary, RunResult
from agentx.replayer.schedule.clock import DispatchClock
from agentx.replayer.schedule.collector import quiet_gc
from agentx.replayer.schedule.hooks import NO_HOOKS, RunHooks
from agentx.replayer.schedule.runner import Runner
from agentx.replayer.schedule.stops import Cancellation, RunStops
from agentx.replayer.telemetry.metrics import ServerCache, parse_cache_config
from agentx.trace.digest import trace_digest
from agentx.trace.model import Trace

_log = logging.getLogger(__name__)
T = TypeVar("T")
WRITE_FAILED: Final = "write_failed"
"""`RunResult.cancel_reason` of a run stopped because its records could not be written."""


class _Server(msgspec.Struct, kw_only=True):
    """What the probes before a run learned of the server: what it serves (with each model's context length), what it
    is, whether it streams usage, the chat calibration and its KV-cache shape."""

    context_lengths: dict[str, int | None]
    identity: ServerIdentity
    stream_usage: StreamUsage
    stream_usage_assumed: str | None
    calibration: ChatCalibration | None
    cache: ServerCache | None


async def _served(client: Client, options: ReplayOptions) -> tuple[dict[str, int | None], ServerIdentity]:
    """What the server serves (each model with its context length, when it says) and what it is; `ModelNotServed`
    when a model of the run is not served."""
    context_lengths = await client.served_models(require=options.server.model)
    served = list(context_lengths)
    missing = [model for model in options.server.models if model not in served]
    if missing:
        raise ModelNotServed(f"models {missing} are not served by {options.server.url} (served: {', '.join(served)})")
    return context_lengths, await identify_server(client, options.server.model)


async def _unless_stopped(work: Coroutine[Any, Any, T], stops: RunStops | None) -> T:
    """`work` (a probe before the run starts), given up on with `RunStopped` at a stop of `stops` (one given before
    too): a run stopped before it started has measured nothing."""
    if stops is None:
        return await work
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    cancellation = Cancellation()

    def on_stop(count: int) -> None:
        loop.call_soon_threadsafe(task.cancel)

    with stops.listening(on_stop):
        try:
            return await task
        except asyncio.CancelledError:
            if cancellation.requested or not task.cancelled():
                raise
    raise RunStopped("the run was stopped while it probed the server, before it started: nothing was measured")


async def _probe(
    client: Client,
    options: ReplayOptions,
    space: TokenSpace,
    block_size: int,
    context_lengths: dict[str, int | None],
    identity: ServerIdentity,
) -> _Server:
    """Ask the server the rest of what the run needs before it starts: whether it streams usage, the chat
    calibration, its KV-cache shape."""
    probe = await stream_usage_probe(client, options, space)
    calibration = await chat_calibration(client, options, block_size) if options.server.api == "chat" else None
    cache = await _server_cache(client) if options.runtime.metrics_interval_s is not None else None
    return _Server(
        context_lengths=context_lengths,
        identity=identity,
        stream_usage=probe.usage,
        stream_usage_assumed=probe.assumed,
        calibration=calibration,
        cache=cache,
    )


def _metadata(options: ReplayOptions, sessions: ReplaySessions, server: _Server) -> dict[str, Any]:
    """What the records file's metadata keeps of the run: its options, the trace as replayed, the locks broken and
    what the probes detected."""
    metadata = flat_options(options)
    metadata["trace"] = {"dropped_sessions": sessions.dropped, "block_size": sessions.trace.block_size}
    broken = locks_broken(options)
    metadata["locks_broken"] = broken
    metadata["unsafe_override"] = bool(broken)
    metadata["detected"] = {
        "stream_usage": server.stream_usage,
        "stream_usage_assumed": server.stream_usage_assumed,
        "calibration": server.calibration.summary() if server.calibration is not None else None,
        "server_cache": msgspec.to_builtins(server.cache) if server.cache is not None else None,
    }
    return metadata


async def run_replay(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    hooks: RunHooks = NO_HOOKS,
    *,
    start_at_ns: int | None = None,
) -> RunResult:
    """Replay `trace` against `options.server.url` (see the module docstring and docs/agentx.md §4d–§4e, §8), calling
    `hooks` as it goes (`RunHooks`).

    A shard of a `--ray` run (agentx.replayer.cluster) starts at `start_at_ns` (`perf_counter_ns`), the instant its
    shards agreed on, once its probes are done: its records count from that instant, so a shard that starts late
    shows it as dispatch lag.

    A stop of `hooks.stops` (Ctrl-C on the command line) acts like reaching the deadline: no new request starts,
    in-flight ones get `grace_s`, the records are flushed, and the result says `interrupted=True`. A second stop
    shrinks the grace period to zero: the requests in flight are cancelled at once and recorded with what had
    arrived. Cancelling the calling task does what two stops do and returns the result with the caller's task still
    cancelling, for the caller to write the run's files and raise (`agentx.replay` does); a cancellation before the
    run started, or a second one, propagates at once.
    `trace` may be a `prepare_trace` result made for options that agree with these on what it depends on.
    """
    options = checked(options)
    refuse_existing_run(options.out_dir, options.overwrite)
    if isinstance(trace, PreparedTrace) and trace.made_for != preparation_key(options):
        raise ValueError(
            "the prepared trace was made for other options (split rules, context limit, load-time idle cap, child "
            "offset or models): prepare it again with these options"
        )
    space = TokenSpace(options.scenario.token_low, options.scenario.token_high)  # validates the range before any I/O
    # Lanes bound the requests in flight; an open loop does not, so neither may its connection pool (0: none).
    limit = options.connection.max_connections or 2 * lanes(options.load)
    async with server_client(
        options.server,
        options.connection,
        limit=limit,
        context_overflow_substrings=options.scenario.context_overflow_substrings,
    ) as client:
        context_lengths, identity = await _unless_stopped(_served(client, options), hooks.stops)
        prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, options)
        sessions = prepared.sessions
        trace = sessions.trace
        notices = dropped_notices(sessions, options)
        probing = _probe(client, options, space, trace.block_size, context_lengths, identity)
        server = await _unless_stopped(probing, hooks.stops)
        if server.stream_usage_assumed is not None:
            notices.append(f"stream usage: {server.stream_usage_assumed}; assuming {server.stream_usage!r}")
            _log.warning(notices[-1])
        out_dir = Path(options.out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputUnwritable.of(exc.filename or out_dir, exc) from None
        run_id = options.runtime.run_id or uuid.uuid4().hex
        records_path = out_dir / RECORDS_FILE
        runner: Runner | None = None
        main: asyncio.Task[None] | None = None

        def write_failed(error: OSError) -> None:
            # Nothing more reaches the disk: the run stops as an interrupt stops it, and keeps its rows in memory.
            if runner is None or main is None or main.done():
                return  # the run had ended: its last rows only are missing
            runner.recorder.cancel_reason = runner.recorder.cancel_reason or WRITE_FAILED
            runner.tally.notices.append(
                f"{error.filename}: cannot write the records ({error.strerror}): the run stopped; the rows measured "
                "from then on are in the summary only"
            )
            runner.stop()

        with contextlib.ExitStack() as stack:
            clock = stack.enter_context(DispatchClock())
            if start_at_ns is not None:
                await clock.at(start_at_ns)
            # Read the two clocks back to back: wall time = epoch + offset must hold to the microsecond.
            now_ns, wall_now_ns = time.perf_counter_ns(), time.time_ns()
            start_ns = now_ns if start_at_ns is None else start_at_ns
            info = RunInfo(
                run_id=run_id,
                wall_epoch_ns=wall_now_ns - (now_ns - start_ns),
                options=_metadata(options, sessions, server),
            )
            # Flushed by the runner's ticker, in gaps between due requests (`_tick`), not as records arrive.
            try:
                made = RecordWriter(
                    records_path, info, flush_interval_s=math.inf, on_batch=hooks.on_batch, on_error=write_failed
                )
            except OSError as exc:
                raise OutputUnwritable.of(records_path, exc) from None
            writer = stack.enter_context(made)
            if hooks.on_start is not None:
                hooks.on_start(info, start_ns, clock)
            calibration = server.calibration
            renderer = (
                ChatRenderer(calibration, options.scenario.seed, trace.block_size) if calibration is not None else None
            )
            bodies = BodyBuilder(
                options,
                trace,
                space,
                stream_options=STREAM_OPTIONS[server.stream_usage],
                renderer=renderer,
                context_lengths={model: length for model, length in server.context_lengths.items() if length},
            )
            capacity_tokens = server.cache.capacity_tokens if server.cache is not None else None
            runner = Runner(
                prepared,
                options,
                client,
                writer,
                bodies,
                run_id,
                start_ns,
                clock,
                hooks,
                notices,
                lru_blocks=None if capacity_tokens is None else capacity_tokens // trace.block_size,
            )
            # Frozen after the runner is built: its long-lived tables (block cache, plans) are never walked.
            with quiet_gc(options.runtime.quiet_gc):
                main = asyncio.create_task(runner.run())
                interrupted = await _run_to_its_end(runner, main, hooks.stops)
                elapsed_s = (time.perf_counter_ns() - start_ns) / 1e9
    result = _result(runner, prepared, server, run_id, records_path, interrupted, elapsed_s, start_ns)
    if writer.error is not None:
        raise written_partly(writer.error, result, writer.rows_written, writer.unwritten())
    return result


async def _run_to_its_end(runner: Runner, main: asyncio.Task[None], stops: RunStops | None) -> bool:
    """Wait for the runner's task `main`; whether it was stopped early. Each of `stops` stops the runner (the first
    gracefully, the second ending the grace period). A cancellation of the caller ends the grace period at once and
    waits for the records, leaving the caller's task cancelling (its caller raises once the run is written); a second
    cancellation cancels `main` and propagates, losing the records of the requests still in flight."""
    loop = asyncio.get_running_loop()

    def on_stop(count: int) -> None:
        loop.call_soon_threadsafe(_stop, runner, count)

    with stops.listening(on_stop) if stops is not None else contextlib.nullcontext():
        try:
            await asyncio.shield(main)
        except asyncio.CancelledError:
            if main.done():
                raise
            _stop(runner, 2, why="the run was cancelled")
            try:
                await asyncio.shield(main)
            except asyncio.CancelledError:
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
                raise
            return True
    return stops is not None and stops.count > 0


def _stop(runner: Runner, count: int, *, why: str = "a second interrupt ended the grace period") -> None:
    """The runner's `count`th early stop: the first graceful, the second (or a cancellation) ending the grace period;
    `why` it ended, said in the records of the requests it cancels."""
    runner.recorder.cancel_reason = runner.recorder.cancel_reason or "interrupted"
    runner.stop()
    if count >= 2:
        runner.hard_stop(why)


def _result(
    runner: Runner,
    prepared: PreparedTrace,
    server: _Server,
    run_id: str,
    records_path: Path,
    interrupted: bool,
    elapsed_s: float,
    start_ns: int,
) -> RunResult:
    """What the run returns, from its runner once it has ended."""
    sessions = prepared.sessions
    trace = sessions.trace
    played_ids = {trace.sessions[index].session_id for index in runner.tally.played}
    flattened = {sid: chains for sid, chains in sessions.chains_by_session.items() if sid in played_ids}
    calibration = server.calibration
    return RunResult(
        run_id=run_id,
        records_path=records_path,
        requests=runner.recorder.requests,
        errors=runner.recorder.errors,
        trees_started=runner.tally.trees_started,
        trees_finished=runner.tally.trees_finished,
        interrupted=interrupted,
        elapsed_s=elapsed_s,
        cancelled=runner.recorder.cancelled,
        skipped=runner.tally.skipped,
        loop_lag_s=runner.tally.loop_lag_s,
        stream_usage=server.stream_usage,
        calibration=msgspec.convert(calibration.summary(), CalibrationSummary) if calibration is not None else None,
        cancel_reason=runner.recorder.cancel_reason,
        server_lost_at_s=runner.tally.server_lost_at_s,
        skipped_context_overflow=runner.tally.skipped_context_overflow,
        warmup_requests=runner.recorder.warmup_requests,
        tstar=runner.tally.tstar,
        dropped_sessions=len(sessions.dropped),
        flattened_chains=sum(flattened.values()),
        flattened_by_session=flattened,
        server=server.identity,
        idle_jumps=len(runner.idle.jumps),
        idle_skipped_s=runner.idle.skipped_ns / 1e9,
        warmup_expected_s=runner.tally.warmup_expected_s,
        notices=runner.tally.notices,
        request_cap_reached=runner.sender.cap_reached,
        profiling_start_ns=runner.gate.start_ns - start_ns if runner.gate.started.is_set() else None,
        trace_digest=trace_digest(trace),
        agentx_version=installed_version(),
    )


def written_partly(error: OSError, run: RunResult, kept: int, unwritten: pa.Table | None) -> WriteFailed:
    """The `WriteFailed` of a run whose records file stopped at `kept` rows (`error`), the rows after it in memory."""
    lost = 0 if unwritten is None else unwritten.num_rows
    condition = error.strerror or str(error)
    return WriteFailed(
        f"{error.filename}: cannot write the records ({condition}); the run stopped early: the file keeps {kept:,} "
        f"records, {lost:,} more were measured but not written",
        path=error.filename or run.records_path,
        condition=condition,
        errno=error.errno,
        records_path=run.records_path,
        records_kept=kept,
        records_unwritten=lost,
        run=run,
        unwritten=unwritten,
    )


async def _server_cache(client: Client) -> ServerCache | None:
    """The server's KV-cache block size and capacity from its `/metrics` (vLLM's `vllm:cache_config_info`), read once
    before the run: the records' LRU bound and the summary's block grid need them; None when it does not say."""
    text = await client.metrics_text()
    return parse_cache_config(text) if text is not None else None
