"""`--workers`: a sharded replay covers exactly the single-process plan, and merged records share one clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from paths import SAMPLE_TRACE

from agentx.records.record import RequestRecord, RunInfo, read_records, run_info, to_records
from agentx.records.writer import RecordWriter, merge_records
from agentx.replayer.options.replay import AgentxLoad, ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.workers import run_workers
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _key(record: RequestRecord) -> tuple[int, str, str, int]:
    return (record.play, record.session_id, record.agent_id, record.turn)


def test_two_workers_replay_the_single_process_plan(tmp_path: Path) -> None:
    from agentx.trace.io import load_trace

    with SimServer(time_scale=0.002) as sim:
        base = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path / "one",
            load=ClosedLoad(concurrency=4),
            scenario=Scenario(sessions=6, delay_scale=0.001),
        )
        single = asyncio.run(run_replay(load_trace(SAMPLE_TRACE), base))
        sharded = run_workers(SAMPLE_TRACE, msgspec.structs.replace(base, out_dir=tmp_path / "two"), workers=2)
    one = to_records(read_records(single.records_path))
    table = read_records(sharded.records_path)
    two = to_records(table)
    assert sorted(map(_key, one)) == sorted(map(_key, two))
    assert sharded.requests == len(two) and sharded.errors == 0 and sharded.trees_finished == 6
    assert {r.run_id for r in two} == {sharded.run_id} == {run_info(table).run_id}
    # Worker i owns lanes i, i+2: plays keep the lane the single-process run would give them.
    assert {r.lane for r in two} == {0, 1, 2, 3}
    assert all(r.lane % 2 == r.play % 2 for r in two)
    # One clock: sorted by send time, and no request ends before it starts.
    sent = [r.sent_ns for r in two]
    assert sent == sorted(sent) and all(r.end_ns >= r.sent_ns for r in two)
    assert sharded.loop_lag_s and sharded.stream_usage == "continuous"


def test_the_workers_lanes_start_together_on_one_agreed_instant(tmp_path: Path) -> None:
    """Each worker builds its lanes' first bodies, then waits for the others: the first requests of every lane are
    due at one instant and go out together, however long each worker took to start."""
    with SimServer(time_scale=0.002) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(concurrency=4),
            scenario=Scenario(sessions=4, delay_scale=0.0),
        )
        result = run_workers(SAMPLE_TRACE, options, workers=2)
    records = to_records(read_records(result.records_path))
    firsts = [min((r for r in records if r.lane == lane), key=lambda r: r.sent_ns) for lane in range(4)]
    due = [r.scheduled_ns for r in firsts]
    assert {r.worker for r in firsts} == {0, 1}
    # One instant on the merged clock, the mapping's error aside: ~1 ms on a quiet machine, 5 ms seen on a loaded one;
    # workers that each start on their own are hundreds of ms apart.
    assert max(due) - min(due) < 20_000_000
    assert max(r.sent_ns for r in firsts) - min(due) < 50_000_000


def test_agentx_workers_report_every_lanes_snapshot(tmp_path: Path) -> None:
    with SimServer(time_scale=0.002) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=AgentxLoad(concurrency=4),
            scenario=Scenario(sessions=4, delay_scale=0.001),
        )
        result = run_workers(SAMPLE_TRACE, options, workers=2)
    assert [entry.lane for entry in result.tstar] == [0, 1, 2, 3]
    records = to_records(read_records(result.records_path))
    assert result.warmup_requests == sum(r.phase == "warmup" for r in records) > 0


def test_more_workers_than_lanes_is_refused(tmp_path: Path) -> None:
    options = ReplayOptions(
        server=Server(url="http://127.0.0.1:9", model="m"), out_dir=tmp_path, load=ClosedLoad(concurrency=2)
    )
    with pytest.raises(ValueError, match="exceeds --concurrency"):
        run_workers(SAMPLE_TRACE, options, workers=3)


def _record(run_id: str, sent_ns: int) -> RequestRecord:
    return RequestRecord(
        run_id=run_id,
        phase="profiling",
        lane=0,
        play=0,
        session_id="s",
        agent_id="",
        depth=0,
        turn=0,
        model="m",
        scheduled_ns=sent_ns - 5,
        sent_ns=sent_ns,
        first_token_ns=sent_ns + 10,
        last_token_ns=sent_ns + 30,
        end_ns=sent_ns + 31,
        chunk_times_ns=[sent_ns + 10, sent_ns + 30],
        chunk_tokens=[1, 1],
        isl_recorded_tokens=4,
        isl_sent_tokens=4,
        osl_recorded_tokens=2,
        osl_streamed_tokens=2,
    )


def test_merging_shifts_each_file_onto_the_earliest_clock(tmp_path: Path) -> None:
    for name, epoch, sent in (("a", 1_000, 100), ("b", 1_250, 100)):
        with RecordWriter(tmp_path / name, RunInfo(run_id="r", wall_epoch_ns=epoch)) as writer:
            writer.append(_record("r", sent))
    assert merge_records([tmp_path / "a", tmp_path / "b"], tmp_path / "m") == 2
    merged = read_records(tmp_path / "m")
    assert run_info(merged).wall_epoch_ns == 1_000
    a, b = to_records(merged)
    assert (a.sent_ns, b.sent_ns) == (100, 350)
    assert b.chunk_times_ns == [360, 380] and b.end_ns == 381
    assert (a.ttft_s, a.e2el_s, a.dispatch_lag_s) == (b.ttft_s, b.e2el_s, b.dispatch_lag_s)


def test_files_of_different_runs_do_not_merge(tmp_path: Path) -> None:
    from agentx.errors import RecordsError

    for name in ("a", "b"):
        with RecordWriter(tmp_path / name, RunInfo(run_id=name, wall_epoch_ns=0)) as writer:
            writer.append(_record(name, 1))
    with pytest.raises(RecordsError, match="different runs"):
        merge_records([tmp_path / "a", tmp_path / "b"], tmp_path / "m")


def test_an_unreachable_server_is_one_clear_error_from_the_workers(tmp_path: Path) -> None:
    from agentx.replayer.http.client import ServerUnreachable

    options = ReplayOptions(
        server=Server(url="http://127.0.0.1:9", model="m"), out_dir=tmp_path, load=ClosedLoad(concurrency=2)
    )
    with pytest.raises(ServerUnreachable, match=r"127\.0\.0\.1:9"):
        run_workers(SAMPLE_TRACE, options, workers=2)


def test_the_cli_runs_workers_and_summarizes_the_merged_records(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--concurrency", "2", "--sessions", "2",
        "--workers", "2", "--delay-scale", "0", "--sim-time-scale", "0.002", "--out", str(tmp_path / "run"),
        "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    counts = summary["counts"]
    assert counts["kept"] == counts["rows"] - counts["warmup_excluded"] > 0
    assert (tmp_path / "run" / "run.json").is_file()
    assert len(to_records(read_records(tmp_path / "run" / "records.arrow"))) == summary["counts"]["rows"]


def test_the_public_replay_runs_workers_itself(tmp_path: Path) -> None:
    import agentx
    from agentx.replayer.options.replay import Runtime

    trace = agentx.trace.load_trace(SAMPLE_TRACE)
    with SimServer(time_scale=0.002) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path / "run",
            load=ClosedLoad(concurrency=4),
            scenario=Scenario(sessions=6, delay_scale=0.001),
            runtime=Runtime(workers=2),
        )
        result = agentx.replay_sync(trace, options, trace_path=SAMPLE_TRACE)
        with pytest.raises(agentx.ConfigError, match="per-request callbacks"):
            asyncio.run(
                agentx.replay(
                    trace, msgspec.structs.replace(options, out_dir=tmp_path / "b"), agentx.RunHooks(on_record=print)
                )
            )
    records = to_records(read_records(result.run.records_path))
    assert {r.lane for r in records} == {0, 1, 2, 3} and result.run.trees_finished == 6
    assert (tmp_path / "run" / "workers" / "1").is_dir()  # shards wrote their own records beside the merged ones
    assert result.summary.counts.rows == len(records) and result.run.trace_path == str(SAMPLE_TRACE.resolve())


def test_a_prepared_trace_over_workers_keeps_what_its_preparation_left_out(tmp_path: Path) -> None:
    """The workers get the sessions a prepared trace kept; the sessions it left out (over `max_context_length`) are
    counted and said in the run's result as a run in one process says them."""
    from builders import growing_chain, make_session, make_trace

    import agentx
    from agentx.replayer.options.replay import Runtime

    small = [make_session(f"s{index}", growing_chain(2, first_in_tokens=64, in_tokens_step=16)) for index in range(4)]
    large = make_session("large", growing_chain(2, first_in_tokens=4000, in_tokens_step=16))
    trace = make_trace(*small, large)
    with SimServer(time_scale=0.002) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path / "workers",
            load=ClosedLoad(concurrency=2),
            scenario=Scenario(delay_scale=0.001, max_context_length=1000),
            runtime=Runtime(workers=2),
        )
        over_workers = agentx.replay_sync(agentx.prepare_trace(trace, options), options)
        one = msgspec.structs.replace(options, out_dir=tmp_path / "one", runtime=Runtime())
        in_one = agentx.replay_sync(agentx.prepare_trace(trace, one), one)
    for result in (over_workers, in_one):
        assert result.run.dropped_sessions == 1
        assert sum("'large'" in notice and "left out" in notice for notice in result.run.notices) == 1
    assert {r.session_id for r in to_records(read_records(over_workers.run.records_path))} == {
        f"s{i}" for i in range(4)
    }
