"""The command line: real invocations, exit codes, and no tracebacks for user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc
import pytest
from builders import write_trace_table
from children import default_stop_signals
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.records.record import read_records
from agentx.replayer.options.replay import Scenario
from agentx.run.progress import end_line
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

TRACE: dict[str, Any] = {
    "id": "abc",
    "models": ["m"],
    "block_size": 64,
    "hash_id_scope": "local",
    "requests": [
        {"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 10, "hash_ids": [0, 1, 2], "api_time": 1.0},
        {"t": 3.0, "type": "n", "model": "m", "in": 900, "out": 10, "hash_ids": [0, 1, 2], "api_time": 1.0},
    ],
}


@pytest.fixture
def weka_file(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(TRACE) + "\n")
    return path


def test_validate_reports_the_hash_id_shortfall_as_a_located_warning(weka_file: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(weka_file)])
    assert result.exit_code == 0, result.output
    assert f'{weka_file}:1 session "abc" request 1: in=900 needs 14 hash ids at block_size 64, has 3' in result.output
    assert "ok" in result.output


def test_validate_exits_2_naming_file_line_session_and_request(tmp_path: Path) -> None:
    bad = dict(TRACE, requests=[dict(TRACE["requests"][0]), dict(TRACE["requests"][1], api_time=-2.0)])
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TRACE) + "\n" + json.dumps(dict(bad, id="xyz")) + "\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert f'{path}:2 session "xyz" request 1: api_time is negative (-2.0)' in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"id": "x", "models": [], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": ', b""],
)
def test_broken_files_fail_with_exit_2_and_one_paragraph(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    for command in ("validate", "inspect", "convert"):
        args = [command, str(path)] + ([str(tmp_path / "out.arrow")] if command == "convert" else [])
        result = subprocess.run([sys.executable, "-m", "agentx.cli", *args], capture_output=True, text=True)
        assert result.returncode == 2, (command, result.stderr)
        assert "Traceback" not in result.stderr
        assert str(path) in result.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope.arrow")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_convert_then_inspect_json(weka_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.arrow"
    result = CliRunner().invoke(main, ["convert", str(weka_file), str(out)])
    assert result.exit_code == 0, result.output
    assert load_trace(out) == load_trace(weka_file)
    result = CliRunner().invoke(main, ["inspect", str(out), "--json", "--cache-tokens", "1e3,1e6"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["requests"] == 2 and report["sessions"] == 1
    # r1 repeats r0's three blocks after r0 ended: 3 hits of 6 blocks.
    assert report["theoretical_hit"] == {"hits": 3, "total": 6}
    assert [lru["capacity_tokens"] for lru in report["lru_hits"]] == [1000, 1_000_000]


def test_inspect_prints_tables(weka_file: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(weka_file)])
    assert result.exit_code == 0, result.output
    for heading in ("sessions", "distributions", "prefix-cache hit", "theoretical"):
        assert heading in result.output


def test_inspect_says_a_think_time_not_recorded_and_shows_the_gaps_replay_waits(tmp_path: Path) -> None:
    """A trace of start times alone (Mooncake sessions, requests 1 s apart): no think time is recorded, and the
    gaps replay waits between the turns are the starts' gaps, not 0."""
    path = tmp_path / "timestamps.jsonl"
    rows = [{"session_id": "a", "timestamp": ms, "input_length": 100, "output_length": 10} for ms in (0, 1000, 2000)]
    rows.append({"session_id": "b", "timestamp": 1500, "input_length": 100, "output_length": 10})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line.split("│")[2:] for line in result.output.splitlines() if "(s)" in line}
    think, gap, start_gap = (
        [cell.strip() for cell in lines[name] if cell.strip()]
        for name in ("think time (s)", "turn gap (s)", "session start gap (s)")
    )
    assert think[:2] == ["0", "not recorded"] and set(think[2:]) == {"–"}
    assert gap == ["2", "1.00", "1.00", "1.00", "1.00", "1.00"]
    assert start_gap == ["1", "1.50", "1.50", "1.50", "1.50", "1.50"]
    assert "Replay waits the turn gaps, never the think times" in " ".join(result.output.split())
    report = json.loads(CliRunner().invoke(main, ["inspect", str(path), "--json"]).stdout)
    assert report["think_time_s"]["count"] == 0 and report["turn_gap_s"]["mean"] == 1.0


def test_bad_cache_tokens_option(weka_file: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(weka_file), "--cache-tokens", "lots"])
    assert result.exit_code == 2
    assert "--cache-tokens" in result.output


def test_block_size_bounds_are_the_same_on_the_command_line_and_in_the_library(weka_file: Path) -> None:
    from agentx.errors import TraceError

    sample = SAMPLE_TRACE
    for path in (weka_file, sample):
        result = CliRunner().invoke(main, ["inspect", str(path), "--block-size", "999999999999"])
        assert result.exit_code == 2 and "--block-size" in result.output and "1048576" in result.output
        with pytest.raises(TraceError, match=r"block_size=999999999999 must be in \[1, 1048576\]"):
            load_trace(path, block_size=999999999999)
        with pytest.raises(TraceError, match="block_size=0 must be"):
            load_trace(path, block_size=0)


def test_replay_without_url_runs_against_the_simulator_and_prints_the_summary(tmp_path: Path) -> None:
    sample = SAMPLE_TRACE
    out = tmp_path / "run"
    args = ["replay", str(sample), "--sessions", "2", "--concurrency", "2", "--sim-time-scale", "0.01"]
    args += ["--mode", "closed", "--delay-scale", "0", "--out", str(out), "--json"]
    result = subprocess.run([sys.executable, "-m", "agentx.cli", *args], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "built-in simulator" in result.stderr
    summary = json.loads(result.stdout)
    trace = load_trace(sample)
    expected = sum(s.request_count for s in trace.sessions[:2])
    assert summary["counts"]["kept"] == expected and summary["counts"]["errors"] == 0
    assert (out / "records.arrow").exists()


def test_replay_against_an_unreachable_url_is_a_clear_error(weka_file: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(
        main, ["replay", str(weka_file), "--url", f"http://127.0.0.1:{port}", "--model", "m", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "unreachable" in result.output
    # A password in the URL is never printed, with or without --model.
    for extra in (["--model", "m"], []):
        url = f"http://someone:pa55w0rd-Do-Not-Print@127.0.0.1:{port}"
        result = CliRunner().invoke(main, ["replay", str(weka_file), "--url", url, *extra, "--out", str(tmp_path)])
        assert result.exit_code == 2 and "unreachable" in result.output
        assert "pa55w0rd" not in result.output and "127.0.0.1" in result.output


def _agentx(args: list[str], signals: Callable[[], None] = default_stop_signals) -> subprocess.Popen[str]:
    """`agentx ARGS` as a child with its output piped, its stop signals set by `signals` (a `preexec_fn`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentx.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=signals,
    )


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_stops_a_replay_gracefully_with_a_partial_summary(tmp_path: Path, stop_signal: str) -> None:
    """Ctrl-C, SIGTERM as schedulers and `timeout` send it, and SIGHUP as a closed terminal or ssh session sends it:
    a graceful stop, run.json and the summary."""
    import signal
    import time

    sample = SAMPLE_TRACE
    out = tmp_path / "run"
    args = ["replay", str(sample), "--concurrency", "2", "--sim-time-scale", "0.2", "--delay-scale", "0.1"]
    args += ["--grace", "1", "--out", str(out), "--json"]
    child = _agentx(args)
    deadline = time.monotonic() + 60
    records = out / "records.arrow"
    # Some profiling requests finished (on disk: the runner flushes them as it goes), others are in flight; a loaded
    # machine takes seconds more to get there, so the test waits for it rather than for a fixed time.
    while time.monotonic() < deadline and not (
        records.exists() and read_records(records).column("phase").to_pylist().count("profiling") >= 1
    ):
        time.sleep(0.1)
    child.send_signal(getattr(signal, stop_signal))
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    kept = f"{summary['counts']['rows']:,} requests"
    assert f"interrupted: the run stopped early; its records and run.json keep the {kept}" in stderr
    assert summary["counts"]["profiling"] >= 1
    assert load_trace(sample).request_count > summary["counts"]["profiling"]  # it did stop early
    run_file = json.loads((out / "run.json").read_text())  # written for an interrupted run too
    assert run_file["run"]["interrupted"] is True
    assert run_file["summary"]["counts"] == summary["counts"]


def _ignore_hangups() -> None:
    default_stop_signals()
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_replay_started_under_nohup_rides_out_a_hangup(tmp_path: Path, workers: str) -> None:
    """`nohup agentx replay ...`: a closed terminal's SIGHUP is ignored at every phase, the run's included; the user's
    Ctrl-C still stops it."""
    import signal
    import time

    sample = SAMPLE_TRACE
    out = tmp_path / "run"
    args = ["replay", str(sample), "--mode", "closed", "--concurrency", "2", "--sim-time-scale", "0.2"]
    args += ["--delay-scale", "0.1", "--grace", "1", "--workers", workers, "--out", str(out), "--json"]
    child = _agentx(args, signals=_ignore_hangups)
    first = out / "records.arrow" if workers == "1" else out / "workers" / "0" / "records.arrow"
    child.send_signal(signal.SIGHUP)  # while it starts
    deadline = time.monotonic() + 60
    while not first.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)
    child.send_signal(signal.SIGHUP)  # while it runs
    time.sleep(1.5)
    assert child.poll() is None, child.communicate()[1]
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert json.loads((out / "run.json").read_text())["run"]["interrupted"] is True
    assert json.loads(stdout)["counts"]["profiling"] >= 1


def test_a_second_ctrl_c_ends_the_grace_period_and_still_writes_the_run(tmp_path: Path) -> None:
    import signal
    import time

    sample = SAMPLE_TRACE
    out = tmp_path / "run"
    args = ["replay", str(sample), "--concurrency", "2", "--sim-time-scale", "1", "--delay-scale", "0.1"]
    args += ["--mode", "closed", "--grace", "600", "--out", str(out), "--json"]
    child = _agentx(args)
    deadline = time.monotonic() + 60
    while not (out / "records.arrow").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # requests in flight, at real-time speed
    child.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert child.poll() is None  # in the 600 s grace period
    interrupted_at = time.monotonic()
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert time.monotonic() - interrupted_at < 10
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    run_file = json.loads((out / "run.json").read_text())
    assert run_file["run"]["interrupted"] is True and run_file["run"]["cancelled"] >= 1
    assert run_file["summary"]["counts"] == summary["counts"]
    records = read_records(out / "records.arrow")
    assert records.num_rows == run_file["run"]["requests"]
    assert "cancelled" in records.column("error_kind").to_pylist()


FAST_REPLAY = ["--sim-time-scale", "0.01", "--delay-scale", "0"]


@pytest.mark.parametrize(
    ("faults", "flags", "message"),
    [
        (
            {"error_500_rate": 1.0},
            [],
            "error: no request succeeded: {n} of {n} profiling requests failed (http {n} (HTTP 500 ×{n}))",
        ),
        (
            {"error_500_rate": 0.5, "seed": 3},
            ["--failed-request-threshold", "0.1"],
            "error: the run was cancelled by --failed-request-threshold 0.1: ",
        ),
    ],
)
def test_a_run_that_does_not_stand_exits_3_with_one_line(
    tmp_path: Path, faults: dict[str, Any], flags: list[str], message: str
) -> None:
    from agentx.sim.faults import FaultConfig
    from agentx.sim.process import SimServer

    with SimServer(time_scale=0.01, faults=FaultConfig(**faults)) as sim:
        out = tmp_path / "run"
        args = ["--url", sim.url, "--mode", "closed", "--concurrency", "2", "--sessions", "4", "--out", str(out)]
        result = _replay(*args, *flags, "--json")
    assert result.returncode == 3, result.stderr
    summary = json.loads(result.stdout)  # the summary is still printed and written
    assert json.loads((out / "run.json").read_text())["summary"]["counts"] == summary["counts"]
    assert message.format(n=summary["counts"]["profiling"]) in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]) and "Traceback" not in result.stderr


def test_sessions_left_out_by_max_context_length_are_said(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--mode", "closed", "--concurrency", "2", "--max-context-length", "30000", "--out", str(out), "--json"]
    result = _replay(*args)
    assert result.returncode == 0, result.stderr
    said = "17 of 20 sessions need more than max_context_length 30,000 tokens (peak in + out) and are left out: "
    assert said in result.stderr
    run_file = json.loads((out / "run.json").read_text())
    assert run_file["run"]["dropped_sessions"] == 17 and run_file["run"]["notices"][0].startswith("17 of 20")


def test_nothing_left_to_replay_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _replay("--mode", "closed", "--max-context-length", "1000", "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert "nothing to replay: 20 of 20 sessions need more than max_context_length 1,000 tokens" in result.stderr
    assert "Traceback" not in result.stderr and not (out / "records.arrow").exists()


def _replay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), *FAST_REPLAY, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def test_replay_flags_reach_the_run_and_run_json_keeps_no_secrets(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _replay(
        "--sessions", "1", "--concurrency", "2", "--ramp", "0.3", "--mode", "closed", "--stream-usage", "final",
        "--out", str(out),
        "--header", "X-Team: hidden-header-value", "--api-key-env", "AGENTX_TEST_KEY",
        "--request-timeout", "120", "--idle-timeout", "off",
        env={"AGENTX_TEST_KEY": "sk-secretsecret12345"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "out tok/s" not in result.stderr  # stderr is a pipe: no progress drawn
    raw = (out / "run.json").read_text()
    assert "secretsecret" not in raw and "hidden-header-value" not in raw
    run_file = json.loads(raw)
    assert run_file["options"]["stream_usage"] == "final" and run_file["options"]["ramp_s"] == 0.3
    assert run_file["options"]["api"] == "completions"
    assert (run_file["options"]["request_timeout_s"], run_file["options"]["idle_timeout_s"]) == (120.0, None)
    assert run_file["run"]["stream_usage"] == "final"  # forced, not probed
    assert run_file["summary"]["stream_usage"] == "final"
    requests = load_trace(SAMPLE_TRACE).sessions[0].request_count
    assert run_file["run"]["requests"] == run_file["summary"]["counts"]["kept"] == requests
    assert run_file["summary"]["loop_lag"]["samples"] == len(run_file["run"]["loop_lag_s"]) > 0
    # the table names where the files went
    assert f"records: {out / 'records.arrow'}" in result.stdout and f"run: {out / 'run.json'}" in result.stdout
    assert "event-loop lag" in result.stdout and "stream usage" in result.stdout


def test_replay_api_chat_calibrates_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _replay("--sessions", "1", "--api", "chat", "--mode", "closed", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"]["kept"] == load_trace(SAMPLE_TRACE).sessions[0].request_count
    assert summary["calibration"] is not None
    run_file = json.loads((out / "run.json").read_text())
    assert run_file["options"]["api"] == "chat" and run_file["run"]["calibration"] == summary["calibration"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokenizer", "tok.json"], "--tokenizer calibrates chat prompts; it needs --api chat"),
        (["--api", "chat", "--tokenizer", "missing.json"], "--tokenizer missing.json: no such file"),
        (["--api", "rest"], "Invalid value for '--api'"),
        (["--ramp", "-1"], "Invalid value for '--ramp'"),
        (["--stream-usage", "sometimes"], "Invalid value for '--stream-usage'"),
        (["--seed", "-1"], "Invalid value for '--seed'"),
        (["--delay-scale", "nan"], "'--delay-scale': 'nan' is not a finite number"),
        (["--delay-scale", "inf"], "'--delay-scale': 'inf' is not a finite number"),
        (["--duration", "nan"], "'--duration': 'nan' is not a finite number"),
        (["--request-timeout", "0"], "'--request-timeout' / '--request-timeout-seconds': 0.0 is not in the range x>0"),
        (["--idle-timeout", "nan"], "'--idle-timeout': 'nan' is not a finite number"),
        (["--idle-timeout", "soon"], "'--idle-timeout': 'soon' is not a number or 'off'"),
    ],
)
def test_replay_flag_mistakes_are_one_clear_error(
    weka_file: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(main, ["replay", str(weka_file), "--out", str(tmp_path / "run"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "run").exists()


DEEP_BODY = '{"a":' * 5000 + "1" + "}" * 5000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "ftp://127.0.0.1:1"], "--url: 'ftp://127.0.0.1:1': the server URL must be http:// or https://"),
        (["--url", "http://"], "the server URL has no host"),
        (["--url", "http://127.0.0.1:99999"], "is not a usable server URL (Port out of range"),
        (["--url", "http://[::1"], "is not a usable server URL (Invalid IPv6 URL)"),
        (["--url", ""], "--url: the server URL is empty"),
        (["--url", " "], "--url: the server URL is empty"),
        (["--url", "http://127.0.0.1:1/?x=1"], "a server base URL has no ?query or #fragment"),
        (["--header", "Bad Name: v"], "--header 'Bad Name: v': 'Bad Name' is not a valid HTTP header name"),
        (["--header", "novalue"], "--header 'novalue' is not NAME:VALUE"),
        (["--extra-body", "{"], "--extra-body is not valid JSON (Input data was truncated)"),
        (["--extra-body", "[1]"], "--extra-body must be a JSON object, got list"),
        (["--extra-body", DEEP_BODY], "--extra-body is nested too deeply to be a request body"),
        (["--request-timeout", "0"], "'--request-timeout' / '--request-timeout-seconds': 0.0 is not in the range x>0"),
        (["--idle-timeout", "-1"], "'--idle-timeout': -1.0 is not in the range x>0"),
    ],
)
@pytest.mark.parametrize("command", ["replay", "sweep", "decode"])
def test_server_flag_mistakes_are_one_clear_error_in_every_command(
    weka_file: Path, tmp_path: Path, args: list[str], message: str, command: str
) -> None:
    """Without --model too: the URL is judged before the server is asked for its models."""
    out = tmp_path / "run"
    given = {
        "replay": ["replay", str(weka_file), "--out", str(out)],
        "sweep": ["sweep", str(weka_file), "--concurrency", "1", "--out", str(out)],
        "decode": ["decode"],
    }[command]
    if "--url" not in args:
        given += ["--url", "http://127.0.0.1:1"]
    result = CliRunner().invoke(main, [*given, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and "unreachable" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not out.exists()


def test_url_forms_users_type_reach_the_server(tmp_path: Path) -> None:
    """`host:port` (AIPerf's form) is http://host:port; a trailing /v1 or an endpoint's path (a URL copied from a curl
    line) is dropped with a note, not doubled."""
    from agentx.sim.process import SimServer

    with SimServer(time_scale=0.01) as sim:
        host_port = sim.url.removeprefix("http://")
        noted = {
            host_port: None,
            f" {sim.url}/v1/ ": "/v1, which agentx adds",
            f"{sim.url}/v1/completions": "/v1/completions, an endpoint's path",
        }
        for index, (url, note) in enumerate(noted.items()):
            out = tmp_path / f"run{index}"
            args = ["replay", str(SAMPLE_TRACE), "--url", url]
            args += ["--sessions", "1", "--mode", "closed", "--delay-scale", "0", "--out", str(out), "--json"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            assert json.loads((out / "run.json").read_text())["options"]["url"] == sim.url
            assert ("note: --url" in result.output) == (note is not None)
            assert note is None or f"note: --url {sim.url}: the URL ends in {note}" in " ".join(result.output.split())


def test_a_server_that_answers_404_for_its_models_is_not_called_unreachable(tmp_path: Path) -> None:
    """A base URL with a path the server does not serve: the error says what the server answered, and where."""
    from agentx.sim.process import SimServer

    with SimServer(time_scale=0.01) as sim:
        for command in (["replay", str(SAMPLE_TRACE), "--out", str(tmp_path / "run")], ["decode"]):
            result = CliRunner().invoke(main, [*command, "--url", f"{sim.url}/wrong"])
            assert result.exit_code == 2, result.output
            said = (
                f"{sim.url}/wrong: the server answered 404 Not Found for GET {sim.url}/wrong/v1/models: is the base "
                "URL right? agentx adds /v1/... to it itself"
            )
            assert said in " ".join(result.output.split()), result.output
            assert "unreachable" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_an_explicit_authorization_header_wins_over_the_environment_key() -> None:
    from agentx.replayer.http.client import Client

    client = Client("http://127.0.0.1:1", api_key="env-key", headers={"authorization": "Bearer mine"})
    assert b"Bearer mine" in client._fixed_head and b"env-key" not in client._fixed_head
    assert client._scrub("token mine here") == "token <redacted> here"
    plain = Client("127.0.0.1:1", api_key="env-key")
    assert b"Authorization: Bearer env-key" in plain._fixed_head and plain.base_url == "http://127.0.0.1:1"
    args = ["decode", "--url", "http://127.0.0.1:1", "--model", "m", "--header", "Authorization: Bearer mine"]
    result = CliRunner(env={"OPENAI_API_KEY": "env-key"}).invoke(main, args)
    assert "note: --header Authorization is sent; the key in $OPENAI_API_KEY is not used" in result.output
    assert result.exit_code == 2 and "unreachable" in result.output


def test_replay_draws_progress_on_a_terminal_only(tmp_path: Path) -> None:
    pty = pytest.importorskip("pty")
    import os
    import select

    main_fd, child_fd = pty.openpty()
    args = ["replay", str(SAMPLE_TRACE), "--sessions", "3", "--concurrency", "2", "--sim-time-scale", "0.05"]
    args += ["--delay-scale", "0.02", "--out", str(tmp_path / "run")]
    child = subprocess.Popen(
        [sys.executable, "-m", "agentx.cli", *args], stdout=subprocess.DEVNULL, stderr=child_fd, text=True
    )
    os.close(child_fd)
    drawn = b""
    while True:
        ready, _, _ = select.select([main_fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            drawn += data
        elif child.poll() is not None:
            break
    os.close(main_fd)
    assert child.wait(timeout=60) == 0
    text = drawn.decode(errors="replace")
    assert "done ·" in text and "in flight" in text and "out tok/s" in text and "errors" in text
    assert " left" in text  # --sessions: time left from the requests still to go
    assert (tmp_path / "run" / "run.json").exists()


def test_a_replay_never_overwrites_a_run_unless_told(tmp_path: Path) -> None:
    """An existing run folder is refused (exit 2, one line, the run untouched); --overwrite replaces it."""
    out = tmp_path / "run"
    first = _replay("--sessions", "2", "--mode", "closed", "--out", str(out), "--json")
    assert first.returncode == 0, first.stderr
    records_before = (out / "records.arrow").read_bytes()
    again = _replay("--sessions", "1", "--mode", "closed", "--out", str(out), "--json")
    assert again.returncode == 2 and "already holds a run" in again.stderr and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert (out / "records.arrow").read_bytes() == records_before
    replaced = _replay("--sessions", "1", "--mode", "closed", "--out", str(out), "--overwrite", "--json")
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads(replaced.stdout)["counts"]["rows"] < json.loads(first.stdout)["counts"]["rows"]


def test_default_run_folders_are_unique_within_a_second() -> None:
    from agentx.cli.common import default_run_dir

    names = {default_run_dir() for _ in range(50)}
    assert len(names) == 50 and all(name.parent == Path("runs") for name in names)


def test_a_run_says_what_ends_it_as_it_starts() -> None:
    assert end_line(Scenario(duration_s=3600.0), 8) == (
        "the run ends after 3,600 s (--duration); Ctrl-C stops it sooner"
    )
    assert end_line(Scenario(duration_s=30.0, sessions=4, num_requests=100), 8) == (
        "the run ends after 30 s (--duration), or after 4 session trees (--sessions), or after 100 profiling requests "
        "(--num-requests), whichever comes first; Ctrl-C stops it sooner"
    )
    assert end_line(Scenario(), 8).startswith("the run ends after one pass of the trace's 8 sessions")


def test_validate_names_an_arrow_traces_rows_out_of_order(tmp_path: Path) -> None:
    """A copy of the sample re-sorted by `t` (as an edit in polars leaves it) fails with the cause, not with the
    hash-id errors of rows given to the wrong agents (tests/trace/test_arrow_rows.py has every other cause)."""
    with ipc.open_file(SAMPLE_TRACE) as reader:
        by_t = write_trace_table(reader.read_all().sort_by("t"), tmp_path / "by_t.arrow")
    result = CliRunner().invoke(main, ["validate", str(by_t)])
    assert result.exit_code == 2 and "are not in the trace's order" in result.output and "ok —" not in result.output
    assert "hash_ids_kept" not in result.output and "Traceback" not in result.output
