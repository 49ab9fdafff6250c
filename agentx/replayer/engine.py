"""Running a replay: lanes of session trees over one client, records streamed to disk.

- `ReplayOptions`: one immutable options object for a run.
- `await run_replay(trace, options, *, on_record=None, on_sent=None) -> RunResult`: drives the server with
  the trace's (or a `prepare_trace` result's) sessions and returns where the records went; `on_sent()` is
  called as each request goes out and `on_record(record)` as it finishes (progress displays, harnesses).
  Raises `ServerUnreachable` / `ModelNotServed` (agentx.replayer.client) or `CalibrationError`
  (agentx.replayer.calibrate) before any request when the server cannot be used.
- `RunResult`: the run id, the records file, counts, whether the run was interrupted, and what the run
  detected (stream usage, chat calibration, event-loop lag samples).

How a run goes (docs/agentx.md §4d–§4e, §8; docs/replay.md):

- `GET /v1/models` first; nothing is created on disk if it fails. Then the stream-usage probe
  (agentx.replayer.probe) unless `stream_usage` is forced, for `api="chat"` the calibration, and the trace as
  replayed (`prepare_trace`, unless given one): over-long sessions dropped; flattened agents are split and
  plans built per session when a tree first draws it (agentx.replayer.sessions).
- agentx mode: each lane draws its first tree and its snapshot at t* (agentx.replayer.tstar), the primers go
  out (spread so that every t* coincides), then the optional cache-pressure stage; the profiling start is
  when that ends. Open-loop modes (`trace`, `rate`) start trees at their arrival times instead of on lanes.
- `concurrency` lanes draw trees from one shared `session_order(...)` stream (lane i waits
  `i/concurrency × ramp_s` first). A lane plans its session (cached per session index, with every step's
  full hash ids), then runs one task per step inside a TaskGroup: a step waits for its anchor and joins,
  sleeps `delay_s × delay_scale` (agentx.replayer.idle: a timer that idle caps move earlier and the stop
  event wakes early), and POSTs a
  streamed request forcing `out` output tokens (at least 1). Its body is built while its anchor is still in
  flight. The lane recycles only when every step of the tree, background subagents included, has
  settled; the next tree starts at turn 0.
- End: after `sessions` trees have started (default with no duration: one pass, `len(trace.sessions)` trees)
  the lanes drain and stop. At `duration_s` (or on cancellation of `run_replay`) no new tree or step starts,
  in-flight requests get `grace_s`, then are cancelled and recorded as errors of kind `cancelled`; steps never
  sent are counted in `RunResult.skipped`, not recorded.
- A failed request still completes its step: its dependents go on (the error is in its record).
- Records stream to `out_dir/records.arrow`; a ticker lets the writer flush every 0.2 s, and
  the writer is closed on every exit path. In agentx mode every play carries its own cache-bust marker.
- `shard=(i, n)` runs lanes i, i+n, ... and the trees at positions ≡ i (mod n) of the order: one process of
  a `--workers n` run (agentx.replayer.workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from agentx.errors import ConfigError, ServerError
from agentx.replayer.arrivals import rate_arrivals, trace_arrivals
from agentx.replayer.calibrate import ChatCalibration, LocalCounter, ServerCounter, TokenCounter, calibrate
from agentx.replayer.chat import CHAT_PATH, MARKER_WORDS, ChatRenderer, chat_body
from agentx.replayer.client import Client, Exchange, ModelNotServed
from agentx.replayer.clock import DispatchClock
from agentx.replayer.collector import QUIET_SPAN_NS, collect_on_clock, freeze_new, quiet_gc
from agentx.replayer.connect import server_client
from agentx.replayer.conversation import ChatTurn, Conversation
from agentx.replayer.identity import ServerIdentity, identify_server
from agentx.replayer.idle import IdleCaps
from agentx.replayer.locks import locks_broken
from agentx.replayer.offloop import OFF_LOOP_REQUESTS, OFF_LOOP_TOKENS, OffLoop
from agentx.replayer.options import (
    AgentxLoad,
    LaneLoad,
    RateLoad,
    ReplayOptions,
    TraceLoad,
    checked,
    flat_options,
    lanes,
)
from agentx.replayer.plan import Step, join_due, session_order
from agentx.replayer.play import Play, PreparedSession, PreparedTrace, marker_hex
from agentx.replayer.probe import STREAM_OPTIONS, UsageProbe, detect_stream_usage
from agentx.replayer.prompts import BlockTokens, TokenSpace, completions_body, filler, prompt_token_ids
from agentx.replayer.record_writer import RecordWriter
from agentx.replayer.records import Phase, RequestRecord, RunInfo
from agentx.replayer.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.replayer.sessions import ReplaySessions
from agentx.replayer.tstar import Snapshot, snapshot, t_star
from agentx.trace.model import Trace

FLUSH_EVERY_S = 0.05
"""Records reach disk this often, in small batches (a flush holds the loop ~0.1 ms + ~10 µs a row), each
written in a gap between due requests (`QUIET_SPAN_NS`), so at most 0.1 s after they ended."""
COMPLETIONS_PATH = "/v1/completions"
LOOP_LAG_TICK_S = 0.1
"""How often the event-loop lag is sampled."""
FAILURE_THRESHOLD_MIN_REQUESTS = 10
"""The failure threshold is judged only once max(this, concurrency) profiling requests have ended, the reference's
grace floor (`records/records_manager.py`): one early error must not cancel a run."""
ARRIVAL_LEAD_NS = 20_000_000
"""Open-loop trees are set up this long before their arrival, so a late wake-up of the arrivals loop or a
long first body (~100k tokens) does not delay the send (setup C: dispatch lag p99 2.7 → 1.9 ms)."""
LATE_NOTICE_S = 1.0
"""The first profiling request sent more than this late is announced: the run fell behind its schedule."""
WARMUP_NOTICE_S = 120.0
"""A warmup expected to take longer than this is announced (on the "agentx" logger, and in `RunResult.notices`)."""
_log = logging.getLogger(__name__)
MARKER_TOKENS = 8
"""Token ids of a cache-bust marker on `--api completions` (drawn from the filler range, per tree)."""


class RunResult(msgspec.Struct, kw_only=True):
    run_id: str
    records_path: Path
    requests: int
    """Records written (every request sent, cancelled ones included)."""
    errors: int
    """Records with status "error" (cancelled ones included)."""
    trees_started: int
    trees_finished: int
    interrupted: bool
    elapsed_s: float
    cancelled: int = 0
    """Requests cancelled after the grace period (also counted in `errors`)."""
    skipped: int = 0
    """Steps of started trees never sent because the run stopped first."""
    loop_lag_s: list[float] = []
    """Event-loop lag samples: how late a 100 ms timer fired, every 100 ms of the run."""
    stream_usage: str = ""
    """What the run's bodies asked for: "continuous", "final" or "none" (after the `auto` probe)."""
    calibration: dict[str, Any] | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start."""
    cancel_reason: str | None = None
    """Why the run stopped early: "interrupted" (Ctrl-C, cancellation) or "failure_threshold"; None otherwise."""
    skipped_context_overflow: int = 0
    """Steps not sent because their session had ended on a context overflow (docs/agentx.md §5)."""
    warmup_requests: int = 0
    """Warmup primers sent (their records have `phase = "warmup"`)."""
    tstar: list[dict[str, Any]] = []
    """agentx mode: each lane's first tree at its t* (session, t*, live and skipped agents, primers, waiting)."""
    dropped_sessions: int = 0
    """Sessions left out by `max_context_length`."""
    flattened_chains: int = 0
    """Agents split out of the flattened request lists of the sessions played (`split_flattened_agents`)."""
    flattened_by_session: dict[str, int] = {}
    """The same per session played (0: nothing flattened); sessions never played are not split."""
    server: ServerIdentity = ServerIdentity()
    """The engine serving the run, as the server says itself (agentx.replayer.identity)."""
    idle_jumps: int = 0
    """Times an idle cap moved timers earlier."""
    idle_skipped_s: float = 0.0
    """Idle time the system cap removed in all (the per-tree cap's shifts are not summed here)."""
    warmup_expected_s: float = 0.0
    """agentx mode: how long the primers' spread schedule was expected to take, idle caps applied."""
    notices: list[str] = []
    """What the run announced as it went (e.g. a warmup of many minutes), as logged."""


class WarmupFailed(ServerError):  # noqa: N818 (reads as a sentence: "warmup failed")
    """A root agent's warmup primer failed: the run stops before profiling (docs/agentx.md §5)."""


OnRecord = Callable[[RequestRecord], None]
OnSent = Callable[[], None]
"""Called once per request that will be recorded, as it goes out (before its record's `OnRecord`)."""


async def run_replay(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    *,
    on_record: OnRecord | None = None,
    on_sent: OnSent | None = None,
    on_profiling: OnSent | None = None,
) -> RunResult:
    """Replay `trace` against `options.server.url` (see the module docstring and docs/agentx.md §4d–§4e, §8);
    `on_profiling()` is called once, as the profiling phase starts (after the warmup).

    Cancelling the calling task (Ctrl-C under `asyncio.run`) acts like reaching the deadline: no new
    request starts, in-flight ones get `grace_s`, the records are flushed, and the result says
    `interrupted=True`. A second cancellation shrinks the grace period to zero: the requests in flight are
    cancelled at once and recorded with what had arrived. Only a third propagates, losing those records.
    `trace` may be a `prepare_trace` result made for options that agree with these on what it depends on.
    """
    options = checked(options)
    refuse_existing_run(options.out_dir, options.overwrite)
    if isinstance(trace, PreparedTrace) and trace.made_for != _preparation(options):
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
        served = await client.probe_models(require=options.server.model)
        missing = [model for model in options.server.models if model not in served]
        if missing:
            raise ModelNotServed(
                f"models {missing} are not served by {options.server.url} (served: {', '.join(served)})"
            )
        server = await identify_server(client, options.server.model)
        prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, options)
        sessions = prepared.sessions
        trace = sessions.trace
        notices = _dropped_notices(sessions, options)
        probe = await _stream_usage(client, options, space)
        stream_usage = probe.usage
        if probe.assumed is not None:
            notices.append(f"stream usage: {probe.assumed}; assuming {stream_usage!r}")
            _log.warning(notices[-1])
        calibration = await _calibrate(client, options, trace.block_size) if options.server.api == "chat" else None
        out_dir = Path(options.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        run_id = options.runtime.run_id or uuid.uuid4().hex
        # Read the two clocks back to back: wall time = epoch + offset must hold to the microsecond.
        start_ns, wall_epoch_ns = time.perf_counter_ns(), time.time_ns()
        metadata = flat_options(options)
        metadata["trace"] = {"dropped_sessions": sessions.dropped}
        broken = locks_broken(options)
        metadata["locks_broken"] = broken
        metadata["unsafe_override"] = bool(broken)
        metadata["detected"] = {
            "stream_usage": stream_usage,
            "stream_usage_assumed": probe.assumed,
            "calibration": calibration.summary() if calibration is not None else None,
        }
        info = RunInfo(run_id=run_id, wall_epoch_ns=wall_epoch_ns, options=metadata)
        records_path = out_dir / RECORDS_FILE
        with (
            # Flushed by the runner's ticker, in gaps between due requests (`_tick`), not as records arrive.
            RecordWriter(records_path, info, flush_interval_s=math.inf) as writer,
            DispatchClock() as clock,
        ):
            runner = _Runner(prepared, options, client, writer, space, run_id, start_ns, on_record, clock)
            runner.on_sent = on_sent
            runner.on_profiling = on_profiling
            runner.stream_options = STREAM_OPTIONS[stream_usage]
            runner.notices.extend(notices)
            if calibration is not None:
                runner.renderer = ChatRenderer(calibration, options.scenario.seed, trace.block_size)
            # Frozen after the runner is built: its long-lived tables (block cache, plans) are never walked.
            with quiet_gc(options.runtime.quiet_gc):
                main = asyncio.create_task(runner.run())
                interrupts = 0
                while True:
                    try:
                        await asyncio.shield(main)
                        break
                    except asyncio.CancelledError:
                        current = asyncio.current_task()
                        if main.done() or current is None:
                            raise
                        interrupts += 1
                        if interrupts > 2:  # a third: give up on the records of the requests in flight
                            main.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await main
                            raise
                        current.uncancel()
                        runner.cancel_reason = runner.cancel_reason or "interrupted"
                        runner.stop()
                        if interrupts == 2:  # the grace period shrinks to zero; the records are still written
                            runner.hard_stop("a second interrupt ended the grace period")
                interrupted = interrupts > 0
                elapsed_s = (time.perf_counter_ns() - start_ns) / 1e9
    played_ids = {trace.sessions[index].session_id for index in runner.played}
    flattened = {sid: chains for sid, chains in sessions.chains_by_session.items() if sid in played_ids}
    return RunResult(
        run_id=run_id,
        records_path=records_path,
        requests=runner.requests,
        errors=runner.errors,
        trees_started=runner.trees_started,
        trees_finished=runner.trees_finished,
        interrupted=interrupted,
        elapsed_s=elapsed_s,
        cancelled=runner.cancelled,
        skipped=runner.skipped,
        loop_lag_s=runner.loop_lag_s,
        stream_usage=stream_usage,
        calibration=calibration.summary() if calibration is not None else None,
        cancel_reason=runner.cancel_reason,
        skipped_context_overflow=runner.skipped_context_overflow,
        warmup_requests=runner.warmup_requests,
        tstar=runner.tstar,
        dropped_sessions=len(sessions.dropped),
        flattened_chains=sum(flattened.values()),
        flattened_by_session=flattened,
        server=server,
        idle_jumps=len(runner.idle.jumps),
        idle_skipped_s=runner.idle.skipped_ns / 1e9,
        warmup_expected_s=runner.warmup_expected_s,
        notices=runner.notices,
    )


def expected_warmup_s(offsets_s: list[float], system_idle_cap_s: float | None) -> float:
    """How long primers sent at `offsets_s` take to go out when the system idle cap shortens every gap between
    them to at most the cap (primers are 1-token requests: the system is idle between them)."""
    if not offsets_s:
        return 0.0
    ordered = sorted(offsets_s)
    if system_idle_cap_s is None:
        return ordered[-1]
    return min(ordered[0], system_idle_cap_s) + sum(
        min(later - earlier, system_idle_cap_s) for earlier, later in itertools.pairwise(ordered)
    )


def _duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _describe_snapshot(lane: int, prepared: PreparedSession, state: Snapshot) -> dict[str, Any]:
    steps = prepared.plan.steps

    def agents(indices: Iterable[int]) -> list[str]:
        return sorted({steps[i].agent_id for i in indices})

    return {
        "lane": lane,
        "session_id": prepared.plan.session_id,
        "t_star_s": state.t_star,
        "live_agents": agents(state.first_live),
        "skipped_agents": agents(state.skipped),
        "done_steps": len(state.done),
        "primers": len(state.primers),
        "waiting_on_join": agents(state.waiting),
    }


def prepare_trace(trace: Trace, options: ReplayOptions) -> PreparedTrace:
    """The trace as runs with `options` replay it: over-long sessions dropped (§4f) now; flattened agents split
    out (§3b), idle gaps cut when the per-tree cap is the load-time kind (§4c) and plans built per session when
    first played. Pass it to several `run_replay` calls (a sweep) to prepare the trace once."""
    cap = options.scenario.tree_idle_cap_s
    sessions = ReplaySessions(
        trace,
        chain_rules=options.scenario.chain_rules if options.scenario.split_flattened_agents else None,
        max_context_length=options.scenario.max_context_length,
        warp_cap_s=cap if cap is not None and options.scenario.tree_idle_cap_mode == "warp" else None,
    )
    return PreparedTrace(
        sessions, options.scenario.child_offset, (options.server.model, *options.server.models), _preparation(options)
    )


class NothingToReplay(ConfigError):  # noqa: N818 (reads as what happened)
    """Every session of the trace was left out (`max_context_length`): there is nothing to replay."""


def _dropped_notices(sessions: ReplaySessions, options: ReplayOptions) -> list[str]:
    """The sessions `max_context_length` left out, said (logged, and returned for `RunResult.notices`); raises
    NothingToReplay when none is left."""
    dropped = sessions.dropped
    if not dropped:
        return []
    total = len(dropped) + len(sessions.trace.sessions)
    shown = ", ".join(repr(session_id) for session_id in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
    what = (
        f"{len(dropped):,} of {total:,} sessions need more than max_context_length "
        f"{options.scenario.max_context_length:,} tokens (peak in + out) and are left out: {shown}"
    )
    if len(dropped) == total:
        raise NothingToReplay(f"nothing to replay: {what}")
    _log.warning(what)
    return [what]


def _preparation(options: ReplayOptions) -> tuple[object, ...]:
    """The options a `PreparedTrace` depends on: runs that agree on them can share one."""
    warp = options.scenario.tree_idle_cap_s if options.scenario.tree_idle_cap_mode == "warp" else None
    rules = options.scenario.chain_rules if options.scenario.split_flattened_agents else None
    return (
        rules,
        options.scenario.max_context_length,
        warp,
        options.scenario.child_offset,
        options.server.model,
        options.server.models,
    )


async def _stream_usage(client: Client, options: ReplayOptions, space: TokenSpace) -> UsageProbe:
    if options.server.stream_usage != "auto":
        return UsageProbe(options.server.stream_usage)
    body: dict[str, object] = {"model": options.server.model, "max_tokens": 2, "ignore_eos": True}
    if options.server.api == "chat":
        body["messages"] = [{"role": "user", "content": "ok"}]
        return await detect_stream_usage(client, CHAT_PATH, body)
    body["prompt"] = [space.low] * 8
    return await detect_stream_usage(client, COMPLETIONS_PATH, body)


async def _calibrate(client: Client, options: ReplayOptions, block_size: int) -> ChatCalibration:
    counter: TokenCounter
    if options.server.tokenizer is not None:
        counter, source = (
            LocalCounter(options.server.tokenizer, client, options.server.model),
            Path(options.server.tokenizer).name,
        )
    else:
        counter, source = ServerCounter(client, options.server.model), "server"
    return await calibrate(counter, block_size=block_size, source=source)


class _Runner:
    def __init__(
        self,
        prepared: PreparedTrace,
        options: ReplayOptions,
        client: Client,
        writer: RecordWriter,
        space: TokenSpace,
        run_id: str,
        start_ns: int,
        on_record: OnRecord | None,
        clock: DispatchClock,
    ) -> None:
        self.prepared = prepared
        self.trace = trace = prepared.trace
        self.played: set[int] = set()
        self.off_loop = OffLoop(fast_switch=options.runtime.fast_thread_switch)
        """Sessions this run has drawn (a shared `PreparedTrace` may hold others, from earlier runs)."""
        self.options = options
        self.client = client
        self.writer = writer
        self.run_id = run_id
        self.start_ns = start_ns
        self.on_record = on_record
        self.blocks = BlockTokens(options.scenario.seed, trace.block_size, space)
        self.session_scope = trace.hash_id_scope == "session"
        shard_index, shard_count = options.runtime.shard
        # Positions in the shared order, not session indices, are dealt round-robin to the shards, so every
        # worker of a `--workers` run sees the same stream and `play` (= position) is unique across them.
        self.order = itertools.islice(
            enumerate(session_order(len(trace.sessions), options.scenario.session_order, options.scenario.seed)),
            shard_index,
            None,
            shard_count,
        )
        if trace.request_count == 0:
            self.tree_limit: int | None = 0
        elif options.scenario.sessions is not None:
            self.tree_limit = options.scenario.sessions
        elif options.scenario.duration_s is None:
            self.tree_limit = len(trace.sessions)
        else:
            self.tree_limit = None
        if self.tree_limit is not None:
            # This shard's share of the positions below the global limit.
            self.tree_limit = max(0, -(-(self.tree_limit - shard_index) // shard_count))
        self.lanes = range(shard_index, lanes(options.load), shard_count)
        self.loop_lag_s: list[float] = []
        self.extra_body = options.server.extra_body
        self.stream_options: Mapping[str, object] | None = STREAM_OPTIONS["continuous"]
        self.renderer: ChatRenderer | None = None
        self.on_sent: OnSent | None = None
        self.on_profiling: OnSent | None = None
        self.path = CHAT_PATH if options.server.api == "chat" else COMPLETIONS_PATH
        load = options.load
        self.delay_scale = options.scenario.delay_scale / (load.speedup if isinstance(load, TraceLoad) else 1.0)
        self.cache_bust = load.cache_bust if isinstance(load, AgentxLoad) else "off"
        self.primer_tokens = load.warmup_max_tokens if isinstance(load, AgentxLoad) else None
        self._stop = asyncio.Event()
        # The load-time cap already cut the gaps; the runtime one acts on the live schedule (§4c).
        runtime_tree_cap = (
            options.scenario.tree_idle_cap_s if options.scenario.tree_idle_cap_mode == "runtime" else None
        )
        self.clock = clock
        self.idle = IdleCaps(options.scenario.system_idle_cap_s, runtime_tree_cap, clock)
        self._hard_stopped = False
        self._cancel_message = f"cancelled after the {options.runtime.grace_s:g} s grace period"
        self._in_flight: set[asyncio.Timeout] = set()
        self.requests = 0
        self.errors = 0
        self.warmup_requests = 0
        self.pressure_left = 0
        """agentx mode: cache-pressure requests still to send before profiling starts."""
        self.pressure_in_flight = 0
        self.profiling_started = asyncio.Event()
        self.profiling_start_ns = 0
        self.tstar: list[dict[str, Any]] = []
        self.profiling_requests = 0
        self.profiling_errors = 0
        self.skipped_context_overflow = 0
        self.cancel_reason: str | None = None
        self.passes: dict[int, int] = {}
        """Per session index: plays so far (the marker's recycle pass)."""
        self.marker_tokens = MARKER_WORDS if options.server.api == "chat" else MARKER_TOKENS
        self.cancelled = 0
        self.warmup_expected_s = 0.0
        self.notices: list[str] = []
        self.fell_behind = False
        self.skipped = 0
        self.trees_started = 0
        self.trees_finished = 0

    # -- run control

    def stop(self) -> None:
        """No new tree or request starts from now on; in-flight requests get the grace period."""
        self._stop.set()
        self.idle.wake_all()

    def hard_stop(self, why: str | None = None) -> None:
        """Cancel every in-flight request: the grace period is over, or `why` it was cut short (said in records)."""
        if not self._hard_stopped and why is not None:
            self._cancel_message = f"cancelled: {why}"
        self._hard_stopped = True
        now = asyncio.get_running_loop().time()
        for timeout in self._in_flight:
            timeout.reschedule(now)

    async def run(self) -> None:
        failure: WarmupFailed | None = None
        async with asyncio.TaskGroup() as services:
            background = [
                services.create_task(self._tick()),
                services.create_task(self._stopper()),
                services.create_task(self._watch_loop()),
            ]
            if self.options.runtime.quiet_gc:
                background.append(services.create_task(collect_on_clock(self.clock)))
            try:
                firsts: dict[int, Play] = {}
                if self.options.load.mode == "agentx":
                    firsts = self._first_plays()
                    if self.options.runtime.quiet_gc:
                        freeze_new()  # the lanes' first plans: built once, walked by no collection
                    await self._warmup(list(firsts.values()))
                    primed_ns = time.perf_counter_ns()
                    for play in firsts.values():
                        play.start_ns = primed_ns
                    self.pressure_left = self._agentx().warmup_requests_per_lane * len(self.lanes)
                if self.pressure_left <= 0:
                    self._start_profiling()
                if self.options.load.mode in ("trace", "rate"):
                    await self._arrivals()
                else:
                    async with asyncio.TaskGroup() as lanes:
                        for lane in self.lanes:
                            lanes.create_task(self._lane(lane, firsts.get(lane)))
            except WarmupFailed as exc:
                failure = exc  # raised out of the group below, as itself rather than inside an ExceptionGroup
            finally:
                for task in background:
                    task.cancel()
                self.idle.close()
                self.off_loop.close()
        if failure is not None:
            raise failure

    # -- the agentx start: t*, snapshot, warmup (docs/agentx.md §4d)

    def _first_plays(self) -> dict[int, Play]:
        """Each lane's first tree, resumed at the lane's t*; a session with nothing to send from its t* is
        passed over for the next one (at most concurrency + 2 × sessions draws in all, as the reference)."""
        firsts: dict[int, Play] = {}
        attempts = lanes(self.options.load) + 2 * len(self.trace.sessions)
        for lane in self.lanes:
            while attempts > 0 and (drawn := self._next_tree()) is not None:
                attempts -= 1
                position, index = drawn
                prepared = self._prepared(index)
                at = t_star(
                    self.options.scenario.seed,
                    prepared.plan.session_id,
                    lane,
                    prepared.plan,
                    self._agentx().tstar_window,
                )
                state = snapshot(prepared.plan, at)
                if not state.sendable:
                    continue
                self.trees_started += 1
                firsts[lane] = self._play(prepared, lane, position, self._marker(index, lane), state)
                self.tstar.append(_describe_snapshot(lane, prepared, state))
                break
        return firsts

    async def _warmup(self, plays: list[Play]) -> None:
        """Send every first tree's primers (the turn before each live agent's t*) and wait for all of them.

        Spread: a primer with lead `t* − t` goes out `max_lead − lead` after the warmup starts, so that every
        lane's t* falls at the profiling start. A failed root primer stops the run (`WarmupFailed`).
        """
        primers = [
            (play, index, lead) for play in plays if play.snapshot for index, lead in play.snapshot.primers.items()
        ]
        if not primers:
            return
        cap = self.options.scenario.tree_idle_cap_s
        if cap is not None:
            primers = [(play, index, min(lead, cap)) for play, index, lead in primers]
        max_lead = max(lead for _, _, lead in primers)
        if self._agentx().warmup == "spread":
            self.warmup_expected_s = expected_warmup_s(
                [(max_lead - lead) * self.delay_scale for _, _, lead in primers],
                self.options.scenario.system_idle_cap_s,
            )
            if self.warmup_expected_s > WARMUP_NOTICE_S:
                cap = self.options.scenario.system_idle_cap_s
                self._notice(
                    f"the warmup will take about {_duration(self.warmup_expected_s)}: {len(primers)} primers spread "
                    f"over leads of up to {_duration(max_lead * self.delay_scale)} before t*"
                    + (" (--system-idle-cap is off)" if cap is None else f", idle gaps capped at {cap:g} s")
                    + "; profiling starts when it ends"
                )
        start_ns = time.perf_counter_ns()
        failures: list[RequestRecord] = []

        async def prime(play: Play, index: int, lead: float) -> None:
            step = play.prepared.plan.steps[index]
            sent_tokens, body = self._build(play, step, phase="warmup")
            offset_s = (max_lead - lead) * self.delay_scale if self._agentx().warmup == "spread" else 0.0
            stopped, due_ns = await self.idle.wait(play, start_ns + int(offset_s * 1e9), self._stop)
            if stopped:
                return
            record = await self._send(play, step, due_ns, sent_tokens, body, phase="warmup")
            if record.status == "error" and step.depth == 0 and not failures and not self._stop.is_set():
                # The first failed root primer ends the run at once, in-flight primers cancelled (reference:
                # `credit/callback_handler.py`, `_handle_warmup_failure`).
                failures.append(record)
                self.stop()
                self.hard_stop("a root agent's warmup primer failed")

        async with asyncio.TaskGroup() as group:
            for play, index, lead in primers:
                group.create_task(prime(play, index, lead))
        if failures:
            first = failures[0]
            raise WarmupFailed(
                f"the warmup primer of session {first.session_id!r} (turn {first.turn}) failed with "
                f"{first.error_kind}: {first.error_message}; the run stopped before profiling, as AgentX does, and "
                "cancelled the other primers in flight"
            )

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        _log.warning(message)

    async def _sleep_until(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (perf_counter) unless the run stops first; True if it stopped."""
        remaining_s = (due_ns - time.perf_counter_ns()) / 1e9
        if remaining_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self._stop.wait()
        return self._stop.is_set()

    def _prepared(self, index: int) -> PreparedSession:
        self.played.add(index)
        return self.prepared.prepared(index)

    async def _prepared_off_loop(self, index: int) -> PreparedSession:
        """`_prepared`, a large session not planned yet planned off the loop (agentx.replayer.offloop)."""
        self.played.add(index)
        cached = self.prepared.cached(index)
        if cached is not None:
            return cached
        if self.trace.sessions[index].request_count < OFF_LOOP_REQUESTS:
            return self.prepared.prepared(index)
        prepared = await self.off_loop.run("plan", self.prepared.prepared, index)
        if self.options.runtime.quiet_gc:
            freeze_new()
        return prepared

    async def _build_off_loop(self, tree: Play, step: Step, phase: Phase) -> tuple[int, bytes]:
        """`_build`, a large completions prompt built off the loop (agentx.replayer.offloop; a chat body
        advances its play's conversation, which stays on the loop)."""
        if self.renderer is not None or step.request.in_tokens < OFF_LOOP_TOKENS:
            return self._build(tree, step, phase)
        return await self.off_loop.run("body", self._build, tree, step, phase)

    def _agentx(self) -> AgentxLoad:
        """The load of an agentx-mode run (only agentx-mode code asks)."""
        assert isinstance(self.options.load, AgentxLoad)
        return self.options.load

    def _marker(self, index: int, lane: int) -> str | None:
        """The cache-bust marker of the next play of session `index` on `lane` (None: no cache-bust)."""
        if self.cache_bust == "off":
            return None
        recycle_pass = self.passes[index] = self.passes.get(index, -1) + 1
        key = self._agentx().benchmark_id or self.run_id
        return marker_hex(key, recycle_pass, lane, self.trace.sessions[index].session_id)

    def _play(
        self, prepared: PreparedSession, lane: int, position: int, marker: str | None, state: Snapshot | None = None
    ) -> Play:
        return Play(
            prepared,
            lane,
            position,
            time.perf_counter_ns(),
            self.options.server.affinity_headers,
            snapshot=state,
            marker=marker,
        )

    async def _watch_loop(self) -> None:
        """Sample how late a timer fires: the event loop's own lag, which every timestamp inherits."""
        loop = asyncio.get_running_loop()
        samples = self.loop_lag_s
        while True:
            due = loop.time() + LOOP_LAG_TICK_S
            await asyncio.sleep(LOOP_LAG_TICK_S)
            samples.append(max(0.0, loop.time() - due))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.clock.until_quiet(QUIET_SPAN_NS, FLUSH_EVERY_S)
            self.writer.flush()

    async def _stopper(self) -> None:
        """End the run `duration_s` after the profiling start (the warmup is not counted, as in the reference),
        or when it is stopped; in-flight requests then get `grace_s`, pending timers none."""
        duration = self.options.scenario.duration_s
        if duration is None:
            await self._stop.wait()
        else:
            await self._wait_for_profiling()
            if not self._stop.is_set():
                end_ns = self.profiling_start_ns + int(duration * 1e9)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9)):
                        await self._stop.wait()
        self.stop()
        await asyncio.sleep(self.options.runtime.grace_s)
        self.hard_stop()

    # -- lanes and trees

    def _next_tree(self) -> tuple[int, int] | None:
        """(play = position in the shared order, session index), or None when no tree may start."""
        if self._stop.is_set():
            return None
        if self.tree_limit is not None and self.trees_started >= self.tree_limit:
            return None
        return next(self.order, None)

    async def _lane(self, lane: int, first: Play | None = None) -> None:
        load = self.options.load
        ramp_s = load.ramp_s * lane / load.concurrency if isinstance(load, LaneLoad) else 0.0
        if ramp_s > 0 and await self._sleep_until(time.perf_counter_ns() + int(ramp_s * 1e9)):
            return
        if first is not None:
            await self._run_play(first)
        while (drawn := self._next_tree()) is not None:
            position, index = drawn
            self.trees_started += 1
            marker = self._marker(index, lane)  # drawn in draw order, whichever plan is ready first
            prepared = await self._prepared_off_loop(index)
            play = self._play(prepared, lane, position, marker)
            await self._prebuild(play)
            await self._run_play(play)

    async def _prebuild(self, tree: Play) -> None:
        """Build the bodies of a new tree's turns due at its start before its clock starts: they go out at once,
        and a 100k-token prompt takes milliseconds to build, which would otherwise be dispatch lag."""
        phase: Phase = "profiling" if self.profiling_started.is_set() else "warmup"
        steps = tree.prepared.plan.steps
        for index in tree.prepared.plan.roots:
            if steps[index].delay_s == 0 and not self._stop.is_set():
                tree.prebuilt[index] = (phase, *await self._build_off_loop(tree, steps[index], phase))

    async def _arrivals(self) -> None:
        """Open loop: start each tree at its arrival time, whatever is still in flight (no lanes)."""
        options = self.options
        shard_index, shard_count = options.runtime.shard
        load = options.load
        if isinstance(load, TraceLoad):
            schedule: Iterator[tuple[float, int]] = iter(trace_arrivals(self.trace, load.speedup))
        else:
            assert isinstance(load, RateLoad)
            order = session_order(len(self.trace.sessions), options.scenario.session_order, options.scenario.seed)
            schedule = zip(rate_arrivals(load.rate, load.burstiness, options.scenario.seed), order, strict=False)
        # The schedule starts one lead from now, so that the first trees' bodies are built before they are due too.
        origin_ns = time.perf_counter_ns() + ARRIVAL_LEAD_NS
        async with asyncio.TaskGroup() as trees:
            for position, (offset_s, index) in itertools.islice(enumerate(schedule), shard_index, None, shard_count):
                if self.tree_limit is not None and self.trees_started >= self.tree_limit:
                    break
                due_ns = origin_ns + int(offset_s * 1e9)
                # Wake a little early: the tree's first body is built before its due time, not after.
                if await self._sleep_until(due_ns - ARRIVAL_LEAD_NS):
                    break
                self.trees_started += 1
                play = self._play(self._prepared(index), -1, position, self._marker(index, -1))
                play.start_ns = due_ns
                trees.create_task(self._run_play(play, started=True))

    async def _run_play(self, tree: Play, *, started: bool = False) -> None:
        if tree.snapshot is None and not started:
            tree.start_ns = time.perf_counter_ns()
        async with asyncio.TaskGroup() as steps:
            for step in tree.prepared.plan.steps:
                steps.create_task(self._step(tree, step))
        self.trees_finished += 1
        await asyncio.sleep(0)  # a tree without steps must not starve the loop

    async def _step(self, tree: Play, step: Step) -> None:
        state = tree.snapshot
        try:
            if state is not None and step.index in state.not_sent:
                tree.completed_ns[step.index] = tree.start_ns  # happened before t*: settled, never sent
                return
            # Build the body while the anchor is in flight (it needs nothing from the server), so a
            # step due right at its anchor's completion does not pay for it then; waiting for the
            # anchor's dispatch keeps at most ~2 bodies per agent alive.
            if step.anchor is not None:
                await tree.sent[step.anchor].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            phase: Phase = "profiling" if self.profiling_started.is_set() else "warmup"
            prebuilt = tree.prebuilt.pop(step.index, None)
            if prebuilt is not None and prebuilt[0] == phase:
                _, sent_tokens, body = prebuilt
            else:
                sent_tokens, body = await self._build_off_loop(tree, step, phase)
            for dependency in step.depends_on:
                await tree.done[dependency].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            if self._ended(tree, step):
                return
            if not self.profiling_started.is_set():
                if self.pressure_left > 0:
                    await self._press(tree, step, sent_tokens, body, phase)
                    return
                await self._wait_for_profiling()
                if self._stop.is_set():
                    self.skipped += 1
                    return
                if phase != "profiling":
                    sent_tokens, body = await self._build_off_loop(tree, step, "profiling")
            first_live = state is not None and step.index in state.first_live
            if step.anchor is None:
                base_ns = tree.start_ns
            else:
                base_ns = (tree.sent_ns if step.from_anchor_send else tree.completed_ns)[step.anchor]
            if state is not None and first_live:
                offset_s = state.first_live[step.index] - self._first_offset_cut(state)
                due_ns = self.profiling_start_ns + int(offset_s * self.delay_scale * 1e9)
            else:
                due_ns = base_ns + int(step.delay_s * self.delay_scale * 1e9)
            # A join whose last subagent completed after the agent's previous turn goes out at once (§3a).
            due_ns = int(join_due(base_ns, due_ns - base_ns, [tree.completed_ns[joined] for joined in step.joins]))
            for barrier in step.barriers:
                due_ns = max(due_ns, tree.completed_ns[barrier])
            # After a cache-pressure stage, a turn due before the profiling start goes out at it (§4d).
            due_ns = max(due_ns, self.profiling_start_ns)
            if step.depth > 0 and step.turn == 0 and not first_live:
                # A subagent's first turn waits a plain sleep that no idle cap moves, as the reference's
                # (`timing/branch_orchestrator.py`, `_dispatch_first_turn_after_offset`) does (§3a).
                stopped = await self._sleep_until(due_ns)
            else:
                stopped, due_ns = await self.idle.wait(tree, due_ns, self._stop)
            if stopped:
                self.skipped += 1
                return
            if self._ended(tree, step):
                return
            await self._send(tree, step, due_ns, sent_tokens, body)
        finally:
            if not tree.completed_ns[step.index]:
                tree.completed_ns[step.index] = time.perf_counter_ns()
            tree.sent[step.index].set()
            tree.done[step.index].set()

    async def _press(self, tree: Play, step: Step, sent_tokens: int, body: bytes, phase: Phase) -> None:
        """A cache-pressure request: sent at once (idle delays removed), recorded as warmup (§4d)."""
        self.pressure_left -= 1
        if phase != "warmup":
            sent_tokens, body = self._build(tree, step, "warmup")
        self.pressure_in_flight += 1
        try:
            await self._send(tree, step, time.perf_counter_ns(), sent_tokens, body, phase="warmup")
        finally:
            self.pressure_in_flight -= 1
            if self.pressure_left <= 0 and self.pressure_in_flight == 0:
                self._start_profiling()

    async def _wait_for_profiling(self) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        started = asyncio.ensure_future(self.profiling_started.wait())
        try:
            await asyncio.wait({stop, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            started.cancel()

    def _start_profiling(self) -> None:
        if not self.profiling_started.is_set():
            self.profiling_start_ns = time.perf_counter_ns()
            self.profiling_started.set()
            if self.on_profiling is not None:
                self.on_profiling()

    def _first_offset_cut(self, state: Snapshot) -> float:
        """How much earlier a lane's first live turns all go (§4c, §4d; reference `agentic_replay.py`,
        `_dispatch_snapshot_for_profiling`): with a per-tree idle cap, so that the earliest is due at most the cap
        after the profiling start; with `warmup="burst"`, so that it is due at the start. Turns waiting on a
        join are not dispatched at an offset and take no part."""
        offsets = [offset for index, offset in state.first_live.items() if index not in state.waiting]
        if not offsets:
            return 0.0
        if self._agentx().warmup == "burst":
            return min(offsets)
        cap = self.options.scenario.tree_idle_cap_s
        return 0.0 if cap is None else max(0.0, min(offsets) - cap)

    def _ended(self, tree: Play, step: Step) -> bool:
        """Whether `step`'s session ended on a context overflow (its agent's, or the root's for the whole
        tree, docs/agentx.md §5); counts it as skipped for that reason."""
        if "" in tree.ended_agents or step.agent_id in tree.ended_agents:
            self.skipped_context_overflow += 1
            return True
        return False

    def _max_tokens(self, tree: Play, step: Step, phase: Phase) -> int:
        if phase == "warmup" and self.primer_tokens is not None:
            return self.primer_tokens
        out = step.request.out_tokens
        cap = self.options.scenario.max_output_tokens
        if cap is not None and tree.prepared.top_level[step.index]:
            out = min(out, cap)
        return max(1, out)

    def _build(self, tree: Play, step: Step, phase: Phase = "profiling") -> tuple[int, bytes]:
        """The request body of `step` and the prompt tokens it carries (as the server will count them)."""
        if self.renderer is not None:
            return self._build_chat(tree, step, self.renderer, phase)
        session_id = tree.prepared.plan.session_id
        marker_ids: list[int] = []
        if tree.marker is not None and self.cache_bust == "marker":
            marker_ids = filler(
                self.options.scenario.seed, f"marker:{tree.marker}", 0, MARKER_TOKENS, self.blocks.space
            )
        prompt = prompt_token_ids(
            step.request,
            tree.prepared.hash_ids[step.index],
            self.trace.block_size,
            self.blocks,
            session_id,
            f"{step.agent_id}:{step.turn}",
            session_id if self.session_scope else "",
            prefix_ids=marker_ids,
        )
        out = self._max_tokens(tree, step, phase)
        body = completions_body(
            tree.prepared.models[step.index],
            prompt,
            out,
            min_tokens=out,
            stream_options=self.stream_options,
            extra_body=self.extra_body,
            cache_salt=tree.marker if self.cache_bust == "salt" else None,
        )
        return len(prompt), body

    def _build_chat(self, tree: Play, step: Step, renderer: ChatRenderer, phase: Phase) -> tuple[int, bytes]:
        session_id = tree.prepared.plan.session_id
        request = step.request
        agent = step.agent_id
        conversation = tree.conversations.get(agent)
        if conversation is None:
            prefix_blocks = -(-tree.prepared.prefix_tokens.get(agent, 0) // self.trace.block_size)
            conversation = tree.conversations[agent] = Conversation(
                self.trace.block_size, prefix_blocks=prefix_blocks, filler_key=agent
            )
        cached = tree.chat_turns.get(agent)
        if cached is not None and cached[0] == step.turn:
            turn = cached[1]  # the same step's body again (its phase changed): the conversation has moved on
        else:
            # A play resumed at t* starts mid-conversation: first replay the turns before it, unsent (§2c).
            steps = tree.prepared.plan.steps
            for earlier in tree.prepared.agent_steps[agent][tree.conversation_turn.get(agent, -1) + 1 : step.turn]:
                self._advance(tree, conversation, steps[earlier])
            turn = self._advance(tree, conversation, step)
            tree.chat_turns[agent] = (step.turn, turn)
        marker = ("", 0)
        if tree.marker is not None and self.cache_bust == "marker":
            marker = renderer.marker_text(tree.marker)
        messages, sent_tokens = renderer.render(
            turn.segments,
            target_tokens=request.in_tokens,
            scope_key=session_id if self.session_scope else "",
            session_id=session_id,
            marker=marker,
        )
        body = chat_body(
            tree.prepared.models[step.index],
            messages,
            self._max_tokens(tree, step, phase),
            stream_options=self.stream_options,
            extra_body=self.extra_body,
            cache_salt=tree.marker if self.cache_bust == "salt" else None,
        )
        return sent_tokens, body

    def _advance(self, tree: Play, conversation: Conversation, step: Step) -> ChatTurn:
        turn = conversation.next_turn(
            tree.prepared.hash_ids[step.index], step.request.in_tokens, tree.last_out_tokens.get(step.agent_id)
        )
        tree.last_out_tokens[step.agent_id] = step.request.out_tokens
        tree.conversation_turn[step.agent_id] = step.turn
        return turn

    async def _send(
        self, tree: Play, step: Step, scheduled_ns: int, sent_tokens: int, body: bytes, phase: Phase = "profiling"
    ) -> RequestRecord:
        tree.sent_ns[step.index] = time.perf_counter_ns()
        tree.sent[step.index].set()
        request_id = str(uuid.uuid4())
        headers = {**tree.headers(step.agent_id), "X-Request-ID": request_id}
        if self.on_sent is not None:
            self.on_sent()
        sent_ns = time.perf_counter_ns()
        # Filled by the client as the response arrives, so a request cancelled after the grace period keeps its
        # status, headers time and chunks.
        exchange = Exchange()
        if self._hard_stopped:
            self._cancelled(exchange)
        else:
            self.idle.started(tree)
            try:
                async with asyncio.timeout(None) as timeout:
                    self._in_flight.add(timeout)
                    try:
                        await self.client.stream(self.path, body, extra_headers=headers, into=exchange)
                    finally:
                        self._in_flight.discard(timeout)
            except TimeoutError:
                self._cancelled(exchange)
            finally:
                self.idle.finished(tree)
        end_ns = exchange.end_ns or time.perf_counter_ns()
        tree.completed_ns[step.index] = end_ns
        if exchange.error_kind == "context_overflow" and phase == "profiling":
            tree.ended_agents.add(step.agent_id)  # the root's ends the whole tree (`_ended`)
        return self._record(tree, step, scheduled_ns, sent_ns, end_ns, sent_tokens, exchange, phase, request_id)

    def _cancelled(self, exchange: Exchange) -> None:
        """End `exchange` as cancelled after the grace period, keeping whatever of the response had arrived."""
        exchange.end_ns = time.perf_counter_ns()
        exchange.error_kind = "cancelled"
        exchange.timeout_kind = None
        exchange.error_message = self._cancel_message

    def _record(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_ns: int,
        end_ns: int,
        sent_tokens: int,
        exchange: Exchange,
        phase: Phase,
        request_id: str,
    ) -> RequestRecord:
        origin = self.start_ns
        request = step.request

        def offset(ns: int) -> int | None:
            return ns - origin if ns else None

        common: dict[str, Any] = {
            "run_id": self.run_id,
            "phase": phase,
            "lane": tree.lane,
            "play": tree.play,
            "session_id": tree.prepared.plan.session_id,
            "agent_id": step.agent_id,
            "depth": step.depth,
            "turn": step.turn,
            "model": tree.prepared.models[step.index],
            "correlation_id": tree.correlation_id(step.agent_id),
            "root_correlation_id": tree.root_correlation_id,
            "parent_correlation_id": tree.parent_correlation_id(step.agent_id),
            "request_id": request_id,
            "scheduled_ns": scheduled_ns - origin,
            "isl_recorded_tokens": request.in_tokens,
            "isl_sent_tokens": sent_tokens,
            "cache_bust_tokens": self.marker_tokens if tree.marker is not None else 0,
            "osl_recorded_tokens": request.out_tokens,
            "theoretical_hit_blocks": tree.prepared.hit_blocks[step.index],
            "theoretical_total_blocks": tree.prepared.total_blocks[step.index],
            "api_time_recorded_s": request.api_time,
            "ttft_recorded_s": request.ttft,
        }
        if exchange.error_kind == "cancelled":
            self.cancelled += 1
        record = RequestRecord(
            **common,
            queued_ns=offset(exchange.queued_ns),
            sent_ns=(exchange.sent_ns or sent_ns) - origin,
            response_ns=offset(exchange.headers_ns),
            first_token_ns=offset(exchange.first_token_ns),
            last_token_ns=offset(exchange.last_token_ns),
            end_ns=end_ns - origin,
            chunk_times_ns=[ns - origin for ns in exchange.chunk_ns],
            chunk_tokens=list(exchange.chunk_tokens),
            isl_server_tokens=exchange.prompt_tokens,
            osl_server_tokens=exchange.completion_tokens,
            osl_streamed_tokens=sum(exchange.chunk_tokens),
            tokens_estimated=exchange.tokens_estimated,
            cached_tokens=exchange.cached_tokens,
            connection_retries=exchange.connection_retries,
            status="ok" if exchange.ok else "error",
            error_kind=exchange.error_kind,
            timeout_kind=exchange.timeout_kind,
            error_message=exchange.error_message,
            http_status=exchange.status or None,
        )
        self.requests += 1
        if record.status == "error":
            self.errors += 1
        if phase == "warmup":
            self.warmup_requests += 1
        else:
            self._judge_failures(record)
            if record.dispatch_lag_s > LATE_NOTICE_S and not self.fell_behind:
                self.fell_behind = True
                self._notice(
                    f"the run fell behind its schedule: session {record.session_id!r} agent {record.agent_id!r} "
                    f"turn {record.turn} went out {record.dispatch_lag_s:.3f} s after it was due (the client, not "
                    "the server, set the pace; see the summary's dispatch lag)"
                )
        self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def _judge_failures(self, record: RequestRecord) -> None:
        """Cancel the run once the profiling error ratio crosses `failed_request_threshold` (docs/agentx.md §5)."""
        self.profiling_requests += 1
        if record.status == "error" and record.error_kind not in ("cancelled", "context_overflow"):
            self.profiling_errors += 1
        threshold = self.options.scenario.failed_request_threshold
        if (
            threshold is not None
            and self.cancel_reason is None
            and self.profiling_requests >= max(FAILURE_THRESHOLD_MIN_REQUESTS, lanes(self.options.load))
            and self.profiling_errors > threshold * self.profiling_requests
        ):
            self.cancel_reason = "failure_threshold"
            self.stop()
