"""Per-trace rules of a replay (docs/agentx.md): model mapping (§2f), context filter (§4f), output cap (§2d),
flattened agents (§3b)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from builders import make_agent, make_request, make_session, make_trace

from agentx.records.record import read_records, to_records
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.plan.play import file_order_models, model_map
from agentx.replayer.run_replay import run_replay
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace
from agentx.trace.model import Request, Session

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _req(t: float, model: str = "opus", in_tokens: int = 30, out: int = 6) -> Request:
    return make_request(t, in_tokens, out, model=model, api_time=0.1, added=(int(t),))


def _session() -> Session:
    sub = make_agent("helper", [_req(0.5, "haiku", out=9), _req(0.8, "haiku", out=9)], spawn_after=1, t=0.5)
    return make_session("s", [_req(0.0), _req(2.0), _req(3.0, "sonnet")], subagents=[sub])


def test_models_map_in_file_order_main_model_first() -> None:
    session = _session()
    assert file_order_models(session) == ["opus", "haiku", "sonnet"]
    assert model_map(session, ("A", "B")) == {"opus": "A", "haiku": "B", "sonnet": "A"}
    assert model_map(session, ("only",)) == {"opus": "only", "haiku": "only", "sonnet": "only"}


def test_the_output_cap_binds_the_root_but_never_a_subagent(tmp_path: Path) -> None:
    trace = make_trace(_session())
    with SimServer(time_scale=0.01, block_size=16) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(max_output_tokens=4, delay_scale=0, split_flattened_agents=False),
        )
        result = asyncio.run(run_replay(trace, options))
    records = to_records(read_records(result.records_path))
    assert {r.osl_server_tokens for r in records if r.depth == 0} == {4}
    assert {r.osl_server_tokens for r in records if r.depth == 1} == {9}


def test_sessions_over_the_context_limit_are_dropped_whole(tmp_path: Path) -> None:
    small = make_session("small", [_req(0.0, in_tokens=40)])
    large = make_session("large", [_req(0.0, in_tokens=40), _req(1.0, in_tokens=400)])
    trace = make_trace(small, large)
    with SimServer(time_scale=0.01, block_size=16) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(max_context_length=100, delay_scale=0),
        )
        result = asyncio.run(run_replay(trace, options))
    records = to_records(read_records(result.records_path))
    assert {r.session_id for r in records} == {"small"} and result.dropped_sessions == 1


def test_an_unserved_extra_model_is_refused_before_the_run(tmp_path: Path) -> None:
    from agentx.replayer.http.client import ModelNotServed

    with SimServer(time_scale=0.01) as sim:
        options = ReplayOptions(server=Server(url=sim.url, model=sim.model, models=("nope",)), out_dir=tmp_path / "x")
        with pytest.raises(ModelNotServed, match="nope"):
            asyncio.run(run_replay(make_trace(_session()), options))
    assert not (tmp_path / "x").exists()


def test_flattened_agents_are_replayed_as_their_own_agents(weka_sample_files: list[Path], tmp_path: Path) -> None:
    trace = load_trace(next(p for p in weka_sample_files if p.stem == "trace_0014"))
    with SimServer(time_scale=0.0005, block_size=trace.block_size) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(delay_scale=0.0002),
        )
        result = asyncio.run(run_replay(trace, options))
    records = to_records(read_records(result.records_path))
    assert result.flattened_chains >= 1 and result.errors == 0
    assert any(r.agent_id.startswith("fa:") for r in records)
    assert len(records) == trace.request_count
