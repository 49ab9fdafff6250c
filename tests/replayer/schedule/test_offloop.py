"""Work off the event loop: the worker threads, and replays whose plans and bodies are made there."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from builders import make_agent, make_request, make_session, make_trace

from agentx.records.record import read_records, to_records
from agentx.replayer.http.http1 import Body
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.run_replay import run_replay
from agentx.replayer.schedule import runner as runner_module
from agentx.replayer.schedule.offloop import SWITCH_INTERVAL_S, OffLoop
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@pytest.mark.parametrize("fast_switch", [False, True])
def test_work_runs_on_a_worker_thread_and_only_an_owner_shortens_the_switch_interval(fast_switch: bool) -> None:
    before = sys.getswitchinterval()
    seen: list[tuple[str, float]] = []

    def work(value: int) -> int:
        seen.append((threading.current_thread().name, sys.getswitchinterval()))
        return value * 2

    async def main() -> tuple[int, int]:
        off_loop = OffLoop(fast_switch=fast_switch)
        try:
            return await off_loop.run("plan", work, 2), await off_loop.run("body", work, 5)
        finally:
            off_loop.close()

    assert asyncio.run(main()) == (4, 10)
    assert [name.split("_")[0] for name, _ in seen] == ["agentx-plan", "agentx-body"]
    # The interval is process-wide: a library caller's stays as it was, the CLI's is short while work runs.
    assert all(interval == (SWITCH_INTERVAL_S if fast_switch else before) for _, interval in seen)
    assert sys.getswitchinterval() == before  # set back once nothing runs


def _trace() -> Trace:
    """Two sessions of growing prompts with a subagent: enough blocks for the cache and markers to matter."""
    sessions = []
    for s in range(2):
        requests = [
            make_request(
                float(turn), 200 + 48 * turn, 4, api_time=0.1, added=tuple(range(100 * s, 100 * s + 12 + 3 * turn))
            )
            for turn in range(5)
        ]
        sub = make_agent("sub", [msgspec.structs.replace(requests[1], t=1.5)], spawn_after=1, t=1.5)
        sessions.append(make_session(f"s{s}", requests, subagents=[sub]))
    return make_trace(*sessions)


def _replay(sim: SimServer, out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[tuple[object, ...], str]:
    """The replay's bodies by (phase, session, agent, turn), as digests, and a check that it succeeded."""
    bodies: dict[tuple[object, ...], str] = {}
    real_build = BodyBuilder.build

    def recording_build(self: Any, tree: Any, step: Any, phase: Any = "profiling") -> tuple[int, Body]:
        sent, body = real_build(self, tree, step, phase)
        key = (phase, tree.prepared.plan.session_id, step.agent_id, step.turn)
        bodies[key] = hashlib.sha256(body if isinstance(body, bytes) else b"".join(body.parts)).hexdigest()
        return sent, body

    monkeypatch.setattr(BodyBuilder, "build", recording_build)
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out_dir,
        load=AgentxLoad(concurrency=1),
        scenario=Scenario(delay_scale=0.0, seed=7),
        runtime=Runtime(run_id="same"),
    )
    result = asyncio.run(run_replay(_trace(), options))
    records = to_records(read_records(result.records_path))
    assert result.errors == 0 and len(records) == len(bodies) >= 8
    return bodies


def test_plans_made_off_the_loop_and_blocks_made_in_groups_give_the_bodies_made_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SimServer(time_scale=0.01, block_size=16) as sim:
        on_loop = _replay(sim, tmp_path / "on", monkeypatch)
        calls: list[str] = []
        real_run = OffLoop.run

        async def counting_run(self: OffLoop, kind: str, function: Any, *args: object) -> Any:
            calls.append(kind)
            return await real_run(self, kind, function, *args)

        monkeypatch.setattr(OffLoop, "run", counting_run)
        monkeypatch.setattr(runner_module, "OFF_LOOP_REQUESTS", 1)
        monkeypatch.setattr(runner_module, "WARM_TOKENS", 1)
        monkeypatch.setattr(runner_module, "WARM_GROUP_BLOCKS", 1)
        groups: list[int] = []
        real_warm_blocks = BodyBuilder.warm_blocks

        def counting_warm_blocks(self: BodyBuilder, scope_key: str, hash_ids: Any) -> None:
            groups.append(len(hash_ids))
            real_warm_blocks(self, scope_key, hash_ids)

        monkeypatch.setattr(BodyBuilder, "warm_blocks", counting_warm_blocks)
        off_loop = _replay(sim, tmp_path / "off", monkeypatch)
    assert "plan" in calls and len(groups) > 8 and set(groups) == {1}  # a block at a time
    assert off_loop == on_loop  # the same bodies, byte for byte
