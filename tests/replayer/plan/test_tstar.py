"""t* and the snapshot at t*: hand-made sessions with known answers, plus properties over generated ones."""

from __future__ import annotations

import pytest
from builders import make_agent, make_request, make_session
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.replayer.plan.steps import plan_session
from agentx.replayer.plan.tstar import snapshot, t_star
from agentx.trace.model import Request, Session


def _req(t: float, api: float = 0.5) -> Request:
    return make_request(t, 10, 2, api_time=api)


def _session() -> Session:
    """Root turns at 0, 10, 20, 30 (each 0.5 s long).

    - `early`: spawned after root turn 0, runs 1–3, joined by root turn 1 (10) — finished by t* = 15;
    - `across`: spawned after root turn 1, runs 11, 13, 16, 18; joined by root turn 3 (30) — running at t* = 15;
    - `late`: spawned after root turn 2 (20), runs 21–22: starts after t*, its spawning turn is replayed;
    - `pending`: spawned after root turn 1 (10, ends 10.5), first turn at 16: starts after t* = 15 from a
      turn completed by t* — live at its first turn, due 1 s after the start;
    - `cut`: spawned by the root turn that runs 14.0–15.5, first turn at 15.8: t* = 15 falls inside its
      spawning request, which had started, so it is live at its turn 0 (the reference's rule).
    """
    early = make_agent("early", [_req(1.0), _req(2.0), _req(3.0)], spawn_after=1, t=1.0)
    across = make_agent("across", [_req(11.0), _req(13.0), _req(16.0), _req(18.0)], spawn_after=2, t=11.0)
    pending = make_agent("pending", [_req(16.0), _req(17.0)], spawn_after=2, t=16.0)
    late = make_agent("late", [_req(21.0), _req(22.0)], spawn_after=4, t=21.0)
    cut = make_agent("cut", [_req(15.8), _req(16.5)], spawn_after=3, t=15.8)
    return make_session(
        "s",
        [_req(0.0), _req(10.0), _req(14.0, api=1.5), _req(20.0), _req(30.0)],
        subagents=[early, across, pending, cut, late],
    )


def _index(plan_steps: object, agent: str, turn: int) -> int:
    for step in plan_steps:  # type: ignore[attr-defined]
        if step.agent_id == agent and step.turn == turn:
            return int(step.index)
    raise KeyError((agent, turn))


def test_the_snapshot_at_15_s() -> None:
    plan = plan_session(_session())
    snap = snapshot(plan, 15.0)

    def at(agent: str, turn: int) -> int:
        return _index(plan.steps, agent, turn)

    # Root: turns at 0, 10, 14 happened; it resumes at 20 (due 5 s in), primed by its turn at 14 (lead 1 s).
    assert {at("", 0), at("", 1), at("", 2)} <= snap.done
    assert snap.first_live[at("", 3)] == pytest.approx(5.0)
    assert snap.primers[at("", 2)] == pytest.approx(1.0)
    # `early` finished before t*: skipped whole.
    assert {at("early", i) for i in range(3)} <= snap.skipped
    # `across` is mid-way: resumes at its turn at 16 (due 1 s), primed by its turn at 13.
    assert {at("across", 0), at("across", 1)} <= snap.done
    assert snap.first_live[at("across", 2)] == pytest.approx(1.0)
    assert snap.primers[at("across", 1)] == pytest.approx(2.0)
    # `pending` starts after t* from a turn that completed by t* (10.5 ≤ 15): live at its turn 0, no primer.
    assert snap.first_live[at("pending", 0)] == pytest.approx(1.0)
    assert at("pending", 0) not in snap.primers and not any(plan.steps[p].agent_id == "pending" for p in snap.primers)
    # `cut` starts after t* and its spawning turn (14.0–15.5) was in flight at t*: it had started, so `cut` is
    # live at its turn 0, due 0.8 s in (reference: `trajectory_source.py`, `spawn_turn_not_completed`).
    assert snap.first_live[at("cut", 0)] == pytest.approx(0.8)
    assert not {at("cut", 0), at("cut", 1)} & snap.not_sent
    # At t* = 13.9 its spawning turn (14.0) had not started: the replay sends that turn, which spawns `cut`.
    early_snap = snapshot(plan, 13.9)
    assert at("cut", 0) not in early_snap.first_live and at("cut", 0) not in early_snap.not_sent
    # `late` is spawned by a root turn replayed after t*: ordinary plan steps, in no snapshot set.
    for turn in (0, 1):
        index = at("late", turn)
        assert index not in snap.not_sent and index not in snap.first_live
    assert snap.sendable


def test_a_first_live_root_turn_that_joins_a_live_subagent_is_waiting() -> None:
    plan = plan_session(_session())
    snap = snapshot(plan, 28.0)
    root_last = _index(plan.steps, "", 4)
    assert root_last in snap.first_live
    # `across` ended long before 28 and is skipped, so the root's last turn waits for nobody...
    assert root_last not in snap.waiting
    # ...while at t* = 15 the root's turn at 20 waits for no join, and at 12 the turn at 14 joins nobody either;
    # the root's turn at 30 joins `across`, which at t* = 15 is live.
    snap15 = snapshot(plan, 15.0)
    assert root_last not in snap15.first_live


def test_t_star_is_seeded_per_trace_and_lane_inside_the_window() -> None:
    plan = plan_session(_session())
    values = {t_star(7, "s", lane, plan) for lane in range(20)}
    assert len(values) == 20
    assert all(0.25 * 30 <= v <= 0.75 * 30 for v in values)
    assert t_star(7, "s", 3, plan) == t_star(7, "s", 3, plan)
    assert t_star(7, "s", 3, plan) != t_star(8, "s", 3, plan)
    assert t_star(7, "s", 3, plan, (0.0, 0.0)) == 0.0
    with pytest.raises(ValueError, match="window"):
        t_star(7, "s", 3, plan, (0.8, 0.2))


@st.composite
def _sessions(draw: st.DrawFn) -> Session:
    """A root chain with subagents at random places and times (turns strictly later than their spawn)."""
    n_root = draw(st.integers(1, 6))
    gaps = draw(st.lists(st.floats(0.6, 5.0), min_size=n_root, max_size=n_root))
    times = [sum(gaps[:i]) for i in range(n_root)]
    subagents = []
    for k in range(draw(st.integers(0, 3))):
        after = draw(st.integers(1, n_root))
        start = times[after - 1] + draw(st.floats(0.5, 3.0))
        count = draw(st.integers(1, 4))
        subagents.append(make_agent(f"a{k}", [_req(start + 0.7 * i) for i in range(count)], spawn_after=after, t=start))
    return make_session("g", [_req(t) for t in times], subagents=subagents)


@settings(max_examples=examples(200), deadline=None)
@given(_sessions(), st.floats(0.0, 1.0))
def test_snapshot_properties(session: Session, where: float) -> None:
    plan = plan_session(session)
    starts = [s.request.t for s in plan.steps]
    t = min(starts) + where * (max(starts) - min(starts))
    snap = snapshot(plan, t)
    # The sets are disjoint; done steps started before t*, first-live ones at or after it.
    assert not snap.done & snap.skipped and not set(snap.first_live) & snap.not_sent
    assert all(plan.steps[i].request.t < t for i in snap.done)
    assert all(plan.steps[i].request.t >= t for i in snap.first_live)
    # A primer is a done step: the turn right before a first-live step of the same agent.
    for primer, lead in snap.primers.items():
        step = plan.steps[primer]
        assert primer in snap.done and lead == pytest.approx(t - step.request.t)
        assert any(
            plan.steps[f].agent_id == step.agent_id and plan.steps[f].turn == step.turn + 1 for f in snap.first_live
        )
    # Every step not settled at t* either is first live or hangs on a live step through its anchor.
    for step in plan.steps:
        if step.index in snap.not_sent or step.index in snap.first_live:
            continue
        assert step.anchor is not None and step.anchor not in snap.not_sent
