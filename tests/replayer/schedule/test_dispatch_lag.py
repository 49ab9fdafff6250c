"""Dispatch lag is stamped from when a request was due, whatever its body took to build: a deliberately slow build
shows as lag (and the run says it fell behind), and lanes due together are not sent one build after another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from builders import growing_chain, make_session, make_trace

from agentx.records.record import RequestRecord, read_records, to_records
from agentx.replayer.http.http1 import Body
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server, TraceLoad
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule import runner as runner_module
from agentx.replayer.schedule.recorder import LATE_NOTICE_S
from agentx.sim.process import SimServer
from agentx.trace.model import Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
SLOW_S = LATE_NOTICE_S + 0.3
"""Longer than the lateness the run announces."""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK) as server:
        yield server


def _session(session_id: str, turns: int, base: int) -> Session:
    """`turns` turns 1 s apart, 0.5 s each, each adding 4 blocks (ids from `base`) to the context."""
    return make_session(
        session_id, growing_chain(turns, first_in_tokens=64, in_tokens_step=64, base=base, block_size=BLOCK)
    )


def _replay(
    sim: SimServer, out: Path, trace: Trace, lanes: int, sessions: int, open_loop: bool = False
) -> tuple[RunResult, list[RequestRecord]]:
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=TraceLoad() if open_loop else ClosedLoad(concurrency=lanes),
        scenario=Scenario(delay_scale=0.0, sessions=sessions),
        runtime=Runtime(grace_s=5.0),
    )
    result = asyncio.run(run_replay(trace, options))
    records = sorted(to_records(read_records(result.records_path)), key=lambda record: record.sent_ns)
    return result, records


def _slow_builds(monkeypatch: pytest.MonkeyPatch, slow: Any, seconds: float = SLOW_S) -> None:
    """Builds whose blocks take `seconds` to make where `slow(prepared, step)` says so, in groups between which the
    loop goes on (so the timestamps it takes meanwhile stay right)."""
    real_warm = runner_module.Runner._warm

    async def warm(self: runner_module.Runner, prepared: Any, indices: Any) -> None:
        indices = list(indices)
        if any(slow(prepared, prepared.plan.steps[index]) for index in indices):
            await asyncio.sleep(seconds)
        await real_warm(self, prepared, indices)

    monkeypatch.setattr(runner_module.Runner, "_warm", warm)
    monkeypatch.setattr(runner_module, "WARM_TOKENS", 1)


def test_a_turn_whose_build_outlasts_its_anchor_is_late_by_the_build_and_said(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_builds(monkeypatch, lambda prepared, step: step.turn == 2)
    result, records = _replay(sim, tmp_path / "run", make_trace(_session("s", 4, 0), block_size=BLOCK), 1, 1)
    late = next(record for record in records if record.turn == 2)
    previous = next(record for record in records if record.turn == 1)
    assert late.scheduled_ns == previous.end_ns  # due as its anchor ended (no think time)
    assert late.dispatch_lag_s >= SLOW_S - 0.2
    assert all(record.dispatch_lag_s < 0.2 for record in records if record.turn != 2)
    assert any("fell behind its schedule" in notice and "turn 2" in notice for notice in result.notices)


def test_a_lanes_next_tree_is_due_as_its_last_one_ended_however_long_it_takes_to_build(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane's second tree: due at its first tree's end, so the build of its first turn is dispatch lag."""
    _slow_builds(monkeypatch, lambda prepared, step: prepared.plan.session_id == "b" and step.turn == 0)
    trace = make_trace(_session("a", 2, 0), _session("b", 2, 100), block_size=BLOCK)
    result, records = _replay(sim, tmp_path / "run", trace, 1, 2)
    first_tree_end = max(record.end_ns for record in records if record.session_id == "a")
    second = next(record for record in records if record.session_id == "b" and record.turn == 0)
    assert second.scheduled_ns == first_tree_end
    assert second.dispatch_lag_s >= SLOW_S - 0.2
    assert any("fell behind its schedule" in notice for notice in result.notices)


def test_lanes_due_together_go_together_however_long_their_bodies_take(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four lanes whose first bodies take 0.3 s each: built before the run's origin, so the four first requests are
    due, and sent, together."""
    lanes = 4
    monkeypatch.setattr(runner_module, "WARM_TOKENS", 1)
    real_build = BodyBuilder.build

    def slow_first(self: BodyBuilder, tree: Any, step: Any, phase: Any = "profiling") -> tuple[int, Body]:
        if step.turn == 0:
            time.sleep(0.3)
        return real_build(self, tree, step, phase)

    monkeypatch.setattr(BodyBuilder, "build", slow_first)
    trace = make_trace(*(_session(f"s{i}", 2, 100 * i) for i in range(lanes)), block_size=BLOCK)
    _, records = _replay(sim, tmp_path / "run", trace, lanes, lanes)
    firsts = [record for record in records if record.turn == 0]
    assert len(firsts) == lanes
    assert len({record.scheduled_ns for record in firsts}) == 1  # one origin
    assert max(record.sent_ns for record in firsts) - min(record.sent_ns for record in firsts) < 50_000_000
    assert all(record.dispatch_lag_s < 0.05 for record in firsts)


def test_open_loop_trees_arriving_together_are_built_ahead_and_go_out_when_due(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four trees arriving within 30 ms, a second into the run, whose first bodies take 0.3 s each: set up half a
    second ahead of their arrival, all four go out when due (made as each arrives, each would be ~0.3 s late)."""
    _slow_builds(monkeypatch, lambda prepared, step: prepared.plan.session_id != "first" and step.turn == 0, 0.3)
    sessions = [_session("first", 1, 0)]
    for i in range(4):
        late = _session(f"s{i}", 2, 100 * (i + 1))
        requests = [msgspec.structs.replace(request, t=request.t + 1.0 + 0.01 * i) for request in late.root.requests]
        sessions.append(make_session(late.session_id, requests))
    _, records = _replay(sim, tmp_path / "run", make_trace(*sessions, block_size=BLOCK), 1, 5, open_loop=True)
    firsts = [record for record in records if record.turn == 0 and record.session_id != "first"]
    assert len(firsts) == 4
    assert all(record.dispatch_lag_s < 0.1 for record in firsts), [record.dispatch_lag_s for record in firsts]
