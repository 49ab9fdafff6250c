"""The trace model: delta-encoded hash ids, the agent tree, recorded ends and counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, hash_id_lists, traces

from agentx.trace.model import Agent, Request, Session, Trace, delta_encode
from agentx.trace.validation import validate

# Few distinct values, so that common prefixes of every length come up.
id_lists = st.lists(st.integers(0, 3), max_size=12)


def _agent_from(full_ids: list[list[int]]) -> Agent:
    requests: list[Request] = []
    previous: list[int] = []
    for t, ids in enumerate(full_ids):
        kept, added = delta_encode(previous, ids)
        requests.append(
            Request(t=float(t), model="m", in_tokens=len(ids), out_tokens=1, hash_ids_kept=kept, hash_ids_added=added)
        )
        previous = ids
    return Agent(requests=requests)


@given(id_lists, id_lists)
def test_delta_encode_splits_at_the_longest_common_prefix(previous: list[int], current: list[int]) -> None:
    kept, added = delta_encode(previous, current)
    assert list(previous[:kept]) + list(added) == current
    # Longest: the prefix cannot be extended by one more id.
    assert kept == min(len(previous), len(current)) or previous[kept] != current[kept]
    assert previous[:kept] == current[:kept]
    assert isinstance(added, tuple)


@given(id_lists, id_lists)
def test_delta_encode_accepts_any_sequence(previous: list[int], current: list[int]) -> None:
    assert delta_encode(tuple(previous), tuple(current)) == delta_encode(previous, current)
    assert delta_encode(range(len(previous)), current) == delta_encode(list(range(len(previous))), current)


def test_delta_encode_typical_cases() -> None:
    assert delta_encode([], [1, 2]) == (0, (1, 2))
    assert delta_encode([1, 2], [1, 2, 3]) == (2, (3,))  # growth
    assert delta_encode([1, 2, 3], [1, 2]) == (2, ())  # a pure shrink adds nothing
    assert delta_encode([1, 2, 3], [1, 9, 3]) == (1, (9, 3))  # compaction rewrites after the first id
    assert delta_encode([1, 2, 3], [7]) == (0, (7,))
    assert delta_encode([1, 2], []) == (0, ())


@given(st.lists(id_lists, max_size=8) | st.integers(0, 6).flatmap(hash_id_lists))
def test_iter_hash_ids_and_hash_ids_rebuild_the_full_lists(full_ids: list[list[int]]) -> None:
    agent = _agent_from(full_ids)
    assert [list(ids) for ids in agent.iter_hash_ids()] == full_ids
    for index, ids in enumerate(full_ids):
        assert list(agent.hash_ids(index)) == ids
        assert agent.requests[index].hash_ids_len == len(ids)
    with pytest.raises(IndexError):
        agent.hash_ids(len(full_ids))


def test_first_request_keeps_nothing_even_if_encoded_against_garbage() -> None:
    # iter_hash_ids starts from an empty list: a first request's kept count cannot borrow ids.
    agent = Agent(requests=[Request(t=0, model="m", in_tokens=1, out_tokens=1, hash_ids_kept=3, hash_ids_added=(5,))])
    assert list(agent.iter_hash_ids()) == [(5,)]
    errors = [
        f
        for f in validate(Trace(sessions=[Session(session_id="s", root=agent)], block_size=1))
        if f.severity == "error"
    ]
    assert any("hash_ids_kept=3 outside [0, 0]" in f.message for f in errors)


def test_request_end_and_hash_ids_len() -> None:
    request = Request(
        t=2.5, model="m", in_tokens=10, out_tokens=1, hash_ids_kept=4, hash_ids_added=(1, 2), api_time=1.25
    )
    assert request.end == 2.5 + 1.25
    assert request.hash_ids_len == 4 + 2
    assert Request(t=2.5, model="m", in_tokens=1, out_tokens=1).end == 2.5  # unknown api_time counts as 0


def _request(t: float, api_time: float | None) -> Request:
    return Request(t=t, model="m", in_tokens=1, out_tokens=1, api_time=api_time)


def test_agent_end_follows_the_reference_precedence() -> None:
    requests = [_request(10.0, 2.0), _request(11.0, 5.0), _request(12.0, None)]
    # 1. spawn time + duration, when both are known
    assert Agent(t=10.0, duration_ms=2500, requests=requests).end == 10.0 + 2.5
    # 2. else the latest recorded request end (not the last request's)
    assert Agent(t=10.0, requests=requests).end == 11.0 + 5.0
    assert Agent(requests=requests).end == 16.0
    # 3. else the spawn time; a root without requests ends at 0
    assert Agent(t=7.0).end == 7.0
    assert Agent().end == 0.0


def test_walk_is_depth_first_with_parents_and_depths() -> None:
    leaf = Agent(agent_id="c")
    middle = Agent(agent_id="b", subagents=[leaf])
    sibling = Agent(agent_id="d")
    root = Agent(subagents=[middle, sibling])
    session = Session(session_id="s", root=root)
    walked = [(agent.agent_id, parent.agent_id if parent else None, depth) for agent, parent, depth in session.agents()]
    assert walked == [("", None, 0), ("b", "", 1), ("c", "b", 2), ("d", "", 1)]


@settings(max_examples=examples(60), deadline=None)
@given(traces())
def test_request_counts_add_up(trace: Trace) -> None:
    per_session = [sum(len(agent.requests) for agent, _, _ in session.agents()) for session in trace.sessions]
    assert [session.request_count for session in trace.sessions] == per_session
    assert trace.request_count == sum(per_session)


@settings(max_examples=examples(100), deadline=None)
@given(traces())
def test_generated_traces_are_valid(trace: Trace) -> None:
    """The strategies draw traces without validation errors (the other property tests rely on it)."""
    errors = [str(f) for f in validate(trace) if f.severity == "error"]
    assert errors == []
    for session in trace.sessions:
        ids = [agent.agent_id for agent, _, _ in session.agents()]
        assert len(set(ids)) == len(ids)
        for agent, parent, depth in session.agents():
            assert depth <= 3
            if parent is not None:
                assert agent.t is not None
                assert 0 <= agent.spawn_after <= len(parent.requests)
