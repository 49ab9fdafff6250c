"""The committed sample traces: they load, validate, show what traces/README.md promises, and are current."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from paths import TRACES

from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Session, Trace
from agentx.trace.validation import validate
from scripts.make_sample_traces import (
    ARROW_NAME,
    MOONCAKE_NAME,
    ROOT_MODEL,
    SUBAGENT_MODEL,
    WEKA_NAME,
    write_samples,
)

JOIN_EPSILON_S = 1e-6  # docs/agentx.md §3a: the tolerance when a parent request joins a subagent


@pytest.fixture(scope="module")
def agentic() -> Trace:
    return load_trace(TRACES / ARROW_NAME)


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace(TRACES / MOONCAKE_NAME)


def _subagents(session: Session) -> list[tuple[Agent, Agent, int]]:
    """(subagent, parent, depth) for every subagent of a session."""
    return [(agent, parent, depth) for agent, parent, depth in session.agents() if parent is not None]


def _joined_parallel_groups(trace: Trace) -> list[list[Agent]]:
    """Groups of >= 2 concurrent subagents spawned after one parent request and joined by its next one."""
    groups: list[list[Agent]] = []
    for session in trace.sessions:
        for parent, _, _ in session.agents():
            by_spawn: dict[int, list[Agent]] = defaultdict(list)
            for sub in parent.subagents:
                by_spawn[sub.spawn_after].append(sub)
            for spawn_after, subs in by_spawn.items():
                if len(subs) < 2 or spawn_after >= len(parent.requests):
                    continue
                joining = parent.requests[spawn_after]
                joined = all(joining.t + JOIN_EPSILON_S >= sub.end for sub in subs)
                concurrent = max(sub.t or 0.0 for sub in subs) < min(sub.end for sub in subs)
                if joined and concurrent:
                    groups.append(subs)
    return groups


def test_the_committed_samples_load_and_validate_without_errors(agentic: Trace, mooncake: Trace) -> None:
    for trace in (agentic, mooncake):
        errors = [finding for finding in validate(trace) if finding.severity == "error"]
        assert not errors, errors


def test_the_arrow_and_weka_samples_hold_the_same_sessions(agentic: Trace) -> None:
    weka = load_trace(TRACES / WEKA_NAME)
    assert weka.block_size == agentic.block_size == 64
    assert weka.hash_id_scope == agentic.hash_id_scope == "session"
    assert weka.sessions == agentic.sessions


def test_the_agentic_sample_has_the_promised_shape(agentic: Trace) -> None:
    assert len(agentic.sessions) == 20
    assert _joined_parallel_groups(agentic), "no joined parallel subagent group"
    models = {
        request.model for session in agentic.sessions for agent, _, _ in session.agents() for request in agent.requests
    }
    assert models == {ROOT_MODEL, SUBAGENT_MODEL}
    assert any(depth >= 2 for session in agentic.sessions for _, _, depth in _subagents(session)), "no nested subagent"
    assert all(sub.subagent_type and sub.status == "completed" for s in agentic.sessions for sub, _, _ in _subagents(s))


def test_the_agentic_sample_has_a_background_subagent(agentic: Trace) -> None:
    background = [
        sub
        for session in agentic.sessions
        for sub, parent, _ in _subagents(session)
        if all(request.t + JOIN_EPSILON_S < sub.end for request in parent.requests[sub.spawn_after :])
    ]
    assert background


def test_the_agentic_sample_has_a_compaction(agentic: Trace) -> None:
    compactions = [
        (session.session_id, index)
        for session in agentic.sessions
        for agent, _, _ in session.agents()
        for index, (previous, request) in enumerate(zip(agent.requests, agent.requests[1:], strict=False), start=1)
        if request.hash_ids_len < previous.hash_ids_len and request.hash_ids_kept <= previous.hash_ids_len // 3
    ]
    assert compactions


def test_the_agentic_sample_keeps_the_recording_conventions(agentic: Trace) -> None:
    for session in agentic.sessions:
        rows = [request for agent, _, _ in session.agents() for request in agent.requests]
        assert sum(request.think_time is None for request in rows) == 1, session.session_id
        assert all(request.think_time is None or request.think_time >= 0 for request in rows)
        for agent, _, _ in session.agents():
            for request in agent.requests:
                assert request.hash_ids_len == -(-request.in_tokens // agentic.block_size)
                assert (request.ttft is not None) == (request.type == "s")
            assert [r.stop for r in agent.requests] == ["tool_use"] * (len(agent.requests) - 1) + ["end_turn"]


def test_the_mooncake_sample_is_open_loop_with_a_shared_first_block(mooncake: Trace) -> None:
    assert (mooncake.block_size, mooncake.hash_id_scope, len(mooncake.sessions)) == (512, "global", 200)
    starts = [session.start_s for session in mooncake.sessions]
    assert starts == sorted(starts) and starts[-1] > 0
    for session in mooncake.sessions:
        (request,) = session.root.requests
        ids = session.root.hash_ids(0)
        assert ids[0] == 0
        assert len(ids) == -(-request.in_tokens // 512)


def test_the_committed_samples_are_what_the_generator_writes(tmp_path: Path) -> None:
    for path in write_samples(tmp_path):
        committed = TRACES / path.name
        assert committed.read_bytes() == path.read_bytes(), f"traces/{path.name} is stale: run `make samples`"
