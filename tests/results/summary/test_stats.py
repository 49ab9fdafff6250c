"""inspect's figures on a tiny trace whose answers are computed by hand in the comments."""

from __future__ import annotations

import itertools

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, traces

from agentx.replayer.plan.arrivals import trace_arrivals
from agentx.replayer.plan.steps import plan_session
from agentx.trace.model import Agent, Request, Session, Trace, delta_encode
from agentx.trace.stats import (
    StartOrderHits,
    join_index,
    lru_hit,
    parse_token_counts,
    prefix_cache_hits,
    trace_stats,
)


def _agent(calls: list[tuple[float, float | None, list[int]]], **fields: object) -> Agent:
    """An agent from (t, api_time, full hash ids) triples."""
    requests: list[Request] = []
    previous: list[int] = []
    for t, api_time, ids in calls:
        kept, added = delta_encode(previous, ids)
        requests.append(
            Request(
                t=t,
                api_time=api_time,
                model="m",
                in_tokens=4 * len(ids),
                out_tokens=1,
                hash_ids_kept=kept,
                hash_ids_added=added,
            )
        )
        previous = ids
    return Agent(requests=requests, **fields)  # type: ignore[arg-type]


def tiny_trace(scope: str = "session", b_start_s: float = 0.0) -> Trace:
    root_a = _agent([(0, 1, [1, 2, 3]), (2, 1, [1, 2, 3, 4, 5]), (3.5, 1, [1, 2, 3, 4, 5, 6]), (10, 1, [7, 1, 2])])
    # Spawned after r1 (t=2); ends at 4.5, so r3 (t=10) is the first parent turn at or after its end.
    root_a.subagents.append(_agent([(2.5, 2, [1, 2, 3, 4, 5, 9])], agent_id="explore", spawn_after=2, t=2.5))
    # Spawned after the last parent turn: nobody waits for it.
    root_a.subagents.append(_agent([(11, 1, [20])], agent_id="bg", spawn_after=4, t=11))
    root_b = _agent([(0, 0.4, [1, 2]), (0.5, None, [1, 2, 3])])
    return Trace(
        sessions=[Session(session_id="A", root=root_a), Session(session_id="B", root=root_b, start_s=b_start_s)],
        block_size=4,
        hash_id_scope=scope,  # type: ignore[arg-type]
    )


def test_theoretical_hit_matches_the_hand_computed_value() -> None:
    hits, totals = prefix_cache_hits(tiny_trace())
    # Rows: A r0..r3, A/explore s0, A/bg b0, B r0, B r1.
    # A r0: nothing cached → 0/3. r1 (t=2): r0 ended at 1 → {1,2,3} → 3/5.
    # r2 (t=3.5): r1 ended at 3 → {1..5} → 5/6. r3 (t=10): leading id 7 never seen → 0/3 (1, 2 don't count).
    # s0 (t=2.5): r1 still running (ends 3), so only r0's {1,2,3} → 3/6. b0: id 20 unseen → 0/1.
    # B is its own namespace: r0 0/2; r1 (t=0.5): r0 ended at 0.4 → {1,2} → 2/3.
    assert hits.tolist() == [0, 3, 5, 0, 3, 0, 0, 2]
    assert totals.tolist() == [3, 5, 6, 3, 6, 1, 2, 3]
    stats = trace_stats(tiny_trace())
    assert (stats.theoretical_hit.hits, stats.theoretical_hit.total) == (13, 29)


def test_non_causal_rule_counts_blocks_from_their_producers_start() -> None:
    hits, _ = prefix_cache_hits(tiny_trace(), causal=False)
    # Only s0 changes: r1 started at 2 ≤ 2.5, so {1..5} are available → 5/6.
    assert hits.tolist() == [0, 3, 5, 0, 5, 0, 0, 2]


def test_global_scope_shares_blocks_across_sessions() -> None:
    hits, _ = prefix_cache_hits(tiny_trace(scope="global", b_start_s=5.0))
    # B now runs at absolute 5 and 5.5 and sees A's {1..5}: B r0 2/2, B r1 3/3.
    assert hits.tolist()[-2:] == [2, 3]
    session_scoped, _ = prefix_cache_hits(tiny_trace(scope="session", b_start_s=5.0))
    assert session_scoped.tolist()[-2:] == [0, 2]


def test_lru_with_room_for_everything_equals_the_infinite_cache() -> None:
    for scope in ("session", "global"):
        trace = tiny_trace(scope=scope, b_start_s=5.0)
        hits, totals = prefix_cache_hits(trace)
        lru = lru_hit(trace, capacity_tokens=10**9)
        assert (lru.hits, lru.total) == (int(hits.sum()), int(totals.sum()))


def test_lru_of_zero_capacity_hits_nothing_and_small_caches_hit_less() -> None:
    trace = tiny_trace()
    assert lru_hit(trace, 0).hits == 0
    # Two blocks (8 tokens): A r1 finds 1 evicted by 2, 3 → its leading run is 0.
    assert lru_hit(trace, 8).hits < lru_hit(trace, 10**9).hits


def test_tree_shape_counts_joined_and_background_subagents() -> None:
    trace = tiny_trace()
    root = trace.sessions[0].root
    assert join_index(root, root.subagents[0]) == 3
    assert join_index(root, root.subagents[1]) is None
    shape = trace_stats(trace).shape
    assert (shape.subagents, shape.joined, shape.background, shape.max_depth) == (2, 1, 1, 1)
    assert (shape.spawn_groups, shape.max_fan_out) == (2, 1)


def test_distributions_and_totals() -> None:
    stats = trace_stats(tiny_trace())
    assert stats.requests == 8 and stats.sessions == 2 and stats.agents == 4
    in_tokens = [4 * n for n in (3, 5, 6, 3, 6, 1, 2, 3)]
    assert stats.input_tokens == sum(in_tokens)
    assert stats.in_tokens.p50 == pytest.approx(float(np.percentile(in_tokens, 50)))
    assert stats.in_tokens.max == max(in_tokens)
    # Session A: peak in+out is r2 or s0 (24 + 1); requests 6 in A, 2 in B.
    assert stats.peak_context_tokens.max == 25
    assert stats.requests_per_session.max == 6


def test_turn_gaps_and_session_start_gaps_are_computed_from_the_recorded_times() -> None:
    stats = trace_stats(tiny_trace(b_start_s=5.0))
    # A: r1 2 − (0 + 1) = 1, r2 3.5 − (2 + 1) = 0.5, r3 10 − (3.5 + 1) = 5.5; the subagents have one turn each;
    # B: r1 0.5 − (0 + 0.4) = 0.1. Sessions start at 0 (A) and 5 + 0 (B).
    assert stats.turn_gap_s.count == 4
    assert stats.turn_gap_s.mean == pytest.approx((1 + 0.5 + 5.5 + 0.1) / 4)
    assert stats.turn_gap_s.min == pytest.approx(0.1) and stats.turn_gap_s.max == pytest.approx(5.5)
    assert (stats.session_start_gap_s.count, stats.session_start_gap_s.mean) == (1, 5.0)
    assert stats.think_time_s.count == 0  # none recorded: no value stands for it


def test_a_trace_of_start_times_alone_has_its_gaps_as_turn_gaps() -> None:
    """A session recorded as start times only (no think time, no API time), its requests 1 s apart."""
    root = _agent([(t, None, [1]) for t in (0.0, 1.0, 2.0, 3.0)])
    trace = Trace(sessions=[Session(session_id="s", root=root)], block_size=4)
    stats = trace_stats(trace)
    assert stats.think_time_s.count == 0 and stats.api_time_s.count == 0
    assert (stats.turn_gap_s.count, stats.turn_gap_s.min, stats.turn_gap_s.max) == (3, 1.0, 1.0)


@settings(max_examples=examples(30), deadline=None)  # ~150 ms an example, drawing the trace
@given(trace=traces(max_sessions=4))
def test_the_gaps_are_what_the_replays_plan_and_arrivals_wait(trace: Trace) -> None:
    """The turn gaps are the planned delays of the agents' later turns (as the trace lists its agents), and the
    session start gaps those between `--mode trace`'s arrivals."""
    stats = trace_stats(trace)
    planned = [step.delay_s for s in trace.sessions for step in plan_session(s, barriers=False).steps if step.turn > 0]
    assert stats.turn_gap_s.count == len(planned)
    if planned:
        assert stats.turn_gap_s.mean == pytest.approx(float(np.mean(planned)), abs=1e-9)
        assert (stats.turn_gap_s.min, stats.turn_gap_s.max) == (min(planned), max(planned))
    played = msgspec.structs.replace(trace, sessions=[s for s in trace.sessions if s.request_count])
    arrivals = np.diff([offset for offset, _ in trace_arrivals(played)])
    assert stats.session_start_gap_s.count == len(arrivals)
    if len(arrivals):
        assert stats.session_start_gap_s.max == pytest.approx(float(arrivals.max()), abs=1e-9)
        assert stats.session_start_gap_s.mean == pytest.approx(float(arrivals.mean()), abs=1e-9)


def test_parse_token_counts() -> None:
    assert parse_token_counts("1e6, 2.5e7,100") == [1_000_000, 25_000_000, 100]
    with pytest.raises(ValueError, match="not a non-negative"):
        parse_token_counts("-1")


@settings(max_examples=examples(100), deadline=None)  # ~150 ms an example; the sweeps run thorough's 2,000
@given(
    trace=traces(max_sessions=6),
    starts=st.lists(st.sampled_from([0.0, 0.5, 1.0, 7.5]), min_size=6, max_size=6) | st.none(),
    data=st.data(),
)
def test_start_order_hits_equal_the_whole_traces_in_any_order_of_asking(
    trace: Trace, starts: list[float] | None, data: st.DataObject
) -> None:
    """Counted one session at a time, as far as each asks, the global hits are the whole trace's, row for row;
    sessions sharing a start (ties broken by row) included."""
    sessions = [
        msgspec.structs.replace(session, start_s=starts[index]) if starts else session
        for index, session in enumerate(trace.sessions)
    ]
    trace = msgspec.structs.replace(trace, sessions=sessions, hash_id_scope="global")
    expected_hits, expected_totals = prefix_cache_hits(trace, causal=False)
    first_rows = [0, *itertools.accumulate(session.request_count for session in sessions)]
    counter = StartOrderHits([session.start_s for session in sessions], sessions.__getitem__)
    asked = data.draw(st.permutations(range(len(sessions))))
    for index in asked:
        hits, totals = counter.of(index)
        rows = slice(first_rows[index], first_rows[index + 1])
        assert hits.tolist() == expected_hits[rows].tolist()
        assert totals.tolist() == expected_totals[rows].tolist()
    with pytest.raises(IndexError):
        counter.of(len(sessions))


def test_start_order_hits_break_a_tie_by_row_across_sessions_added_late() -> None:
    """Session 1 starts first, but its second request starts with session 0's first: session 0's comes first (row
    order), so session 1's sees its blocks, even when session 1 is asked for first."""
    early = Session(session_id="b", start_s=0.0, root=_agent([(0.0, 0.1, [7]), (1.0, 0.1, [1, 2])]))
    late = Session(session_id="a", start_s=1.0, root=_agent([(0.0, 0.1, [1, 2])]))
    sessions = [late, early]
    counter = StartOrderHits([session.start_s for session in sessions], sessions.__getitem__)
    assert counter.of(1)[0].tolist() == [0, 2]
    assert counter.of(0)[0].tolist() == [0]
    whole, _ = prefix_cache_hits(Trace(sessions=sessions, block_size=4, hash_id_scope="global"), causal=False)
    assert whole.tolist() == [0, 0, 2]
