"""The lean HTTP/1.1 client: response framing under any split of the bytes, keep-alive reuse, and the one
retry of a request whose reused connection the server had closed."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.replayer.http.client import Client
from agentx.replayer.http.http1 import (
    ConnectionClosedError,
    Endpoint,
    HttpConnection,
    HTTPProtocolError,
    WholeBody,
    encode_headers,
    encode_request,
)
from agentx.replayer.http.pool import Pool, reserve_descriptors

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class Recorder:
    """A sink that keeps what it was given."""

    def __init__(self, fail_on: bytes | None = None, *, whole: bool = True) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.reads = 0
        self.fail_on = fail_on
        self.whole = whole

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None:
        self.status, self.headers = status, headers

    def data(self, chunk: bytes, now_ns: int) -> None:
        self.reads += 1
        self.body += chunk
        if self.fail_on is not None and self.fail_on in self.body:
            raise ValueError("the sink gives up")


def feed(response: bytes, cuts: list[int], sink: Any = None) -> tuple[Any, HttpConnection, Any]:
    """Run `response`, split at `cuts`, through a connection; returns (sink, connection, outcome)."""

    async def main() -> tuple[Any, HttpConnection, Any]:
        connection = HttpConnection()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        recorder = sink or Recorder()
        done = connection.send((b"POST / HTTP/1.1\r\n\r\n", b""), recorder)
        bounds = [0, *sorted(set(cuts)), len(response)]
        for start, end in itertools.pairwise(bounds):
            if end > start and not done.done():
                connection.data_received(response[start:end])
        if not done.done():
            connection.connection_lost(None)
        outcome: Any = done.exception() or done.result()
        return recorder, connection, outcome

    return asyncio.run(main())


def chunked(body: bytes, sizes: list[int], *, extension: bool, trailer: bool) -> bytes:
    """`body` in chunks of `sizes` (the rest in one last chunk), with optional chunk extensions and trailers."""
    parts: list[bytes] = []
    position = 0
    for size in [*sizes, len(body)]:
        piece = body[position : position + size]
        position += len(piece)
        if piece:
            ext = b";name=value" if extension else b""
            parts.append(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
    parts.append(b"0\r\n" + (b"X-Trailer: yes\r\n" if trailer else b"") + b"\r\n")
    return b"".join(parts)


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
bodies = st.binary(min_size=0, max_size=300)


@settings(max_examples=examples(200), deadline=None)
@given(
    body=bodies,
    sizes=st.lists(st.integers(min_value=1, max_value=64), max_size=8),
    extension=st.booleans(),
    trailer=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=12),
)
def test_chunked_body_survives_any_split(
    body: bytes, sizes: list[int], extension: bool, trailer: bool, cuts: list[int]
) -> None:
    response = HEAD_CHUNKED + chunked(body, sizes, extension=extension, trailer=trailer)
    sink, _connection, outcome = feed(response, [c for c in cuts if c < len(response)])
    assert outcome is True  # complete, reusable
    assert sink.status == 200 and sink.headers["content-type"] == "text/event-stream"
    assert sink.body == body


@settings(max_examples=examples(100), deadline=None)
@given(body=bodies, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_content_length_body_survives_any_split(body: bytes, cuts: list[int]) -> None:
    response = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    sink, _, outcome = feed(response, [c for c in cuts if c < len(response)])
    assert outcome is True and sink.status == 400 and sink.body == body


@settings(max_examples=examples(100), deadline=None)
@given(
    body=bodies,
    sizes=st.lists(st.integers(min_value=1, max_value=64), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=12),
    framing=st.sampled_from(["chunked", "length", "close"]),
)
def test_a_whole_body_is_gathered_whatever_its_framing_and_split(
    body: bytes, sizes: list[int], cuts: list[int], framing: str
) -> None:
    """The plain calls' sink (a model list, /metrics): the body decoded from its framing, however it arrives."""
    if framing == "chunked":
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        response = head + chunked(body, sizes, extension=False, trailer=True)
    elif framing == "length":
        response = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    else:
        response = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body
    sink, _, outcome = feed(response, [c for c in cuts if c < len(response)], WholeBody(1024))
    assert outcome is (framing != "close")  # a body up to the close leaves no connection to reuse
    assert (sink.status, sink.reason, sink.headers["content-type"]) == (200, "OK", "text/plain")
    assert sink.body == body


def test_a_whole_body_longer_than_its_limit_aborts_the_exchange() -> None:
    response = HEAD_CHUNKED + chunked(b"x" * 100, [30, 30], extension=False, trailer=False)
    _, connection, outcome = feed(response, [60, 90], WholeBody(64))
    assert isinstance(outcome, HTTPProtocolError) and "longer than 64 bytes" in str(outcome)
    assert connection.closed


def test_a_request_has_a_content_length_only_with_a_body() -> None:
    head = b"Host: example.com\r\n"
    assert encode_request("GET", "/v1/models", head) == (b"GET /v1/models HTTP/1.1\r\nHost: example.com\r\n\r\n", b"")
    post = encode_request("POST", "/p/tokenize", head, b'{"a":1}')
    assert post == (b"POST /p/tokenize HTTP/1.1\r\nHost: example.com\r\nContent-Length: 7\r\n\r\n", b'{"a":1}')
    assert encode_request("POST", "/x", head, b"")[0].endswith(b"Content-Length: 0\r\n\r\n")


def test_interim_response_is_skipped() -> None:
    response = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    sink, _, outcome = feed(response, [10, 30])
    assert outcome is True and sink.status == 200 and sink.body == b"ok"


def test_body_until_close_ends_with_the_connection() -> None:
    sink, _, outcome = feed(b"HTTP/1.1 200 OK\r\n\r\nall of it", [20])
    assert outcome is False  # complete, but the connection is gone
    assert sink.body == b"all of it"


@pytest.mark.parametrize(
    ("head", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nstray", False),  # bytes past the end: framing lost
    ],
)
def test_keep_alive_rules(head: bytes, reusable: bool) -> None:
    _, _, outcome = feed(head, [])
    assert outcome is reusable


def test_a_body_its_sink_calls_cut_short_leaves_the_connection_unused() -> None:
    """A zero-length chunk mid-stream ends the body's framing before the stream's end: the rest may follow."""
    response = HEAD_CHUNKED + chunked(b"data: one\n\n", [11], extension=False, trailer=False)
    _, _, outcome = feed(response, [], Recorder(whole=False))
    assert outcome is False


@pytest.mark.parametrize("blank", [b"\r\n", b"\n", b"\r\n\r\n"])
@pytest.mark.parametrize("apart", [False, True])
def test_blank_lines_before_a_status_line_are_ignored(blank: bytes, apart: bool) -> None:
    """A server's stray CRLF after its last response reaches the next one's head, in its read or one of its own."""
    response = blank + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    sink, _, outcome = feed(response, [len(blank)] if apart else [])
    assert outcome is True and sink.status == 200 and sink.body == b"ok"


def test_a_stray_crlf_on_an_idle_connection_keeps_it() -> None:
    async def main() -> HttpConnection:
        connection = HttpConnection()
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        done = connection.send((b"GET / HTTP/1.1\r\n\r\n", b""), Recorder())
        connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        assert done.result() is True
        connection.data_received(b"\r\n")
        return connection

    connection = asyncio.run(main())
    assert not connection.closed and connection.transport is not None and not connection.transport.is_closing()


@pytest.mark.parametrize(
    "response",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -x\r\n\r\n",
    ],
)
def test_malformed_responses_are_protocol_errors(response: bytes) -> None:
    _, connection, outcome = feed(response, [])
    assert isinstance(outcome, HTTPProtocolError)
    assert connection.transport is not None and connection.transport.is_closing()


def test_a_sink_error_aborts_the_connection() -> None:
    response = HEAD_CHUNKED + chunked(b"data: one\n\ndata: BAD\n\n", [11], extension=False, trailer=False)
    _sink, connection, outcome = feed(response, [len(HEAD_CHUNKED) + 16], Recorder(fail_on=b"BAD"))
    assert isinstance(outcome, ValueError)
    assert connection.transport is not None and connection.transport.is_closing()


def test_close_mid_response_is_not_before_response() -> None:
    _, _, outcome = feed(HEAD_CHUNKED + b"5\r\nab", [])
    assert isinstance(outcome, ConnectionClosedError) and not outcome.before_response


def test_headers_refuse_line_breaks() -> None:
    assert encode_headers({"X-A": "1", "X-B": "é"}) == b"X-A: 1\r\nX-B: \xe9\r\n"
    for bad in ({"X-A\n": "1"}, {"": "1"}, {"A:B": "1"}, {"Bad Name": "v"}, {"X-\x00": "1"}):
        with pytest.raises(ValueError, match="is not a valid HTTP header name"):
            encode_headers(bad)
    for bad in ({"X-A": "1\r\nX-Injected: 1"}, {"X-A": "\x00"}, {"X-A": "a\x7fb"}):
        with pytest.raises(ValueError, match="holds a control character"):
            encode_headers(bad)
    assert encode_headers({"X-A": "a\tb"}) == b"X-A: a\tb\r\n"


def test_endpoint() -> None:
    plain = Endpoint("http://127.0.0.1:8000/prefix/")
    assert (plain.host, plain.port, plain.prefix, plain.host_header, plain.ssl) == (
        "127.0.0.1",
        8000,
        "/prefix",
        "127.0.0.1:8000",
        None,
    )
    secure = Endpoint("https://example.com")
    assert (secure.port, secure.host_header, secure.ssl is not None) == (443, "example.com", True)
    assert Endpoint("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError, match="not an http"):
        Endpoint("ftp://example.com")


# Over loopback: a scripted server that sees every connection.

SSE_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(
    b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n',
    [40],
    extension=False,
    trailer=False,
)

Script = Callable[[int, int], bytes | None]
"""(connection number, request number on that connection) → the response, or None to close unanswered."""


async def _read_request(reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    await reader.readexactly(length)
    return True


def run_with_server(script: Script, use: Callable[[str, list[int]], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        served: list[int] = []  # requests read per connection

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            number = len(served)
            served.append(0)
            try:
                while await _read_request(reader):
                    served[number] += 1
                    response = script(number, served[number] - 1)
                    if response is None:
                        break
                    writer.write(response)
                    await writer.drain()
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await use(f"http://127.0.0.1:{port}", served)

    return asyncio.run(main())


def test_connections_are_reused() -> None:
    async def use(url: str, served: list[int]) -> tuple[list[bool], list[int]]:
        async with Client(url, limit=4) as client:
            results = [(await client.stream("/v1/completions", b"{}")).ok for _ in range(3)]
        return results, served

    results, served = run_with_server(lambda connection, request: SSE_OK, use)
    assert results == [True, True, True] and [n for n in served if n] == [3]  # the spares served none


def test_a_reused_connection_closed_by_the_server_is_retried_once_on_a_fresh_one() -> None:
    # Each connection answers its first request and then drops the next one unanswered, as a server closing
    # kept-alive connections at will does.
    def script(connection: int, request: int) -> bytes | None:
        return SSE_OK if request == 0 else None

    async def use(url: str, served: list[int]) -> tuple[list[tuple[str | None, int]], list[int]]:
        async with Client(url, limit=4, spare_connections=0) as client:
            exchanges = [await client.stream("/v1/completions", b"{}") for _ in range(3)]
        return [(e.error_message, e.connection_retries) for e in exchanges], served

    outcomes, served = run_with_server(script, use)
    assert outcomes == [(None, 0), (None, 1), (None, 1)]  # each retry is on the record
    assert served == [2, 2, 1]  # every second request on a connection was sent again on the next one


def test_a_fresh_connection_closed_unanswered_is_an_error_not_a_retry() -> None:
    async def use(url: str, served: list[int]) -> tuple[Any, list[int]]:
        async with Client(url, limit=4, spare_connections=0) as client:
            exchange = await client.stream("/v1/completions", b"{}")
        return exchange, served

    exchange, served = run_with_server(lambda connection, request: None, use)
    assert exchange.error_kind == "connection" and "before any response" in exchange.error_message
    assert served == [1]


def test_pool_limit_and_release() -> None:
    async def main() -> tuple[int, int]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            endpoint = Endpoint(f"http://127.0.0.1:{port}")
            pool = Pool(endpoint, limit=1, connect_timeout_s=5, keepalive_timeout_s=60, spare=0)
            first, reused = await pool.acquire()
            assert not reused
            waiting = asyncio.ensure_future(pool.acquire())
            await asyncio.sleep(0.05)
            assert not waiting.done()  # the limit holds the second caller
            pool.release(first, reusable=True)
            second, reused = await waiting
            assert second is first and reused
            pool.release(second, reusable=False)
            opened_after = pool.open_connections
            pool.close()
            return opened_after, first.requests

    opened_after, requests = asyncio.run(main())
    assert opened_after == 0 and requests == 0


def test_spare_connections_are_opened_ahead_within_the_limit() -> None:
    async def main() -> tuple[int, bool, int]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            endpoint = Endpoint(f"http://127.0.0.1:{port}")
            pool = Pool(endpoint, limit=3, connect_timeout_s=5, keepalive_timeout_s=60, spare=4)
            first, _ = await pool.acquire()
            await asyncio.sleep(0.1)
            opened = pool.open_connections  # the limit caps the spares: 1 in use + 2 spare
            second, reused = await pool.acquire()  # a spare: waiting in the pool, so it may have gone stale
            pool.release(first, reusable=True)
            pool.release(second, reusable=True)
            pool.close()
            return opened, reused, pool.open_connections

    opened, reused, left = asyncio.run(main())
    assert opened == 3 and reused and left == 0


def test_the_servers_keep_alive_timeout_is_honoured() -> None:
    head = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Length: 0\r\n\r\n"
    _, connection, outcome = feed(head, [])
    assert outcome is True and connection.server_idle_timeout_s == 5.0

    async def main() -> tuple[float, float]:
        pool = Pool(Endpoint("http://127.0.0.1:9"), limit=0, connect_timeout_s=1, keepalive_timeout_s=60, spare=0)
        before = pool._idle_limit_s()
        pool.release(connection, reusable=False)  # what it announced is remembered for every connection
        return before, pool._idle_limit_s()

    assert asyncio.run(main()) == (60.0, 4.0)  # a second's margin under the server's 5 s


def test_a_fresh_connection_at_the_limit_replaces_an_idle_one() -> None:
    async def main() -> tuple[bool, int]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            pool = Pool(Endpoint(f"http://127.0.0.1:{port}"), limit=1, connect_timeout_s=5, keepalive_timeout_s=60)
            first, _ = await pool.acquire()
            pool.release(first, reusable=True)  # idle, and the pool is at its limit
            second, reused = await asyncio.wait_for(pool.acquire(fresh=True), timeout=5)
            assert second is not first and first.closed
            opened = pool.open_connections
            pool.release(second, reusable=False)
            pool.close()
            return reused, opened

    assert asyncio.run(main()) == (False, 1)


_RESERVE = """
import os, resource, sys
from pathlib import Path
from agentx.replayer.http.pool import reserve_descriptors

def slots():
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("FDSize:"))

soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
wanted = min(3000, soft - 65)
before = slots()
reserve_descriptors(wanted)
try:
    os.fstat(wanted + 64)
    held = True
except OSError:
    held = False
print(before, wanted, slots(), held)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux reports the descriptor table's size")
def test_descriptors_are_reserved_before_connections_open() -> None:
    # A fresh process: this one's table may have grown already.
    output = subprocess.run([sys.executable, "-c", _RESERVE], capture_output=True, text=True, check=True).stdout
    before, wanted, after, held = output.split()
    assert int(before) < int(wanted) <= int(after)  # grown now, so connections opened mid-run never grow it
    assert held == "False"  # the descriptor that made room is closed again


def test_reserving_descriptors_never_closes_one_in_use() -> None:
    """Another thread of an embedding program (a second replay, its own files) may hold the descriptor the
    reservation reaches for: it stays open, and the table is grown past it instead."""
    with open(os.devnull, "rb") as null:
        held = os.dup2(null.fileno(), 900)
        try:
            reserve_descriptors(900 - 64)
            os.fstat(held)  # raises if the reservation closed it
        finally:
            os.close(held)


def test_a_failed_spare_connection_frees_its_slot_for_a_waiting_request() -> None:
    """At the limit with every slot taken by spares that fail to connect (the server is gone), a waiting
    request gets a slot back, tries itself and reports the failure, instead of waiting forever."""

    async def main() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()  # nothing listens there any more: every connect is refused
        pool = Pool(Endpoint(f"http://127.0.0.1:{port}"), limit=2, connect_timeout_s=5, keepalive_timeout_s=60, spare=2)
        try:
            async with asyncio.timeout(5):
                await pool.acquire()
        finally:
            pool.close()

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(main())
