"""A dead server stops the run: the watch's verdict, and `agentx replay` against a simulator killed mid-run.

The watch (agentx.replayer.schedule.server_loss) is checked against records and probes made by hand; the command is
run in a subprocess in every mode at concurrencies 1 to 64, the simulator SIGKILLed once profiling is under way,
and must end within grace + the loss window (+ a margin for the probe's period and the process's own end), exit 3,
say when the server stopped answering, and keep its records and run.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from children import default_stop_signals
from paths import REPO, SAMPLE_TRACE
from strategies import record_identity

from agentx.errors import RecordsError, ServerUnreachable
from agentx.records.record import RequestRecord, read_records
from agentx.replayer.schedule.server_loss import PROBE_EVERY_S, ServerLossWatch, is_loss
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _record(**fields: Any) -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(run_id="r", phase="profiling"),
        "scheduled_ns": 0,
        "sent_ns": 0,
        "end_ns": 1,
        "isl_recorded_tokens": 10,
        "isl_sent_tokens": 10,
        "osl_recorded_tokens": 10,
        "status": "error",
    }
    return RequestRecord(**{**values, **fields})


REFUSED = _record(error_kind="connection", error_message="connection refused")
CONNECT_TIMEOUT = _record(error_kind="timeout", timeout_kind="connect")
CUT_MID_ANSWER = _record(error_kind="connection", response_ns=1, error_message="reset")
HTTP_503 = _record(error_kind="http", http_status=503, response_ns=1)
ANSWERED = _record(status="ok", response_ns=1)


def test_what_counts_as_a_loss() -> None:
    assert is_loss(REFUSED) and is_loss(CONNECT_TIMEOUT)
    assert not is_loss(CUT_MID_ANSWER)  # the server was there: it answered, then died or reset
    assert not is_loss(HTTP_503) and not is_loss(ANSWERED)
    assert not is_loss(_record(error_kind="timeout", timeout_kind="idle"))
    assert not is_loss(_record(error_kind="cancelled"))


class _Server:
    """What the watch's probes meet: an answer, or none."""

    def __init__(self, answering: bool) -> None:
        self.answering = answering
        self.probes = 0

    async def request_json(self, method: str, path: str, *, timeout_s: float) -> tuple[int, bytes]:
        self.probes += 1
        if not self.answering:
            raise ServerUnreachable(f"{method} {path}: refused")
        return 404, b""


def _watch(server: _Server, failures: int, window_s: float) -> tuple[ServerLossWatch, list[tuple[int, float]]]:
    verdicts: list[tuple[int, float]] = []
    watch = ServerLossWatch(
        server,  # type: ignore[arg-type]
        failures=failures,
        window_s=window_s,
        on_lost=lambda first_ns, losses, span_s: verdicts.append((losses, span_s)),
    )
    return watch, verdicts


def test_the_verdict_needs_both_the_count_and_the_span() -> None:
    watch, verdicts = _watch(_Server(answering=False), failures=3, window_s=0.2)
    for _ in range(10):  # many losses at once: not yet, the span is short
        watch.observe(REFUSED)
    assert not verdicts and watch.losses == 10
    time.sleep(0.25)
    watch.observe(REFUSED)
    assert len(verdicts) == 1 and verdicts[0][0] == 11 and verdicts[0][1] >= 0.2
    watch.observe(REFUSED)  # said once
    assert len(verdicts) == 1

    watch, verdicts = _watch(_Server(answering=False), failures=3, window_s=0.0)
    watch.observe(REFUSED)
    watch.observe(REFUSED)
    assert not verdicts  # the span is there, the count not yet
    watch.observe(CONNECT_TIMEOUT)
    assert verdicts and verdicts[0][0] == 3


def test_an_answer_resets_the_streak_and_other_failures_do_not() -> None:
    watch, verdicts = _watch(_Server(answering=False), failures=3, window_s=0.0)
    watch.observe(REFUSED)
    watch.observe(REFUSED)
    watch.observe(CUT_MID_ANSWER)  # neither life nor loss
    assert watch.losses == 2
    watch.observe(HTTP_503)  # an answer, whatever its status
    assert watch.losses == 0
    watch.observe(REFUSED)
    watch.observe(REFUSED)
    assert not verdicts


def test_probes_decide_while_no_request_is_sent() -> None:
    """A streak begun by one refusal goes on by the watch's own probes: an unanswering server is lost after the
    window though the run sends nothing more; an answering one ends the streak."""

    async def go(answering: bool) -> tuple[ServerLossWatch, list[tuple[int, float]], _Server, float]:
        server = _Server(answering)
        watch, verdicts = _watch(server, failures=2, window_s=1.5)
        task = asyncio.create_task(watch.watch())
        started = time.monotonic()
        watch.observe(REFUSED)
        await asyncio.sleep(1.5 + 2.5 * PROBE_EVERY_S)
        task.cancel()
        return watch, verdicts, server, time.monotonic() - started

    watch, verdicts, server, _ = asyncio.run(go(answering=False))
    assert watch.lost and verdicts and verdicts[0][1] >= 1.5 and server.probes >= 2
    watch, verdicts, server, _ = asyncio.run(go(answering=True))
    assert not watch.lost and not verdicts and watch.losses == 0 and server.probes >= 2


# The command against a simulator killed mid-run.

GRACE_S = 1.0
WINDOW_S = 2.0
MARGIN_S = 5.0
"""Beyond grace + window: the probe's period and timeout, the summary, the process's end."""


def _profiling_records(out: Path) -> int:
    """Profiling records in the run folder so far (a `--workers` run's in its workers' files until the end)."""
    count = 0
    for path in [out / "records.arrow", *sorted(out.glob("workers/*/records.arrow"))]:
        try:
            table = read_records(path)
        except RecordsError:  # not created yet, or its schema not yet flushed
            continue
        count += sum(phase == "profiling" for phase in table.column("phase").to_pylist())
    return count


def _replay(sim: SimServer, out: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "agentx.cli",
        "replay",
        str(SAMPLE_TRACE),
        "--url",
        sim.url,
        "--model",
        sim.model,
        "--grace",
        str(GRACE_S),
        "--server-loss-window",
        str(WINDOW_S),
        "--server-loss-failures",
        "3",
        "--failed-request-threshold",
        "off",  # the threshold would cancel the run first and hide the loss
        "--duration",
        "600",
        "--out",
        str(out),
        *extra,
    ]
    stdout = (out.parent / f"{out.name}.stdout").open("wb")
    stderr = (out.parent / f"{out.name}.stderr").open("wb")
    with stdout, stderr:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            cwd=REPO,
            preexec_fn=default_stop_signals,
        )


MODES = {
    "agentx-c1-thinking": ["--concurrency", "1", "--delay-scale", "1"],
    "agentx-c16": ["--concurrency", "16", "--delay-scale", "0.05"],
    "closed-c4": ["--mode", "closed", "--concurrency", "4", "--delay-scale", "0.05"],
    "closed-c64": ["--mode", "closed", "--concurrency", "64", "--delay-scale", "0.05"],
    "closed-c8-workers": ["--mode", "closed", "--concurrency", "8", "--delay-scale", "0.05", "--workers", "2"],
    "trace": ["--mode", "trace", "--speedup", "2", "--delay-scale", "0.05"],
    "rate": ["--mode", "rate", "--rate", "2", "--delay-scale", "0.05"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_killing_the_server_stops_the_run_with_exit_3(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "run"
    with SimServer(time_scale=0.05, block_size=64) as sim:
        process = _replay(sim, out, MODES[mode])
        try:
            deadline = time.monotonic() + 90.0
            while _profiling_records(out) < 1:
                assert process.poll() is None, (tmp_path / "run.stderr").read_text()
                assert time.monotonic() < deadline, "the replay did not get going"
                time.sleep(0.05)
            os.kill(sim.pid, signal.SIGKILL)
            killed = time.monotonic()
            try:
                process.wait(timeout=GRACE_S + WINDOW_S + MARGIN_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the replay still ran {GRACE_S + WINDOW_S + MARGIN_S:g} s after the server died")
            ended_after_s = time.monotonic() - killed
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    err = (tmp_path / "run.stderr").read_text()
    assert "Traceback" not in err, err
    assert process.returncode == 3, err
    assert ended_after_s >= WINDOW_S  # not before the window: a restart within it is ridden out
    last = err.strip().splitlines()[-1]
    assert "the server stopped answering" in last and "s into the run" in last, err
    run = json.loads((out / "run.json").read_text())
    assert run["run"]["cancel_reason"] == "server_lost"
    assert run["run"]["server_lost_at_s"] is not None
    assert any("the server stopped answering at" in notice for notice in run["run"]["notices"])
    assert run["run"]["requests"] == read_records(out / "records.arrow").num_rows > 0
    assert "replay of" in (tmp_path / "run.stdout").read_text()  # the summary was printed


def test_on_server_loss_continue_keeps_playing_against_a_dead_server(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with SimServer(time_scale=0.05, block_size=64) as sim:
        process = _replay(sim, out, ["--mode", "closed", "--concurrency", "4", "--on-server-loss", "continue"])
        try:
            while _profiling_records(out) < 1:
                assert process.poll() is None, (tmp_path / "run.stderr").read_text()
                time.sleep(0.05)
            os.kill(sim.pid, signal.SIGKILL)
            time.sleep(GRACE_S + WINDOW_S + 3.0)
            assert process.poll() is None, "the run stopped though told to go on"
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 130
    run = json.loads((out / "run.json").read_text())
    assert run["run"]["cancel_reason"] == "interrupted"
    assert run["summary"]["counts"]["errors_by_kind"]["connection"] > 0


def test_a_server_back_within_the_window_resets_it(tmp_path: Path) -> None:
    """Once profiling is under way the simulator refuses every connection for 1.5 s, then answers again: shorter than
    the window, so the run rides it out and ends at its duration."""
    out = tmp_path / "run"
    with SimServer(time_scale=0.05, block_size=64) as sim:
        extra = ["--mode", "closed", "--concurrency", "4", "--delay-scale", "0.02", "--duration", "6"]
        process = _replay(sim, out, [*extra, "--server-loss-window", "4"])
        try:
            while _profiling_records(out) < 1:
                assert process.poll() is None, (tmp_path / "run.stderr").read_text()
                time.sleep(0.05)
            sim.set_faults(FaultConfig(refuse_connections_s=1.5))
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    err = (tmp_path / "run.stderr").read_text()
    run = json.loads((out / "run.json").read_text())
    assert run["run"]["cancel_reason"] is None, err
    assert process.returncode == 0, err
    assert run["summary"]["counts"]["errors_by_kind"].get("connection", 0) >= 3, "too few refusals to test anything"


def test_a_quiet_server_is_asked_only_when_no_request_is_in_flight() -> None:
    """Silence with requests in flight is a slow server's (the stall watchdog's to judge), not a reason to probe it:
    a late answer to a probe must not count against a server busy with the run."""

    async def go(in_flight: int) -> int:
        server = _Server(answering=True)
        watch = ServerLossWatch(
            server,  # type: ignore[arg-type]
            failures=2,
            window_s=0.5,
            on_lost=lambda first_ns, losses, span_s: None,
            in_flight=lambda: in_flight,
        )
        task = asyncio.create_task(watch.watch())
        await asyncio.sleep(2.5 * PROBE_EVERY_S)
        task.cancel()
        return server.probes

    assert asyncio.run(go(in_flight=3)) == 0
    assert asyncio.run(go(in_flight=0)) >= 2
