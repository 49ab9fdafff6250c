"""The AgentX start (docs/agentx.md §4d): each lane's first tree resumes at its t*, primers warm the server's
cache with the turn before, an optional cache-pressure stage follows, and profiling starts when both are done.

- `send_primers`: every first tree's primers, spread so that every lane's t* falls at the profiling start
  (`warmup="spread"`) or all at once (`"burst"`); a failed root primer stops the run (`WarmupFailed`).
- `ProfilingGate`: the profiling start, held while cache-pressure requests are still to go; `handoff_steps`: the
  turns a per-lane stage hands over to profiling.
- `first_offset_cut`: how much earlier a lane's first live turns all go once profiling starts.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final, Protocol

import msgspec

from agentx.errors import WarmupFailed
from agentx.records.record import Phase, RequestRecord
from agentx.replayer.http.http1 import Body
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.plan.play import Play, PreparedSession
from agentx.replayer.plan.steps import Step
from agentx.replayer.plan.tstar import Snapshot
from agentx.replayer.schedule.idle import IdleCaps
from agentx.replayer.schedule.sending import Sender
from agentx.replayer.schedule.slices import Slices

if TYPE_CHECKING:
    from agentx.replayer.schedule.parts import RunSettings

WARMUP_NOTICE_S: Final = 120.0
"""A warmup expected to take longer than this is announced (on the "agentx" logger, and in `RunResult.notices`)."""


class LaneStart(msgspec.Struct, kw_only=True):
    """A lane's first tree at its t*, as run.json reports it (`RunResult.tstar`)."""

    lane: int
    session_id: str
    t_star_s: float
    live_agents: list[str]
    """Agents with a turn to send from t* on."""
    skipped_agents: list[str]
    """Agents wholly before t*: never sent."""
    done_steps: int
    primers: int
    waiting_on_join: list[str]
    """Agents whose first live turn waits for a subagent to join."""


def lane_start(lane: int, prepared: PreparedSession, state: Snapshot) -> LaneStart:
    steps = prepared.plan.steps

    def agents(indices: Iterable[int]) -> list[str]:
        return sorted({steps[i].agent_id for i in indices})

    return LaneStart(
        lane=lane,
        session_id=prepared.plan.session_id,
        t_star_s=state.t_star,
        live_agents=agents(state.first_live),
        skipped_agents=agents(state.skipped),
        done_steps=len(state.done),
        primers=len(state.primers),
        waiting_on_join=agents(state.waiting),
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


def first_offset_cut(state: Snapshot, burst: bool, tree_idle_cap_s: float | None) -> float:
    """How much earlier a lane's first live turns all go under the AIPerf 0.13.0 rules (§4c, §4d; reference
    `agentic_replay.py`, `_dispatch_snapshot_for_profiling`): with a per-tree idle cap, so that the earliest is due
    at most the cap after the profiling start; with `warmup="burst"`, so that it is due at the start. Turns waiting
    on a join are not dispatched at an offset and take no part."""
    offsets = live_offsets(state)
    if not offsets:
        return 0.0
    if burst:
        return min(offsets)
    return 0.0 if tree_idle_cap_s is None else max(0.0, min(offsets) - tree_idle_cap_s)


def live_offsets(state: Snapshot) -> list[float]:
    """The profiling offsets of a lane's first live turns that go out at an offset (not those waiting on a join)."""
    return [offset for index, offset in state.first_live.items() if index not in state.waiting]


def handoff_steps(plays: Iterable[Play]) -> Iterator[tuple[Play, Step, bool]]:
    """The turns a per-lane cache-pressure stage hands over to profiling (§4d; the harness's `finalize_phase`): of
    each live tree, every turn not sent yet that has no anchor or whose anchor has returned (been sent, for a turn
    timed from its anchor's send), barrier-held ones included; with whether it still waits on subagents it joins.
    An anchor's return is its `completed_ns`, set as its request ends, before its step is marked done."""
    for play in plays:
        settled = play.snapshot.not_sent if play.snapshot is not None else frozenset()
        for step in play.prepared.plan.steps:
            if play.sent.is_set(step.index) or step.index in settled:
                continue
            anchor = step.anchor
            if anchor is not None and not (play.sent_ns if step.from_anchor_send else play.completed_ns)[anchor]:
                continue
            yield play, step, any(not play.completed_ns[joined] for joined in step.joins)


class Dispatcher(Protocol):
    """What the primers need of the run (agentx.replayer.schedule.runner.Runner)."""

    bodies: BodyBuilder
    sender: Sender
    idle: IdleCaps
    settings: RunSettings
    stopped: asyncio.Event

    def stop(self) -> None: ...

    def hard_stop(self, why: str | None = None) -> None: ...

    def notice(self, message: str) -> None: ...

    async def build_body(self, tree: Play, step: Step, phase: Phase) -> tuple[int, Body]: ...


async def send_primers(
    run: Dispatcher,
    plays: list[Play],
    *,
    spread: bool,
    lead_cap_s: float | None,
    system_idle_cap_s: float | None,
) -> float:
    """Send every first tree's primers (the turn before each live agent's t*) and wait for all of them; returns
    how long the spread schedule was expected to take (0 for a burst).

    Spread: a primer with lead `t* − t`, clamped to `lead_cap_s` (the idle cap the rule set names, §4d), goes out
    `max_lead − lead` after the warmup starts, so that every lane's t* falls at the profiling start. A failed root
    primer stops the run (`WarmupFailed`).
    """
    primers = [(play, index, lead) for play in plays if play.snapshot for index, lead in play.snapshot.primers.items()]
    if not primers:
        return 0.0
    if lead_cap_s is not None:
        primers = [(play, index, min(lead, lead_cap_s)) for play, index, lead in primers]
    max_lead = max(lead for _, _, lead in primers)
    expected_s = 0.0
    if spread:
        expected_s = expected_warmup_s(
            [(max_lead - lead) * run.settings.delay_scale for _, _, lead in primers], system_idle_cap_s
        )
        if expected_s > WARMUP_NOTICE_S:
            run.notice(
                f"the warmup will take about {_duration(expected_s)}: {len(primers)} primers spread "
                f"over leads of up to {_duration(max_lead * run.settings.delay_scale)} before t*"
                + (
                    " (--system-idle-cap is off)"
                    if system_idle_cap_s is None
                    else f", idle gaps capped at {system_idle_cap_s:g} s"
                )
                + "; profiling starts when it ends"
            )
    start_ns = time.perf_counter_ns()
    failures: list[RequestRecord] = []
    # A primer's body is built when it is due, never before: it carries its turn's whole prefix (~200 KB of body at
    # 30k tokens), and a spread warmup holds thousands of primers for minutes. Builds take the lock (a large one off
    # the loop) and, once they have held the event loop for a slice, yield it with the lock held: primers due at once
    # (a burst, or leads at the cap) then build one per turn of the loop rather than all in one turn that would hold
    # every body and the loop (a Ctrl-C with it) for seconds. The primers' tasks are made under the same lock, so none
    # goes out before every primer's timer is set, as the reference sets them all at the warmup's start (an idle cap's
    # shift sees them all). A primer's dispatch lag is not a profiling figure.
    building = asyncio.Lock()
    slices = Slices()

    async def prime(play: Play, index: int, lead: float) -> None:
        step = play.prepared.plan.steps[index]
        offset_s = (max_lead - lead) * run.settings.delay_scale if spread else 0.0
        stopped, due_ns = await run.idle.wait(play, start_ns + int(offset_s * 1e9), run.stopped)
        if stopped:
            return
        async with building:
            await slices.pause()
            if run.stopped.is_set():
                return
            sent_tokens, body = await run.build_body(play, step, "warmup")
        record = await run.sender.send(play, step, due_ns, sent_tokens, body, phase="warmup")
        if record.status == "error" and step.depth == 0 and not failures and not run.stopped.is_set():
            # The first failed root primer ends the run at once, in-flight primers cancelled (reference:
            # `aiperf/credit/callback_handler.py`, `_handle_warmup_failure`).
            failures.append(record)
            run.stop()
            run.hard_stop("a root agent's warmup primer failed")

    async with asyncio.TaskGroup() as group, building:
        for play, index, lead in primers:
            if run.stopped.is_set():
                break
            group.create_task(prime(play, index, lead))
            await slices.pause()
    if failures:
        first = failures[0]
        raise WarmupFailed(
            f"the warmup primer of session {first.session_id!r} (turn {first.turn}) failed with "
            f"{first.error_kind}: {first.error_message}; the run stopped before profiling, as AgentX does, and "
            "cancelled the other primers in flight"
        )
    return expected_s


class ProfilingGate:
    """The profiling start: at once, or once the cache-pressure stage is over (§4d). `begin_pressure` sets the
    stage: `pooled`, one pool of requests any lane may take (the gate opens when the last one ends); per lane, a
    quota per lane, a lane's further turns waiting at the gate, which opens once every lane has used its quota or
    has nothing left to send and every pressure request has ended. `on_open()` and `on_start()` are called as it
    opens (the run's own hook first, then an observer's)."""

    def __init__(self, on_open: Callable[[], None] | None = None, on_start: Callable[[], None] | None = None) -> None:
        self.on_open = on_open
        self.on_start = on_start
        self.started = asyncio.Event()
        self.start_ns = 0
        self.pressure_left = 0
        """Pooled: cache-pressure requests still to send before profiling starts."""
        self.lane_left: dict[int, int] = {}
        """Per lane: each lane's requests still to send; a lane with nothing left to send is dropped."""
        self._lanes_pressing = 0
        """Lanes of `lane_left` with requests still to send (`pressing` is asked once per lane done: counting them
        there would cost the square of the lanes)."""
        self.per_lane = False
        """A per-lane stage was set: its turns over quota are handed over to profiling
        (agentx.replayer.schedule.runner)."""
        self.pressure_in_flight = 0
        self.aborted = False
        self.held: set[int] = set()
        """Lanes whose tree ended with a cache-pressure request and that have not drawn their next tree yet."""

    def begin_pressure(self, lanes: Iterable[int], per_lane: int, *, pooled: bool) -> None:
        """Start the cache-pressure stage of `per_lane` requests for each of `lanes`; with none, profiling starts."""
        lanes = list(lanes)
        if pooled:
            self.pressure_left = per_lane * len(lanes)
        elif per_lane > 0:
            self.lane_left = dict.fromkeys(lanes, per_lane)
            self._lanes_pressing = len(self.lane_left)
            self.per_lane = True
        self._maybe_open()

    @property
    def pressing(self) -> bool:
        """Whether cache-pressure requests may still go out (from some lane)."""
        return self.pressure_left > 0 or self._lanes_pressing > 0

    def take(self, lane: int) -> bool:
        """Whether a request of `lane` goes out now as a cache-pressure request (and counts it)."""
        if self.pressure_left > 0:
            self.pressure_left -= 1
            return True
        if self.lane_left.get(lane, 0) > 0:
            self.lane_left[lane] -= 1
            self._lanes_pressing -= self.lane_left[lane] == 0
            return True
        return False

    def lane_done(self, lane: int) -> None:
        """`lane` has nothing more to send: it no longer holds the profiling start back."""
        held = lane in self.held
        self.held.discard(lane)
        left = self.lane_left.pop(lane, None)
        self._lanes_pressing -= bool(left)
        if left is not None or held:
            self._maybe_open()

    def hold(self, lane: int) -> None:
        """`lane`'s tree ended with a cache-pressure request: profiling waits until the lane has drawn its next tree
        (`release`) or has none (`lane_done`), so that the tree is handed over at its origin, as the harness hands a
        fresh trajectory to a lane whose stream ended (`finalize_phase`, §4d), whichever request ends last."""
        self.held.add(lane)

    def release(self, lane: int) -> None:
        """`lane`'s next tree is live."""
        if lane in self.held:
            self.held.discard(lane)
            self._maybe_open()

    def open(self) -> None:
        if not self.started.is_set():
            self.start_ns = time.perf_counter_ns()
            self.started.set()
            if self.on_open is not None:
                self.on_open()
            if self.on_start is not None:
                self.on_start()

    def _maybe_open(self) -> None:
        if not self.aborted and not self.pressing and self.pressure_in_flight == 0 and not self.held:
            self.open()

    async def wait(self, stopped: asyncio.Event) -> None:
        """Until profiling starts or the run stops."""
        stop = asyncio.ensure_future(stopped.wait())
        started = asyncio.ensure_future(self.started.wait())
        try:
            await asyncio.wait({stop, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            started.cancel()

    async def press(self, send: Awaitable[RequestRecord]) -> RequestRecord:
        """Send one cache-pressure request (counted by `take`); the last one to end opens the gate, unless a failed
        root request of the stage ended the run (`abort`)."""
        self.pressure_in_flight += 1
        try:
            return await send
        finally:
            self.pressure_in_flight -= 1
            self._maybe_open()

    def abort(self) -> None:
        """The warmup failed: profiling never starts."""
        self.aborted = True
