"""The session → step DAG planner: hand-made schedules, DAG properties, real samples, session sampling."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from strategies import sessions as session_strategy

from agentx.replayer.options.replay import SessionOrder
from agentx.replayer.plan.steps import (
    ChildOffset,
    SessionPlan,
    Step,
    join_due,
    plan_session,
    session_order,
)
from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Request, Session

EPS = 1e-9
CHILD_OFFSETS: tuple[ChildOffset, ...] = ("branch_start", "anchor_end")


def recorded_service_time_s(step: Step) -> float:
    """The recorded server duration of a step (unknown → 0), for `dry_run` against the trace itself."""
    return step.request.api_time or 0.0


def dry_run(plan: SessionPlan, service_time_s: Callable[[Step], float]) -> list[float]:
    """Each step's dispatch time (seconds from the session start) if step i takes `service_time_s(step)`: the
    engine's rules without a server. With no contention to model, the event simulation reduces to evaluating the
    DAG in topological order, each step dispatched at `join_due(...)` (as the engine does), then held by its
    barriers."""
    dispatch_s = [0.0] * len(plan.steps)
    completion_s = [0.0] * len(plan.steps)
    for index in plan.order:
        step = plan.steps[index]
        base = dispatch_s if step.from_anchor_send else completion_s
        anchor_s = base[step.anchor] if step.anchor is not None else 0.0
        at = join_due(anchor_s, step.delay_s, [completion_s[j] for j in step.joins])
        for barrier in step.barriers:
            at = max(at, completion_s[barrier])
        dispatch_s[index] = at
        completion_s[index] = at + max(0.0, service_time_s(step))
    return dispatch_s


def req(t: float, api_time: float | None, *, in_tokens: int = 100, kept: int = 0, added: int = 2) -> Request:
    return Request(
        t=t,
        model="m",
        in_tokens=in_tokens,
        out_tokens=10,
        api_time=api_time,
        hash_ids_kept=kept,
        hash_ids_added=tuple(range(kept, kept + added)),
    )


def sub(
    agent_id: str, spawn_after: int, t: float | None, *requests: Request, subagents: list[Agent] | None = None
) -> Agent:
    return Agent(agent_id=agent_id, spawn_after=spawn_after, t=t, requests=list(requests), subagents=subagents or [])


def session(*requests: Request, subagents: list[Agent] | None = None) -> Session:
    return Session(session_id="s", root=Agent(requests=list(requests), subagents=subagents or []))


def timing(plan: SessionPlan) -> list[tuple[int | None, float, tuple[int, ...]]]:
    """(anchor, delay, joins) per step, delays rounded so float noise does not matter."""
    return [(s.anchor, round(s.delay_s, 9), s.joins) for s in plan.steps]


def approx(values: list[float]) -> list[float]:
    return [round(v, 9) for v in values]


def test_a_subagent_joins_the_turn_after_next_and_recorded_times_replay_exactly() -> None:
    # root: r0 [0, 2], r1 [3, 4], r2 [6, 7]; subagent A spawned at 2 after r0: a0 [2.5, 3.5], a1 [4, 5].
    # A ends at 5: r1 (t=3) is too early, r2 (t=6) is the first at/after 5 → tiered join on r2, not r1.
    # Steps (depth first): 0=r0, 1=r1, 2=r2, 3=a0, 4=a1.
    # a0: anchor r0, delay 2.5 − branch start 2 = 0.5; a1: anchor a0, 4 − 3.5 = 0.5;
    # r1: anchor r0, 3 − 2 = 1; r2: anchor r1, 6 − 4 = 2, joins a1.
    plan = plan_session(session(req(0, 2), req(3, 1), req(6, 1), subagents=[sub("A", 1, 2.0, req(2.5, 1), req(4, 1))]))
    assert [(s.agent_id, s.depth, s.turn) for s in plan.steps] == [
        ("", 0, 0),
        ("", 0, 1),
        ("", 0, 2),
        ("A", 1, 0),
        ("A", 1, 1),
    ]
    assert timing(plan) == [(None, 0.0, ()), (0, 1.0, ()), (1, 2.0, (4,)), (0, 0.5, ()), (3, 0.5, ())]
    assert plan.roots == (0,) and plan.background == ()
    assert plan.dependents == ((1, 3), (2,), (), (4,), (2,))
    # Recorded service times reproduce the recorded starts, but for the join: A ends (5) after r1 (4), so r2
    # goes out as A ends, with no think time (docs/agentx.md §3a), at 5 rather than its recorded 6.
    assert approx(dry_run(plan, recorded_service_time_s)) == [0.0, 3.0, 5.0, 2.5, 4.0]
    # A faster than r1 (A's turns 0.1 s): r2 keeps its end-to-start delay after r1, 4 + 2 = 6.
    fast_child = dry_run(plan, lambda s: 0.1 if s.agent_id == "A" else recorded_service_time_s(s))
    assert approx(fast_child) == [0.0, 3.0, 6.0, 2.5, 3.1]
    # A slow a1 (10 s, done at 14) holds r2 back: max(r1 done 4 + 2 = 6, 14) = 14; r1 does not wait.
    slow = dry_run(plan, lambda s: 10.0 if (s.agent_id, s.turn) == ("A", 1) else recorded_service_time_s(s))
    assert approx(slow) == [0.0, 3.0, 14.0, 2.5, 4.0]


def test_a_subagent_nobody_joins_is_background() -> None:
    # root r0 [0, 1], r1 [2, 3]; B spawned at 1 after r0: b0 [1.5, 6.5] ends after the root's last request.
    # Steps: 0=r0, 1=r1, 2=b0 (anchor r0, delay 0.5, background); nobody joins it.
    plan = plan_session(session(req(0, 1), req(2, 1), subagents=[sub("B", 1, 1.0, req(1.5, 5))]))
    assert timing(plan) == [(None, 0.0, ()), (0, 1.0, ()), (0, 0.5, ())]
    assert plan.background == (2,)
    assert [s.background for s in plan.steps] == [False, False, True]
    assert approx(dry_run(plan, recorded_service_time_s)) == [0.0, 2.0, 1.5]


def test_parallel_subagents_share_one_branch_start() -> None:
    # root r0 [0, 2], r1 [10, 11]. A (spawn 2.0): a0 [2.2, 5.2]; B (spawn 2.1): b0 [2.4, 6.4]; both end
    # before r1 → same (anchor r0, join r1) → one branch starting at min spawn 2.0:
    #   a0 delay 0.2, b0 delay 2.4 − 2.0 = 0.4 (not 2.4 − 2.1 = 0.3, B's own spawn).
    # C (spawn 3.0): c0 [3.5, 20] ends after r1 → background, its own branch (anchor r0, no join): delay 0.5.
    # Steps: 0=r0, 1=r1, 2=a0, 3=b0, 4=c0; r1 joins a0 and b0.
    subs = [sub("A", 1, 2.0, req(2.2, 3)), sub("B", 1, 2.1, req(2.4, 4)), sub("C", 1, 3.0, req(3.5, 16.5))]
    plan = plan_session(session(req(0, 2), req(10, 1), subagents=subs))
    assert timing(plan) == [(None, 0.0, ()), (0, 8.0, (2, 3)), (0, 0.2, ()), (0, 0.4, ()), (0, 0.5, ())]
    assert plan.background == (4,)
    # r1 joins a branch that ends (6.4) after r0 (2): it goes out at 6.4, with no think time (§3a).
    assert approx(dry_run(plan, recorded_service_time_s)) == [0.0, 6.4, 2.2, 2.4, 2.5]
    # r0 takes 5 s: a0 at 5.2 (done 8.2), b0 at 5.4 (done 9.4), r1 at 9.4, as the last child ends.
    slow_root = dry_run(plan, lambda s: 5.0 if s.index == 0 else recorded_service_time_s(s))
    assert approx(slow_root) == [0.0, 9.4, 5.2, 5.4, 5.5]
    # b0 takes 20 s (2.4 + 20, done 22.4): r1 waits for the slowest child of the branch.
    slow_child = dry_run(plan, lambda s: 20.0 if s.agent_id == "B" else recorded_service_time_s(s))
    assert approx(slow_child) == [0.0, 22.4, 2.2, 2.4, 2.5]


def test_a_nested_subagent_is_planned_relative_to_its_own_parent() -> None:
    # root r0 [0, 1], r1 [10, 11]. A (spawn 1 after r0): a0 [1.5, 2.5], a1 [5, 6]; A joins r1.
    # N under A (spawn 2.5 after a0): n0 [3, 4]; joins a1 (t=5 ≥ 4).
    # Steps: 0=r0, 1=r1, 2=a0, 3=a1, 4=n0.
    # n0: anchor a0, delay 0.5, depth 2; a1: anchor a0, 5 − 2.5 = 2.5, joins n0; r1: 10 − 1 = 9, joins a1.
    # Replayed with recorded service times, each join goes out as its subagent ends (§3a): a1 at n0's end 4,
    # r1 at a1's end 5.
    nested = sub("N", 1, 2.5, req(3, 1))
    plan = plan_session(
        session(req(0, 1), req(10, 1), subagents=[sub("A", 1, 1.0, req(1.5, 1), req(5, 1), subagents=[nested])])
    )
    assert [(s.agent_id, s.depth) for s in plan.steps] == [("", 0), ("", 0), ("A", 1), ("A", 1), ("N", 2)]
    assert timing(plan) == [(None, 0.0, ()), (0, 9.0, (3,)), (0, 0.5, ()), (2, 2.5, (4,)), (2, 0.5, ())]
    assert approx(dry_run(plan, recorded_service_time_s)) == [0.0, 5.0, 1.5, 4.0, 3.0]
    # n0 slow (10 s, done 13): a1 waits until 13 (done 14); r1 waits until max(1 + 9, 14) = 14.
    slow = dry_run(plan, lambda s: 10.0 if s.agent_id == "N" else recorded_service_time_s(s))
    assert approx(slow) == [0.0, 14.0, 1.5, 13.0, 3.0]


def test_a_nested_subagent_of_a_background_subagent_is_background_too() -> None:
    # A (spawn after r0) outlives the root → background; N joins a1 inside A, but no root step waits on A.
    nested = sub("N", 1, 2.5, req(3, 1))
    plan = plan_session(
        session(req(0, 1), req(2, 1), subagents=[sub("A", 1, 1.0, req(1.5, 1), req(5, 1), subagents=[nested])])
    )
    assert plan.background == (2, 3, 4)
    assert plan.steps[3].joins == (4,)


def test_compaction_has_no_effect_on_timing() -> None:
    # The same times; the second trace compacts at turn 2 (keeps 1 id, a much smaller prompt).
    times = [(0.0, 1.0), (2.0, 1.0), (4.0, 1.0)]
    growing = [req(t, a, in_tokens=100 * (i + 1), kept=2 * i) for i, (t, a) in enumerate(times)]
    compacted = [*growing[:2], req(4.0, 1.0, in_tokens=50, kept=1, added=1)]
    plans = [plan_session(session(*requests)) for requests in (growing, compacted)]
    assert timing(plans[0]) == timing(plans[1]) == [(None, 0.0, ()), (0, 1.0, ()), (1, 1.0, ())]
    assert dry_run(plans[0], recorded_service_time_s) == dry_run(plans[1], recorded_service_time_s)


def test_a_negative_recorded_gap_becomes_a_zero_delay() -> None:
    # r0 [0, 5]; r1 recorded at 3, before r0's end → delay max(0, 3 − 5) = 0: dispatched at 5, not 3.
    # An unknown api_time counts as 0: r2 at 7 after r1 (t=5.5, api None) → delay 7 − 5.5 = 1.5.
    plan = plan_session(session(req(0, 5), req(5.5, None), req(7, 1)))
    assert timing(plan) == [(None, 0.0, ()), (0, 0.5, ()), (1, 1.5, ())]
    plan = plan_session(session(req(0, 5), req(3, 1)))
    assert timing(plan) == [(None, 0.0, ()), (0, 0.0, ())]
    assert dry_run(plan, recorded_service_time_s) == [0.0, 5.0]


def test_a_subagent_spawned_before_the_first_parent_request_is_kept_from_the_session_start() -> None:
    # root r0 [1, 2], r1 [3, 4]; S (spawn_after 0, spawn 0.5): s0 [1.5, 2.5] → joins r1 (first t ≥ 2.5).
    # S has no anchor: it starts at the session start (r0's dispatch) + its lead 1.5 − 1 = 0.5.
    plan = plan_session(session(req(1, 1), req(3, 1), subagents=[sub("S", 0, 0.5, req(1.5, 1))]))
    assert timing(plan) == [(None, 0.0, ()), (0, 1.0, (2,)), (None, 0.5, ())]
    assert plan.roots == (0, 2)
    # r1 joins S, which ends (1.5) after r0 (1): it goes out then (§3a).
    assert approx(dry_run(plan, recorded_service_time_s)) == [0.0, 1.5, 0.5]


def test_a_branch_begun_while_its_spawning_root_request_ran_starts_from_that_requests_send() -> None:
    # root r0 [0, 5], r1 [20, 21]. A spawned at 2 (inside r0): a0 [2.5, 3.5] → from r0's send, 2.5 − 0 = 2.5
    # (reference `on_credit_issued`); B spawned at 6 (after r0's end): b0 [6.5, 26.5], background (its own
    # branch) → from r0's end, 0.5.
    # A nested subagent of A spawned inside a0 does not overlap: only the root's branches are issued early.
    nested = sub("N", 1, 2.8, req(3.0, 0.2))
    subs = [sub("A", 1, 2.0, req(2.5, 1), subagents=[nested]), sub("B", 1, 6.0, req(6.5, 20))]
    plan = plan_session(session(req(0, 5), req(20, 1), subagents=subs))
    at = {(step.agent_id, step.turn): step for step in plan.steps}
    assert at[("A", 0)].from_anchor_send and at[("A", 0)].delay_s == 2.5
    assert at[("A", 0)].anchor not in at[("A", 0)].depends_on
    assert not at[("B", 0)].from_anchor_send and at[("B", 0)].delay_s == 0.5
    assert not at[("N", 0)].from_anchor_send
    dispatch = dry_run(plan, recorded_service_time_s)
    assert dispatch[at[("A", 0)].index] == 2.5 and dispatch[at[("B", 0)].index] == 5.5
    # anchor_end keeps the recorded gap from the spawning request's end and never overlaps.
    keeping = plan_session(session(req(0, 5), req(20, 1), subagents=subs), child_offset="anchor_end")
    assert not any(step.from_anchor_send for step in keeping.steps)


def test_a_branch_recorded_at_its_spawning_request_s_end_overlaps_as_the_references_round() -> None:
    # r1 [20.83…, +23.78…]: its end in seconds equals A's spawn (44.616160248488995), but in milliseconds, as the
    # references compare, the spawn is one rounding before the end: A starts from r1's send (a trace seen held out).
    t_s, api_s, spawn_s = 20.832535248489002, 23.783624999999997, 44.616160248488995
    assert t_s + api_s == spawn_s
    subs = [sub("A", 2, spawn_s, req(spawn_s + 0.05, 1))]
    plan = plan_session(session(req(0, 5), req(t_s, api_s), req(300, 1), subagents=subs))
    first = next(step for step in plan.steps if step.agent_id == "A")
    assert first.from_anchor_send and first.delay_s == pytest.approx(spawn_s + 0.05 - t_s)


def test_a_missing_spawn_time_falls_back_to_the_first_request() -> None:
    # A without a spawn time: branch start = its first request → delay 0 after the anchor r0 [0, 1].
    plan = plan_session(session(req(0, 1), req(5, 1), subagents=[sub("A", 1, None, req(2, 1))]))
    assert timing(plan) == [(None, 0.0, ()), (0, 4.0, (2,)), (0, 0.0, ())]


def test_subagents_without_requests_add_no_steps() -> None:
    plan = plan_session(session(req(0, 1), req(2, 1), subagents=[sub("E", 1, 1.0)]))
    assert len(plan.steps) == 2 and plan.background == ()
    assert plan_session(session()).steps == ()


# ---------------------------------------------------------------------------------------------
# properties


def check_plan(sess: Session, plan: SessionPlan) -> None:
    assert len(plan.steps) == sess.request_count
    assert [s.index for s in plan.steps] == list(range(len(plan.steps)))
    expected = [(agent.agent_id, turn) for agent, _, _ in sess.agents() for turn in range(len(agent.requests))]
    assert sorted((s.agent_id, s.turn) for s in plan.steps) == sorted(expected)
    assert sorted(plan.order) == list(range(len(plan.steps)))
    position = {index: at for at, index in enumerate(plan.order)}
    for step in plan.steps:
        assert step.delay_s >= 0
        for dependency in step.depends_on:
            assert position[dependency] < position[step.index]
            assert step.index in plan.dependents[dependency]
    assert sum(len(d) for d in plan.dependents) == sum(len(s.depends_on) for s in plan.steps)
    assert set(plan.roots) == {s.index for s in plan.steps if not s.depends_on}
    assert all(plan.steps[i].background for i in plan.background)


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data())
def test_generated_sessions_give_a_dag_whose_dry_run_respects_every_dependency(data: st.DataObject) -> None:
    sess = data.draw(session_strategy("s", block_size=16))
    plan = plan_session(sess, child_offset=data.draw(st.sampled_from(CHILD_OFFSETS)))
    check_plan(sess, plan)
    service = data.draw(st.lists(st.floats(0, 100), min_size=len(plan.steps), max_size=len(plan.steps)))

    def service_time_s(step: Step) -> float:
        return service[step.index]

    dispatch = dry_run(plan, service_time_s)
    completion = [d + s for d, s in zip(dispatch, service, strict=True)]
    for step in plan.steps:
        base = dispatch if step.from_anchor_send else completion
        anchor_at = base[step.anchor] if step.anchor is not None else 0.0
        for waited in step.depends_on:
            assert dispatch[step.index] >= completion[waited] - EPS
        # Its delay after the anchor, unless a joined subagent ended after the anchor: then at that end (§3a);
        # barriers hold it further. Nothing waits longer than it must.
        last_join = max((completion[j] for j in step.joins), default=-1.0)
        due = last_join if last_join > anchor_at else anchor_at + step.delay_s
        assert dispatch[step.index] == max([due, *(completion[b] for b in step.barriers)])


@settings(max_examples=examples(100), deadline=None)
@given(sess=session_strategy("s", block_size=16))
def test_joined_subagents_are_waited_for_exactly_once_and_others_are_background(sess: Session) -> None:
    plan = plan_session(sess)
    last_step: dict[str, int] = {}
    for step in plan.steps:
        last_step[step.agent_id] = step.index
    joined = [j for s in plan.steps for j in s.joins]
    assert len(joined) == len(set(joined))
    for agent, parent, _ in sess.agents():
        if parent is None or not agent.requests:
            continue
        steps = [s for s in plan.steps if s.agent_id == agent.agent_id]
        assert steps[0].depth > 0 and [s.turn for s in steps] == list(range(len(agent.requests)))
        if not steps[-1].background:
            assert last_step[agent.agent_id] in joined


def test_the_real_weka_samples_plan_without_cycles(weka_sample_files: list[Path]) -> None:
    planned = 0
    for path in weka_sample_files:
        for sess in load_trace(path).sessions:
            recorded = [r.t - sess.root.requests[0].t for a, _, _ in sess.agents() for r in a.requests]
            for mode in CHILD_OFFSETS:
                plan = plan_session(sess, child_offset=mode)  # raises PlanError on a cycle
                check_plan(sess, plan)
                dispatch = dry_run(plan, recorded_service_time_s)
                # Steps are numbered in the same order as `recorded` (agents depth first, then turns).
                # The reference drops spawn gaps (up to ~339 s in trace_0277) and sends a join as its last
                # subagent ends, so it can only run early; the turns before any spawn replay exactly.
                assert all(d <= r + 1e-6 for d, r in zip(dispatch, recorded, strict=True))
            planned += len(plan.steps)
    assert planned == 226  # the sample's documented request count


def test_anchor_end_keeps_the_recorded_spawn_gap_that_the_reference_drops() -> None:
    # root r0 [0, 2], r1 [10, 11]; A spawned at 5 (3 s after r0's end): a0 [5.5, 6.5], joins r1.
    # branch_start (reference): a0 at r0 done + (5.5 − 5) = 2.5; anchor_end: r0 done + (5.5 − 2) = 5.5.
    sess = session(req(0, 2), req(10, 1), subagents=[sub("A", 1, 5.0, req(5.5, 1))])
    reference = plan_session(sess)
    keeping = plan_session(sess, child_offset="anchor_end")
    assert timing(reference) == [(None, 0.0, ()), (0, 8.0, (2,)), (0, 0.5, ())]
    assert timing(keeping) == [(None, 0.0, ()), (0, 8.0, (2,)), (0, 3.5, ())]
    # r1 goes out as A ends (§3a): 3.5 and 6.5.
    assert approx(dry_run(reference, recorded_service_time_s)) == [0.0, 3.5, 2.5]
    assert approx(dry_run(keeping, recorded_service_time_s)) == [0.0, 6.5, 5.5]
    with pytest.raises(ValueError, match="unknown child offset"):
        plan_session(sess, child_offset="bogus")  # type: ignore[arg-type]


def test_a_plan_is_plain_data() -> None:
    plan = plan_session(session(req(0, 1), req(2, 1), subagents=[sub("A", 1, 1.0, req(1.5, 0.2))]))
    assert msgspec.json.decode(msgspec.json.encode(plan), type=SessionPlan) == plan


# ---------------------------------------------------------------------------------------------
# session sampling


def take(n_sessions: int, mode: SessionOrder, seed: int, count: int) -> list[int]:
    return list(itertools.islice(session_order(n_sessions, mode, seed), count))


def test_sequential_order_wraps() -> None:
    assert take(3, "sequential", 7, 8) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_shuffle_draws_a_new_permutation_each_pass() -> None:
    drawn = take(10, "shuffle", 1, 50)
    passes = [drawn[i : i + 10] for i in range(0, 50, 10)]
    assert all(sorted(p) == list(range(10)) for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_random_order_draws_with_replacement() -> None:
    drawn = take(5, "random", 3, 200)
    assert set(drawn) == set(range(5))
    assert any(a == b for a, b in itertools.pairwise(drawn))  # repeats happen: with replacement


@pytest.mark.parametrize("mode", ["sequential", "shuffle", "random"])
def test_session_order_is_deterministic_under_the_seed(mode: SessionOrder) -> None:
    assert take(20, mode, 42, 100) == take(20, mode, 42, 100)
    if mode != "sequential":
        assert take(20, mode, 42, 100) != take(20, mode, 43, 100)


def test_session_order_edge_cases() -> None:
    assert take(0, "shuffle", 0, 5) == []
    assert take(1, "random", 0, 3) == [0, 0, 0]
    with pytest.raises(ValueError, match="unknown session order"):
        session_order(3, "bogus", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative"):
        session_order(-1, "sequential", 0)


def _timed(t: float, end: float) -> Request:
    return Request(t=t, model="m", in_tokens=10, out_tokens=2, api_time=end - t)


def test_barriers_tie_a_root_to_the_chains_split_out_of_it() -> None:
    """docs/agentx.md §3c: each turn also waits for the latest turn of every other stream of its scope that ended
    before it started; overlapping turns create no edge, and plain subagents are no part of the scope."""
    chain = Agent(
        agent_id="fa:000", spawn_after=1, t=1.0, subagent_type="fa", requests=[_timed(1.0, 1.5), _timed(3.0, 3.2)]
    )
    helper = Agent(agent_id="helper", spawn_after=2, t=2.6, subagent_type="Explore", requests=[_timed(2.6, 2.7)])
    root = Agent(
        requests=[_timed(0.0, 0.5), _timed(2.0, 2.5), _timed(2.9, 3.6), _timed(4.0, 4.5)], subagents=[chain, helper]
    )
    session = Session(session_id="s", root=root)
    plan = plan_session(session)
    at = {(step.agent_id, step.turn): step for step in plan.steps}
    # Root turn at 2.0 waits for the chain's turn at 1.0 (ended 1.5).
    assert at[("fa:000", 0)].index in at[("", 1)].barriers
    # The chain's turn at 3.0 waits for root turn 2.0 (ended 2.5), not 2.9 (still running at 3.0), and never
    # for `helper`, a plain subagent outside the scope.
    assert at[("fa:000", 1)].barriers == (at[("", 1)].index,)
    without = plan_session(session, barriers=False)
    assert without.steps[at[("fa:000", 1)].index].barriers == ()
    assert at[("fa:000", 0)].index not in without.steps[at[("", 1)].index].barriers


def test_barriers_drop_a_turn_that_ended_before_another_candidate_started() -> None:
    fa = Agent(
        agent_id="fa:000", spawn_after=1, t=0.6, subagent_type="fa", requests=[_timed(0.6, 0.7), _timed(5.0, 5.5)]
    )
    aux = Agent(agent_id="aux:001", spawn_after=1, t=1.0, subagent_type="aux", requests=[_timed(1.0, 1.2)])
    root = Agent(requests=[_timed(0.0, 0.5), _timed(3.5, 4.0), _timed(6.0, 6.5)], subagents=[fa, aux])
    plan = plan_session(Session(session_id="s", root=root))
    at = {(step.agent_id, step.turn): step for step in plan.steps}
    # For fa:000's turn at 5.0: root's 3.5–4.0 and aux's 1.0–1.2 both ended by then, but aux's ended before
    # root's started, so only the root's binds.
    assert at[("fa:000", 1)].barriers == (at[("", 1)].index,)


def test_barriers_drop_a_turn_that_ended_exactly_when_another_candidate_started() -> None:
    """Exact boundary touches are ordered (reference `infer_cross_stream_predecessors`): aux's 1.0–3.5 ended at
    the very moment root's 3.5–4.0 started, so for fa:000's turn at 5.0 only the root's binds."""
    fa = Agent(
        agent_id="fa:000", spawn_after=1, t=0.6, subagent_type="fa", requests=[_timed(0.6, 0.7), _timed(5.0, 5.5)]
    )
    aux = Agent(agent_id="aux:001", spawn_after=1, t=1.0, subagent_type="aux", requests=[_timed(1.0, 3.5)])
    root = Agent(requests=[_timed(0.0, 0.5), _timed(3.5, 4.0), _timed(6.0, 6.5)], subagents=[fa, aux])
    plan = plan_session(Session(session_id="s", root=root))
    at = {(step.agent_id, step.turn): step for step in plan.steps}
    assert at[("fa:000", 1)].barriers == (at[("", 1)].index,)
