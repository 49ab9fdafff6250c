"""The replay HTTP client end to end over loopback against the simulator: timing, token counts, error kinds."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import msgspec
import pytest
from aiohttp import web

from agentx.replayer.http.client import Client, Exchange, ModelNotServed, ServerUnreachable
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

T = TypeVar("T")
SECRET = "sk-test-0123456789-secret"
MAX_MODEL_LEN = 4096
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=4096, seed=3) as server:
        yield server


@pytest.fixture
def faulty(sim: SimServer) -> Iterator[SimServer]:
    """The module's server; whatever faults a test sets are switched off after it."""
    try:
        yield sim
    finally:
        sim.set_faults(FaultConfig())


def run(url: str, use: Callable[[Client], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        async with Client(url, api_key=SECRET, **options) as client:
            return await use(client)

    return asyncio.run(main())


def prompt(rng: random.Random, count: int = 40) -> list[int]:
    return [rng.randrange(1000, 30000) for _ in range(count)]


def completion(model: str, ids: list[int], max_tokens: int, **extra: Any) -> bytes:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **extra,
    }
    return msgspec.json.encode(body)


def assert_ordered(exchange: Exchange) -> None:
    assert 0 < exchange.sent_ns <= exchange.headers_ns <= exchange.first_token_ns
    assert exchange.first_token_ns <= exchange.last_token_ns <= exchange.end_ns
    assert exchange.chunk_ns == sorted(exchange.chunk_ns)
    assert exchange.chunk_ns[0] == exchange.first_token_ns
    assert exchange.chunk_ns[-1] == exchange.last_token_ns


def assert_secret_hidden(*things: object) -> None:
    for thing in things:
        assert SECRET not in repr(thing)
        assert SECRET not in str(thing)
        if isinstance(thing, Exchange):
            assert SECRET.encode() not in msgspec.json.encode(thing)


def test_completion_stream_counts_and_timing(sim: SimServer) -> None:
    rng = random.Random(1)

    async def use(client: Client) -> list[Exchange]:
        assert await client.probe_models(require=sim.model) == [sim.model]
        return [
            await client.stream(COMPLETIONS, completion(sim.model, prompt(rng), 37)),
            await client.stream(COMPLETIONS, completion(sim.model, prompt(rng), 20, return_token_ids=True)),
        ]

    for exchange in run(sim.url, use):
        assert exchange.ok, exchange.error_message
        assert exchange.status == 200
        assert exchange.finish_reason == "length"
        assert not exchange.tokens_estimated
        assert sum(exchange.chunk_tokens) == exchange.completion_tokens
        assert len(exchange.chunk_tokens) == len(exchange.chunk_ns)
        assert exchange.prompt_tokens == 40
        assert_ordered(exchange)
        assert_secret_hidden(exchange)
    assert [e.completion_tokens for e in run(sim.url, use)] == [37, 20]


def test_token_ids_and_estimated_counts(sim: SimServer) -> None:
    """Without continuous usage the counts come from token ids, else one token per chunk: exact when the final
    usage counts as many tokens as chunks (a one-token-per-event stream), else flagged as estimated."""
    rng = random.Random(2)

    async def use(client: Client) -> tuple[Exchange, Exchange]:
        options = {"stream_options": {"include_usage": True}}
        with_ids = completion(sim.model, prompt(rng), 25, return_token_ids=True, **options)
        without = completion(sim.model, prompt(rng), 25, **options)
        return await client.stream(COMPLETIONS, with_ids), await client.stream(COMPLETIONS, without)

    with_ids, without = run(sim.url, use)
    assert with_ids.ok and without.ok
    assert not with_ids.tokens_estimated and sum(with_ids.chunk_tokens) == 25
    assert without.chunk_tokens == [1] * len(without.chunk_ns) == [1] * 25
    assert without.completion_tokens == 25 and not without.tokens_estimated
    # Two tokens in one chunk, and only a final count: one per chunk is a guess, flagged.
    merged = canned(
        [
            chunk({"content": "ab"}),
            chunk({"content": "c"}),
            chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 3}),
            b"data: [DONE]\r\n\r\n",
        ]
    )
    assert merged.ok and merged.chunk_tokens == [1, 1] and merged.tokens_estimated


def test_cached_tokens_on_repeated_prompt(sim: SimServer) -> None:
    ids = prompt(random.Random(3), 100)

    async def use(client: Client) -> list[Exchange]:
        body = completion(sim.model, ids, 4)
        return [await client.stream(COMPLETIONS, body) for _ in range(2)]

    first, second = run(sim.url, use)
    assert first.ok and second.ok
    assert first.cached_tokens == 0
    assert second.cached_tokens is not None and second.cached_tokens >= 96


def test_chat_stream(sim: SimServer) -> None:
    body = msgspec.json.encode(
        {
            "model": sim.model,
            "messages": [{"role": "user", "content": "bawone bejoka tell me a story"}],
            "max_completion_tokens": 30,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    exchange = run(sim.url, lambda client: client.stream(CHAT, body))
    assert exchange.ok, exchange.error_message
    assert exchange.completion_tokens == 30 == sum(exchange.chunk_tokens)
    assert exchange.finish_reason == "length"
    assert_ordered(exchange)


@pytest.mark.parametrize(
    ("faults", "status"),
    [
        (FaultConfig(error_500_rate=1.0), 500),
        (FaultConfig(error_429_rate=1.0), 429),
        (FaultConfig(error_503_rate=1.0), 503),
    ],
)
def test_status_faults_are_http_errors_and_429_is_rate_limited(
    faulty: SimServer, faults: FaultConfig, status: int
) -> None:
    faulty.set_faults(faults)
    body = completion(faulty.model, prompt(random.Random(4)), 8)
    exchange = run(faulty.url, lambda client: client.stream(COMPLETIONS, body))
    assert (exchange.error_kind, exchange.status) == ("rate_limited" if status == 429 else "http", status)
    assert exchange.error_message and str(status) in exchange.error_message
    assert exchange.end_ns >= exchange.headers_ns >= exchange.sent_ns
    assert_secret_hidden(exchange)


@pytest.mark.parametrize(
    ("faults", "kind"),
    [
        (FaultConfig(reset_rate=1.0, reset_after_chunks=3), "connection"),
        (FaultConfig(malformed_rate=1.0, malformed_after_chunks=2), "protocol"),
        (FaultConfig(stall_rate=1.0, stall_s=1.5, stall_after_chunks=2), "timeout"),
    ],
)
def test_stream_faults(faulty: SimServer, faults: FaultConfig, kind: str) -> None:
    faulty.set_faults(faults)
    body = completion(faulty.model, prompt(random.Random(5)), 30)
    exchange = run(faulty.url, lambda client: client.stream(COMPLETIONS, body), idle_timeout_s=0.5)
    assert exchange.error_kind == kind, exchange.error_message
    assert exchange.status == 200
    assert exchange.chunk_ns, "chunks before the fault are kept"
    assert exchange.error_message is not None and len(exchange.error_message) <= 500
    assert_secret_hidden(exchange)


def test_context_overflow(sim: SimServer) -> None:
    body = completion(sim.model, prompt(random.Random(6), MAX_MODEL_LEN + 1), 10)
    exchange = run(sim.url, lambda client: client.stream(COMPLETIONS, body))
    assert (exchange.error_kind, exchange.status) == ("context_overflow", 400)
    assert exchange.error_message is not None and "maximum context length" in exchange.error_message

    # The substrings are configurable; an empty list makes it a plain HTTP error.
    plain = run(sim.url, lambda client: client.stream(COMPLETIONS, body), context_overflow_substrings=())
    assert plain.error_kind == "http"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_refused_connection() -> None:
    url = closed_port_url()

    async def use(client: Client) -> Exchange:
        with pytest.raises(ServerUnreachable) as raised:
            await client.probe_models()
        assert_secret_hidden(raised.value)
        return await client.stream(COMPLETIONS, b"{}")

    exchange = run(url, use)
    assert (exchange.error_kind, exchange.status) == ("connection", 0)
    assert_secret_hidden(exchange)


def test_unknown_model(sim: SimServer) -> None:
    async def use(client: Client) -> None:
        with pytest.raises(ModelNotServed, match="no-such-model"):
            await client.probe_models(require="no-such-model")

    run(sim.url, use)


def test_api_key_hidden(sim: SimServer) -> None:
    async def use(client: Client) -> Client:
        assert_secret_hidden(client)
        return client

    assert "redacted" in repr(run(sim.url, use))


def test_cancellation_propagates(sim: SimServer) -> None:
    body = completion(sim.model, prompt(random.Random(7)), 2000)

    async def use(client: Client) -> None:
        task = asyncio.ensure_future(client.stream(COMPLETIONS, body))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The pool still works after a cancelled stream.
        assert (await client.stream(COMPLETIONS, completion(sim.model, prompt(random.Random(8)), 3))).ok

    run(sim.url, use)


def test_concurrent_streams_share_a_pool(sim: SimServer) -> None:
    rng = random.Random(9)
    bodies = [completion(sim.model, prompt(rng), 16) for _ in range(32)]

    async def use(client: Client) -> list[Exchange]:
        return await asyncio.gather(*(client.stream(COMPLETIONS, body) for body in bodies))

    exchanges = run(sim.url, use, limit=8)
    assert all(e.ok and e.completion_tokens == 16 == sum(e.chunk_tokens) for e in exchanges)


def test_non_streaming(sim: SimServer) -> None:
    rng = random.Random(10)
    completions = msgspec.json.encode({"model": sim.model, "prompt": prompt(rng), "max_tokens": 12, "ignore_eos": True})
    chat = msgspec.json.encode(
        {"model": sim.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True}
    )

    async def use(client: Client) -> list[Exchange]:
        return [await client.complete(COMPLETIONS, completions), await client.complete(CHAT, chat)]

    first, second = run(sim.url, use)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert (first.completion_tokens, first.chunk_tokens, first.prompt_tokens) == (12, [12], 40)
    assert (second.completion_tokens, second.chunk_tokens) == (5, [5])
    assert first.first_token_ns == first.last_token_ns == first.end_ns >= first.headers_ns >= first.sent_ns


# Edge cases no simulator produces: a loopback server answering canned SSE bytes, written in pieces.


def chunk(delta: dict[str, Any] | None = None, usage: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + msgspec.json.encode({"choices": choices, "usage": usage}) + b"\r\n\r\n"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def serve(handler: Handler, use: Callable[[Client], Awaitable[T]], **options: Any) -> T:
    """Run `use` with a client of a loopback aiohttp app answering `POST /v1/chat/completions` with `handler`."""

    async def main() -> T:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with Client(f"http://127.0.0.1:{port}", api_key=SECRET, **options) as client:
                return await use(client)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def paced(pieces: list[bytes], gaps_s: list[float], *, headers_after_s: float = 0.0) -> Handler:
    """A handler writing `pieces[i]` `gaps_s[i]` seconds after the previous one (headers after `headers_after_s`)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(headers_after_s)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the client hangs up on errors
            for piece, gap_s in zip(pieces, gaps_s, strict=True):
                await asyncio.sleep(gap_s)
                await response.write(piece)
            await response.write_eof()
        return response

    return handler


def serve_canned(pieces: list[bytes], use: Callable[[Client], Awaitable[T]]) -> T:
    return serve(paced(pieces, [0.002] * len(pieces)), use)


def canned(pieces: list[bytes]) -> Exchange:
    return serve_canned(pieces, lambda client: client.stream(CHAT, b"{}"))


def test_content_kinds_and_trailing_usage() -> None:
    """Role-only and empty chunks are not content; reasoning and tool-call deltas are; usage-only is excluded."""
    tool_call = {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
    exchange = canned(
        [
            chunk({"role": "assistant", "content": ""}, usage={"completion_tokens": 0}),
            b": keep-alive\n\n",
            chunk({"reasoning_content": "hmm"}, usage={"completion_tokens": 2}),
            chunk({"reasoning": "so"}, usage={"completion_tokens": 3}),
            chunk({"content": "Hi"}, usage={"completion_tokens": 4}),
            chunk(tool_call, usage={"completion_tokens": 7}),
            chunk({"content": ""}, usage={"completion_tokens": 8}, finish="stop"),
            chunk(usage={"prompt_tokens": 9, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 4}}),
            b"data: [DONE]\r\n\r\n",
        ]
    )
    assert exchange.ok, exchange.error_message
    assert exchange.chunk_tokens == [2, 1, 1, 4], "the EOS after the last content chunk is charged to it"
    assert (exchange.prompt_tokens, exchange.completion_tokens, exchange.cached_tokens) == (9, 8, 4)
    assert exchange.finish_reason == "stop"
    assert exchange.last_token_ns == exchange.chunk_ns[-1] < exchange.end_ns


@pytest.mark.parametrize(
    ("tail", "kind", "text"),
    [
        (b'event: error\ndata: {"message": "engine died"}\n\n', "http", "engine died"),
        (b'data: {"error": {"message": "out of memory", "code": 500}}\n\n', "http", "out of memory"),
        (b'data: {"object": "error", "message": "old shape"}\n\n', "http", "old shape"),
        (
            b'data: {"error": {"message": "This model\'s maximum context length is 8192"}}\n\n',
            "context_overflow",
            "8192",
        ),
        (b"data: not json\n\n", "protocol", "malformed"),
        (b"", "protocol", "[DONE]"),
    ],
)
def test_in_band_errors(tail: bytes, kind: str, text: str) -> None:
    exchange = canned([chunk({"content": "a"}), tail])
    assert exchange.error_kind == kind
    assert exchange.error_message is not None and text in exchange.error_message
    assert exchange.chunk_tokens == [1] and exchange.tokens_estimated


@pytest.mark.parametrize("status", [400, 413, 500])
def test_a_context_overflow_is_one_whatever_its_status(status: int) -> None:
    """As the reference classifies every error record (docs/agentx.md §5): by the text, not the status."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.json_response({"error": {"message": "prompt is too long: 9000 tokens"}}, status=status)

    exchange = serve(handler, lambda client: client.stream(CHAT, b"{}"))
    assert (exchange.error_kind, exchange.status) == ("context_overflow", status)


def test_secret_scrubbed_from_messages() -> None:
    exchange = canned([f'data: {{"error": {{"message": "bad key {SECRET}"}}}}\n\n'.encode()])
    assert exchange.error_kind == "http"
    assert_secret_hidden(exchange)


# The idle timeout (one watchdog per client, not a timer per read).

IDLE_S = 0.3


def stream_of(count: int) -> list[bytes]:
    return [chunk({"content": "a"}, usage={"completion_tokens": n + 1}) for n in range(count)] + [b"data: [DONE]\n\n"]


def test_stalled_stream_times_out() -> None:
    pieces = stream_of(4)
    handler = paced(pieces, [0.01, 0.01, 4 * IDLE_S] + [0.01] * (len(pieces) - 3))
    exchange = serve(handler, lambda client: client.stream(CHAT, b"{}"), idle_timeout_s=IDLE_S)
    assert exchange.error_kind == "timeout", exchange.error_message
    assert exchange.error_message is not None and "idle" in exchange.error_message
    assert len(exchange.chunk_ns) == 2, "chunks before the stall are kept"
    idle_s = (exchange.end_ns - exchange.last_token_ns) / 1e9
    assert IDLE_S <= idle_s < 4 * IDLE_S, "aborted after the idle timeout, well before the stall would end"


def test_silent_server_times_out_before_headers() -> None:
    handler = paced(stream_of(1), [0.0, 0.0], headers_after_s=4 * IDLE_S)
    exchange = serve(handler, lambda client: client.stream(CHAT, b"{}"), idle_timeout_s=IDLE_S)
    assert (exchange.error_kind, exchange.status) == ("timeout", 0), exchange.error_message
    assert IDLE_S <= (exchange.end_ns - exchange.sent_ns) / 1e9 < 4 * IDLE_S


def test_slow_but_alive_stream_does_not_time_out() -> None:
    """Every gap is under the idle timeout while the whole stream lasts several times longer."""
    pieces = stream_of(8)
    handler = paced(pieces, [IDLE_S / 2] * len(pieces), headers_after_s=IDLE_S / 2)
    exchange = serve(handler, lambda client: client.stream(CHAT, b"{}"), idle_timeout_s=IDLE_S)
    assert exchange.ok, exchange.error_message
    assert (exchange.end_ns - exchange.sent_ns) / 1e9 > 3 * IDLE_S
    assert exchange.completion_tokens == 8 == sum(exchange.chunk_tokens)


@pytest.mark.parametrize("idle_timeout_s", [None, 0.0])
def test_no_idle_timeout(idle_timeout_s: float | None) -> None:
    pieces = stream_of(2)
    handler = paced(pieces, [0.01, 2 * IDLE_S, 0.01])
    exchange = serve(handler, lambda client: client.stream(CHAT, b"{}"), idle_timeout_s=idle_timeout_s)
    assert exchange.ok, exchange.error_message


def test_watchdog_spares_other_streams_and_stops_when_idle() -> None:
    stalled = paced(stream_of(2), [0.01, 4 * IDLE_S, 0.01])
    alive = paced(stream_of(10), [IDLE_S / 3] * 11)

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        return await (stalled if body == b"stall" else alive)(request)

    async def use(client: Client) -> tuple[Exchange, Exchange, bool]:
        results = await asyncio.gather(client.stream(CHAT, b"stall"), client.stream(CHAT, b"live"))
        await asyncio.sleep(2 * IDLE_S)
        return results[0], results[1], client._require_streams()._watchdog is None

    stall, live, stopped = serve(handler, use, idle_timeout_s=IDLE_S)
    assert stall.error_kind == "timeout" and live.ok, (stall.error_message, live.error_message)
    assert stopped, "no timer is left running once nothing is in flight"


# When a request counts as sent.


def test_sent_when_written_not_when_queued() -> None:
    """With a pool of one connection, the second request waits for the first to end: that wait is queueing
    (`queued_ns` → `sent_ns`), not time-to-first-token."""
    received: list[int] = []
    inner = paced(stream_of(3), [0.05] * 4)

    async def handler(request: web.Request) -> web.StreamResponse:
        received.append(time.perf_counter_ns())
        return await inner(request)

    async def use(client: Client) -> list[Exchange]:
        return list(await asyncio.gather(client.stream(CHAT, b"{}"), client.stream(CHAT, b"{}")))

    first, second = sorted(serve(handler, use, limit=1), key=lambda exchange: exchange.sent_ns)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    for exchange, arrival in zip((first, second), received, strict=True):
        assert 0 < exchange.queued_ns <= exchange.sent_ns <= arrival <= exchange.headers_ns
    assert second.queued_ns < first.end_ns <= second.sent_ns
    waited_ns = second.sent_ns - second.queued_ns
    assert second.first_token_ns - second.sent_ns < waited_ns, "the wait for the connection is not in the TTFT"
