"""records.arrow's two containers: an Arrow IPC file after a clean end, which pyarrow, polars and duckdb open, and
the crash-safe stream a killed run leaves, which agentx reads and `agentx export --format arrow` finalizes; and a
trace's `.arrow` file in the same three readers (docs/formats.md)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pytest
from children import default_stop_signals
from click.testing import CliRunner
from paths import REPO
from strategies import record_identity

import agentx
from agentx.cli import main
from agentx.errors import RecordsDamaged, RecordsError, RecordsInUse
from agentx.records import writer as record_writer
from agentx.records.ipc_files import FILE_MAGIC, META_ROWS, without_rows
from agentx.records.record import RequestRecord, RunInfo, read_records, run_info, to_records
from agentx.records.writer import RecordWriter, finalize_records, merge_records
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SAMPLE = REPO / "traces" / "sample.arrow"
RUN = RunInfo(run_id="run-1", wall_epoch_ns=1_780_000_000_000_000_000, options={"concurrency": 4, "mode": "closed"})
COLUMNS = ["request_id", "session_id", "agent_id", "turn", "sent_ns", "ttft_s", "chunk_tokens", "status"]


def make(turn: int, **overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "turn": turn,
        "request_id": f"req-{turn:04d}",
        "scheduled_ns": 1_000 * turn,
        "sent_ns": 1_000 * turn + 5,
        "first_token_ns": 1_000 * turn + 50,
        "last_token_ns": 1_000 * turn + 900,
        "end_ns": 1_000 * turn + 950,
        "chunk_times_ns": [1_000 * turn + 50, 1_000 * turn + 900],
        "chunk_tokens": [1, turn + 1],
        "isl_recorded_tokens": 10 + turn,
        "isl_sent_tokens": 10 + turn,
        "osl_recorded_tokens": turn + 2,
        "osl_streamed_tokens": turn + 2,
    }
    values.update(overrides)
    return RequestRecord(**values)


def is_ipc_file(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(FILE_MAGIC) and data.endswith(FILE_MAGIC)


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.endswith(".tmp"))


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The table's COLUMNS as tuples, in request-id order (how the duckdb query below orders them)."""
    picked = table.select(COLUMNS).to_pylist()
    return sorted((tuple(row[name] for name in COLUMNS) for row in picked), key=lambda row: row[0])


# ---------------------------------------------------------------------------------------------
# a real replay against the simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    trace = agentx.trace.load_trace(SAMPLE)
    with SimServer(time_scale=0.01, block_size=trace.block_size) as server:
        yield server


@pytest.fixture(scope="module")
def finished_run(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(sessions=2, delay_scale=0.01),
    )
    result = agentx.replay_sync(agentx.trace.load_trace(SAMPLE), options)
    assert result.run.requests > 0 and result.run.errors == 0
    return out


def test_a_finished_replay_leaves_an_ipc_file_that_pyarrow_polars_and_duckdb_open(finished_run: Path) -> None:
    path = finished_run / "records.arrow"
    assert is_ipc_file(path) and leftovers(finished_run) == []
    ours = read_records(path)
    expected = rows(ours)
    assert len(expected) == json.loads((finished_run / "run.json").read_text())["run"]["requests"]

    with ipc.open_file(path) as reader:
        assert rows(reader.read_all()) == expected
    by_feather = feather.read_table(path)
    assert rows(by_feather) == expected
    assert run_info(by_feather) == run_info(ours)  # the run's id, epoch and options travel in the file
    assert by_feather.equals(ours)

    frame = pl.read_ipc(path)
    assert frame.height == len(expected) and frame.columns == ours.column_names
    assert rows(frame.to_arrow()) == expected

    # duckdb reads an .arrow file from SQL only through its `arrow` community extension (a download); offline it
    # queries the pyarrow table or the polars frame in Python scope.
    query = f"SELECT {', '.join(COLUMNS)} FROM records ORDER BY request_id"
    connection = duckdb.connect()
    connection.register("records", ours)
    assert connection.execute(query).fetchall() == expected
    records = frame  # noqa: F841 (duckdb finds the frame by its name in this scope)
    assert duckdb.connect().execute(query).fetchall() == expected


def test_agentx_readers_open_the_finished_file(finished_run: Path) -> None:
    summary = agentx.summarize(read_records(finished_run / "records.arrow"))
    run_file = json.loads((finished_run / "run.json").read_text())
    assert summary.counts.kept == run_file["summary"]["counts"]["kept"] > 0
    result = CliRunner().invoke(main, ["report", str(finished_run), "--json"])
    assert result.exit_code == 0, result.output


def _replay_child(sim: SimServer, out: Path) -> subprocess.Popen[str]:
    args = ["replay", str(SAMPLE), "--url", sim.url, "--model", sim.model, "--concurrency", "2", "--mode", "closed"]
    args += ["--delay-scale", "0.05", "--grace", "2", "--out", str(out), "--json"]
    command = [sys.executable, "-m", "agentx.cli", *args]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals
    )


def _wait_for_rows(path: Path, count: int, child: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        try:
            flushed = int(read_records(path).num_rows)
        except RecordsError:  # not created yet, or its schema not yet flushed
            flushed = 0
        if flushed >= count:
            return flushed
        time.sleep(0.05)
    raise AssertionError(f"the replay flushed fewer than {count} records before it ended or the deadline")


def test_a_killed_replay_leaves_a_stream_agentx_reads_and_export_finalizes(sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    child = _replay_child(sim, out)
    try:
        flushed = _wait_for_rows(out / "records.arrow", 4, child)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    path = out / "records.arrow"
    assert not path.read_bytes().startswith(FILE_MAGIC) and not (out / "run.json").exists()
    stream = read_records(path)
    assert stream.num_rows >= flushed
    assert agentx.summarize(stream).counts.kept >= 1

    result = CliRunner().invoke(main, ["export", str(out), "--format", "arrow"])
    assert result.exit_code == 0, result.output
    assert "rewrote" in result.output and f"({stream.num_rows} rows)" in result.output
    assert is_ipc_file(path) and leftovers(out) == []
    finalized = pl.read_ipc(path).to_arrow()
    assert rows(finalized) == rows(stream)
    assert read_records(path).equals(stream) and run_info(read_records(path)) == run_info(stream)

    before = path.read_bytes()
    again = CliRunner().invoke(main, ["export", str(out), "--format", "arrow"])
    assert again.exit_code == 0 and "already an Arrow IPC file" in again.output
    assert path.read_bytes() == before


def test_a_replay_stopped_by_sigterm_leaves_an_ipc_file(sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    child = _replay_child(sim, out)
    try:
        _wait_for_rows(out / "records.arrow", 4, child)
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    path = out / "records.arrow"
    assert is_ipc_file(path) and leftovers(out) == []
    requests = json.loads((out / "run.json").read_text())["run"]["requests"]
    assert pl.read_ipc(path).height == feather.read_table(path).num_rows == requests


# ---------------------------------------------------------------------------------------------
# the writer's finalization


def test_closing_makes_the_stream_an_ipc_file_with_the_same_rows_metadata_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "records.arrow"
    records = [make(turn) for turn in range(7)]
    writer = RecordWriter(path, RUN, flush_rows=2)
    for record in records:
        writer.append(record)
    os.chmod(path, 0o640)
    assert not path.read_bytes().startswith(FILE_MAGIC)  # the running stream
    assert to_records(read_records(path)) == records[:6]
    writer.close()
    assert writer.finalized and is_ipc_file(path) and leftovers(tmp_path) == []
    assert os.stat(path).st_mode & 0o777 == 0o640
    with ipc.open_file(path) as reader:
        assert reader.num_record_batches == 1  # the stream's small batches, coalesced
        assert without_rows(reader.schema).metadata == read_records(path).schema.metadata
        assert reader.schema.metadata[META_ROWS] == b"7"  # the file's own count, which a table read from it drops
    assert to_records(read_records(path)) == records and run_info(read_records(path)) == RUN
    assert finalize_records(path) is False  # already a file: nothing written


def test_a_stream_a_writer_still_holds_is_not_finalized(tmp_path: Path) -> None:
    path = tmp_path / "records.arrow"
    writer = RecordWriter(path, RUN, flush_rows=1)
    writer.append(make(0))
    before = path.read_bytes()
    with pytest.raises(RecordsInUse, match="still writing"):
        finalize_records(path)
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "arrow"])
    assert result.exit_code == 2 and "still writing" in result.output and "Traceback" not in result.output
    assert path.read_bytes() == before
    writer.append(make(1))  # the run goes on into the same file
    writer.close()
    assert writer.finalized and [r.turn for r in to_records(read_records(path))] == [0, 1]


def test_a_failed_finalization_keeps_the_whole_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def disk_full(*args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(record_writer, "write_records_file", disk_full)
    path = tmp_path / "records.arrow"
    with caplog.at_level(logging.WARNING), RecordWriter(path, RUN) as writer:
        for turn in range(3):
            writer.append(make(turn))
    assert not writer.finalized and "stays an Arrow IPC stream" in caplog.text
    assert not path.read_bytes().startswith(FILE_MAGIC) and leftovers(tmp_path) == []
    assert [r.turn for r in to_records(read_records(path))] == [0, 1, 2]


_KILLED_WHILE_FINALIZING = textwrap.dedent(
    """
    import sys, time
    from agentx.records import writer as record_writer

    real = record_writer.write_records_file

    def slow(batches, schema, path):
        def paused():
            for index, batch in enumerate(batches):
                yield batch
                if index == 2:
                    print("midway", flush=True)
                    time.sleep(60)
        return real(paused(), schema, path)

    record_writer.write_records_file = slow
    record_writer.finalize_records(sys.argv[1])
    """
)


def test_a_kill_while_finalizing_leaves_the_whole_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_writer, "finalize_records", lambda path: False)  # keep the stream at close
    path = tmp_path / "records.arrow"
    with RecordWriter(path, RUN, flush_rows=1) as writer:
        for turn in range(6):
            writer.append(make(turn))
    stream = path.read_bytes()
    assert not stream.startswith(FILE_MAGIC)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", _KILLED_WHILE_FINALIZING, str(path)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == "midway\n"
        assert len(leftovers(tmp_path)) == 1  # the file being written beside the stream
    finally:
        child.kill()
        child.wait(timeout=10)
    assert path.read_bytes() == stream
    assert [r.turn for r in to_records(read_records(path))] == list(range(6))
    (tmp_path / leftovers(tmp_path)[0]).unlink()
    assert finalize_records(path) and [r.turn for r in to_records(read_records(path))] == list(range(6))


def test_a_finalized_file_cut_short_reads_its_complete_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_writer, "FINAL_BATCH_ROWS", 3)
    path = tmp_path / "records.arrow"
    with RecordWriter(path, RUN, flush_rows=1) as writer:
        for turn in range(10):
            writer.append(make(turn))
    data = path.read_bytes()
    assert is_ipc_file(path)
    cut = tmp_path / "copy.arrow"
    seen = set()
    # A copy in progress, the footer last; cut every 61 bytes, a stride prime to Arrow's 8-byte alignment and shorter
    # than any batch, so that every batch is cut inside.
    for offset in range(64, len(data) + 1, 61):
        cut.write_bytes(data[:offset])
        try:
            turns = [r.turn for r in to_records(read_records(cut, partial=True))]
        except RecordsDamaged as exc:  # the schema itself is cut
            assert (exc.rows_read, exc.rows_expected) == (0, None), offset
            continue
        assert turns == list(range(len(turns))) and len(turns) in (0, 3, 6, 9, 10), offset
        seen.add(len(turns))
        if len(turns) < 10:  # without `partial`, what reads short is refused, saying how short
            with pytest.raises(RecordsDamaged) as refused:
                read_records(cut)
            assert (refused.value.rows_read, refused.value.rows_expected) == (len(turns), 10), offset
    cut.write_bytes(data)
    assert len(read_records(cut)) == 10 and {3, 6, 9} <= seen


def test_a_merged_workers_file_is_an_ipc_file(tmp_path: Path) -> None:
    parts = []
    for index in range(2):
        part = tmp_path / f"w{index}.arrow"
        with RecordWriter(part, msgspec.structs.replace(RUN, wall_epoch_ns=RUN.wall_epoch_ns + index)) as writer:
            writer.append(make(index))
        parts.append(part)
    out = tmp_path / "records.arrow"
    assert merge_records(parts, out) == 2
    assert is_ipc_file(out) and feather.read_table(out).num_rows == 2


# ---------------------------------------------------------------------------------------------
# a trace's .arrow file (README: "opens as a plain table in pyarrow, polars or duckdb")


def test_the_sample_trace_opens_in_pyarrow_polars_and_duckdb() -> None:
    trace = agentx.trace.load_trace(SAMPLE)
    requests = [request for session in trace.sessions for agent, _, _ in session.agents() for request in agent.requests]
    total_in = sum(request.in_tokens for request in requests)
    table = feather.read_table(SAMPLE)
    assert table.num_rows == len(requests) and pc.sum(table.column("in")).as_py() == total_in
    with ipc.open_file(SAMPLE) as reader:
        assert reader.read_all().equals(table)
    frame = pl.read_ipc(SAMPLE)
    assert frame.height == len(requests) and frame["in"].sum() == total_in
    query = 'SELECT count(*), sum("in"), count(DISTINCT session_id) FROM sample'
    expected = (len(requests), total_in, len(trace.sessions))
    sample = frame  # noqa: F841 (duckdb finds the polars frame by its name in this scope)
    assert duckdb.connect().execute(query).fetchone() == expected
    connection = duckdb.connect()
    connection.register("sample", table)
    assert connection.execute(query).fetchone() == expected
