"""Server quirks lose no measurement: real replays over loopback against a stand-in server that writes its bytes by
hand, each test with one quirk seen in the field.

- A stream that delivered every token and its `finish_reason`, then ended without `data: [DONE]`, is kept whole and
  marked (`server_notices: no_done`); a `data: [DONE]` the close left without its blank line counts.
- A stray CRLF after a complete response does not break the next response on the connection.
- A zero-length chunk mid-stream ends that request (its stream was cut) and nothing after it.
- Every request says `Accept-Encoding: identity`; a stream compressed anyway is decoded as it arrives and marked
  (`compressed`), a coding agentx does not decode is a clear protocol error.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from builders import make_request, make_session, make_trace

from agentx.records.record import RequestRecord, read_records, to_records
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.results.summary.summarize import summarize

MODEL = "m"
TOKENS = ("one", " two", " three", " four")
SESSIONS, TURNS = 3, 4

Writer = Callable[[asyncio.StreamWriter], None]


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(text: str, finish_reason: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish_reason}
    return b"data: " + json.dumps({"object": "text_completion", "model": MODEL, "choices": [choice]}).encode() + b"\n\n"


def _events(*, done: bytes | None = b"data: [DONE]\n\n") -> list[bytes]:
    """A whole completion's events: one token each, the finish reason on the last, then `done` (None: no [DONE])."""
    events = [_event(token) for token in TOKENS[:-1]] + [_event(TOKENS[-1], "length")]
    return events + ([done] if done is not None else [])


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _stream(events: list[bytes]) -> bytes:
    return STREAM_HEAD + b"".join(_chunk(event) for event in events) + b"0\r\n\r\n"


def _json(document: object) -> bytes:
    body = json.dumps(document).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class QuirkServer:
    """Answers `/v1/models` and streams every completion as `answer(completion number)` writes it, keeping each
    request's head."""

    def __init__(self, answer: Callable[[int], list[bytes]]) -> None:
        self.answer = answer
        self.heads: list[dict[str, str]] = []
        self.completions = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.CancelledError:  # the test's loop ends with the client's connections still open
                    return
                lines = raw.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path == "/v1/models":
                    writer.write(_json({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
                elif method == "POST" and path == "/v1/completions":
                    self.heads.append(headers)
                    self.completions += 1
                    for piece in self.answer(self.completions):
                        writer.write(piece)
                        await writer.drain()
                        await asyncio.sleep(0.002)  # each piece a read of its own
                else:
                    writer.write(NOT_FOUND)
                await writer.drain()
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()


def _replay(server: QuirkServer, out_dir: Path) -> tuple[RunResult, list[RequestRecord]]:
    chain = [make_request(float(i), 64 + 32 * i, len(TOKENS), api_time=0.05) for i in range(TURNS)]
    trace = make_trace(*(make_session(f"s{i}", chain) for i in range(SESSIONS)), block_size=16)

    async def go() -> RunResult:
        async with server.running() as url:
            options = ReplayOptions(
                server=Server(url=url, model=MODEL, stream_usage="none"),
                out_dir=out_dir,
                load=ClosedLoad(concurrency=2),
                scenario=Scenario(delay_scale=0.0, failed_request_threshold=None),
                runtime=Runtime(grace_s=2.0, metrics_interval_s=None),
            )
            return await run_replay(trace, options)

    result = asyncio.run(go())
    return result, to_records(read_records(result.records_path))


def test_a_stream_ended_after_its_finish_reason_without_done_is_kept_and_marked(tmp_path: Path) -> None:
    result, records = _replay(QuirkServer(lambda _: [_stream(_events(done=None))]), tmp_path)
    assert len(records) == SESSIONS * TURNS and all(r.status == "ok" for r in records)
    assert all(r.osl_streamed_tokens == len(TOKENS) and r.server_notices == ["no_done"] for r in records)
    assert all(r.first_token_ns is not None and r.last_token_ns is not None for r in records)
    said = [notice for notice in result.notices if "without data: [DONE]" in notice]
    assert len(said) == 1 and "finish_reason 'length'" in said[0]
    counted = summarize(read_records(result.records_path)).counts
    assert counted.server_notices == {"no_done": counted.profiling}


def test_a_done_without_its_blank_line_ends_the_stream(tmp_path: Path) -> None:
    _, records = _replay(QuirkServer(lambda _: [_stream(_events(done=b"data: [DONE]"))]), tmp_path)
    assert len(records) == SESSIONS * TURNS
    assert all(r.status == "ok" and r.server_notices == [] for r in records)


def test_a_stream_without_its_finish_reason_or_done_is_still_a_protocol_error(tmp_path: Path) -> None:
    _, records = _replay(QuirkServer(lambda _: [_stream(_events(done=None)[:-1])]), tmp_path)
    assert records and all(
        r.error_kind == "protocol" and "without data: [DONE]" in (r.error_message or "") for r in records
    )


def test_a_stray_crlf_after_each_response_breaks_no_later_one(tmp_path: Path) -> None:
    server = QuirkServer(lambda _: [_stream(_events()), b"\r\n"])
    _, records = _replay(server, tmp_path)
    assert len(records) == SESSIONS * TURNS and all(r.status == "ok" for r in records), [
        r.error_message for r in records if r.status != "ok"
    ]


def test_a_zero_length_chunk_mid_stream_cuts_that_request_only(tmp_path: Path) -> None:
    def answer(number: int) -> list[bytes]:
        if number != 3:
            return [_stream(_events())]
        events = _events()
        # The first half, a zero-length chunk, then the rest of the stream as if nothing had happened.
        return [STREAM_HEAD + _chunk(events[0]) + b"0\r\n\r\n", b"".join(_chunk(e) for e in events[1:]) + b"0\r\n\r\n"]

    _, records = _replay(QuirkServer(answer), tmp_path)
    failed = [r for r in records if r.status != "ok"]
    assert len(records) == SESSIONS * TURNS and len(failed) == 1, [r.error_message for r in failed]
    assert failed[0].error_kind == "protocol" and failed[0].osl_streamed_tokens == 1


def test_every_request_asks_for_no_compression_and_a_compressed_stream_is_decoded_and_marked(tmp_path: Path) -> None:
    plain = QuirkServer(lambda _: [_stream(_events())])
    _replay(plain, tmp_path / "plain")
    assert plain.heads and all(head.get("accept-encoding") == "identity" for head in plain.heads)

    def compressed(coding: bytes, compress: Callable[[bytes], bytes]) -> Callable[[int], list[bytes]]:
        def answer(_: int) -> list[bytes]:
            body = compress(b"".join(_events()))
            head = STREAM_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: " + coding + b"\r\n\r\n")
            half = len(body) // 2  # two reads, the decoder fed each as it comes
            return [head + _chunk(body[:half]), _chunk(body[half:]) + b"0\r\n\r\n"]

        return answer

    for coding, compress in ((b"gzip", gzip.compress), (b"deflate", zlib.compress)):
        result, records = _replay(QuirkServer(compressed(coding, compress)), tmp_path / coding.decode())
        assert len(records) == SESSIONS * TURNS and all(r.status == "ok" for r in records)
        assert all(r.osl_streamed_tokens == len(TOKENS) and r.server_notices == ["compressed"] for r in records)
        said = [notice for notice in result.notices if "compressed its answer" in notice]
        assert len(said) == 1 and f"({coding.decode()})" in said[0]

    _, records = _replay(QuirkServer(compressed(b"br", lambda body: body)), tmp_path / "br")
    assert records and all(r.error_kind == "protocol" for r in records)
    assert all("Content-Encoding 'br'" in (r.error_message or "") for r in records)


def test_http_errors_say_their_status_and_a_rate_limit_its_retry_after(tmp_path: Path) -> None:
    def answer(number: int) -> list[bytes]:
        if number % 3:
            return [_stream(_events())]
        if number % 2:  # an overload, without a word on when to come back
            return [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"]
        body = b'{"error": {"message": "slow down", "type": "rate_limit"}}'
        head = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\nContent-Type: application/json\r\n"
        return [head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)]

    result, records = _replay(QuirkServer(answer), tmp_path)
    limited = [r for r in records if r.http_status == 429]
    busy = [r for r in records if r.http_status == 503]
    assert limited and busy and len(limited) + len(busy) == sum(r.status != "ok" for r in records)
    assert all(
        r.error_kind == "rate_limited" and r.error_message == "HTTP 429: slow down (Retry-After: 5)" for r in limited
    )
    assert all(r.error_kind == "http" and r.error_message == "HTTP 503: busy" for r in busy)
    said = [notice for notice in result.notices if "rate-limited" in notice]
    assert len(said) == 1 and "(Retry-After: 5)" in said[0] and "rate_limited" in said[0]
    counts = summarize(read_records(result.records_path)).counts
    assert counts.errors_by_kind == {"http": len(busy), "rate_limited": len(limited)}
    assert counts.errors_by_status == {"503": len(busy)}
    assert counts.errors_text() == f"http {len(busy)} (HTTP 503 ×{len(busy)}), rate_limited {len(limited)}"
