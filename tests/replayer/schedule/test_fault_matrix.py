"""The fault matrix and the kill-the-server tests: real replays over loopback HTTP against the simulator.

Fault matrix: one replay per simulator fault, and one with them all mixed, each checked for the count identity
(records = generation requests the server received − the stream-usage probe's; a request the client sent again,
once, because its kept-alive connection was reset unanswered counts as received twice) and for what every
record says went wrong, against the faults the server says it injected during the run. The probe's requests
are the server's count at the profiling start (closed mode: nothing but the probe sends a generation request
before it), so the identity holds however many requests the probe needed and whatever faults they met.

Kill the server: `agentx replay` in a subprocess, the simulator killed (SIGKILL, or SIGTERM) while requests are
in flight; the replay must end on its own within grace + 5 s, without a traceback, with its records and
run.json readable and every request that got no response recorded as a connection error, not as cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from builders import growing_chain, make_session, make_trace
from paths import REPO
from prometheus_client.parser import text_string_to_metric_families

from agentx.errors import RecordsError
from agentx.records.record import RequestRecord, read_records, run_info, to_records
from agentx.replayer.options.replay import ClosedLoad, Connection, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.server_loss import PROBE_EVERY_S
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
SEED = 7
"""The fault RNG's seed: with it, which faults a run meets (and so every `> 0` below) is the same every run."""
TURNS = 4
OUT_TOKENS = 6
"""More chunks than any `*_after_chunks` below, so that every stream fault drawn happens."""
CONCURRENCY = 4
AFTER_CHUNKS = 2


# The fault matrix.


@dataclass(frozen=True)
class Case:
    faults: FaultConfig
    refuse_s: float = 0.0
    """A refusal window opened at the profiling start (the probe and `/v1/models` must get through)."""
    idle_timeout_s: float = 300.0
    """The replay's idle timeout (`--idle-timeout`): the default, unless the case needs a shorter one."""
    delay_scale: float = 0.01
    sessions: int = 8


@dataclass(frozen=True)
class Outcome:
    result: RunResult
    records: list[RequestRecord]
    probes: int
    """Generation requests the server received before the profiling start: the probe's."""
    received: int
    """Generation requests the server received from the profiling start to the end of the run."""
    injected: Counter[str]
    """Faults the server injected from the profiling start to the end of the run, by kind."""

    @property
    def errors(self) -> list[RequestRecord]:
        return [record for record in self.records if record.status == "error"]

    @property
    def ok(self) -> list[RequestRecord]:
        return [record for record in self.records if record.status == "ok"]

    def kinds(self) -> Counter[tuple[str | None, int | None]]:
        return Counter((record.error_kind, record.http_status) for record in self.errors)


def _trace(sessions: int) -> Trace:
    """Sessions of TURNS growing-context requests 1 s apart, 0.5 s each, forcing OUT_TOKENS each."""
    chain = growing_chain(TURNS, out=OUT_TOKENS, block_size=BLOCK)
    return make_trace(*(make_session(f"s{i}", chain) for i in range(sessions)), block_size=BLOCK)


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK, seed=SEED) as sim:
        yield sim
        assert "Traceback" not in sim.stderr(), sim.stderr()


@pytest.fixture
def sim(server: SimServer) -> Iterator[SimServer]:
    """The module's server with faults off after the test, whatever it left."""
    yield server
    server.set_faults(FaultConfig(seed=SEED))


def _scrape(sim: SimServer) -> tuple[int, Counter[str]]:
    """(generation requests received, faults injected by kind) as the server's /metrics says."""
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5.0) as response:
        text = response.read().decode()
    received = 0
    faults: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "agentx_sim_requests_received_total":
                received += int(sample.value)
            elif sample.name == "agentx_sim_faults_injected_total":
                faults[sample.labels["fault"]] = int(sample.value)
    return received, faults


def _replay(sim: SimServer, out_dir: Path, case: Case) -> Outcome:
    sim.set_faults(msgspec.structs.replace(case.faults, seed=SEED))
    received_before, _ = _scrape(sim)
    at_profiling: list[tuple[int, Counter[str]]] = []

    def on_profiling() -> None:
        # Blocking inside the loop, but nothing is in flight yet: the probe is over, no turn has gone out.
        at_profiling.append(_scrape(sim))
        if case.refuse_s:
            sim.set_faults(msgspec.structs.replace(case.faults, refuse_connections_s=case.refuse_s))

    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out_dir,
        load=ClosedLoad(concurrency=CONCURRENCY),
        scenario=Scenario(delay_scale=case.delay_scale),
        connection=Connection(idle_timeout_s=case.idle_timeout_s),
        # In a refusal window the server-loss watch's `/v1/models` and the telemetry's `/metrics` are refused and
        # counted with the turns too (as many as a loaded machine's timing lets in): both have tests of their own.
        runtime=Runtime(
            grace_s=5.0,
            on_server_loss="continue" if case.refuse_s else "stop",
            metrics_interval_s=None if case.refuse_s else Runtime().metrics_interval_s,
        ),
    )
    result = asyncio.run(run_replay(_trace(case.sessions), options, RunHooks(on_profiling=on_profiling)))
    # /metrics is refused too while the window lasts.
    deadline = time.monotonic() + 10.0
    while sim.get_faults().refuse_connections_s > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    received_after, faults_after = _scrape(sim)
    assert len(at_profiling) == 1
    received_at_start, faults_at_start = at_profiling[0]
    table = read_records(result.records_path)
    assert run_info(table).run_id == result.run_id
    return Outcome(
        result=result,
        records=to_records(table),
        probes=received_at_start - received_before,
        received=received_after - received_at_start,
        injected=faults_after - faults_at_start,
    )


def _stall_gap_s(record: RequestRecord) -> float:
    """The longest silence between two content chunks of a record."""
    times = record.chunk_times_ns
    return max((later - earlier for earlier, later in itertools.pairwise(times)), default=0) / 1e9


def _check_status(status: int) -> Callable[[Outcome], None]:
    def check(outcome: Outcome) -> None:
        kind = "rate_limited" if status == 429 else "http"
        assert outcome.kinds() == {(kind, status): outcome.injected[f"error_{status}"]}
        for record in outcome.errors:
            assert f"HTTP {status}" in (record.error_message or "")
            assert record.response_ns is not None and record.first_token_ns is None

    return check


def _check_reset(outcome: Outcome) -> None:
    # The headers (200) and at most the chunks before the reset arrived; the stream never ended.
    assert outcome.kinds() == {("connection", 200): outcome.injected["reset"]}
    for record in outcome.errors:
        assert len(record.chunk_times_ns) <= AFTER_CHUNKS and record.osl_server_tokens is None


def _check_malformed(outcome: Outcome) -> None:
    assert outcome.kinds() == {("protocol", 200): outcome.injected["malformed"]}
    assert all("malformed" in (record.error_message or "") for record in outcome.errors)


def _check_stall(outcome: Outcome) -> None:
    # Within the idle timeout a stall is only a gap: every request completes, and the gaps are the stalls.
    assert not outcome.errors
    stall_s = STALL.faults.stall_s
    assert sum(_stall_gap_s(record) >= 0.8 * stall_s for record in outcome.records) == outcome.injected["stall"]
    assert all(record.osl_streamed_tokens == OUT_TOKENS for record in outcome.records)


def _check_stall_timeout(outcome: Outcome) -> None:
    assert outcome.kinds() == {("timeout", 200): outcome.injected["stall"]}
    timeout_s = STALL_TIMEOUT.idle_timeout_s
    for record in outcome.errors:
        assert "idle timeout" in (record.error_message or "") and record.timeout_kind == "idle"
        assert record.last_token_ns is not None and (record.end_ns - record.last_token_ns) / 1e9 >= timeout_s


def _check_slow_first_byte(outcome: Outcome) -> None:
    assert not outcome.errors
    slow_s = SLOW.faults.slow_first_byte_s
    waits_s = [(r.response_ns - r.sent_ns) / 1e9 for r in outcome.records if r.response_ns is not None]
    assert len(waits_s) == len(outcome.records)
    assert sum(wait_s >= 0.8 * slow_s for wait_s in waits_s) == outcome.injected["slow_first_byte"]


def _check_refused(outcome: Outcome) -> None:
    # No response at all; a request on a kept-alive connection is sent once more on a new one (also refused),
    # so the server refused each failed request 1 + retries times. The server-loss watch's probes (one every
    # `PROBE_EVERY_S` while a streak counts, each sent at most twice the same way) were refused beside them: the
    # window of 0.6 s, stretched by a loaded machine, holds at most two (CI saw 3 refusals more than the records').
    assert set(outcome.kinds()) == {("connection", None)}
    errors = outcome.errors
    refused_requests = sum(1 + record.connection_retries for record in errors)
    probes_max = math.ceil((REFUSED.refuse_s + 0.2) / PROBE_EVERY_S) + 1
    assert refused_requests <= outcome.injected["refused"] <= refused_requests + 2 * probes_max, outcome.injected
    assert all(record.response_ns is None for record in errors)
    # The failures are the window's (it opened as the first turns went out); after it the run went on, answered.
    first_sent_ns = min(record.sent_ns for record in outcome.records)
    assert max(record.sent_ns - first_sent_ns for record in errors) / 1e9 <= REFUSED.refuse_s + 0.2
    assert outcome.ok


def _check_mix(outcome: Outcome) -> None:
    kinds = Counter(record.error_kind for record in outcome.errors)
    assert set(kinds) <= {"http", "rate_limited", "connection", "protocol"}
    statuses = Counter(record.http_status for record in outcome.errors if record.error_kind in ("http", "rate_limited"))
    assert statuses == {status: outcome.injected[f"error_{status}"] for status in (500, 429, 503)}
    # A malformed event always comes before the reset of the same stream (earlier chunk) and ends it on the
    # client's side; the server may still reach the reset before it notices the client is gone.
    assert kinds["protocol"] == outcome.injected["malformed"]
    assert outcome.injected["reset"] - outcome.injected["malformed"] <= kinds["connection"] <= outcome.injected["reset"]
    # Every kind of fault happened, and some requests met none.
    assert set(kinds) == {"http", "rate_limited", "connection", "protocol"} and outcome.ok
    assert all(outcome.injected[fault] > 0 for fault in ("stall", "slow_first_byte"))


STALL = Case(FaultConfig(stall_rate=0.4, stall_s=0.4, stall_after_chunks=AFTER_CHUNKS))
STALL_TIMEOUT = Case(FaultConfig(stall_rate=0.4, stall_s=2.0, stall_after_chunks=AFTER_CHUNKS), idle_timeout_s=0.5)
REFUSED = Case(FaultConfig(), refuse_s=0.6, delay_scale=0.3)
SLOW = Case(FaultConfig(slow_first_byte_rate=0.4, slow_first_byte_s=0.4))
MIX = Case(
    FaultConfig(
        error_500_rate=0.1,
        error_429_rate=0.1,
        error_503_rate=0.1,
        reset_rate=0.25,
        reset_after_chunks=AFTER_CHUNKS + 1,
        malformed_rate=0.25,
        malformed_after_chunks=AFTER_CHUNKS,
        stall_rate=0.2,
        stall_s=0.2,
        # After the reset's chunk: output held by a stall before it would be lost with the malformed event in it.
        stall_after_chunks=AFTER_CHUNKS + 2,
        slow_first_byte_rate=0.2,
        slow_first_byte_s=0.2,
    ),
    sessions=16,
)

MATRIX: dict[str, tuple[Case, Callable[[Outcome], None]]] = {
    "error_500": (Case(FaultConfig(error_500_rate=0.4)), _check_status(500)),
    "error_429": (Case(FaultConfig(error_429_rate=0.4)), _check_status(429)),
    "error_503": (Case(FaultConfig(error_503_rate=0.4)), _check_status(503)),
    "reset": (Case(FaultConfig(reset_rate=0.4, reset_after_chunks=AFTER_CHUNKS)), _check_reset),
    "malformed": (Case(FaultConfig(malformed_rate=0.4, malformed_after_chunks=AFTER_CHUNKS)), _check_malformed),
    "stall": (STALL, _check_stall),
    "stall_timeout": (STALL_TIMEOUT, _check_stall_timeout),
    "slow_first_byte": (SLOW, _check_slow_first_byte),
    "refused": (REFUSED, _check_refused),
    "mix": (MIX, _check_mix),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_fault_matrix(name: str, sim: SimServer, tmp_path: Path) -> None:
    case, check = MATRIX[name]
    outcome = _replay(sim, tmp_path, case)
    records = outcome.records
    result = outcome.result
    assert result.requests == len(records) and result.errors == len(outcome.errors)
    assert not result.interrupted and result.cancelled == 0 and result.skipped == 0
    assert result.trees_started == result.trees_finished == case.sessions
    # Every step of the trace is recorded once, failed or not (a failed request still completes its step).
    assert sorted((r.session_id, r.turn) for r in records) == sorted(
        (f"s{i}", turn) for i in range(case.sessions) for turn in range(TURNS)
    )
    assert outcome.probes >= 1
    # The count identity: the server received every recorded request, once, plus a resend per retry.
    assert len(records) + sum(r.connection_retries for r in records) == outcome.received
    if not case.refuse_s:
        assert not any(r.connection_retries for r in records)
    assert all(record.error_message for record in outcome.errors)
    if name not in ("stall", "slow_first_byte"):
        assert outcome.errors, "the case must make requests fail"
    assert sum(outcome.injected.values()) > 0
    check(outcome)


@pytest.mark.parametrize("name", ["error_500", "error_429"])
def test_a_transient_error_on_the_probe_keeps_continuous_usage(name: str, sim: SimServer, tmp_path: Path) -> None:
    """One 500 used to settle the run on `final`, and 429, 429, then 200 on `none` (no record
    had the server's token counts). Under SEED the probe's first request meets the case's error status and a retry
    gets through (with another seed all three tries may fail, and `final` is then rightly assumed)."""
    outcome = _replay(sim, tmp_path, MATRIX[name][0])
    assert outcome.probes > 1, "the premise: the probe's first request met the error and was retried"
    assert outcome.result.stream_usage == "continuous"
    assert all(record.osl_server_tokens is not None for record in outcome.ok)


# Killing the server mid-run.

GRACE_S = 2.0
KILL_MARGIN_S = 5.0
"""The replay must end within grace + this after the server died."""


def _profiling_records(path: Path) -> int:
    try:
        table = read_records(path)
    except RecordsError:  # not created yet, or its schema not yet flushed
        return 0
    return sum(phase == "profiling" for phase in table.column("phase").to_pylist())


@pytest.mark.parametrize(
    ("concurrency", "signum"),
    [(2, signal.SIGKILL), (4, signal.SIGKILL), (4, signal.SIGTERM), (8, signal.SIGKILL)],
    ids=["c2-kill", "c4-kill", "c4-term", "c8-kill"],
)
def test_killing_the_server_mid_run_ends_the_replay(tmp_path: Path, concurrency: int, signum: signal.Signals) -> None:
    out = tmp_path / "run"
    records_path = out / "records.arrow"
    # Outputs of hundreds of tokens at 20x real time: requests are in flight for a second or more, and the
    # trace holds far more work than runs before the kill. With idle delays ÷ 1000, what follows the kill (every
    # request failing at once) is over in a few seconds.
    with SimServer(time_scale=0.05, block_size=64) as sim:
        command = [
            sys.executable,
            "-m",
            "agentx.cli",
            "replay",
            str(REPO / "traces" / "sample.arrow"),
            "--url",
            sim.url,
            "--model",
            sim.model,
            "--concurrency",
            str(concurrency),
            "--grace",
            str(GRACE_S),
            "--delay-scale",
            "0.001",
            # One pass over the trace's 20 sessions with no failure threshold, as the test's premise (the default
            # rules' 3600 s and threshold 0.10 would recycle trees or cancel the run at the first failures).
            "--sessions",
            "20",
            "--failed-request-threshold",
            "off",
            "--out",
            str(out),
            "--overwrite",
        ]
        with (tmp_path / "stdout").open("wb") as stdout, (tmp_path / "stderr").open("wb") as stderr:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=REPO)
            try:
                deadline = time.monotonic() + 60.0
                while _profiling_records(records_path) < 2 * concurrency:
                    assert process.poll() is None, (tmp_path / "stderr").read_text()
                    assert time.monotonic() < deadline, "the replay did not get going"
                    time.sleep(0.05)
                killed_wall_ns = time.time_ns()
                killed = time.monotonic()
                os.kill(sim.pid, signum)
                try:
                    process.wait(timeout=GRACE_S + KILL_MARGIN_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(
                        f"the replay still ran {GRACE_S + KILL_MARGIN_S:g} s after the server died "
                        f"({_profiling_records(records_path)} profiling records so far)"
                    )
                ended_after_s = time.monotonic() - killed
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err, err
    assert process.returncode >= 0, f"the replay died of signal {-process.returncode}"
    assert ended_after_s <= GRACE_S + KILL_MARGIN_S
    table = read_records(records_path)
    records = to_records(table)
    run = json.loads((out / "run.json").read_text())
    assert run["run"]["requests"] == len(records) and run["run"]["run_id"] == run_info(table).run_id
    assert run["run"]["cancelled"] == 0
    killed_ns = killed_wall_ns - run_info(table).wall_epoch_ns
    # Requests that ended after the kill without any response never got a connection (or lost theirs before
    # an answer): a connection error each, none left to be cancelled.
    unanswered = [r for r in records if r.end_ns > killed_ns and r.response_ns is None]
    assert unanswered, "no request went out after the kill: the run ended too soon to test anything"
    assert Counter(r.error_kind for r in unanswered) == {"connection": len(unanswered)}
    assert not any(r.error_kind == "cancelled" for r in records)
    # Everything answered before the kill went through (the kill cut nothing it should not have).
    assert all(r.status == "ok" for r in records if r.end_ns < killed_ns - 50_000_000)
