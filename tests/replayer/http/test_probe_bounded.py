"""The stream-usage probe is bounded: a server whose stream never ends holds a run at "starting" for at most the
probe's budget (`PROBE_TIMEOUT_S` an attempt, or the run's shorter `--request-timeout`), the run says what it waits
for, and then goes on with the usage assumed, saying so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from loopback import serve

from agentx.replayer.http.client import Client
from agentx.replayer.http.probe import (
    PROBE_ATTEMPTS,
    PROBE_NOTICE_AFTER_S,
    PROBE_RETRY_DELAYS_S,
    PROBE_TIMEOUT_S,
    UsageProbe,
    detect_stream_usage,
    probe_budget_s,
    probe_timeout_s,
)
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.io import save_trace
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BODY = {"model": "m", "prompt": [1000] * 8, "max_tokens": 2}
STALL_S = 60.0
"""Longer than any bound under test: a stream that, for the probe, never ends (and that the servers end by
themselves)."""


def _endless(done: asyncio.Event) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """One content chunk, then silence until `done` (or `STALL_S`): a stream the probe cannot see the end of."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"text":" x"}]}\n\n')
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), STALL_S)
        return response

    return handler


def test_each_attempt_waits_the_probe_timeout_or_the_shorter_request_timeout() -> None:
    assert probe_timeout_s(Client("http://127.0.0.1:9")) == PROBE_TIMEOUT_S
    assert probe_timeout_s(Client("http://127.0.0.1:9", total_timeout_s=10 * PROBE_TIMEOUT_S)) == PROBE_TIMEOUT_S
    assert probe_timeout_s(Client("http://127.0.0.1:9", total_timeout_s=0.25)) == 0.25
    pauses = sum(PROBE_RETRY_DELAYS_S[: PROBE_ATTEMPTS - 1])
    assert probe_budget_s(Client("http://127.0.0.1:9", total_timeout_s=0.25)) == PROBE_ATTEMPTS * 0.25 + pauses


def test_an_endless_stream_costs_the_budget_says_what_it_waits_for_and_assumes_final(
    caplog: pytest.LogCaptureFixture,
) -> None:
    timeout_s = 0.5

    async def go() -> tuple[UsageProbe, float, float]:
        done = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", _endless(done))
        async with serve(app) as url, Client(url, total_timeout_s=timeout_s) as client:
            started = time.perf_counter()
            probe = await detect_stream_usage(client, "/v1/completions", BODY)
            took_s = time.perf_counter() - started
            done.set()  # the server's streams end, and it stops at once
            return probe, took_s, probe_budget_s(client)

    with caplog.at_level(logging.WARNING, logger="agentx"):
        probe, took_s, budget_s = asyncio.run(go())
    assert probe.usage == "final" and probe.assumed is not None and "/v1/completions" in probe.assumed
    assert PROBE_ATTEMPTS * timeout_s <= took_s < budget_s + 1.0
    waiting = [r.getMessage() for r in caplog.records if "stream-usage reporting" in r.getMessage()]
    assert waiting == [
        f"probing the server's stream-usage reporting (POST /v1/completions): no usable answer yet; waiting up to "
        f"{budget_s:g} s in all, then going on assuming 'final'"
    ]


def test_a_prompt_answer_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> UsageProbe:
        async with Client(sim.url) as client:
            return await detect_stream_usage(client, "/v1/completions", {**BODY, "model": sim.model})

    with SimServer(time_scale=0.01) as sim, caplog.at_level(logging.WARNING, logger="agentx"):
        started = time.perf_counter()
        assert asyncio.run(go()) == UsageProbe("continuous")
    assert time.perf_counter() - started < PROBE_NOTICE_AFTER_S + 5.0
    assert not [r for r in caplog.records if "stream-usage reporting" in r.getMessage()]


def test_a_replay_against_a_stalling_simulator_starts_within_its_request_timeout(tmp_path: Path) -> None:
    trace = tmp_path / "one.arrow"
    request = Request(t=0, model="m", in_tokens=8, out_tokens=2, hash_ids_added=(0,))
    save_trace(Trace(sessions=[Session(session_id="s", root=Agent(requests=[request]))], block_size=16), trace)
    faults = FaultConfig(stall_rate=1.0, stall_s=STALL_S, stall_after_chunks=1)
    with SimServer(time_scale=0.01, faults=faults) as sim:
        args = [trace, "--url", sim.url, "--out", tmp_path / "run", "--mode", "closed", "--request-timeout", "1"]
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "agentx.cli", "replay", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took_s = time.perf_counter() - started
    assert "Traceback" not in result.stderr, result.stderr
    budget_s = PROBE_ATTEMPTS * 1.0 + sum(PROBE_RETRY_DELAYS_S[: PROBE_ATTEMPTS - 1])
    waiting = (
        f"probing the server's stream-usage reporting (POST /v1/completions): no usable answer yet; waiting up to "
        f"{budget_s:g} s in all, then going on assuming 'final'"
    )
    lines = result.stderr.splitlines()
    assert waiting in lines, result.stderr
    assumed = [line for line in lines if line.startswith("stream usage: the stream-usage probe")]
    assert len(assumed) == 1 and assumed[0].endswith("; assuming 'final'"), result.stderr
    assert lines.index(waiting) < lines.index(assumed[0])
    # The probe's budget, then the run's own requests, each cut at 1 s: far from the minutes of a stuck probe.
    assert took_s < budget_s + 30.0, (took_s, result.stderr)
    assert (tmp_path / "run" / "run.json").is_file()
