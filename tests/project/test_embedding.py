"""Good manners inside a host program: a library replay leaves process-wide state as it found it
(docs/api.md, "Embedding"); the garbage-collector control is the caller's to ask for, and the CLI asks."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import make_request, make_session, make_trace

from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _trace() -> Trace:
    requests = [make_request(float(turn), 64, 4, api_time=0.1, added=(turn,)) for turn in range(3)]
    return make_trace(make_session("s", requests))


def _collectable(thing: object) -> bool:
    """Whether `thing` is in a generation the collector walks (a frozen object is in none of them)."""
    return any(candidate is thing for candidate in gc.get_objects())


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=16) as server:
        yield server


@pytest.mark.parametrize("quiet_gc", [False, True])
def test_a_library_replay_leaves_the_hosts_collector_alone(sim: SimServer, tmp_path: Path, quiet_gc: bool) -> None:
    hosts = [[object()] for _ in range(1000)]  # what the host froze before calling us
    gc.freeze()
    assert not _collectable(hosts[0])
    switch_interval_s = sys.getswitchinterval()
    try:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(delay_scale=0.0),
            runtime=Runtime(quiet_gc=quiet_gc),
        )
        result = asyncio.run(run_replay(_trace(), options))
        assert result.errors == 0
        assert gc.isenabled()
        assert sys.getswitchinterval() == switch_interval_s
        # Asked for, the run freezes and unfreezes the heap, the host's objects included (documented); not asked
        # for, what the host froze stays frozen.
        assert _collectable(hosts[0]) is quiet_gc
    finally:
        gc.unfreeze()
        del hosts


def test_the_cli_takes_the_collector_for_its_own_run(sim: SimServer, tmp_path: Path) -> None:
    trace = tmp_path / "trace.arrow"
    from agentx.trace.io import save_trace

    save_trace(_trace(), trace)
    out = tmp_path / "run"
    args = ["replay", str(trace), "--url", sim.url, "--model", sim.model, "--mode", "closed", "--delay-scale", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "agentx.cli", *args, "--out", str(out), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    options = json.loads((out / "run.json").read_text())["options"]
    assert options["quiet_gc"] is True and options["fast_thread_switch"] is True
