"""`--ray`: one replay sharded over Ray actors on a local multi-node cluster (docs/distributed.md).

The cluster is Ray's own test cluster: a head with no CPU (so no shard lands there and a node can be killed without
killing the cluster) and two worker nodes of one CPU each, every process on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from children import default_stop_signals
from paths import SAMPLE_TRACE
from prometheus_client.parser import text_string_to_metric_families

from agentx.errors import RecordsError
from agentx.records.record import WORKER_LOST, RequestRecord, read_records, to_records
from agentx.replayer.cluster.driver import run_cluster
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

Cluster = Any
"""`ray.cluster_utils.Cluster`, whose methods are untyped."""
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""Ray then gives every node 127.0.0.1 instead of the host's outbound address, and reports no usage statistics: tests
talk only to loopback. Ray reads these as it is imported, so this module imports Ray only in the fixture."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    from ray import cluster_utils

    made: Cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        for _ in range(2):
            made.add_node(num_cpus=1)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.002) as server:
        yield server


def _received(sim: SimServer) -> int:
    """Generation requests the simulator has received, by its /metrics."""
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5.0) as response:
        text = response.read().decode()
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "agentx_sim_requests_received_total"
    )


def _options(sim: SimServer, out_dir: Path, *, workers: int = 1, ray: str | None = None) -> ReplayOptions:
    return ReplayOptions(
        server=Server(url=sim.url, model=sim.model, stream_usage="continuous"),  # no probe: requests = records
        out_dir=out_dir,
        load=ClosedLoad(concurrency=4),
        scenario=Scenario(sessions=6, delay_scale=0.001),
        runtime=Runtime(workers=workers, ray=ray),
    )


def _plan_key(record: RequestRecord) -> tuple[int, str, str, int, int]:
    return (record.play, record.session_id, record.agent_id, record.turn, record.isl_sent_tokens)


def test_shards_on_two_nodes_replay_the_one_process_plan(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    trace = load_trace(SAMPLE_TRACE)  # in memory: the actors get it from the object store, never from this path
    single = asyncio.run(run_replay(trace, _options(sim, tmp_path / "one")))
    before = _received(sim)
    result = asyncio.run(run_cluster(trace, _options(sim, tmp_path / "ray", workers=2, ray=cluster.address)))
    received = _received(sim) - before
    one = to_records(read_records(single.records_path))
    records = to_records(read_records(result.records_path))
    # The same plays, sessions, turns and prompts as one process (the seed is the run's), on the same lanes: a
    # lane that frees first draws the next tree, so one process gives a later play any lane; shards keep its parity.
    assert sorted(map(_plan_key, records)) == sorted(map(_plan_key, one))
    assert {r.lane for r in records} == {r.lane for r in one} == {0, 1, 2, 3}
    assert all(r.lane % 2 == r.play % 2 for r in records)
    # Complete: one record per request the server received, none failed.
    assert len(records) == received == result.requests and result.errors == 0
    assert result.trees_finished == 6 and not result.interrupted
    # Each record says its shard and node: shard i owns lanes i, i+2; the two shards ran on two nodes.
    assert all(r.worker == r.lane % 2 for r in records)
    shards = {shard.index: shard for shard in result.shards}
    assert sorted(shards) == [0, 1] and len({shard.node_id for shard in shards.values()}) == 2
    assert {(r.worker, r.node) for r in records} == {(i, shard.node_id) for i, shard in shards.items()}
    # One timeline: per lane, each play starts after the one before it ended, and every record is in order.
    for lane in range(4):
        plays: dict[int, list[RequestRecord]] = {}
        for record in records:
            if record.lane == lane:
                plays.setdefault(record.play, []).append(record)
        spans = [(min(r.sent_ns for r in rs), max(r.end_ns for r in rs)) for _, rs in sorted(plays.items())]
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), (lane, spans)
    assert all(0 <= r.scheduled_ns <= r.sent_ns <= r.end_ns for r in records)
    for shard in shards.values():
        assert shard.clock_error_ns > 0 and shard.clock_drift_ns is not None and shard.cpu_s
        assert not shard.lost


def test_a_shard_clock_offset_is_measured_and_taken_off(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    """Shard 1 reads its clock 250 ms ahead (both shards really share this host's clock, offset 0)."""
    skew_ns = 250_000_000
    options = _options(sim, tmp_path, workers=2, ray=cluster.address)
    result = asyncio.run(run_cluster(load_trace(SAMPLE_TRACE), options, clock_skews_ns={1: skew_ns}))
    shards = {shard.index: shard for shard in result.shards}
    assert abs(shards[0].clock_offset_ns) <= shards[0].clock_error_ns
    assert abs(shards[1].clock_offset_ns - skew_ns) <= shards[1].clock_error_ns
    # Taken off: both shards started at the same true instant (their wall clocks, which the skew does not touch,
    # read the same at their starts), and their first requests were due together on the merged timeline, inside
    # the 250 ms a skew left on would put between them. A shard's lanes start once it has built its first requests,
    # which a machine loaded past timing (event-loop lag above 50 ms: the suite four workers to two cores beside
    # Ray) delays by up to two seconds (1.8 s seen); there only the order of magnitude is checked.
    # The wall clocks' offset is read through the measured one: it is known to that one's error (±15 ms on a loaded
    # machine, where the round trips are slow) and a few ms more.
    for shard in shards.values():
        offset_ns = shard.wall_clock_offset_ns
        assert offset_ns is not None and abs(offset_ns) < 5_000_000 + shard.clock_error_ns
    records = to_records(read_records(result.records_path))
    due = [min(r.scheduled_ns for r in records if r.worker == index) for index in (0, 1)]
    loaded = max(result.loop_lag_s, default=0.0) > 0.05
    assert abs(due[0] - due[1]) < (3_000_000_000 if loaded else 200_000_000) and min(due) >= 0, (due, loaded)
    first_sent_ns = max(min(r.sent_ns for r in records if r.worker == index) for index in (0, 1))
    assert first_sent_ns < (4_000_000_000 if loaded else 2_000_000_000), (first_sent_ns, loaded)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentx.cli", *args]


def _long_run(sim: SimServer, cluster: Cluster, out: Path, *extra: str) -> subprocess.Popen[str]:
    """A CLI replay on two shards that runs until stopped (sessions recycle for 60 s)."""
    command = _cli(
        "replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--mode", "closed", "--concurrency", "4",
        "--duration", "60", "--delay-scale", "0.001", "--ray", cluster.address, "--workers", "2",
        "--stream-usage", "continuous", "--grace", "5", "--out", str(out), "--json", *extra,
    )  # fmt: skip
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals
    )


def _wait_for_records(path: Path, rows: int, process: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if path.is_file():
            try:
                if read_records(path).num_rows >= rows:
                    return
            except RecordsError:  # the schema is not on disk yet
                pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"no {rows} records in {path} after {timeout_s} s: {process.communicate()}")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_drains_every_shard_and_keeps_the_records(
    cluster: Cluster, sim: SimServer, tmp_path: Path, stop: signal.Signals
) -> None:
    """Ray's own SIGTERM handler (exit at once) must not replace the drain."""
    out = tmp_path / "run"
    process = _long_run(sim, cluster, out)
    _wait_for_records(out / "records.arrow", 20, process)
    process.send_signal(stop)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    run = json.loads((out / "run.json").read_text())["run"]
    assert run["interrupted"] and run["cancel_reason"] == "interrupted"
    records = to_records(read_records(out / "records.arrow"))
    summary = json.loads(stdout)
    assert len(records) == run["requests"] == summary["counts"]["rows"] > 20
    assert {r.worker for r in records} == {0, 1}
    assert summary["shards"]["count"] == 2 and summary["shards"]["lost"] == []


def test_a_lost_node_records_worker_lost_and_aborts(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    process = _long_run(sim, cluster, out)
    _wait_for_records(out / "records.arrow", 20, process)
    victim = cluster.list_all_nodes()[-1]
    cluster.remove_node(victim, allow_graceful=False)  # a crash: its raylet and the actor die at once
    try:
        stdout, stderr = process.communicate(timeout=90)
    finally:
        cluster.add_node(num_cpus=1)  # the next tests want two worker nodes again
        cluster.wait_for_nodes()
    assert process.returncode == 3, stderr
    assert "worker_lost" in stderr and "--on-worker-loss abort" in stderr
    run = json.loads((out / "run.json").read_text())["run"]
    assert run["cancel_reason"] == WORKER_LOST
    lost = [shard for shard in run["shards"] if shard["lost"]]
    assert len(lost) == 1 and lost[0]["lost_reason"]
    records = to_records(read_records(out / "records.arrow"))
    gone = [r for r in records if (r.error_message or "").startswith(WORKER_LOST)]
    assert len(gone) == lost[0]["lost_in_flight"] > 0
    assert all(r.error_kind == "cancelled" and r.worker == lost[0]["index"] for r in gone)
    assert len(records) == run["requests"] == json.loads(stdout)["counts"]["rows"]


def test_with_continue_the_other_shards_run_to_the_end(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    process = _long_run(sim, cluster, out, "--on-worker-loss", "continue", "--duration", "8")
    _wait_for_records(out / "records.arrow", 20, process)
    cluster.remove_node(cluster.list_all_nodes()[-1], allow_graceful=False)
    try:
        stdout, stderr = process.communicate(timeout=90)
    finally:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    assert process.returncode == 0, stderr
    assert "--on-worker-loss continue" in stderr
    run = json.loads((out / "run.json").read_text())["run"]
    (lost,) = [shard for shard in run["shards"] if shard["lost"]]
    assert run["cancel_reason"] is None and not run["interrupted"]
    records = to_records(read_records(out / "records.arrow"))
    survivor = [r for r in records if r.worker != lost["index"]]
    # The survivor went on sending well after the loss, to the end of the window.
    assert max(r.sent_ns for r in survivor) / 1e9 > lost["lost_at_s"] + 2
    assert sum((r.error_message or "").startswith(WORKER_LOST) for r in records) == lost["lost_in_flight"]
    assert len(records) == run["requests"] == json.loads(stdout)["counts"]["rows"]


def test_a_cluster_too_small_fails_before_any_request(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    before = _received(sim)
    command = _cli(
        "replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--concurrency", "4",
        "--ray", cluster.address, "--workers", "3", "--ray-placement-timeout", "2", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "cannot place 3 shards" in lines[0], done.stderr
    assert _received(sim) == before and not (tmp_path / "run" / "records.arrow").exists()


def test_a_sweep_runs_each_level_on_the_cluster(cluster: Cluster, sim: SimServer, tmp_path: Path) -> None:
    command = _cli(
        "sweep", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--mode", "closed", "--concurrency", "2,4",
        "--sessions", "4", "--delay-scale", "0.001", "--ray", cluster.address, "--workers", "2",
        "--out", str(tmp_path / "sweep"),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    for level in (2, 4):
        records = to_records(read_records(tmp_path / "sweep" / f"c{level}" / "records.arrow"))
        assert {r.worker for r in records} == {0, 1} and all(r.worker == r.lane % 2 for r in records)
        run = msgspec.json.decode((tmp_path / "sweep" / f"c{level}" / "run.json").read_bytes())["run"]
        assert len(run["shards"]) == 2


def test_ray_local_starts_a_private_instance_for_the_run(sim: SimServer, tmp_path: Path) -> None:
    command = _cli(
        "replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--mode", "closed", "--concurrency", "2",
        "--sessions", "2", "--delay-scale", "0", "--ray", "local", "--workers", "2", "--out", str(tmp_path / "run"),
        "--json",
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env={**os.environ, **RAY_ENV})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"]["kept"] > 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())["run"]
    assert len(run["shards"]) == 2 and run["errors"] == 0


def test_a_sweep_over_processes_is_refused_before_anything_runs(tmp_path: Path) -> None:
    command = _cli("sweep", str(SAMPLE_TRACE), "--concurrency", "2,4", "--workers", "2", "--out", str(tmp_path / "s"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workers needs --ray" in done.stderr
    assert not (tmp_path / "s").exists()
