"""Repeats (`--repeat N`, agentx.run.repeats) over real HTTP against the simulator: each repeat a complete run or
sweep with its derived seed, the index, refusal of a used folder, interruption, and `--repeat 1` as a plain run."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from children import default_stop_signals
from click.testing import CliRunner, Result

from agentx.cli import main
from agentx.errors import ConfigError, RunExists
from agentx.records.record import RequestRecord, read_records
from agentx.records.run_folder import RECORDS_FILE, REPEATS_FILE, RUN_FILE, SWEEP_FILE
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.plan.steps import session_order
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import RunStops
from agentx.results.folders.repeat_index import RepeatIndex, read_repeats, repeat_seed
from agentx.run.repeats import ReplayRepeats, SweepRepeats, replay_repeats, replay_repeats_sync, sweep_repeats
from agentx.run.sweep import SweepOptions
from agentx.sim.process import SimServer
from agentx.trace.io import save_trace
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
SESSIONS = 6


def small_trace(sessions: int = SESSIONS, turns: int = 3) -> Trace:
    """Sessions of a few short turns, s0 … s{sessions-1}."""
    result = []
    for s in range(sessions):
        requests = [
            Request(
                t=float(i),
                model="m",
                in_tokens=32 + 16 * i,
                out_tokens=8,
                api_time=0.2,
                hash_ids_kept=0,
                hash_ids_added=tuple(range(1000 * s, 1000 * s + 2 + i)),
            )
            for i in range(turns)
        ]
        result.append(Session(session_id=f"s{s}", root=Agent(requests=requests)))
    return Trace(sessions=result, block_size=BLOCK)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK) as server:
        yield server


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.arrow"
    save_trace(small_trace(), path)
    return path


def _replay(sim: SimServer, trace_path: Path, out: Path, *args: str) -> Result:
    """`agentx replay` of 4 trees on 2 lanes, drawn at random (the seed decides which), against `sim`."""
    command = ["replay", str(trace_path), "--url", sim.url, "--model", sim.model, "--mode", "closed"]
    command += ["--concurrency", "2", "--sessions", "4", "--session-order", "random", "--delay-scale", "0"]
    return CliRunner().invoke(main, [*command, "--out", str(out), *args])


def _index(folder: Path) -> RepeatIndex:
    return msgspec.json.decode((folder / REPEATS_FILE).read_bytes(), type=RepeatIndex)


def _run_file(run_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run_dir / RUN_FILE).read_text())
    return document


def _played(run_dir: Path) -> collections.Counter[str]:
    """The sessions the run's trees played (one count per tree)."""
    table = read_records(run_dir / RECORDS_FILE)
    plays = set(zip(table.column("play").to_pylist(), table.column("session_id").to_pylist(), strict=True))
    return collections.Counter(session for _, session in plays)


def _drawn(seed: int, trees: int = 4) -> collections.Counter[str]:
    """The sessions `trees` trees draw in `random` order under `seed`."""
    drawn = itertools.islice(session_order(SESSIONS, "random", seed), trees)
    return collections.Counter(f"s{index}" for index in drawn)


def test_replay_repeat_writes_each_run_with_its_derived_seed_and_indexes_them(
    sim: SimServer, trace_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "set"
    result = _replay(sim, trace_path, out, "--seed", "5", "--repeat", "3", "--json")
    assert result.exit_code == 0, result.output
    seeds = [repeat_seed(5, number) for number in (1, 2, 3)]
    assert seeds[0] == 5 and len(set(seeds)) == 3
    assert _index(out) == RepeatIndex(base_seed=5, seeds=seeds, dirs=["r1", "r2", "r3"])
    assert read_repeats(out) == [out / "r1", out / "r2", out / "r3"]
    assert not (out / RECORDS_FILE).exists() and not (out / RUN_FILE).exists()
    document = json.loads(result.stdout)
    assert msgspec.convert(document["repeats"], RepeatIndex) == _index(out)
    for number, seed in enumerate(seeds, start=1):
        run_dir = out / f"r{number}"
        run_file = _run_file(run_dir)
        assert run_file["options"]["seed"] == seed and run_file["options"]["out_dir"] == str(run_dir)
        assert run_file["run"]["interrupted"] is False
        assert run_file["summary"]["counts"] == document["summaries"][number - 1]["counts"]
        assert run_file["summary"]["counts"]["errors"] == 0 and run_file["summary"]["counts"]["kept"] > 0
        assert _played(run_dir) == _drawn(seed)  # the seed reached the run, not only run.json
        assert f"repeat {number}/3 (seed {seed})" in result.stderr
        assert f"r{number} (seed {seed}): ok" in result.stderr
    assert len({tuple(sorted(_drawn(seed).elements())) for seed in seeds}) > 1  # the seeds do draw differently


def test_replay_repeat_1_writes_what_a_plain_replay_writes(sim: SimServer, trace_path: Path, tmp_path: Path) -> None:
    plain, once = tmp_path / "plain", tmp_path / "once"
    assert _replay(sim, trace_path, plain, "--seed", "5").exit_code == 0
    result = _replay(sim, trace_path, once, "--seed", "5", "--repeat", "1")
    assert result.exit_code == 0, result.output
    listing = sorted(path.name for path in once.iterdir())
    assert listing == sorted(path.name for path in plain.iterdir())
    assert {RECORDS_FILE, RUN_FILE} <= set(listing) and "r1" not in listing and REPEATS_FILE not in listing
    assert _run_file(once)["options"]["seed"] == 5 and _played(once) == _played(plain) == _drawn(5)
    assert "repeat 1/1" not in result.output and "agentx compare" not in result.output


def test_a_used_folder_is_refused_unless_overwritten(sim: SimServer, trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    assert _replay(sim, trace_path, out, "--seed", "5", "--repeat", "3").exit_code == 0
    records = (out / "r1" / RECORDS_FILE).read_bytes()
    index = (out / REPEATS_FILE).read_bytes()
    again = _replay(sim, trace_path, out, "--seed", "5", "--repeat", "2")
    assert again.exit_code == 2, again.output
    assert f"{out} already holds results (repeats.json, r1/records.arrow, r1/run.json, ...)" in again.output
    assert "--overwrite" in again.output and "Traceback" not in again.output
    assert (out / "r1" / RECORDS_FILE).read_bytes() == records and (out / REPEATS_FILE).read_bytes() == index
    # A plain run's folder is refused too: its records would sit beside the repeats'.
    plain = tmp_path / "plain"
    assert _replay(sim, trace_path, plain).exit_code == 0
    into_run = _replay(sim, trace_path, plain, "--repeat", "2")
    assert into_run.exit_code == 2 and "already holds results (records.arrow, run.json" in into_run.output
    assert not (plain / "r1").exists()
    replaced = _replay(sim, trace_path, out, "--seed", "9", "--repeat", "2", "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert _index(out) == RepeatIndex(base_seed=9, seeds=[9, repeat_seed(9, 2)], dirs=["r1", "r2"])
    assert read_repeats(out) == [out / "r1", out / "r2"]  # the old set's r3 is no repeat of this one
    assert _run_file(out / "r1")["options"]["seed"] == 9 and _played(out / "r1") == _drawn(9)


def test_the_library_refuses_bad_counts_and_used_folders(sim: SimServer, tmp_path: Path) -> None:
    options = ReplayOptions(server=Server(url=sim.url, model=sim.model), out_dir=tmp_path / "set", load=ClosedLoad())
    with pytest.raises(ConfigError, match="repeats must be at least 1"):
        replay_repeats_sync(small_trace(), options, 0)
    (tmp_path / "set" / "r2").mkdir(parents=True)
    (tmp_path / "set" / "r2" / RUN_FILE).write_text("{}")
    with pytest.raises(RunExists, match=r"already holds runs \(r2/run.json\); pass overwrite=True"):
        replay_repeats_sync(small_trace(), options, 2)
    assert not (tmp_path / "set" / REPEATS_FILE).exists()


def test_sweep_repeat_writes_a_sweep_per_repeat(sim: SimServer, trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweeps"
    args = ["sweep", str(trace_path), "--url", sim.url, "--model", sim.model, "--mode", "closed"]
    args += ["--concurrency", "1,2", "--duration", "0.3", "--delay-scale", "0", "--seed", "3", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--repeat", "2", "--json"])
    assert result.exit_code == 0, result.output
    seeds = [3, repeat_seed(3, 2)]
    assert _index(out) == RepeatIndex(base_seed=3, seeds=seeds, dirs=["r1", "r2"])
    assert not (out / SWEEP_FILE).exists()
    document = json.loads(result.stdout)
    for number, seed in enumerate(seeds, start=1):
        sweep_dir = out / f"r{number}"
        index = json.loads((sweep_dir / SWEEP_FILE).read_text())
        assert document["sweeps"][number - 1] == index
        assert index["seed"] == seed and [(e["dir"], e["status"]) for e in index["levels"]] == [
            ("c1", "ok"),
            ("c2", "ok"),
        ]
        for level in (1, 2):
            options = _run_file(sweep_dir / f"c{level}")["options"]
            assert options["seed"] == seed and options["concurrency"] == level
        assert f"repeat {number}/2 (seed {seed})" in result.stderr
    records = (out / "r2" / "c2" / RECORDS_FILE).read_bytes()
    again = CliRunner().invoke(main, [*args, "--repeat", "2"])
    assert again.exit_code == 2 and "already holds results (repeats.json, r1/sweep.json, r2/sweep.json)" in again.output
    # --resume goes into every repeat's sweep: each keeps its finished levels.
    resumed = CliRunner().invoke(main, [*args, "--repeat", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert (out / "r2" / "c2" / RECORDS_FILE).read_bytes() == records
    for number in (1, 2):
        levels = json.loads((out / f"r{number}" / SWEEP_FILE).read_text())["levels"]
        assert [level["status"] for level in levels] == ["kept", "kept"]
    assert _index(out) == RepeatIndex(base_seed=3, seeds=seeds, dirs=["r1", "r2"])


@pytest.mark.parametrize("when", ["start", "record", "cancel"])
def test_stopping_a_set_keeps_the_index_to_the_repeats_that_completed(
    sim: SimServer, tmp_path: Path, when: Literal["start", "record", "cancel"]
) -> None:
    """Stopped as repeat 2 starts, or while it runs, or cancelled while it runs: repeat 1 stays indexed, repeat 2 is
    not, and no third starts; a cancellation is raised once repeat 2 is written."""
    out = tmp_path / "set"
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(delay_scale=0.0, duration_s=0.6, seed=11),
        runtime=Runtime(grace_s=2.0),
    )
    stops = RunStops()
    started: list[int] = []

    async def run() -> ReplayRepeats | None:
        def on_start(number: int, count: int, seed: int) -> None:
            started.append(number)
            if when == "start" and number == 2:
                stops.stop()

        def on_record(record: RequestRecord) -> None:
            if when != "start" and started == [1, 2] and not stopped:
                stopped.append(True)
                if when == "cancel":
                    task.cancel()
                else:
                    stops.stop()

        stopped: list[bool] = []
        hooks = RunHooks(on_record=on_record, stops=stops)
        task = asyncio.ensure_future(replay_repeats(small_trace(), options, 3, hooks, on_repeat_start=on_start))
        if when == "cancel":
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()
            return None
        return await task

    result = asyncio.run(run())
    assert started == [1, 2]
    assert _index(out) == RepeatIndex(base_seed=11, seeds=[11], dirs=["r1"])
    assert read_repeats(out) == [out / "r1"] and not (out / "r3").exists()
    assert _run_file(out / "r1")["run"]["interrupted"] is False
    if when == "start":  # stopped before its run started: nothing of repeat 2 to keep
        assert result is not None and result.interrupted and result.index == _index(out)
        assert len(result.results) == 1 and not (out / "r2" / RUN_FILE).exists()
        return
    # The stopped or cancelled run is written as an interrupted run is, with its own seed.
    run_file = _run_file(out / "r2")
    assert run_file["run"]["interrupted"] is True and run_file["options"]["seed"] == repeat_seed(11, 2)
    if result is not None:
        assert result.interrupted and len(result.results) == 2 and result.results[1].run.interrupted


def test_ctrl_c_ends_the_set_after_the_current_repeat_and_exits_130(trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    args = ["replay", str(trace_path), "--mode", "closed", "--concurrency", "2", "--duration", "1.5", "--grace", "1"]
    args += ["--sim-time-scale", "0.05", "--delay-scale", "0", "--seed", "4", "--repeat", "3", "--out", str(out)]
    child = subprocess.Popen(
        [sys.executable, "-m", "agentx.cli", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,
    )
    deadline = time.monotonic() + 120
    while not (out / "r2" / RECORDS_FILE).exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # repeat 2 under way
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "r2 (seed" in stderr and "interrupted" in stderr
    assert _index(out) == RepeatIndex(base_seed=4, seeds=[4], dirs=["r1"])
    assert _run_file(out / "r1")["run"]["interrupted"] is False
    assert _run_file(out / "r2")["run"]["interrupted"] is True and not (out / "r3").exists()
    document = json.loads(stdout)
    assert document["repeats"]["dirs"] == ["r1"] and len(document["summaries"]) == 2


def test_repeats_that_do_not_stand_exit_3_naming_each(trace_path: Path, tmp_path: Path) -> None:
    from agentx.sim.faults import FaultConfig

    out = tmp_path / "set"
    with SimServer(time_scale=0.01, block_size=BLOCK, faults=FaultConfig(error_500_rate=1.0)) as failing:
        result = _replay(failing, trace_path, out, "--repeat", "2")
    assert result.exit_code == 3, result.output
    assert "error: 2 of 2 repeats do not stand (r1: no request succeeded: " in result.output
    assert "; r2: no request succeeded: " in result.output and "r2 (seed" in result.output
    assert _index(out).dirs == ["r1", "r2"]  # both ran to their end: their run.json says why they do not stand


def test_repeats_of_a_run_over_worker_processes(sim: SimServer, trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "set"
    result = _replay(sim, trace_path, out, "--seed", "6", "--workers", "2", "--repeat", "2", "--json")
    assert result.exit_code == 0, result.output
    seeds = [6, repeat_seed(6, 2)]
    assert _index(out) == RepeatIndex(base_seed=6, seeds=seeds, dirs=["r1", "r2"])
    for number, seed in enumerate(seeds, start=1):
        run_file = _run_file(out / f"r{number}")
        assert run_file["options"]["seed"] == seed and run_file["options"]["workers"] == 2
        assert run_file["summary"]["counts"]["kept"] > 0 and run_file["summary"]["counts"]["errors"] == 0
        assert _played(out / f"r{number}") == _drawn(seed)


@pytest.mark.parametrize("cancel", [False, True], ids=["stopped", "cancelled"])
def test_stopping_a_set_of_sweeps_keeps_the_index_to_the_sweeps_that_completed(
    sim: SimServer, tmp_path: Path, cancel: bool
) -> None:
    out = tmp_path / "sweeps"
    base = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=ClosedLoad(),
        scenario=Scenario(delay_scale=0.0, duration_s=0.3, seed=2),
        runtime=Runtime(grace_s=2.0),
    )
    options = SweepOptions(concurrency=(1, 2), out_dir=out)

    stops = RunStops()

    async def run() -> SweepRepeats | None:
        started: list[int] = []
        stopped: list[bool] = []

        def on_record(record: RequestRecord) -> None:
            if started == [1, 2] and not stopped:
                stopped.append(True)
                if cancel:
                    task.cancel()
                else:
                    stops.stop()

        task = asyncio.ensure_future(
            sweep_repeats(
                small_trace(),
                base,
                options,
                3,
                RunHooks(on_record=on_record, stops=stops),
                on_repeat_start=lambda number, count, seed: started.append(number),
            )
        )
        if cancel:
            with pytest.raises(asyncio.CancelledError):
                await task
            return None
        return await task

    result = asyncio.run(run())
    if result is not None:
        assert result.interrupted and len(result.results) == 2 and result.results[1].interrupted
        assert result.index == _index(out)
    assert _index(out) == RepeatIndex(base_seed=2, seeds=[2], dirs=["r1"])
    assert read_repeats(out) == [out / "r1"] and not (out / "r3").exists()
    first = json.loads((out / "r1" / SWEEP_FILE).read_text())
    second = json.loads((out / "r2" / SWEEP_FILE).read_text())
    assert [level["status"] for level in first["levels"]] == ["ok", "ok"]
    assert [level["status"] for level in second["levels"]] == ["interrupted"] and second["seed"] == repeat_seed(2, 2)
    assert second["levels"][0]["error"] == ("cancelled" if cancel else "stopped early (Ctrl-C or a stop)")
    assert _run_file(out / "r2" / "c1")["run"]["interrupted"] is True  # written before the cancellation went on
