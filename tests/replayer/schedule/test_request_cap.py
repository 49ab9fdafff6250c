"""`--num-requests` (`Scenario.num_requests`): a cap on the requests sent in the profiling phase, end to end against
the simulator. At the cap no new request or tree starts, the requests in flight finish (the grace period does not cut
them), and the run ends; run.json says so."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import growing_chain, make_session, make_trace
from paths import SAMPLE_TRACE

from agentx.records.record import read_records
from agentx.replayer.options.replay import AgentxLoad, ClosedLoad, RateLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.run.replay import ReplayResult, replay_sync
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace, save_trace
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.02, block_size=BLOCK) as server:
        yield server


def _trace(sessions: int = 2, turns: int = 2, out: int = 8) -> Trace:
    """`sessions` sessions of `turns` growing turns each: a pass is `sessions × turns` requests."""
    made = []
    for index in range(sessions):
        requests = growing_chain(
            turns, first_in_tokens=32, in_tokens_step=32, out=out, base=1000 * index, block_size=BLOCK
        )
        made.append(make_session(f"s{index}", requests))
    return make_trace(*made, block_size=BLOCK)


def _run(sim: SimServer, out: Path, trace: Trace, **parts: Any) -> tuple[ReplayResult, dict[str, Any]]:
    options = ReplayOptions(server=Server(url=sim.url, model=sim.model), out_dir=out, **parts)
    result = replay_sync(trace, options)
    return result, json.loads((out / "run.json").read_text())


def _phases(result: ReplayResult) -> list[str]:
    return [str(phase) for phase in read_records(result.run.records_path).column("phase").to_pylist()]


def test_the_cap_ends_the_run_after_that_many_requests_and_trees_recycle_to_reach_it(
    sim: SimServer, tmp_path: Path
) -> None:
    trace = _trace(sessions=2, turns=2)  # 4 requests a pass: 9 needs three passes
    result, run_file = _run(
        sim,
        tmp_path / "run",
        trace,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(num_requests=9, delay_scale=0),
    )
    assert _phases(result) == ["profiling"] * 9
    assert result.summary.counts.profiling == result.summary.counts.kept == 9
    assert result.run.request_cap_reached and result.run.trees_started > len(trace.sessions)
    assert run_file["options"]["num_requests"] == 9
    assert run_file["run"]["request_cap_reached"] is True
    assert run_file["summary"]["counts"]["profiling"] == 9


def test_requests_in_flight_at_the_cap_finish_whatever_the_grace_period(sim: SimServer, tmp_path: Path) -> None:
    """A deadline gives in-flight requests `grace_s`; the cap lets its requests finish: with no grace at all, none is
    cancelled, and the steps after them are left out."""
    result, _ = _run(
        sim,
        tmp_path / "run",
        _trace(sessions=4, turns=3, out=400),  # the first turns are still decoding when the fourth is sent
        load=ClosedLoad(concurrency=4),
        scenario=Scenario(num_requests=4, delay_scale=0),
        runtime=Runtime(grace_s=0.0),
    )
    table = read_records(result.run.records_path)
    assert table.column("status").to_pylist() == ["ok"] * 4
    assert result.run.cancelled == 0 and result.run.skipped == 8  # the second and third turns of each tree
    assert result.run.request_cap_reached and not result.run.interrupted


def test_the_agentx_warmup_is_not_counted(sim: SimServer, tmp_path: Path) -> None:
    result, _ = _run(
        sim,
        tmp_path / "run",
        load_trace(SAMPLE_TRACE),
        load=AgentxLoad(concurrency=2, warmup_requests_per_lane=2),
        scenario=Scenario(num_requests=5, delay_scale=0),
    )
    phases = _phases(result)
    assert phases.count("profiling") == 5 == result.summary.counts.profiling
    assert phases.count("warmup") >= 2 + 2 * 2  # a primer per lane, then the cache-pressure stage
    assert result.run.request_cap_reached


def test_an_open_loop_stops_at_the_cap(sim: SimServer, tmp_path: Path) -> None:
    """Rate arrivals never run out: the cap is what ends the run."""
    result, _ = _run(
        sim,
        tmp_path / "run",
        _trace(sessions=3, turns=2),
        load=RateLoad(rate=50.0),
        scenario=Scenario(num_requests=6, delay_scale=0),
    )
    assert _phases(result) == ["profiling"] * 6 and result.run.request_cap_reached


def test_a_cap_the_trace_does_not_reach_is_said_to_be_unreached(sim: SimServer, tmp_path: Path) -> None:
    """With --sessions, the trees run out first: the run ends as it would have, and run.json says the cap was not
    what ended it."""
    result, run_file = _run(
        sim,
        tmp_path / "run",
        _trace(sessions=2, turns=2),
        load=ClosedLoad(concurrency=1),
        scenario=Scenario(num_requests=50, sessions=2, delay_scale=0),
    )
    assert result.summary.counts.profiling == 4
    assert run_file["run"]["request_cap_reached"] is False


def test_workers_share_the_cap(sim: SimServer, tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(_trace(sessions=4, turns=2), trace_path)
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=tmp_path / "run",
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(num_requests=7, delay_scale=0),
        runtime=Runtime(workers=2),
    )
    result = replay_sync(_trace(sessions=4, turns=2), options, trace_path=trace_path)
    assert result.summary.counts.profiling == 7 and result.run.request_cap_reached
    assert result.run.trace_path == str(trace_path)


def test_the_command_line_takes_the_cap_and_keeps_the_trace_path_in_run_json(sim: SimServer, tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(_trace(sessions=2, turns=2), trace_path)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "agentx.cli", "replay", "trace.arrow", "--url", sim.url, "--mode", "closed"]
    command += ["--num-requests", "3", "--delay-scale", "0", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_file = json.loads((out / "run.json").read_text())
    assert run_file["run"]["trace_path"] == str(trace_path)  # absolute, though given relative
    assert run_file["summary"]["counts"]["profiling"] == 3 and run_file["run"]["request_cap_reached"]
    assert "stopped at --num-requests 3" in done.stdout


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_cap_that_is_not_a_positive_count_is_refused_before_anything_starts(tmp_path: Path, value: str) -> None:
    from click.testing import CliRunner

    from agentx.cli import main

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["replay", str(SAMPLE_TRACE), "--num-requests", value, "--out", str(out)])
    assert result.exit_code == 2 and "'--num-requests'" in result.output, result.output
    assert "built-in simulator" not in result.output and not out.exists()
