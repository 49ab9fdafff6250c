"""The schedule of a run: lanes of session trees (or open-loop arrivals), each tree's steps as a DAG, each step sent
when it is due (agentx.replayer.schedule.due; docs/agentx.md §3a, §4; docs/replay.md). The pieces it composes: bodies
(agentx.replayer.plan.bodies), records and counters (agentx.replayer.schedule.sending), the AgentX warmup and the
profiling gate (agentx.replayer.schedule.warmup), idle caps (agentx.replayer.schedule.idle) and work off the loop
(agentx.replayer.schedule.offloop).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import itertools
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

from agentx.errors import WarmupFailed
from agentx.records.record import Phase, RequestRecord
from agentx.records.writer import RecordWriter
from agentx.replayer.http.client import Client
from agentx.replayer.http.http1 import Body
from agentx.replayer.options.replay import AgentxLoad, LaneLoad, RateLoad, ReplayOptions, TraceLoad, lanes
from agentx.replayer.plan.arrivals import rate_arrivals, trace_arrivals
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.plan.play import Play, PreparedSession, PreparedTrace, marker_hex
from agentx.replayer.plan.steps import Step, session_order
from agentx.replayer.plan.tstar import Snapshot, snapshot, t_star
from agentx.replayer.prompts.block_text import GROUP_BLOCKS
from agentx.replayer.schedule import due
from agentx.replayer.schedule.clock import DispatchClock
from agentx.replayer.schedule.collector import QUIET_SPAN_NS, collect_on_clock, freeze_new
from agentx.replayer.schedule.hooks import NO_HOOKS, RunHooks
from agentx.replayer.schedule.idle import IdleCaps
from agentx.replayer.schedule.offloop import OFF_LOOP_REQUESTS, OffLoop
from agentx.replayer.schedule.parts import (
    LOOP_LAG_TICK_S,
    RunTally,
    recorder,
    run_settings,
    sender,
    server_loss_watch,
)
from agentx.replayer.schedule.release import Release
from agentx.replayer.schedule.slices import Slices
from agentx.replayer.schedule.warmup import (
    ProfilingGate,
    handoff_steps,
    lane_start,
    live_offsets,
    send_primers,
)

FLUSH_EVERY_S = 0.05
"""How often the records waiting are looked at: a batch is written once `FLUSH_ROWS` wait, and at least every
`FLUSH_AT_MOST_S`, each in a gap between due requests (`QUIET_SPAN_NS`): a batch of a row holds the loop ~0.4 ms (a
column at a time), so at a few requests a second a flush per request cost more than the rest of the request's
bookkeeping."""
FLUSH_ROWS = 16
FLUSH_AT_MOST_S = 0.5
WARM_TOKENS = 16384
"""A body that writes at least this many tokens its agent's last prompt does not hold (a first turn, a compaction) has
their blocks' text made first, `WARM_GROUP_BLOCKS` at a time (`Runner._warm`)."""
WARM_GROUP_BLOCKS = GROUP_BLOCKS
"""~8k tokens of 64: ~0.3 ms on the loop, the most a due request waits behind a group. On a worker thread instead, the
text (~4 ms for 80k tokens of new blocks) held the interpreter half the time meanwhile, so every callback on the loop
took up to twice as long (setup D's open loop at 105 requests/s, a run each: dispatch lag p99 17-21 ms, against 9-12 ms
this way)."""
PREFETCH_LEAD_NS = 500_000_000
"""Large open-loop trees are planned, and their first bodies built, between half this and this long before their
arrival, in the background: at 15 arrivals/s of AgentX-size sessions that work takes ~10% of the interpreter, which
it then spreads over a quarter to a half second instead of the arrival's last 20 ms, and arrivals close together no
longer wait for each other's builds (bench/README.md, setup D)."""
ARRIVAL_LEAD_NS = 20_000_000
"""Open-loop trees are set up this long before their arrival, so a late wake-up of the arrivals loop or a
long first body (~100k tokens) does not delay the send (bench/README.md, setup C: dispatch lag p99 2.7 → 1.9 ms)."""
_log = logging.getLogger(__name__)


def _ended_ns(tree: Play) -> int:
    """When `tree`'s last request ended (or its last step settled): its lane's next tree is due then."""
    return max(tree.completed_ns, default=0) or time.perf_counter_ns()


class Runner:
    """One run's schedule: lanes (or arrivals) draw trees, each tree runs its steps as a DAG, each step is
    sent when due; `stop()` ends it gracefully, `hard_stop()` cancels what is in flight."""

    def __init__(
        self,
        prepared: PreparedTrace,
        options: ReplayOptions,
        client: Client,
        writer: RecordWriter,
        bodies: BodyBuilder,
        run_id: str,
        start_ns: int,
        clock: DispatchClock,
        hooks: RunHooks | None = None,
        notices: Sequence[str] = (),
        *,
        lru_blocks: int | None = None,
    ) -> None:
        """`lru_blocks`: the server's KV-cache capacity in trace blocks, for the records' `lru_hit_blocks` (None:
        not known)."""
        hooks = hooks or NO_HOOKS
        self.prepared = prepared
        self.trace = trace = prepared.trace
        self.options = options
        self.settings = settings = run_settings(trace, options)
        self.tally = RunTally(notices=list(notices))
        self.off_loop = OffLoop(fast_switch=options.runtime.fast_thread_switch)
        self.on_ready = hooks.on_ready
        self.client = client
        self.writer = writer
        self.bodies = bodies
        self.run_id = run_id
        self.server_loss = server_loss_watch(
            client, options, on_lost=self._server_lost, in_flight=lambda: len(self.sender.exchanges)
        )
        self.recorder = recorder(
            writer,
            options,
            bodies,
            hooks,
            run_id=run_id,
            start_ns=start_ns,
            notice=self.notice,
            fail_run=self.stop,
            server_loss=self.server_loss,
            route=client.route,
        )
        shard_index, shard_count = options.runtime.shard
        # Positions in the shared order, not session indices, are dealt round-robin to the shards, so every
        # worker of a `--workers` run sees the same stream and `play` (= position) is unique across them.
        self.order = itertools.islice(
            enumerate(session_order(len(trace.sessions), options.scenario.session_order, options.scenario.seed)),
            shard_index,
            None,
            shard_count,
        )
        self.stopped = asyncio.Event()
        self.graceful = asyncio.Event()
        """Set with `stopped` by every stop but the request cap's: the grace period runs (`_stopper`)."""
        self.clock = clock
        # Under the harness's rules the runtime tree cap counts from the profiling start only (`_profiling_opened`).
        from_start = settings.runtime_tree_cap_s if settings.rules.tree_idle_cap_mode == "warp" else None
        self.idle = IdleCaps(
            options.scenario.system_idle_cap_s,
            from_start,
            clock,
            at_return=settings.rules.system_cap_at_return,
        )
        self.gate = ProfilingGate(on_open=self._profiling_opened, on_start=hooks.on_profiling)
        self.live_plays: set[Play] = set()
        """Trees being played now."""
        self.firsts: list[Play] = []
        """The lanes' first trees, resumed at t* (agentx mode)."""
        self._phase_cut_s: float | None = None
        self.warmup_failure: WarmupFailed | None = None
        """A failed root request of the cache-pressure stage: the run stopped, and `run` raises it."""
        self.handoff: dict[tuple[int, int], tuple[Play, Step, bool]] = {}
        """After a per-lane cache-pressure stage, the turns it handed over to profiling, by (id(tree), step index):
        (tree, step, waiting on subagents) (agentx.replayer.schedule.warmup.handoff_steps)."""
        self.sender = sender(
            client,
            options,
            bodies,
            hooks,
            idle=self.idle,
            recorder=self.recorder,
            lru_blocks=lru_blocks,
            on_cap=self.halt,
        )
        self._upcoming: collections.deque[tuple[int, int]] = collections.deque()
        """Trees of the shared order looked at ahead of their draw (`_peek_tree`), not drawn yet."""
        self._prefetching: set[int] = set()
        """Sessions being planned and warmed ahead (`_prefetch`)."""
        self._side_tasks: set[asyncio.Task[None]] = set()
        """Work done ahead of when it is needed (`_prefetch`): cancelled when the run ends."""

    # -- run control

    def stop(self) -> None:
        """No new tree or request starts from now on; in-flight requests get the grace period."""
        self.graceful.set()
        self.halt()

    def halt(self) -> None:
        """No new tree or request starts from now on; in-flight requests finish (the request cap's stop)."""
        self.stopped.set()
        self.idle.wake_all()

    def hard_stop(self, why: str | None = None) -> None:
        """Cancel every in-flight request: the grace period is over, or `why` it was cut short (said in records)."""
        self.sender.hard_stop(why)

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
            if self.server_loss is not None:
                background.append(services.create_task(self.server_loss.watch()))
            if self.options.runtime.stall_timeout_s is not None:
                background.append(services.create_task(self._watch_stall(self.options.runtime.stall_timeout_s)))
            try:
                firsts: dict[int, Play] = {}
                load = self.options.load
                if isinstance(load, AgentxLoad):
                    firsts = await self._first_plays(load)
                    self.firsts = list(firsts.values())
                    if self.options.runtime.quiet_gc:
                        freeze_new()  # the lanes' first plans: built once, walked by no collection
                    scenario = self.options.scenario
                    self.tally.warmup_expected_s = await send_primers(
                        self,
                        self.firsts,
                        spread=load.warmup == "spread",
                        lead_cap_s=scenario.system_idle_cap_s
                        if self.settings.rules.warmup_lead_cap == "system"
                        else scenario.tree_idle_cap_s,
                        system_idle_cap_s=scenario.system_idle_cap_s,
                    )
                    # Their first live turns are built before profiling can start: lanes due together go together.
                    phase: Phase = "warmup" if load.warmup_requests_per_lane > 0 else "profiling"
                    await self._prebuild(self.firsts, phase)
                    primed_ns = await self._start_instant()
                    for play in self.firsts:
                        play.begin(primed_ns)
                    pooled = self.settings.rules.pressure == "pooled"
                    self.gate.begin_pressure(self.settings.lanes, load.warmup_requests_per_lane, pooled=pooled)
                    origin_ns = primed_ns
                elif isinstance(load, LaneLoad):
                    firsts = await self._first_trees()
                    await self._prebuild(list(firsts.values()), "profiling")
                    origin_ns = await self._start_instant()
                    self.gate.open()
                else:
                    origin_ns = await self._start_instant()
                    self.gate.open()
                if isinstance(load, TraceLoad | RateLoad):
                    await self._arrivals(load, origin_ns)
                else:
                    async with asyncio.TaskGroup() as lane_tasks:
                        await self._start_lanes(lane_tasks, firsts, origin_ns)
            except WarmupFailed as exc:
                failure = exc  # raised out of the group below, as itself rather than inside an ExceptionGroup
            else:
                failure = self.warmup_failure
            finally:
                for task in [*background, *self._side_tasks]:
                    task.cancel()
                self.idle.close()
                self.off_loop.close()
        if failure is not None:
            raise failure

    async def _first_plays(self, load: AgentxLoad) -> dict[int, Play]:
        """Each lane's first tree, resumed at the lane's t* (docs/agentx.md §4d); a session with nothing to send
        from its t* is passed over for the next one (at most concurrency + 2 × sessions draws, as the reference).
        Made in slices of the event loop (agentx.replayer.schedule.slices), a large plan off it; a stop ends it, and
        so does the first lane left without a tree (the lanes after it draw none either)."""
        firsts: dict[int, Play] = {}
        attempts = load.concurrency + 2 * len(self.trace.sessions)
        seed = self.options.scenario.seed
        slices = Slices()
        for lane in self.settings.lanes:
            while attempts > 0 and (drawn := self._next_tree()) is not None:
                attempts -= 1
                position, index = drawn
                prepared = await self._prepared_off_loop(index)
                plan = prepared.plan
                state = snapshot(plan, t_star(seed, plan.session_id, lane, plan, load.tstar_window))
                if not state.sendable:
                    continue
                self.tally.trees_started += 1
                firsts[lane] = self._play(prepared, lane, position, self._marker(index, lane), state)
                self.tally.tstar.append(lane_start(lane, prepared, state))
                break
            if lane not in firsts:
                break
            await slices.pause()
        return firsts

    async def _first_trees(self) -> dict[int, Play]:
        """Closed loop: each lane's first tree, drawn in lane order as the lanes would draw them, before the run's
        origin, so that their first bodies are built before they are due (`_prebuild`); a stop ends it, and so does
        the first lane left without a tree."""
        firsts: dict[int, Play] = {}
        slices = Slices()
        for lane in self.settings.lanes:
            drawn = self._next_tree()
            if drawn is None:
                break
            position, index = drawn
            self.tally.trees_started += 1
            marker = self._marker(index, lane)
            firsts[lane] = self._play(await self._prepared_off_loop(index), lane, position, marker)
            await slices.pause()
        self._prefetch_next()
        return firsts

    async def _start_instant(self) -> int:
        """When the lanes or arrivals start: now, or the instant the shards of a `--workers` run agreed on
        (`RunHooks.on_ready`), waited for (a stop meanwhile: now)."""
        if self.on_ready is None:
            return time.perf_counter_ns()
        agreed = asyncio.ensure_future(self.on_ready())
        stopped = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait({agreed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            agreed.cancel()
        if not agreed.done() or agreed.cancelled():
            return time.perf_counter_ns()
        start_ns = agreed.result()
        await self._sleep_until(start_ns)
        return start_ns

    async def _start_lanes(self, lane_tasks: asyncio.TaskGroup, firsts: dict[int, Play], origin_ns: int) -> None:
        """Start each lane's task in `lane_tasks`, in slices of the event loop (agentx.replayer.schedule.slices), each
        once its ramp offset (`ramp_s`) has passed: a lane costs nothing before it starts, and one with no tree to
        play (its first, or one left to draw) gets no task."""
        load = self.options.load
        ramp_s = load.ramp_s if isinstance(load, LaneLoad) else 0.0
        concurrency = lanes(load)
        slices = Slices()
        for lane in self.settings.lanes:
            first = firsts.get(lane)
            due_ns = origin_ns + int(ramp_s * lane / concurrency * 1e9)
            stopped = ramp_s > 0 and await self._sleep_until(due_ns)
            if first is not None and (stopped or self.stopped.is_set()):
                self._unplayed(first)
                first = None
            if first is not None and first.snapshot is None:
                first.begin(due_ns)  # its body is built: it is due at the lane's start, not when its task runs
            if first is None and not self._may_draw():
                self.gate.lane_done(lane)  # holds no cache-pressure stage back
                continue
            lane_tasks.create_task(self._lane(lane, first))
            await slices.pause()

    def notice(self, message: str) -> None:
        self.tally.notices.append(message)
        _log.warning(message)

    async def _sleep_until(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (perf_counter) unless the run stops first; True if it stopped."""
        remaining_s = (due_ns - time.perf_counter_ns()) / 1e9
        if remaining_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self.stopped.wait()
        return self.stopped.is_set()

    def _prepared(self, index: int) -> PreparedSession:
        self.tally.played.add(index)
        return self.prepared.prepared(index)

    async def _prepared_off_loop(self, index: int) -> PreparedSession:
        """`_prepared`, a large session not planned yet planned off the loop (agentx.replayer.schedule.offloop)."""
        self.tally.played.add(index)
        return await self._planned(index)

    async def _planned(self, index: int) -> PreparedSession:
        """Session `index` planned, off the loop when large and not planned yet; not counted as played."""
        cached = self.prepared.cached(index)
        if cached is not None:
            return cached
        if self.trace.sessions[index].request_count < OFF_LOOP_REQUESTS:
            return self.prepared.prepared(index)
        prepared = await self.off_loop.run("plan", self.prepared.prepared, index)
        if self.options.runtime.quiet_gc:
            freeze_new()
        return prepared

    async def build_body(self, tree: Play, step: Step, phase: Phase) -> tuple[int, Body]:
        """`step`'s body for `phase` (`bodies.build`). When it writes many tokens its agent's last prompt does not hold,
        their blocks' text is made first, a group at a time (`_warm`); the body is then assembled from it at once."""
        if self.bodies.new_tokens(tree, step) >= WARM_TOKENS:
            await self._warm(tree.prepared, (step.index,))
        return self.bodies.build(tree, step, phase)

    async def _warm(self, prepared: PreparedSession, indices: Iterable[int]) -> None:
        """Make the text of the blocks the steps `indices` of `prepared` carry, `WARM_GROUP_BLOCKS` blocks at a time
        on the loop, letting what is due go between groups."""
        for index in indices:
            scope_key, hash_ids = self.bodies.step_blocks(prepared, index)
            for start in range(0, len(hash_ids), WARM_GROUP_BLOCKS):
                self.bodies.warm_blocks(scope_key, hash_ids[start : start + WARM_GROUP_BLOCKS])
                await asyncio.sleep(0)

    def _marker(self, index: int, lane: int) -> str | None:
        """The cache-bust marker of the next play of session `index` on `lane` (None: no cache-bust)."""
        if self.bodies.cache_bust == "off":
            return None
        recycle_pass = self.tally.passes[index] = self.tally.passes.get(index, -1) + 1
        load = self.options.load
        key = (load.benchmark_id if isinstance(load, AgentxLoad) else None) or self.run_id
        return marker_hex(key, recycle_pass, lane, self.trace.sessions[index].session_id)

    def _play(
        self, prepared: PreparedSession, lane: int, position: int, marker: str | None, state: Snapshot | None = None
    ) -> Play:
        return Play(
            prepared,
            lane,
            position,
            time.perf_counter_ns(),
            self.settings.affinity_headers,
            snapshot=state,
            marker=marker,
        )

    async def _watch_loop(self) -> None:
        """Sample how late a timer fires: the event loop's own lag, which every timestamp inherits."""
        loop = asyncio.get_running_loop()
        samples = self.tally.loop_lag_s
        while True:
            due = loop.time() + LOOP_LAG_TICK_S
            await asyncio.sleep(LOOP_LAG_TICK_S)
            samples.append(max(0.0, loop.time() - due))

    async def _watch_stall(self, timeout_s: float) -> None:
        """Stop the run when requests are in flight and none has shown progress for `timeout_s` (a stalled server or
        network): the requests in flight are cancelled at once, and the run says why (`cancel_reason` "stalled")."""
        while True:
            await asyncio.sleep(min(5.0, timeout_s / 4))
            in_flight = len(self.sender.exchanges)
            silent_s = (time.perf_counter_ns() - self.sender.progress_ns()) / 1e9
            if in_flight and silent_s >= timeout_s and self.recorder.cancel_reason is None:
                self.recorder.cancel_reason = "stalled"
                self.notice(
                    f"the server made no progress for {silent_s:,.0f} s with {in_flight:,} requests in flight "
                    f"(--stall-timeout {timeout_s:g}): the run stopped and cancelled them"
                )
                self.stop()
                self.hard_stop(f"the server made no progress for {timeout_s:g} s (--stall-timeout)")
                return

    def _server_lost(self, first_loss_ns: int, losses: int, span_s: float) -> None:
        """The server stopped answering (agentx.replayer.schedule.server_loss): the run stops as an interrupt does."""
        self.tally.server_lost_at_s = at_s = (first_loss_ns - self.recorder.start_ns) / 1e9
        ago = datetime.timedelta(seconds=(time.perf_counter_ns() - first_loss_ns) / 1e9)
        wall = datetime.datetime.now().astimezone() - ago
        if self.recorder.cancel_reason is None:
            self.recorder.cancel_reason = "server_lost"
        self.notice(
            f"the server stopped answering at {wall:%H:%M:%S %Z} ({at_s:,.1f} s into the run): {losses:,} requests "
            f"and probes in a row were refused or reset before their first byte, over {span_s:,.1f} s "
            "(--server-loss-failures, --server-loss-window); the run stopped (--on-server-loss continue goes on)"
        )
        self.stop()

    async def _tick(self) -> None:
        flushed_ns = time.perf_counter_ns()
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            waiting = self.writer.pending
            if not waiting or (waiting < FLUSH_ROWS and time.perf_counter_ns() - flushed_ns < FLUSH_AT_MOST_S * 1e9):
                continue
            await self.clock.until_quiet(QUIET_SPAN_NS, FLUSH_EVERY_S)
            self.writer.flush()
            flushed_ns = time.perf_counter_ns()

    async def _stopper(self) -> None:
        """End the run `duration_s` after the profiling start (the warmup is not counted, as in the reference),
        or when it is stopped; in-flight requests then get `grace_s`, pending timers none. After the request cap's
        `halt` the requests in flight run on until the deadline or a stop."""
        duration = self.options.scenario.duration_s
        if duration is None:
            await self.graceful.wait()
        else:
            await self.gate.wait(self.graceful)
            if not self.graceful.is_set():
                end_ns = self.gate.start_ns + int(duration * 1e9)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9)):
                        await self.graceful.wait()
        self.stop()
        await asyncio.sleep(self.options.runtime.grace_s)
        self.hard_stop()

    # -- lanes and trees

    def _next_tree(self) -> tuple[int, int] | None:
        """(play = position in the shared order, session index), or None when no tree may start."""
        if not self._may_draw():
            return None
        return self._upcoming.popleft() if self._upcoming else next(self.order, None)

    def _peek_tree(self) -> tuple[int, int] | None:
        """The tree `_next_tree` draws next, if one may still start; not drawn."""
        if not self._may_draw():
            return None
        if not self._upcoming and (upcoming := next(self.order, None)) is not None:
            self._upcoming.append(upcoming)
        return self._upcoming[0] if self._upcoming else None

    def _unplayed(self, tree: Play) -> None:
        """A lane's first tree that the run stopped before the lane started: counted as `_run_play` counts a tree
        whose steps all find the run stopped (each not settled at t* skipped), without a task per step."""
        state = tree.snapshot
        steps = tree.prepared.plan.steps
        self.tally.skipped += sum(1 for step in steps if state is None or not state.is_settled(step.index))
        self.sender.sent_blocks.forget(tree)
        self.idle.forget(tree)
        self.tally.trees_finished += 1

    def _may_draw(self) -> bool:
        """Whether a tree may still start (the run goes on, below its tree limit); once not, never again."""
        limit = self.settings.tree_limit
        return not self.stopped.is_set() and (limit is None or self.tally.trees_started < limit)

    async def _lane(self, lane: int, first: Play | None = None) -> None:
        try:
            free_ns = time.perf_counter_ns()
            if first is not None:
                await self._run_play(first)
                free_ns = _ended_ns(first)
            while (drawn := self._next_tree()) is not None:
                position, index = drawn
                self.tally.trees_started += 1
                marker = self._marker(index, lane)  # drawn in draw order, whichever plan is ready first
                self._prefetch_next()
                prepared = await self._prepared_off_loop(index)
                play = self._play(prepared, lane, position, marker)
                # Due as the lane's last tree ended: what its plan and bodies take is dispatch lag, and said as such.
                play.begin(free_ns)
                await self._prebuild([play], "profiling" if self.gate.started.is_set() else "warmup")
                await self._run_play(play)
                free_ns = _ended_ns(play)
        finally:
            self.gate.lane_done(lane)  # a lane with nothing left to send holds no cache-pressure stage back

    async def _prebuild(self, trees: Sequence[Play], phase: Phase) -> None:
        """Build the bodies of the turns each tree sends first before its clock starts (its first live turns, at a t*;
        else its roots due at its start): a 100k-token prompt takes milliseconds to build, which would otherwise be
        dispatch lag, and lanes due together would go out one build after another."""
        for tree in trees:
            steps = tree.prepared.plan.steps
            if tree.snapshot is not None:
                indices: Iterable[int] = tree.snapshot.first_live
            else:
                indices = (index for index in tree.prepared.plan.roots if steps[index].delay_s == 0)
            for index in indices:
                if self.stopped.is_set():
                    return
                tree.keep_prebuilt(index, phase, *await self.build_body(tree, steps[index], phase))

    def _prefetch_next(self) -> None:
        """Plan the next tree of the shared order and make the text of its first turns' blocks, off the loop, while
        the trees before it play: whichever lane draws it then only assembles its bodies."""
        upcoming = self._peek_tree()
        if upcoming is not None:
            self._prefetch(upcoming[1])

    def _prefetch(self, index: int) -> None:
        """Plan session `index` (a long one on a worker thread) and make the text of its first turns' blocks (a group
        at a time), in the background, unless that is under way or not work enough (`_worth_ahead`)."""
        if index in self._prefetching or not self._worth_ahead(index):
            return
        self._prefetching.add(index)
        task = asyncio.get_running_loop().create_task(self._prefetched_session(index))
        self._side_tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._side_tasks.discard(task)
            self._prefetching.discard(index)

        task.add_done_callback(done)

    def _worth_ahead(self, index: int) -> bool:
        """Whether session `index` is work enough to set up ahead (a thread's round trip, a task): one the runner
        plans off the loop, or whose first prompt it builds a group of blocks at a time."""
        session = self.trace.sessions[index]
        first = session.root.requests[0].in_tokens if session.root.requests else 0
        return session.request_count >= OFF_LOOP_REQUESTS or first >= WARM_TOKENS

    async def _prefetched_session(self, index: int) -> None:
        prepared = self.prepared.cached(index)
        if prepared is None:
            prepared = await self.off_loop.run("plan", self.prepared.prepared, index)
            if self.options.runtime.quiet_gc:
                freeze_new()
        steps = prepared.plan.steps
        await self._warm(prepared, [index for index in prepared.plan.roots if steps[index].delay_s == 0])

    async def _arrivals(self, load: TraceLoad | RateLoad, start_ns: int) -> None:
        """Open loop: start each tree at its arrival time, counted from `start_ns`, whatever is still in flight (no
        lanes); a large one is planned, and its first bodies built, `PREFETCH_LEAD_NS` ahead (`_ready_tree`)."""
        options = self.options
        shard_index, shard_count = options.runtime.shard
        if isinstance(load, TraceLoad):
            schedule: Iterator[tuple[float, int]] = iter(trace_arrivals(self.trace, load.speedup))
        else:
            order = session_order(len(self.trace.sessions), options.scenario.session_order, options.scenario.seed)
            schedule = zip(rate_arrivals(load.rate, load.burstiness, options.scenario.seed), order, strict=False)
        # The schedule starts one lead after the start, so that the first trees' bodies are built before they are due.
        origin_ns = start_ns + ARRIVAL_LEAD_NS
        arrivals = itertools.islice(enumerate(schedule), shard_index, None, shard_count)
        ahead: collections.deque[tuple[int, int, int, str | None, asyncio.Task[Play] | None]] = collections.deque()
        """(due, position, session index, marker, its tree being set up when that is worth doing ahead) of the
        arrivals within the lead, in order, up to the tree limit."""
        upcoming = next(arrivals, None)
        async with asyncio.TaskGroup() as trees:
            while True:
                # Set up every arrival within the lead, up to the tree limit.
                horizon_ns = time.perf_counter_ns() + PREFETCH_LEAD_NS
                while upcoming is not None and origin_ns + int(upcoming[1][0] * 1e9) < horizon_ns:
                    limit = self.settings.tree_limit
                    if limit is not None and self.tally.trees_started + len(ahead) >= limit:
                        upcoming = None
                        break
                    position, (offset_s, index) = upcoming
                    marker = self._marker(index, -1)  # drawn in arrival order, whichever tree is ready first
                    ready = (
                        trees.create_task(self._ready_tree(index, position, marker))
                        if self._worth_ahead(index)
                        else None
                    )
                    ahead.append((origin_ns + int(offset_s * 1e9), position, index, marker, ready))
                    upcoming = next(arrivals, None)
                if not ahead and upcoming is None:
                    break
                # Wake a little early for the next arrival (a small tree is planned then, a large one not ready yet
                # has that long), or when the one after it is half a lead away, whichever is first: a tree is set up
                # between half a lead and a lead ahead, and dense arrivals cost no wake-ups of their own.
                wake_ns = ahead[0][0] - ARRIVAL_LEAD_NS if ahead else sys.maxsize
                if upcoming is not None:
                    wake_ns = min(wake_ns, origin_ns + int(upcoming[1][0] * 1e9) - PREFETCH_LEAD_NS // 2)
                if await self._sleep_until(wake_ns):
                    break
                if not ahead or time.perf_counter_ns() < ahead[0][0] - ARRIVAL_LEAD_NS:
                    continue
                due_ns, position, index, marker, ready = ahead.popleft()
                if ready is None:
                    play = self._play(self._prepared(index), -1, position, marker)
                else:
                    play = await ready
                    if self.stopped.is_set():
                        break
                    self.tally.played.add(index)
                self.tally.trees_started += 1
                play.begin(due_ns)
                trees.create_task(self._run_play(play))

    async def _ready_tree(self, index: int, position: int, marker: str | None) -> Play:
        """A large open-loop tree set up ahead of its arrival: planned (a long session on a worker thread) and the
        bodies it sends first built, so that several arriving close together do not queue behind each other's builds."""
        play = self._play(await self._planned(index), -1, position, marker)
        await self._prebuild([play], "profiling" if self.gate.started.is_set() else "warmup")
        return play

    async def _run_play(self, tree: Play) -> None:
        """Play `tree`, begun already (its clock set to when it was due)."""
        self.live_plays.add(tree)
        self.gate.release(tree.lane)  # a lane held for its next tree (`ProfilingGate.hold`) has it now
        try:
            async with asyncio.TaskGroup() as steps:
                for step in tree.prepared.plan.steps:
                    steps.create_task(self._step(tree, step))
        finally:
            self.live_plays.discard(tree)
            self.sender.sent_blocks.forget(tree)
            self.idle.forget(tree)
            tree.forget_texts()
        self.tally.trees_finished += 1
        await asyncio.sleep(0)  # a tree without steps must not starve the loop

    def _profiling_opened(self) -> None:
        """The profiling start: after a per-lane cache-pressure stage, every turn of a live tree that is next to go
        (its anchor returned, or it has none) is handed over to profiling at its recorded offset (`handoff`, §4d);
        under the harness's rules the per-tree idle cap acts from now, each idle tree's idle clock starting now
        (§4c)."""
        if self.gate.per_lane:
            self.handoff = {
                (id(tree), step.index): (tree, step, waiting) for tree, step, waiting in handoff_steps(self.live_plays)
            }
        if self.settings.runtime_tree_cap_s is not None and self.settings.rules.tree_idle_cap_mode == "runtime":
            self.idle.start_tree_cap(self.settings.runtime_tree_cap_s, self.live_plays, self.gate.start_ns)

    def _phase_cut(self) -> float:
        """How much earlier every first profiling turn goes under a phase-wide profiling start (§4d; the harness's
        `_profiling_phase_t0_offset_ms`): the earliest offset over every lane's turns that go out at an offset (the
        turns a per-lane cache-pressure stage handed over, else the first trees' live turns), those waiting on a
        join excepted. Taken once, at the first turn due after the start."""
        if self._phase_cut_s is None:
            if self.gate.per_lane:
                offsets = [
                    due.replay_offset_s(tree, step) for tree, step, waiting in self.handoff.values() if not waiting
                ]
            else:
                offsets = [offset for play in self.firsts if play.snapshot for offset in live_offsets(play.snapshot)]
            self._phase_cut_s = min(offsets, default=0.0)
        return self._phase_cut_s

    async def _step(self, tree: Play, step: Step) -> None:
        state = tree.snapshot
        try:
            if state is not None and state.is_settled(step.index):
                tree.complete(step.index, tree.start_ns)  # happened before t*: settled, never sent
                return
            # Build the body while the anchor is in flight (it needs nothing from the server), so a
            # step due right at its anchor's completion does not pay for it then; waiting for the
            # anchor's dispatch keeps at most ~2 bodies per agent alive.
            if step.anchor is not None:
                await tree.sent.wait(step.anchor)
                if not tree.completed_ns[step.anchor]:
                    # Not due before its anchor ends: what is due now goes first (lanes starting together send their
                    # first turns before any builds its next).
                    await asyncio.sleep(0)
            if self.stopped.is_set():
                self.tally.skipped += 1
                return
            phase: Phase = "profiling" if self.gate.started.is_set() else "warmup"
            prebuilt = tree.take_prebuilt(step.index)
            if prebuilt is not None and prebuilt[0] == phase:
                _, sent_tokens, body = prebuilt
            else:
                sent_tokens, body = await self.build_body(tree, step, phase)
            # Under the harness's join rule the subagents joined are waited for after the turn's own deadline,
            # which runs meanwhile (§3a); otherwise every dependency first.
            joins_after = self.settings.rules.join_waits_delay and bool(step.joins)
            for dependency in step.depends_on:
                if not (joins_after and dependency in step.joins):
                    await tree.done.wait(dependency)
            if self.stopped.is_set():
                self.tally.skipped += 1
                return
            if self._ended(tree, step):
                return
            if not self.gate.started.is_set() and joins_after:
                # In the cache-pressure stage a join waits for its subagents only; profiling may start first.
                await self._joined_before_profiling(tree, step)
            if not self.gate.started.is_set() and self.gate.per_lane and step.turn > 0:
                # The subagents a return spawns take the lane's quota before the agent's next turn, as the harness's
                # orchestrator starts them before its strategy sends that turn (their steps wake right after).
                await asyncio.sleep(0)
            if not self.gate.started.is_set():
                taken = self.gate.take(tree.lane)
                tree.reached_gate.set(step.index)
                if taken:
                    # A cache-pressure request: sent at once (idle delays removed), recorded as warmup (§4d).
                    if phase != "warmup":
                        sent_tokens, body = self.bodies.build(tree, step, "warmup")
                    await self.gate.press(self._send_pressure(tree, step, sent_tokens, body))
                    return
                await self.gate.wait(self.stopped)
            if self.stopped.is_set():
                self.tally.skipped += 1
                return
            if phase != "profiling":
                sent_tokens, body = await self.build_body(tree, step, "profiling")
            release = self._due(tree, step, (id(tree), step.index) in self.handoff)
            first_live = state is not None and step.index in state.first_live
            child_start = step.depth > 0 and step.turn == 0 and not first_live
            outside_caps = (child_start or joins_after) and not self.settings.rules.child_timers_capped
            if outside_caps:
                # A subagent's first turn waits a plain sleep that no idle cap moves, as AIPerf 0.13.0's
                # (`aiperf/timing/branch_orchestrator.py`, `_dispatch_first_turn_after_offset`) does (§3a).
                stopped = await self._sleep_until(release.due_ns)
            else:
                stopped, fired_ns = await self.idle.wait(tree, release.due_ns, self.stopped)
                release.cut_to(fired_ns)
            if joins_after and not stopped:
                for dependency in step.joins:
                    await tree.done.wait(dependency)
                last = max(step.joins, key=tree.completed_ns.__getitem__)
                if tree.completed_ns[last] > release.due_ns:
                    release.hold(last, tree.completed_ns[last])
                stopped = self.stopped.is_set()
            if stopped:
                self.tally.skipped += 1
                return
            if self._ended(tree, step):
                return
            if not self.sender.admit():  # the request cap was reached
                self.tally.skipped += 1
                return
            await self.sender.send(
                tree, step, release.due_ns, sent_tokens, body, outside_caps=outside_caps, release=release
            )
        finally:
            tree.settle(step.index)

    async def _after_parent_turn(self, tree: Play, step: Step) -> None:
        """A subagent's first turn, spawned at a return of its parent's, waits until the parent's next turn, if it
        goes at that same return, has come to the cache-pressure gate: the subagent takes the lane's quota first (see
        `_step`) but goes out second. The harness's orchestrator issues the subagent's credit first, yet its workers
        put the parent's turn on the server first in most runs; on a server that ends both in one step, the first
        sent returns first, and the order decides which stream takes the lane's last cache-pressure slot
        (docs/agentx.md §4d)."""
        anchor = step.anchor
        if step.depth == 0 or step.turn > 0 or anchor is None or step.from_anchor_send:
            return
        plan = tree.prepared.plan
        spawning = plan.steps[anchor]
        for index in plan.dependents[anchor]:
            parent_next = plan.steps[index]
            if parent_next.agent_id == spawning.agent_id and parent_next.anchor == anchor:
                # A turn that also waits on something else (a join, a barrier) does not go at this return.
                if all(tree.done.is_set(other) for other in parent_next.depends_on if other != anchor):
                    await tree.reached_gate.wait(index)
                return

    async def _send_pressure(self, tree: Play, step: Step, sent_tokens: int, body: Body) -> RequestRecord:
        """Send a cache-pressure request (after its parent's turn, `_after_parent_turn`); a root one that fails ends
        the run at once, before profiling can start, as the references abort on any failed root request of their
        warmup (`aiperf/credit/callback_handler.py`, `_handle_warmup_failure`; docs/agentx.md §5)."""
        if self.gate.per_lane:
            await self._after_parent_turn(tree, step)
        record = await self.sender.send(tree, step, time.perf_counter_ns(), sent_tokens, body, phase="warmup")
        others = (index for index in range(len(tree.done)) if index != step.index)
        if self.gate.per_lane and all(tree.done.is_set(index) or tree.completed_ns[index] for index in others):
            self.gate.hold(tree.lane)  # the tree ends here: its lane's next one is handed over too
        if record.status == "error" and step.depth == 0 and not self.gate.aborted and not self.stopped.is_set():
            self.gate.abort()
            self.warmup_failure = WarmupFailed(
                f"the cache-pressure request of session {record.session_id!r} (turn {record.turn}) failed with "
                f"{record.error_kind}: {record.error_message}; the run stopped before profiling, as AgentX does for "
                "any failed root request of its warmup, and cancelled the requests in flight"
            )
            self.stop()
            self.hard_stop("a root agent's warmup request failed")
        return record

    async def _joined_before_profiling(self, tree: Play, step: Step) -> None:
        """Wait until the subagents `step` joins have completed, or profiling starts or the run stops first."""

        async def all_joined() -> None:
            for index in step.joins:
                await tree.done.wait(index)

        joined: asyncio.Future[None] = asyncio.ensure_future(all_joined())
        started: asyncio.Future[None] = asyncio.ensure_future(self.gate.wait(self.stopped))
        try:
            await asyncio.wait({joined, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
            joined.cancel()

    def _due(self, tree: Play, step: Step, held: bool) -> Release:
        """When `step` is due, and what released it (agentx.replayer.schedule.due): a turn a per-lane cache-pressure
        stage handed over (`held`) at its recorded offset from its tree's origin, any other by its anchor, offset and
        barriers."""
        if held:
            return due.handoff_due(
                tree,
                step,
                profiling_start_ns=self.gate.start_ns,
                phase_cut_s=self._handoff_cut(tree),
                delay_scale=self.settings.delay_scale,
            )
        return due.due(
            tree,
            step,
            profiling_start_ns=self.gate.start_ns,
            load=self.options.load,
            rules=self.settings.rules,
            tree_idle_cap_s=self.options.scenario.tree_idle_cap_s,
            phase_cut_s=self._phase_cut() if self.settings.rules.profiling_start == "phase" else 0.0,
            delay_scale=self.settings.delay_scale,
        )

    def _handoff_cut(self, tree: Play) -> float:
        """The cut of a turn handed over to profiling: the phase-wide one, or with `warmup="burst"` its lane's
        earliest offset (each lane's profiling starts at its earliest turn, §4d)."""
        load = self.options.load
        if not (isinstance(load, AgentxLoad) and load.warmup == "burst"):
            return self._phase_cut()
        offsets = [
            due.replay_offset_s(other, step)
            for other, step, waiting in self.handoff.values()
            if other.lane == tree.lane and not waiting
        ]
        return min(offsets, default=0.0)

    def _ended(self, tree: Play, step: Step) -> bool:
        """Whether `step`'s session ended on a context overflow (its agent's, or the root's for the whole
        tree, docs/agentx.md §5); counts it as skipped for that reason."""
        if "" in tree.ended_agents or step.agent_id in tree.ended_agents:
            self.tally.skipped_context_overflow += 1
            return True
        return False
