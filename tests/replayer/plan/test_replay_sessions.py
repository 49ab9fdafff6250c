"""`ReplaySessions`: the run's view of the trace, each session split and warped when first played (docs/agentx.md
§3b, §4c)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentx.replayer.plan.sessions import ReplaySessions
from agentx.trace.chains import DEFAULT_RULES, split_trace
from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Request, Session, Trace
from agentx.trace.warp import warp_idle_gaps


def _flattened(session_id: str) -> Session:
    """A root whose turns interleave two conversations (ids 1… and 9…): one hidden agent."""
    requests = [
        Request(t=0.0, model="m", in_tokens=64, out_tokens=8, api_time=0.1, hash_ids_added=(1,)),
        Request(t=1.0, model="m", in_tokens=64, out_tokens=8, api_time=0.1, hash_ids_kept=0, hash_ids_added=(9,)),
        Request(t=2.0, model="m", in_tokens=128, out_tokens=8, api_time=0.1, hash_ids_kept=0, hash_ids_added=(1, 2)),
        Request(t=3.0, model="m", in_tokens=128, out_tokens=8, api_time=0.1, hash_ids_kept=0, hash_ids_added=(9, 10)),
    ]
    return Session(session_id=session_id, root=Agent(requests=requests))


def test_sessions_are_split_when_first_played_and_only_then() -> None:
    trace = Trace(sessions=[_flattened("a"), _flattened("b")], block_size=64)
    sessions = ReplaySessions(trace, chain_rules=DEFAULT_RULES)
    assert sessions.chains_by_session == {} and len(sessions) == 2
    first = sessions.session(1)
    assert sessions.chains_by_session == {"b": 1} and sessions.flattened_chains == 1
    assert sessions.session(1) is first  # cached, counted once
    assert sessions.flattened_chains == 1
    split, _ = split_trace(trace)
    assert msgspec.to_builtins(first) == msgspec.to_builtins(split.sessions[1])
    assert msgspec.to_builtins(sessions.whole()) == msgspec.to_builtins(split)
    assert sessions.chains_by_session == {"a": 1, "b": 1}


def test_a_one_request_session_is_not_searched_for_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mooncake row is a session of one request: nothing to split, and 6,000 of them took ~0.2 s to search."""
    import agentx.replayer.plan.sessions as module
    from agentx.trace.chains import split_flattened_agents

    alone = Session(session_id="one", root=Agent(requests=_flattened("x").root.requests[:1]))
    trace = Trace(sessions=[alone, _flattened("two")], block_size=64)
    searched: list[str] = []

    def spy(session: Session, *args: Any, **kwargs: Any) -> Session:
        searched.append(session.session_id)
        return split_flattened_agents(session, *args, **kwargs)

    monkeypatch.setattr(module, "split_flattened_agents", spy)
    sessions = ReplaySessions(trace, chain_rules=DEFAULT_RULES)
    assert sessions.session(0) is alone and sessions.session(1) is not trace.sessions[1]
    assert searched == ["two"] and sessions.chains_by_session == {"one": 0, "two": 1}


def test_without_rules_sessions_are_played_as_recorded() -> None:
    trace = Trace(sessions=[_flattened("a")], block_size=64)
    sessions = ReplaySessions(trace, chain_rules=None)
    assert sessions.session(0) is trace.sessions[0] and sessions.flattened_chains == 0


def test_over_long_sessions_are_dropped_at_start_and_warp_follows_the_split() -> None:
    long = _flattened("long")
    long.root.requests[3] = msgspec.structs.replace(long.root.requests[3], t=500.0, in_tokens=4096)
    trace = Trace(sessions=[_flattened("a"), long], block_size=64)
    kept = ReplaySessions(trace, chain_rules=DEFAULT_RULES, max_context_length=1000, warp_cap_s=0.5)
    assert kept.dropped == ["long"] and len(kept) == 1 and [s.session_id for s in kept.trace.sessions] == ["a"]
    everything = ReplaySessions(trace, chain_rules=DEFAULT_RULES, warp_cap_s=0.5)
    split, _ = split_trace(trace)
    assert msgspec.to_builtins(everything.session(1)) == msgspec.to_builtins(warp_idle_gaps(split.sessions[1], 0.5))


def test_a_real_flattened_trace_splits_as_the_whole_trace_does(weka_sample_files: list[Path]) -> None:
    trace = load_trace(next(p for p in weka_sample_files if p.stem == "trace_0014"))
    sessions = ReplaySessions(trace, chain_rules=DEFAULT_RULES)
    split, report = split_trace(trace)
    assert msgspec.to_builtins(sessions.whole()) == msgspec.to_builtins(split)
    assert sessions.flattened_chains == report.total.chains >= 1


def test_replay_hits_count_a_block_once_its_request_started() -> None:
    """The records' theoretical hit follows the reference (docs/agentx.md §6): a block is seen once the request
    that sends it has started, so a request starting while another with the same prefix still runs hits it."""
    from agentx.replayer.plan.play import Hits

    first = Request(t=0.0, model="m", in_tokens=64, out_tokens=1, api_time=10.0, hash_ids_added=(1, 2, 3, 4))
    overlapping = Request(t=1.0, model="m", in_tokens=64, out_tokens=1, api_time=1.0, hash_ids_added=(1, 2, 3, 4))
    sub = Agent(agent_id="a", spawn_after=1, t=1.0, requests=[overlapping])
    trace = Trace(sessions=[Session(session_id="s", root=Agent(requests=[first], subagents=[sub]))], block_size=16)
    hits, totals = Hits(ReplaySessions(trace, chain_rules=None)).of(0)
    assert list(hits) == [0, 4] and list(totals) == [4, 4]
