"""The stream-usage probe: continuous usage where the server gives it, clean fallbacks where it does not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from loopback import serve

from agentx.replayer.http.client import Client
from agentx.replayer.http.probe import PROBE_ATTEMPTS, UsageProbe, detect_stream_usage
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def _server(handler: _Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    async with serve(app) as url:
        yield url


def _stand_in(*, reject: set[str], usage_per_chunk: bool) -> _Handler:
    """A server that 400s bodies with any key of `reject` inside `stream_options` (or `stream_options`
    itself when "stream_options" is in `reject`), and otherwise streams two tokens."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = msgspec.json.decode(await request.read())
        options = body.get("stream_options")
        if options is not None and ("stream_options" in reject or reject & set(options)):
            return web.json_response({"error": {"message": "unknown field"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n in (1, 2):
            usage = b',"usage":{"prompt_tokens":8,"completion_tokens":%d}' % n if usage_per_chunk else b""
            await response.write(b'data: {"choices":[{"index":0,"text":" x"}]' + usage + b"}\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


BODY = {"model": "m", "prompt": [1000] * 8, "max_tokens": 2}


@pytest.mark.parametrize(
    ("reject", "usage_per_chunk", "expected"),
    [
        (set(), True, "continuous"),
        (set(), False, "final"),  # accepted but ignored
        ({"continuous_usage_stats"}, True, "final"),
        ({"stream_options"}, False, "none"),
    ],
)
def test_the_probe_picks_what_the_server_takes(reject: set[str], usage_per_chunk: bool, expected: str) -> None:
    async def go() -> str:
        async with _server(_stand_in(reject=reject, usage_per_chunk=usage_per_chunk)) as url, Client(url) as client:
            return (await detect_stream_usage(client, "/v1/completions", BODY)).usage

    assert asyncio.run(go()) == expected


def test_the_simulator_gives_continuous_usage_on_both_apis() -> None:
    async def go(url: str, model: str) -> tuple[str, str]:
        async with Client(url) as client:
            completions = await detect_stream_usage(client, "/v1/completions", {**BODY, "model": model})
            chat = {"model": model, "messages": [{"role": "user", "content": "ok"}], "max_tokens": 2}
            return completions.usage, (await detect_stream_usage(client, "/v1/chat/completions", chat)).usage

    with SimServer(time_scale=0.01) as sim:
        assert asyncio.run(go(sim.url, sim.model)) == ("continuous", "continuous")


def test_a_failing_server_gets_final_usage_said_to_be_assumed() -> None:
    calls = 0

    async def handler(_: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    async def go() -> UsageProbe:
        async with _server(handler) as url, Client(url) as client:
            return await detect_stream_usage(client, "/v1/completions", BODY)

    probe = asyncio.run(go())
    assert probe.usage == "final" and calls == PROBE_ATTEMPTS
    assert probe.assumed == f"the stream-usage probe failed {PROBE_ATTEMPTS} times (HTTP 503)"


@pytest.mark.parametrize("first", [500, 503, 429, "reset"])
def test_one_transient_failure_does_not_settle_the_usage(first: int | str) -> None:
    """One 5xx, 429 or dropped connection, then a server that gives running usage: "continuous", not "final"."""
    answered = 0
    stand_in = _stand_in(reject=set(), usage_per_chunk=True)

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal answered
        answered += 1
        if answered > 1:
            return await stand_in(request)
        if first == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        return web.json_response({"error": {"message": "busy"}}, status=int(first))

    async def go() -> UsageProbe:
        async with _server(handler) as url, Client(url) as client:
            return await detect_stream_usage(client, "/v1/completions", BODY)

    assert asyncio.run(go()) == UsageProbe("continuous")
    assert answered == 2


def test_a_replay_says_when_it_assumed_the_stream_usage(tmp_path: Path) -> None:
    from agentx.records.record import read_records, run_info
    from agentx.replayer.run_replay import run_replay
    from agentx.sim.faults import FaultConfig
    from agentx.trace.model import Agent, Request, Session, Trace

    request = Request(t=0, model="m", in_tokens=8, out_tokens=2, hash_ids_added=(0,))
    trace = Trace(sessions=[Session(session_id="s", root=Agent(requests=[request]))], block_size=16)
    with SimServer(time_scale=0.01, faults=FaultConfig(error_503_rate=1.0)) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(delay_scale=0.0),
        )
        result = asyncio.run(run_replay(trace, options))
    notice = f"stream usage: the stream-usage probe failed {PROBE_ATTEMPTS} times (HTTP 503); assuming 'final'"
    assert result.stream_usage == "final" and result.notices == [notice]
    detected = run_info(read_records(result.records_path)).options["detected"]
    assert detected["stream_usage_assumed"] == f"the stream-usage probe failed {PROBE_ATTEMPTS} times (HTTP 503)"
