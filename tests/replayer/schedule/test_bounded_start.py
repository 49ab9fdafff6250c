"""A replay's start at any concurrency: bounded and interruptible.

- Lanes are made in slices of the event loop and a lane with no tree to play gets no task, so 100,000 lanes start
  sending within seconds and a lane beyond the sessions costs next to nothing; the cache-pressure stage's count of the
  lanes still pressing is kept, not recounted per lane (it was the square of the lanes).
- A stop signal at any phase of the start (the imports, the trace's load, the simulator starting, the probes, each
  lane's first tree, the primers) ends the process with one line and exit 130, never a traceback or a hang.
- What a lane holds before its first request is small: step flags, not an `asyncio.Event` per step; settled steps a byte
  each; each step's hash ids rebuilt from the trace's delta encoding, not kept whole per step.

End-to-end tests run `agentx replay` against its built-in simulator over loopback; memory figures are the benchmarks'
(bench/startup.py, bench/corpus_replay.py --peak, bench/replay_overhead.py --cli-peak).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from builders import make_agent, make_request, make_session, make_trace
from children import default_stop_signals
from paths import SAMPLE_TRACE

from agentx.records.record import read_records
from agentx.replayer.plan.play import CHECKPOINT_TURNS, StepFlags, StepIds
from agentx.replayer.plan.steps import plan_session
from agentx.replayer.plan.tstar import snapshot
from agentx.replayer.schedule.warmup import ProfilingGate
from agentx.trace.formats.arrow import arrow_bytes, from_arrow_bytes
from agentx.trace.model import Request, Session

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

FAST = ["--sim-time-scale", "0.001", "--delay-scale", "0"]
PROGRESS_EVERY_S = {"AGENTX_PROGRESS_INTERVAL_S": "0.5"}
"""Progress lines twice a second (on a pipe they are plain lines): the first says "starting"."""


def _replay(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`agentx replay` of the sample into tmp_path/run, in a session of its own (the simulator it starts with it)."""
    command = [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--out", str(tmp_path / "run"), *args]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        preexec_fn=default_stop_signals,
    )


def _read_until(stream: IO[str], text: str, deadline_s: float) -> str:
    """What `stream` said up to and including the first line holding `text` (all of it if the stream ended first)."""
    said = ""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = stream.readline()
        if not line:
            break
        said += line
        if text in line:
            break
    return said


def _end(child: subprocess.Popen[str], timeout_s: float = 60.0) -> tuple[str, str]:
    try:
        return child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise


def _catches(pid: int, stop_signal: signal.Signals) -> bool:
    """Whether process `pid` has a handler of its own for `stop_signal` (/proc's SigCgt mask)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(mask >> (stop_signal - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads a process's signal handlers from /proc")
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_right_after_spawn_ends_with_one_line(tmp_path: Path, stop_signal: signal.Signals) -> None:
    """As soon as agentx's own code runs (its handler for SIGTERM is the sign), a stop signal during the imports and
    the parsing ends the process with one line and exit 130: nothing to clean up, no import's traceback."""
    child = _replay(tmp_path, "--concurrency", "2", *FAST)
    deadline = time.monotonic() + 30
    while not _catches(child.pid, signal.SIGTERM) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(stop_signal)
    stdout, stderr = _end(child)
    assert child.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "interrupted" and "Traceback" not in stderr
    assert stdout == ""


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_as_the_simulator_starts_ends_with_one_line(tmp_path: Path, stop_signal: signal.Signals) -> None:
    """Right after the simulator is up: the probes, the planning and the first trees are under way (or about to be)."""
    child = _replay(tmp_path, "--concurrency", "2", *FAST)
    assert child.stderr is not None
    before = _read_until(child.stderr, "replaying against the built-in simulator", 60)
    assert "built-in simulator" in before, before
    child.send_signal(stop_signal)
    _, stderr = _end(child)
    assert child.returncode == 130, before + stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted"), stderr


def test_a_hundred_thousand_lanes_send_soon_and_stop_on_ctrl_c(tmp_path: Path) -> None:
    """Each lane's first tree and its primer timers are made in slices of the event loop, each primer's body when it
    is due: the first requests go out and finish (records on disk) while lanes are still being made, and Ctrl-C then
    stops the run as any run stops: the partial summary, run.json, exit 130."""
    child = _replay(tmp_path, "--concurrency", "100000", "--duration", "20", "--grace", "1", "--json", *FAST)
    records = tmp_path / "run" / "records.arrow"
    deadline = time.monotonic() + 180
    while child.poll() is None and time.monotonic() < deadline:
        if records.exists() and read_records(records).num_rows > 0:
            break
        time.sleep(0.2)
    assert child.poll() is None, child.communicate()[1]
    assert read_records(records).num_rows > 0
    interrupted_at = time.monotonic()
    child.send_signal(signal.SIGINT)
    stdout, stderr = _end(child, 120)
    stopped_s = time.monotonic() - interrupted_at
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    assert summary["counts"]["rows"] > 0
    assert stderr.splitlines()[-1].startswith("interrupted: the run stopped early")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["run"]["interrupted"] is True
    assert stopped_s < 60  # the grace period (1 s), then the records and the summary: not the lanes left to make


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_a_hundred_thousand_lanes_start_ends_the_run(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """The first progress line ("starting") comes while the lanes' first trees are still being made: the signal stops
    that, and the run ends as an interrupted run, with what it kept."""
    child = _replay(
        tmp_path, "--concurrency", "100000", "--duration", "20", "--grace", "1", *FAST, env=PROGRESS_EVERY_S
    )
    assert child.stderr is not None
    before = _read_until(child.stderr, "starting", 120)
    assert "starting" in before, before
    child.send_signal(stop_signal)
    _, stderr = _end(child, 120)
    assert child.returncode == 130, before + stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1].startswith("interrupted: the run stopped early")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["run"]["interrupted"] is True


def test_lanes_beyond_the_sessions_cost_nothing(tmp_path: Path) -> None:
    """100,000 lanes for 2 trees under the harness's rules (10 cache-pressure requests a lane): the 99,998 lanes with
    nothing to play get no task, and each one's end no longer recounts every lane's quota, which took hours."""
    child = _replay(tmp_path, "--concurrency", "100000", "--sessions", "2", "--json", *FAST)
    stdout, stderr = _end(child, 180)
    assert child.returncode == 0, stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())["run"]
    assert run["trees_started"] == 2
    assert json.loads(stdout)["counts"]["kept"] > 0


# -- what a lane holds


def _session(seed: int) -> Session:
    """A session of a root and two subagents whose contexts grow turn by turn and sometimes shrink (a compaction):
    each request keeps part of its predecessor's ids."""
    rng = random.Random(seed)

    def turns(count: int, start: float) -> list[Request]:
        requests = []
        held = 0
        for turn in range(count):
            kept = rng.randint(0, held) if rng.random() < 0.1 else held
            added = tuple(rng.randrange(1 << 40) for _ in range(rng.randint(0, 5)))
            requests.append(make_request(start + turn, 64, 1, kept=kept, added=added))
            held = kept + len(added)
        return requests

    root = turns(3 * CHECKPOINT_TURNS + 5, 0.0)
    subagents = [
        make_agent("a", turns(CHECKPOINT_TURNS + 1, 0.5), spawn_after=1),
        make_agent("b", turns(2, 1.5), spawn_after=2),
    ]
    return make_session(f"s{seed}", root, subagents=subagents)


@pytest.mark.parametrize("seed", range(4))
def test_step_ids_rebuild_every_steps_full_ids_in_any_order(seed: int) -> None:
    session = _session(seed)
    plan = plan_session(session)
    agents = {agent.agent_id: agent for agent, _, _ in session.agents()}
    whole = [agents[step.agent_id].hash_ids(step.turn) for step in plan.steps]
    ids = StepIds(plan.steps, agents.values())
    order = list(range(len(plan.steps))) * 2
    random.Random(seed).shuffle(order)
    assert [ids[index] for index in order] == [whole[index] for index in order]
    assert list(ids) == whole and ids[2:5] == tuple(whole[2:5]) and len(ids) == len(whole)


def test_step_flags_wake_their_waiters_and_a_cancelled_waiter_leaves_the_others() -> None:
    async def scenario() -> list[str]:
        flags = StepFlags(3)
        woken: list[str] = []

        async def wait(index: int, name: str) -> None:
            await flags.wait(index)
            woken.append(name)

        first, second, gone = (asyncio.create_task(wait(1, name)) for name in ("first", "second", "gone"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        assert not flags.is_set(1) and woken == []
        flags.set(1)
        await asyncio.gather(first, second)
        await flags.wait(1)  # set already: at once
        assert flags.is_set(1) and not flags.is_set(0) and len(flags) == 3 and gone.cancelled()
        return woken

    assert asyncio.run(scenario()) == ["first", "second"]


@pytest.mark.parametrize("seed", range(3))
def test_a_snapshot_settles_each_step_as_done_skipped_or_neither(seed: int) -> None:
    plan = plan_session(_session(seed))
    for t_star in (0.5, 3.2, 9.9, 100.0):
        state = snapshot(plan, t_star)
        assert state.done.isdisjoint(state.skipped) and state.not_sent == state.done | state.skipped
        assert {index for index in range(len(plan.steps)) if state.is_settled(index)} == state.not_sent
        assert all(plan.steps[index].request.t < t_star for index in state.done)


def test_the_pressure_stage_counts_the_lanes_still_pressing() -> None:
    """Whatever the lanes take and whichever end, the stage is pressing exactly while some lane has requests left,
    profiling never starts meanwhile, and it has once every lane has ended."""
    rng = random.Random(7)

    async def scenario() -> None:
        gate = ProfilingGate()
        lanes = list(range(20))
        gate.begin_pressure(lanes, 3, pooled=False)
        left = dict.fromkeys(lanes, 3)
        for _ in range(400):
            lane = rng.choice(lanes)
            if rng.random() < 0.1:
                gate.lane_done(lane)
                left.pop(lane, None)
            else:
                assert gate.take(lane) == (left.get(lane, 0) > 0)
                if left.get(lane, 0) > 0:
                    left[lane] -= 1
            assert gate.pressing == any(left.values())
            assert not (gate.started.is_set() and gate.pressing)
        for lane in lanes:
            gate.lane_done(lane)
        assert not gate.pressing and gate.started.is_set()

    asyncio.run(scenario())


def test_a_loaded_trace_shares_its_repeated_ids_and_type_lists() -> None:
    """Equal hash ids in different sessions are one int object, equal `input_types` one tuple: the AgentX-size corpus
    repeats 57k distinct ids over 4.4M places."""
    requests = [make_request(float(i), 64, 1, added=(1000 + i % 3, 1001), input_types=("text",)) for i in range(6)]
    trace = make_trace(*(make_session(f"s{n}", requests[n::2]) for n in range(2)), block_size=64)
    loaded = from_arrow_bytes(arrow_bytes(trace), file="memory")
    assert loaded == trace
    rows = [request for session in loaded.sessions for request in session.root.requests]
    assert rows[0].hash_ids_added[1] is rows[-1].hash_ids_added[1]
    assert rows[0].input_types is rows[-1].input_types
