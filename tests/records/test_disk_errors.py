"""A run's files that the OS refuses to write (a full disk, a read-only file system, no permission, a quota, an I/O
error) at the start, mid-run and at the end: one line naming the file and the condition, what was kept, no traceback;
and the stop signals (SIGINT, SIGTERM, SIGHUP) under `--workers` and `--ray`.

Real file systems where the machine allows: a tmpfs of a few hundred kB, or one remounted read-only, in a mount
namespace of the command's own (`unshare -m`, as root); the files are copied out before it ends. Elsewhere the
failure is injected at the OS boundary: pyarrow's file refuses a write with the errno once a byte budget is spent,
writing the part that fits, as a full disk does.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from children import default_stop_signals
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.errors import OutputUnwritable, WriteFailed
from agentx.records.record import RequestRecord, RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.results.export.export_run import export_run
from agentx.run.replay import RESERVE_FILE, replay_sync
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

RECORDS = "records.arrow"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.02) as server:
        yield server


def _options(sim: SimServer, out: Path, *, grace_s: float = 1.0, sessions: int | None = None) -> ReplayOptions:
    return ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=ClosedLoad(concurrency=4),
        scenario=Scenario(delay_scale=0.0, sessions=sessions),
        runtime=Runtime(grace_s=grace_s),
    )


# ---------------------------------------------------------------------------------------------
# the OS boundary: a pyarrow file that refuses writes


class _Refusing(io.FileIO):
    """A file opened for writing that refuses (`code`) the write crossing `budget` bytes, after writing what fits."""

    def __init__(self, path: str, budget: int, code: int) -> None:
        super().__init__(path, "wb")
        self.left = budget
        self.code = code
        self.refused = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) <= self.left:
            self.left -= len(view)
            return super().write(view)
        if self.left:
            super().write(view[: self.left])
            self.left = 0
        self.refused += 1
        raise OSError(self.code, os.strerror(self.code))


class _Disk:
    """`pyarrow.OSFile` for files named `name`, opened for writing, through `_Refusing`; `open_error`: refuse the
    open itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, budget: int, code: int, open_error: bool = False):
        self.files: list[_Refusing] = []
        real = pa.OSFile

        def opened(path: Any, mode: str = "r", **kwargs: Any) -> Any:
            # a records stream starts as `<name>.partial` (agentx.records.writer)
            if "w" in mode and os.path.basename(os.fspath(path)).removesuffix(".partial").endswith(name):
                if open_error:
                    raise OSError(code, os.strerror(code))
                file = _Refusing(os.fspath(path), budget, code)
                self.files.append(file)
                return pa.PythonFile(file, mode="w")
            return real(path, mode, **kwargs)

        monkeypatch.setattr(pa, "OSFile", opened)

    @property
    def refused(self) -> int:
        return sum(file.refused for file in self.files)


def _run_info() -> RunInfo:
    return RunInfo(run_id="r", wall_epoch_ns=0, options={})


def _record(turn: int) -> RequestRecord:
    return RequestRecord(
        run_id="r",
        phase="profiling",
        lane=0,
        play=0,
        session_id="s",
        agent_id="",
        depth=0,
        turn=turn,
        model="m",
        scheduled_ns=0,
        sent_ns=1,
        end_ns=2,
        isl_recorded_tokens=4,
        isl_sent_tokens=4,
        osl_recorded_tokens=2,
    )


def test_a_refused_write_cuts_the_file_to_whole_batches_and_keeps_the_rest_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / RECORDS
    disk = _Disk(monkeypatch, RECORDS, budget=1 << 30, code=errno.ENOSPC)
    errors: list[OSError] = []
    writer = RecordWriter(path, _run_info(), flush_rows=2, on_error=errors.append)
    for index in range(4):  # two whole batches
        writer.append(_record(index))
    whole = path.stat().st_size
    disk.files[0].left = 100  # the next batch is torn after 100 bytes
    for index in range(4, 9):
        writer.append(_record(index))
    writer.close()
    assert disk.refused == 1  # nothing is written after the refusal
    assert [str(e) for e in errors] == [str(writer.error)] and writer.error is not None
    assert writer.error.errno == errno.ENOSPC and writer.error.filename == str(path)
    assert path.stat().st_size == whole  # the torn batch is cut off
    assert read_records(path).column("turn").to_pylist() == [0, 1, 2, 3]
    unwritten = writer.unwritten()
    assert unwritten is not None and unwritten.column("turn").to_pylist() == [4, 5, 6, 7, 8]


def test_a_records_file_that_cannot_take_its_schema_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Disk(monkeypatch, RECORDS, budget=10, code=errno.ENOSPC)
    with pytest.raises(OSError) as caught:
        RecordWriter(tmp_path / RECORDS, _run_info())
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / RECORDS)
    assert not (tmp_path / RECORDS).exists()


# ---------------------------------------------------------------------------------------------
# the library: start, mid-run, end


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO])
def test_a_refused_write_mid_run_stops_it_and_says_what_was_kept(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    out = tmp_path / "run"
    budget = 250_000  # the schema and a few batches (of up to 16 rows, FLUSH_ROWS)
    disk = _Disk(monkeypatch, RECORDS, budget=budget, code=code)
    trace = load_trace(SAMPLE_TRACE)
    with pytest.raises(WriteFailed) as caught:
        replay_sync(trace, _options(sim, out))
    failed = caught.value
    assert disk.refused == 1
    records = out / RECORDS
    assert failed.errno == code and failed.path == str(records) and os.strerror(code) in failed.condition
    assert failed.result is not None
    run, summary = failed.result.run, failed.result.summary
    assert run.cancel_reason == "write_failed" and not run.interrupted
    on_disk = read_records(records)  # readable: whole batches only
    assert records.stat().st_size <= budget
    assert failed.records_kept is not None and failed.records_kept == on_disk.num_rows > 0
    assert failed.records_unwritten > 0 and failed.records_kept + failed.records_unwritten == summary.counts.rows
    assert summary.counts.rows < trace.request_count  # it stopped early
    assert failed.run_file == out / "run.json" and not (out / RESERVE_FILE).exists()
    kept = json.loads((out / "run.json").read_text())
    assert kept["summary"]["counts"] == msgspec.to_builtins(summary.counts)
    assert kept["run"]["cancel_reason"] == "write_failed"
    assert kept["run"]["records_kept"] == on_disk.num_rows  # the witness of what the file holds, not the summary's
    monkeypatch.undo()  # the disk has room again: the kept rows export whole, not refused as a file cut short
    exported = pa_csv.read_csv(export_run(out, "csv"))
    assert exported.num_rows == on_disk.num_rows
    message = str(failed)
    assert "\n" not in message and str(records) in message and os.strerror(code) in message
    expected = f"{RECORDS} keeps {on_disk.num_rows:,} of the {summary.counts.rows:,} records measured"
    assert expected in message and "run.json was written" in message


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_records_file_refused_at_the_start_is_one_error_and_nothing_is_left(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    out = tmp_path / "run"
    _Disk(monkeypatch, RECORDS, budget=0, code=code, open_error=True)
    with pytest.raises(OutputUnwritable) as caught:
        replay_sync(load_trace(SAMPLE_TRACE), _options(sim, out))
    assert caught.value.errno == code and caught.value.path == str(out / RECORDS)
    assert os.strerror(code) in str(caught.value) and "did not start" in str(caught.value)
    assert not (out / RECORDS).exists() and not (out / "run.json").exists()


def test_a_run_folder_that_cannot_be_made_is_one_error(sim: SimServer, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputUnwritable) as caught:
        replay_sync(load_trace(SAMPLE_TRACE), _options(sim, blocker / "run"))
    assert caught.value.errno == errno.ENOTDIR and str(blocker) in str(caught.value)


def test_a_run_json_that_cannot_be_written_keeps_the_records_and_the_result(sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "run.json.partial").mkdir(parents=True)  # the OS refuses the file: EISDIR
    with pytest.raises(WriteFailed) as caught:
        replay_sync(load_trace(SAMPLE_TRACE), _options(sim, out, sessions=2))
    failed = caught.value
    assert failed.errno == errno.EISDIR and failed.run_file is None and not (out / "run.json").exists()
    assert failed.result is not None and failed.result.run.cancel_reason is None  # it ran to its end
    rows = read_records(out / RECORDS).num_rows
    assert failed.records_kept == rows == failed.result.summary.counts.rows and failed.records_unwritten == 0
    assert str(failed).startswith(f"{out / 'run.json'}: cannot write (Is a directory, EISDIR)")
    assert f"{RECORDS} keeps all {rows:,} records; run.json is missing" in str(failed)


def test_a_full_disk_at_the_end_loses_only_the_ipc_footer(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The end-of-stream marker and the IPC file's rewrite refused: every row is in the stream, the run stands."""
    out = tmp_path / "run"
    disk = _Disk(monkeypatch, RECORDS, budget=1 << 30, code=errno.ENOSPC)
    real_close = RecordWriter.close

    def close_on_a_full_disk(self: RecordWriter) -> None:
        self.flush()
        for file in disk.files:
            file.left = 0
        _Disk(monkeypatch, ".tmp", budget=0, code=errno.ENOSPC)  # the IPC file written beside it
        real_close(self)

    monkeypatch.setattr(RecordWriter, "close", close_on_a_full_disk)
    result = replay_sync(load_trace(SAMPLE_TRACE), _options(sim, out, sessions=2))
    assert disk.refused >= 1 and "stays an Arrow IPC stream" in caplog.text
    assert read_records(out / RECORDS).num_rows == result.summary.counts.rows > 0
    assert json.loads((out / "run.json").read_text())["summary"]["counts"]["rows"] == result.summary.counts.rows


# ---------------------------------------------------------------------------------------------
# the command line


def test_the_cli_says_a_refused_write_in_one_line_after_the_summary(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _Disk(monkeypatch, RECORDS, budget=60_000, code=errno.EIO)
    args = ["replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--concurrency", "4"]
    args += ["--delay-scale", "0", "--grace", "1", "--out", str(out), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 4, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith(f"error: {out / RECORDS}: cannot write (Input/output error, EIO): the run stopped")
    summary = json.loads(result.stdout)
    assert summary["counts"] == json.loads((out / "run.json").read_text())["summary"]["counts"]


def _namespaces() -> bool:
    """A private mount namespace with a tmpfs can be made here (root, with CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


real_file_systems = pytest.mark.skipif(not _namespaces(), reason="no mount namespace with a tmpfs on this machine")


def _on_small_disk(
    tmp_path: Path, size: str, args: list[str], *, read_only: bool = False
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`agentx ARGS` with `--out MNT/run`, MNT a tmpfs of `size` (`read_only`: remounted read-only, `run` made
    beforehand) in a mount namespace of its own; the folder is copied out to the returned path afterwards."""
    mount = tmp_path / "mnt"
    kept = tmp_path / "kept"
    mount.mkdir()
    script = f"""
        mount -t tmpfs -o size={size} tmpfs {mount} || exit 99
        {"mkdir " + str(mount / "run") + " && mount -o remount,ro " + str(mount) + " || exit 98" if read_only else ""}
        "$@"
        code=$?
        cp -a {mount}/. {kept}/ 2>/dev/null
        exit $code
    """
    kept.mkdir()
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
    command += [sys.executable, "-m", "agentx.cli", *args, "--out", str(mount / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode not in (98, 99), done.stderr
    return done, kept / "run"


def _one_error(stderr: str) -> str:
    assert "Traceback" not in stderr and "ExceptionGroup" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert stderr.rstrip().endswith(errors[0]), stderr  # said last
    return errors[0]


@real_file_systems
@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers"])
def test_a_disk_that_fills_mid_run_stops_it_with_its_records_run_json_and_summary(
    sim: SimServer, tmp_path: Path, workers: int
) -> None:
    args = [
        "replay",
        str(SAMPLE_TRACE),
        "--url",
        sim.url,
        "--model",
        sim.model,
        "--concurrency",
        "4",
        "--delay-scale",
        "0",
    ]
    args += ["--grace", "1", "--workers", str(workers), "--json"]
    done, run = _on_small_disk(tmp_path, "400k", args)
    assert done.returncode == 4, done.stderr
    line = _one_error(done.stderr)
    records = tmp_path / "mnt" / "run" / RECORDS
    assert line.startswith(f"error: {records}: cannot write (No space left on device, ENOSPC): the run stopped early")
    summary = json.loads(done.stdout)
    kept = json.loads((run / "run.json").read_text())  # the room held for it took it
    assert kept["summary"]["counts"] == summary["counts"] and kept["run"]["cancel_reason"] == "write_failed"
    total = summary["counts"]["rows"]
    assert 0 < total < load_trace(SAMPLE_TRACE).request_count
    on_disk = read_records(run / RECORDS).num_rows if (run / RECORDS).exists() else 0
    assert f"{RECORDS} keeps {on_disk:,} of the {total:,} records measured" in line
    assert "run.json was written" in line


@real_file_systems
def test_an_existing_out_folder_on_a_read_only_file_system_is_one_line_exit_2(sim: SimServer, tmp_path: Path) -> None:
    args = ["replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model, "--concurrency", "2"]
    done, _ = _on_small_disk(tmp_path, "1m", args, read_only=True)
    assert done.returncode == 2, done.stderr
    line = _one_error(done.stderr)
    records = tmp_path / "mnt" / "run" / RECORDS
    assert line == f"error: {records}: cannot write the run (Read-only file system, EROFS); the run did not start"


# ---------------------------------------------------------------------------------------------
# stop signals under --workers and --ray


def _replay(out: Path, sim: SimServer, *extra: str, grace: str = "2") -> subprocess.Popen[str]:
    """`agentx replay` in a session of its own (its process group: a terminal's job), against `sim`, which is not
    in that group (a hangup of the group reaches the replay's processes only)."""
    args = [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--url", sim.url, "--model", sim.model]
    args += ["--mode", "closed", "--concurrency", "4", "--delay-scale", "0.1", "--grace", grace, "--out", str(out)]
    args += ["--json", *extra]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_stop_signals,
    )


def _started(child: subprocess.Popen[str], path: Path, settle_s: float) -> None:
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    assert path.exists(), child.communicate(timeout=60)[1]
    time.sleep(settle_s)  # some requests finish, others are in flight


def _signal(child: subprocess.Popen[str], number: int, whole_group: bool) -> None:
    if whole_group:  # a closed terminal, Ctrl-C: every process of the job gets it
        os.killpg(child.pid, number)
    else:  # `kill PID`, a scheduler
        child.send_signal(number)


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.2) as server:
        yield server


def _check_interrupted(child: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    run_file: dict[str, Any] = json.loads((out / "run.json").read_text())
    assert run_file["run"]["interrupted"] is True and run_file["summary"]["counts"] == summary["counts"]
    rows = read_records(out / RECORDS).num_rows
    assert rows == summary["counts"]["rows"] == run_file["run"]["requests"] > 0
    assert f"its records and run.json keep the {rows:,} requests it measured" in stderr
    return run_file


@pytest.mark.parametrize(
    ("stop", "whole_group"),
    [("SIGHUP", True), ("SIGHUP", False), ("SIGTERM", True), ("SIGTERM", False), ("SIGINT", True)],
    ids=["hup-group", "hup", "term-group", "term", "int-group"],
)
def test_a_stop_signal_stops_a_workers_run_with_every_workers_records(
    slow_sim: SimServer, tmp_path: Path, stop: str, whole_group: bool
) -> None:
    """The workers outlive the signal (they take stops from the parent only) and drain; their records are merged."""
    out = tmp_path / "run"
    child = _replay(out, slow_sim, "--workers", "2")
    _started(child, out / "workers" / "1" / RECORDS, 2.0)
    _signal(child, getattr(signal, stop), whole_group)
    run_file = _check_interrupted(child, out)
    assert run_file["run"]["cancelled"] == 0  # the grace period let the requests in flight finish
    assert {row["worker"] for row in read_records(out / RECORDS).select(["worker"]).to_pylist()} == {0, 1}


@pytest.mark.parametrize(("stop", "workers"), [("SIGHUP", "1"), ("SIGTERM", "1"), ("SIGHUP", "2"), ("SIGINT", "2")])
def test_a_second_stop_signal_ends_the_grace_period(tmp_path: Path, stop: str, workers: str) -> None:
    out = tmp_path / "run"
    with SimServer(time_scale=1.0) as real_time:  # requests in flight for seconds
        child = _replay(out, real_time, "--workers", workers, grace="600")
        first = out / "workers" / "0" / RECORDS if workers != "1" else out / RECORDS
        _started(child, first, 1.5)
        _signal(child, getattr(signal, stop), True)
        time.sleep(1.0)
        assert child.poll() is None  # in the 600 s grace period
        stopped_at = time.monotonic()
        _signal(child, getattr(signal, stop), True)
        run_file = _check_interrupted(child, out)
    assert time.monotonic() - stopped_at < 30
    assert run_file["run"]["cancelled"] >= 1
    assert "cancelled" in read_records(out / RECORDS).column("error_kind").to_pylist()


RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.mark.parametrize("stop", ["SIGHUP", "SIGTERM"])
def test_a_hangup_of_the_process_group_stops_a_ray_run_and_keeps_its_records(
    slow_sim: SimServer, tmp_path: Path, stop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's local cluster outlives the hangup (its processes block it), so the driver drains the shards."""
    pytest.importorskip("ray")
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    child = _replay(out, slow_sim, "--workers", "2", "--ray", "local")
    _started(child, out / RECORDS, 3.0)
    _signal(child, getattr(signal, stop), True)
    _check_interrupted(child, out)
