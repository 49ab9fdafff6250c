"""Idle caps (docs/agentx.md §4b, §4c): timers move earlier together when nothing is in flight; joins never move."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest
from builders import make_agent, make_request, make_session, make_trace

from agentx.records.record import read_records, to_records
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.options.rules import RulesName
from agentx.replayer.run_replay import run_replay
from agentx.replayer.schedule.idle import IdleCaps
from agentx.sim.process import SimServer
from agentx.trace.model import Request

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

MS = 1_000_000


class _Tree:
    """A play as the caps know it: a key of its state in the caps."""


def test_an_ended_tree_is_forgotten() -> None:
    async def go() -> tuple[int, int]:
        caps = IdleCaps(system_cap_s=None, tree_cap_s=60.0)
        tree = _Tree()
        stop = asyncio.Event()
        caps.started(tree)
        waiting = asyncio.create_task(caps.wait(tree, time.perf_counter_ns() + 60_000 * MS, stop))
        await asyncio.sleep(0)
        caps.finished(tree)  # idle with a timer pending: the tree's watch is armed
        tracked = caps.tracked
        stop.set()
        caps.wake_all()
        await waiting
        caps.forget(tree)  # its state, and the watch armed when it went idle with a timer, go
        return tracked, caps.tracked

    assert asyncio.run(go()) == (1, 0)


def test_the_system_cap_moves_every_pending_timer_by_one_amount() -> None:
    async def go() -> tuple[list[int], list[int], list[tuple[int, str, int]]]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None)
        a, b = _Tree(), _Tree()
        stop = asyncio.Event()
        caps.started(a)
        now = time.perf_counter_ns()
        dues = [now + 5_000 * MS, now + 6_000 * MS]
        waits = [
            asyncio.create_task(caps.wait(a, dues[0], stop)),
            asyncio.create_task(caps.wait(b, dues[1], stop)),
        ]
        await asyncio.sleep(0.01)
        caps.finished(a)  # nothing in flight any more: the earliest timer comes to 50 ms from now
        idle_ns = caps.idle_since_ns or 0
        first_stopped, first_due = await waits[0]
        assert not first_stopped
        effective = [first_due, *caps.state(b).pending_due_ns.values()]
        sent = [time.perf_counter_ns() - idle_ns]
        stop.set()
        caps.wake_all()
        await waits[1]
        return effective, sent, caps.jumps

    effective, sent, jumps = asyncio.run(go())
    assert len(jumps) == 1 and jumps[0][1] == "system"
    # The same shift for both: their spacing (1 s) is kept.
    assert effective[1] - effective[0] == 1_000 * MS
    assert 40 * MS <= sent[0] <= 150 * MS


async def _one_in_flight_one_waiting(caps: IdleCaps, far_ms: int) -> tuple[_Tree, asyncio.Task[tuple[bool, int]]]:
    """Tree b with a request in flight, tree a waiting on a timer `far_ms` away (10 ms later): returns b and a's
    wait."""
    a, b = _Tree(), _Tree()
    caps.started(b)
    waiting = asyncio.create_task(caps.wait(a, time.perf_counter_ns() + far_ms * MS, asyncio.Event()))
    await asyncio.sleep(0.01)
    return b, waiting


@pytest.mark.parametrize(("at_return", "moved"), [(True, True), (False, False)])  # AIPerf 0.13.0, the harness
def test_a_first_turn_slept_outside_the_caps_does_not_undo_aiperfs_shift_at_the_return(
    at_return: bool, moved: bool
) -> None:
    """AIPerf 0.13.0 shifts at the return that leaves nothing in flight; a subagent's first turn it slept outside
    its scheduler, sent 10 ms later, does not undo that (seen on a held-out trace: the reference sent a turn 10 s
    after such a return, agentx 6 s later). The harness's watchdog ends with that send and starts again at the
    child's return."""

    async def go() -> tuple[bool, int, int, list[tuple[int, str, int]]]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None, at_return=at_return)
        b, waiting = await _one_in_flight_one_waiting(caps, 400)
        caps.finished(b)  # nothing in flight: the return the reference shifts at
        returned_ns = time.perf_counter_ns()
        await asyncio.sleep(0.01)
        caps.started(b, outside_caps=True)  # the child's first turn, after its offset
        await asyncio.sleep(0.02)
        caps.finished(b)
        child_returned_ns = time.perf_counter_ns()
        stopped, due = await waiting
        return stopped, due - returned_ns, due - child_returned_ns, caps.jumps

    stopped, after_return_ns, after_child_ns, jumps = asyncio.run(go())
    assert not stopped and len(jumps) == 1
    if moved:
        assert 45 * MS <= after_return_ns <= 60 * MS
    else:
        assert 45 * MS <= after_child_ns <= 60 * MS


def test_a_return_driven_send_cancels_the_shift_at_the_return() -> None:
    """A send before the next completion that the caps see (a timer due at once, a join) means the reference saw
    a request in flight at the return: no shift."""

    async def go() -> tuple[int, list[tuple[int, str, int]]]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None, at_return=True)
        b, waiting = await _one_in_flight_one_waiting(caps, 300)
        caps.finished(b)
        caps.started(b)  # return-driven: in flight when the reference looks
        await asyncio.sleep(0.1)
        caps.finished(b)  # a later return: its own shift, from here
        later_ns = time.perf_counter_ns()
        _, due = await waiting
        return due - later_ns, caps.jumps

    after_later_ns, jumps = asyncio.run(go())
    assert len(jumps) == 1 and 45 * MS <= after_later_ns <= 60 * MS


def test_a_timer_set_after_a_jump_keeps_its_whole_delay() -> None:
    """The shift acts on the timers pending at that moment only (reference `cap_pending_delay`): a timer set
    afterwards is due its full delay from when it was set, never in the past."""

    async def go() -> tuple[int, int, int]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None)
        tree, other = _Tree(), _Tree()
        stop = asyncio.Event()
        caps.started(tree)
        far = asyncio.create_task(caps.wait(tree, time.perf_counter_ns() + 60_000 * MS, stop))
        await asyncio.sleep(0.01)
        caps.finished(tree)  # idle: the 60 s timer comes to 50 ms
        await far
        caps.started(tree)  # its request goes out; another tree's request keeps the system busy meanwhile
        caps.started(other)
        await asyncio.sleep(0.01)
        caps.finished(tree)
        set_ns = time.perf_counter_ns()
        _, due_ns = await caps.wait(tree, set_ns + 200 * MS, stop)  # the next think time: 200 ms
        caps.finished(other)
        return due_ns - set_ns, time.perf_counter_ns() - set_ns, len(caps.jumps)

    planned, waited, jumps = asyncio.run(go())
    assert planned == 200 * MS  # not pulled in by the earlier jump of ~60 s
    assert waited >= 195 * MS
    assert jumps == 1


def test_a_shifted_timer_is_never_due_in_the_past() -> None:
    async def go() -> tuple[int, int]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None)
        tree = _Tree()
        stop = asyncio.Event()
        caps.started(tree)
        await asyncio.sleep(0.1)  # in flight for 100 ms: more than the cap
        caps.finished(tree)
        await asyncio.sleep(0.08)  # idle 80 ms already, past the 50 ms budget
        set_ns = time.perf_counter_ns()
        _, due_ns = await caps.wait(tree, set_ns + 10_000 * MS, stop)
        return due_ns - set_ns, time.perf_counter_ns() - due_ns

    due_after_set, late = asyncio.run(go())
    assert 0 <= due_after_set < 20 * MS  # moved to "now", not to idle start + cap (30 ms ago)
    assert late < 20 * MS


def test_the_tree_cap_moves_only_that_trees_timers() -> None:
    async def go() -> tuple[int, int]:
        caps = IdleCaps(system_cap_s=None, tree_cap_s=0.05)
        idle, busy = _Tree(), _Tree()
        stop = asyncio.Event()
        caps.started(busy)  # another tree keeps a request in flight throughout
        caps.started(idle)
        now = time.perf_counter_ns()
        waits = [
            asyncio.create_task(caps.wait(idle, now + 5_000 * MS, stop)),
            asyncio.create_task(caps.wait(busy, now + 5_000 * MS, stop)),
        ]
        await asyncio.sleep(0.01)
        caps.finished(idle)
        _, idle_due = await waits[0]
        busy_due = next(iter(caps.state(busy).pending_due_ns.values()))
        stop.set()
        caps.wake_all()
        await waits[1]
        return now + 5_000 * MS - idle_due, now + 5_000 * MS - busy_due

    idle_shift, busy_shift = asyncio.run(go())
    assert idle_shift > 4_800 * MS and busy_shift == 0


def _req(t: float, api: float = 0.05) -> Request:
    return make_request(t, 20, 2, api_time=api, added=(int(t * 10),))


@pytest.mark.parametrize("rules", ["agentx-harness-1.0.12", "aiperf-0.13.0"])
def test_a_replay_skips_idle_gaps_but_never_a_join(tmp_path: Path, rules: RulesName) -> None:
    """A recorded gap of 20 s runs in well under a second with a 50 ms cap. The root's second turn joins the
    subagent that ended after the root's first turn: under AIPerf 0.13.0 it goes out as soon as the subagent's last
    turn ended, with none of its recorded 40 s delay; under the harness its 40 s deadline is a timer the cap moves
    too, so it goes out one cap after the subagent's end (docs/agentx.md §3a, §4b). The cap never sends it before
    the subagent ended."""
    sub = make_agent("sub", [_req(1.0), _req(21.0)], spawn_after=1, t=1.0)
    trace = make_trace(make_session("gaps", [_req(0.0), _req(40.0)], subagents=[sub]))
    with SimServer(time_scale=0.01, block_size=16) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(system_idle_cap_s=0.05, sessions=1, rules=rules),
        )
        result = asyncio.run(run_replay(trace, options))
    records = sorted(to_records(read_records(result.records_path)), key=lambda r: r.sent_ns)
    assert [(r.agent_id, r.turn) for r in records] == [("", 0), ("sub", 0), ("sub", 1), ("", 1)]
    harness = rules == "agentx-harness-1.0.12"
    assert result.elapsed_s < 5.0 and result.idle_jumps == (2 if harness else 1) and result.idle_skipped_s > 19
    for before, after in itertools.pairwise(records):
        # Nothing was in flight between them, so the gap is at most the cap (plus scheduling noise).
        assert (after.sent_ns - before.end_ns) / 1e9 < 0.05 + 0.05
    assert records[3].sent_ns >= records[2].end_ns  # the join held
    if harness:  # due one cap after the subagent ended, when the system had been idle that long
        assert records[3].scheduled_ns == pytest.approx(records[2].end_ns + 50 * MS, abs=10 * MS)
    else:
        assert records[3].scheduled_ns == records[2].end_ns  # due the moment the subagent ended


def test_the_cap_sees_every_timer_a_completion_sets_whatever_order_they_are_set_in() -> None:
    """As in a real run (trace_0277 at t*): a subagent's turn due in 1.75 s and the root's in 2.145 s; the cap
    brings the subagent's to 50 ms and the root's to 445 ms, spacing kept. When the subagent's request returns
    and its next turn is set 30 ms out, the root's timer stays where it was: the completion's own timer is due
    well within the cap, so no shift happens (the reference shifts once the return has been processed)."""

    async def go() -> tuple[int, int, int]:
        caps = IdleCaps(system_cap_s=0.05, tree_cap_s=None)
        root, sub = _Tree(), _Tree()
        stop = asyncio.Event()
        start = time.perf_counter_ns()
        first = asyncio.create_task(caps.wait(sub, start + 1_750 * MS, stop))
        root_wait = asyncio.create_task(caps.wait(root, start + 2_145 * MS, stop))
        _, sub_due = await first
        caps.started(sub)
        await asyncio.sleep(0.01)
        caps.finished(sub)  # idle again: the root's timer is the only one pending for a moment
        await asyncio.sleep(0)
        _, next_due = await caps.wait(sub, time.perf_counter_ns() + 30 * MS, stop)
        caps.started(sub)  # that next turn's request is in flight until the root's timer fires
        _, root_due = await root_wait
        caps.finished(sub)
        return sub_due - start, root_due - start, next_due - start

    sub_due, root_due, next_due = asyncio.run(go())
    assert 45 * MS <= sub_due <= 60 * MS
    assert root_due - sub_due == 395 * MS  # the spacing of the one shift, not pulled in by the return
    assert next_due < root_due
