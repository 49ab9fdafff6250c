"""One request streamed over the `http1` pool and timed per chunk, as the replay sends them.

The caller hands over a path and a pre-encoded JSON body and gets back an `Exchange`. Timestamps are
`time.perf_counter_ns()` taken as soon as a read delivers bytes, before any parsing; every event completed by one
read shares that read's timestamp. A request's `sent_ns` is taken when its bytes are handed to the socket, so time
spent queued in the client before that (waiting for a pooled connection, a burst of other requests on the same
loop) is not charged to the server's TTFT; it stays visible as `sent_ns − queued_ns`. `asyncio.CancelledError`
propagates untouched; every other failure ends the `Exchange` with an error kind.

The idle timeout costs no timer per read: one watchdog per `Streams` wakes at most once a second while requests
are in flight and aborts those whose last read is older than `idle_timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Final

import msgspec

from agentx.records.kinds import ErrorKind
from agentx.replayer.http.exchange import (
    MESSAGE_MAX_CHARS,
    ErrorBody,
    Exchange,
    ExchangeError,
    describe,
    error_message,
    overflows,
)
from agentx.replayer.http.http1 import Body, HTTPProtocolError, Payload, encode_headers, encode_request
from agentx.replayer.http.pool import Pool, send
from agentx.replayer.http.sse import DONE, ERROR_EVENT, SSEParser

ERROR_BODY_MAX_BYTES: Final = 64 * 1024
"""How much of an error answer's body is kept for its message."""
DECODED: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}
"""The content codings a response is decoded from, with their zlib window bits (deflate: zlib's format, as RFC 9110
says, or gzip's, which some servers send under that name)."""
WATCHDOG_PERIOD_MAX_S: Final = 1.0
"""The idle watchdog's longest period; a stalled stream is aborted between idle and idle + period after its
last read (a quarter of the idle timeout when that is shorter, so short timeouts stay meaningful)."""


# The minimal shape of a streamed chunk: only what is recorded gets decoded.


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[msgspec.Raw] | None = None


class _Choice(msgspec.Struct, gc=False):
    text: str | None = None
    delta: _Delta | None = None
    message: _Delta | None = None
    """Non-streaming responses (chat)."""
    token_ids: list[int] | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: ErrorBody | str | None = None
    object: str | None = None
    """vLLM before 0.6 put errors at the top level: `{"object": "error", "message": ...}`."""
    message: str | None = None


_chunk_decoder: Final = msgspec.json.Decoder(_Chunk)


def _has_content(delta: _Delta) -> bool:
    return bool(delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)


class Flight:
    """The watchdog's view of one in-flight request."""

    __slots__ = ("exchange", "expired", "last_ns", "timeout")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.timeout: asyncio.Timeout | None = None
        self.last_ns = 0
        """The last sign of life: the request's bytes written, headers, any read; 0 before the request is
        written, so waiting for a pooled connection is not idle time (the connect has its own timeout)."""
        self.expired = False


class StreamResponse:
    """One exchange's response, fed by its connection as reads arrive (an `http1.Sink`).

    Streamed: SSE events are decoded as they complete, each content chunk stamped with its read's time.
    Otherwise the body is gathered and decoded at its end. A non-200 answer keeps its body's start for the
    error message. `finish` settles the `Exchange` once the response is complete.
    """

    __slots__ = (
        "_content_type",
        "_decoder",
        "_done",
        "_error_body",
        "_feed",
        "_foreign",
        "_parts",
        "_reason",
        "_retry_after",
        "_running_tokens",
        "_usage",
        "exchange",
        "flight",
        "streamed",
    )

    def __init__(self, *, streamed: bool, exchange: Exchange | None = None) -> None:
        self.exchange = exchange if exchange is not None else Exchange()
        self.flight = Flight(self.exchange)
        self.streamed = streamed
        self._feed = SSEParser().feed
        self._parts: list[bytes] = []
        self._error_body = b""
        self._reason = ""
        self._retry_after = ""
        self._content_type = ""
        self._foreign = False  # a streamed request answered with something that says it is not an event stream
        self._usage: _Usage | None = None
        self._running_tokens = 0  # completion_tokens of the running usage as of the last content chunk
        self._done = False
        self._decoder: zlib._Decompress | None = None

    def _undecodable(self, exc: zlib.error) -> ExchangeError:
        return ExchangeError("protocol", f"a {self.exchange.content_encoding} body that does not decode ({exc})")

    @property
    def whole(self) -> bool:
        """Whether the body, its framing ended, was all the answer: not a 200 event stream that ended before
        `data: [DONE]` (a server sending a zero-length chunk mid-stream, the rest of the stream then following on
        the connection, which must not carry another request)."""
        return self._done or not self.streamed or self._foreign or self.exchange.status != 200

    def sending(self) -> None:
        """The request's bytes go to the socket now."""
        self.exchange.sent_ns = self.flight.last_ns = time.perf_counter_ns()

    def retrying(self) -> None:
        self.exchange.connection_retries += 1

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None:
        self.exchange.headers_ns = self.flight.last_ns = now_ns
        self.exchange.status = status
        self._reason = reason
        self._retry_after = headers.get("retry-after", "") if status != 200 else ""
        self._content_type = headers.get("content-type", "")
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            if encoding not in DECODED:
                raise ExchangeError(
                    "protocol",
                    f"the server answered with Content-Encoding {encoding!r} though agentx asks for none "
                    "(Accept-Encoding: identity), and agentx decodes gzip and deflate only: turn the server's or "
                    "proxy's compression off for this endpoint",
                )
            # Decoded as each read arrives, so a stream's chunks keep their times; said (sanity.py), since a
            # compressing proxy may hold chunks back to fill its blocks.
            self._decoder = zlib.decompressobj(DECODED[encoding])
            self.exchange.content_encoding = encoding
        kind = self._content_type.split(";", 1)[0].strip().lower()
        self._foreign = self.streamed and status == 200 and bool(kind) and kind != "text/event-stream"
        if self._foreign:
            self.exchange.foreign_content_type = self._content_type

    def data(self, chunk: bytes, now_ns: int) -> None:
        self.flight.last_ns = now_ns
        if self._decoder is not None:
            try:
                chunk = self._decoder.decompress(chunk)
            except zlib.error as exc:
                raise self._undecodable(exc) from None
        # Kept for the message: an error's body, or a page a proxy answered in place of the stream.
        if (self.exchange.status != 200 or self._foreign) and len(self._error_body) < ERROR_BODY_MAX_BYTES:
            self._error_body += chunk[: ERROR_BODY_MAX_BYTES - len(self._error_body)]
        if self.exchange.status != 200:
            return
        if not self.streamed:
            self._parts.append(chunk)
        elif not self._done:  # after [DONE], the rest is only drained so the connection can be reused
            self._events(chunk, now_ns)

    def _events(self, raw: bytes, now_ns: int) -> None:
        """The SSE events that `raw` completed; raises ExchangeError for protocol and in-band errors."""
        exchange = self.exchange
        for event_type, data in self._feed(raw):
            if data == DONE:
                self._done = True
                return
            if event_type == ERROR_EVENT:
                raise ExchangeError("http", f"error event: {data[:MESSAGE_MAX_CHARS].decode('utf-8', 'replace')}")
            try:
                chunk = _chunk_decoder.decode(data)
            except msgspec.DecodeError as exc:
                raise ExchangeError("protocol", f"malformed event ({exc}): {data[:200]!r}") from None
            if chunk.error is not None or chunk.object == "error":
                raise ExchangeError("http", f"error event: {error_message(data)}")
            content = False
            ids_tokens = 0
            has_ids = False
            for choice in chunk.choices or ():
                delta = choice.delta
                if choice.text or (delta is not None and _has_content(delta)):
                    content = True
                if choice.token_ids is not None:
                    has_ids = True
                    ids_tokens += len(choice.token_ids)
                if choice.finish_reason is not None:
                    exchange.finish_reason = choice.finish_reason
            chunk_usage = chunk.usage
            if chunk_usage is not None:
                self._usage = chunk_usage
            if not content:
                continue
            if not exchange.chunk_ns:
                exchange.first_token_ns = now_ns
            exchange.last_token_ns = now_ns
            exchange.chunk_ns.append(now_ns)
            if chunk_usage is not None and chunk_usage.completion_tokens is not None:
                exchange.chunk_tokens.append(chunk_usage.completion_tokens - self._running_tokens)
                self._running_tokens = chunk_usage.completion_tokens
            elif has_ids:
                exchange.chunk_tokens.append(ids_tokens)
            else:
                exchange.chunk_tokens.append(1)
                exchange.tokens_estimated = True

    def finish(self, context_overflow_substrings: Sequence[str]) -> None:
        """Settle the exchange after its last byte; raises ExchangeError for an error answer."""
        exchange = self.exchange
        exchange.end_ns = self.flight.last_ns or time.perf_counter_ns()
        if self._decoder is not None:
            try:
                rest = self._decoder.flush()
            except zlib.error as exc:
                raise self._undecodable(exc) from None
            self._decoder = None
            if rest:
                self.data(rest, exchange.end_ns)
        if exchange.status != 200:
            raw = self._error_body
            message = error_message(raw) or self._reason
            text = raw.decode("utf-8", "replace")
            kind: ErrorKind = "context_overflow" if overflows(text, context_overflow_substrings) else "http"
            if exchange.status == HTTPStatus.TOO_MANY_REQUESTS:
                kind = "rate_limited"
            # A rate limit's or an overload's own word on when to come back: the run does not wait for it (that
            # would change the load it was asked to offer), but says it.
            later = f" (Retry-After: {self._retry_after[:40]})" if self._retry_after else ""
            raise ExchangeError(kind, f"HTTP {exchange.status}: {message}{later}")
        if not self.streamed:
            self._whole(b"".join(self._parts))
            return
        if not self._done and not self._foreign:
            # An event the close left unterminated (`data: [DONE]`, or the last chunk, with no blank line after it)
            # still counts.
            self._events(b"\n\n", exchange.end_ns)
        usage = self._usage
        if usage is not None:
            exchange.prompt_tokens = usage.prompt_tokens
            exchange.completion_tokens = usage.completion_tokens
            # Tokens reported after the last content chunk (e.g. an EOS with empty text) belong to no chunk of
            # their own; charging them to the last one keeps the per-chunk counts summing to the usage.
            running = self._running_tokens
            if running and usage.completion_tokens is not None and usage.completion_tokens > running:
                exchange.chunk_tokens[-1] += usage.completion_tokens - running
            details = usage.prompt_tokens_details
            exchange.cached_tokens = details.cached_tokens if details is not None else None
            # Counted one per chunk for want of running usage, but the final count says as many tokens as
            # chunks: each chunk was one token (llama.cpp streams so), so the counts are exact after all.
            if exchange.tokens_estimated and usage.completion_tokens == len(exchange.chunk_tokens):
                exchange.tokens_estimated = False
        if not self._done:
            if self._foreign:
                start = self._error_body[:MESSAGE_MAX_CHARS].decode("utf-8", "replace").strip()
                raise ExchangeError(
                    "protocol",
                    f"the server answered 200 with Content-Type {self._content_type!r}, not an event stream "
                    f"(text/event-stream): {start!r}",
                )
            if exchange.finish_reason is None:
                raise ExchangeError("protocol", "the stream ended without data: [DONE]")
            # Every token and the finish reason came: what was measured stands (sanity.py marks it).
            exchange.without_done = True

    def _whole(self, raw: bytes) -> None:
        """A non-streaming answer: its content, if any, is one chunk arriving with the end of the body."""
        exchange = self.exchange
        try:
            answer = _chunk_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise ExchangeError("protocol", f"malformed response ({exc}): {raw[:200]!r}") from None
        if answer.error is not None or answer.object == "error":
            raise ExchangeError("http", f"error response: {error_message(raw)}")
        content = False
        ids_tokens: int | None = None
        for choice in answer.choices or ():
            message = choice.message or choice.delta
            if choice.text or (message is not None and _has_content(message)):
                content = True
            if choice.token_ids is not None:
                ids_tokens = (ids_tokens or 0) + len(choice.token_ids)
            if choice.finish_reason is not None:
                exchange.finish_reason = choice.finish_reason
        usage = answer.usage
        if usage is not None:
            exchange.prompt_tokens = usage.prompt_tokens
            exchange.completion_tokens = usage.completion_tokens
            details = usage.prompt_tokens_details
            exchange.cached_tokens = details.cached_tokens if details is not None else None
        if content:
            exchange.first_token_ns = exchange.last_token_ns = exchange.end_ns
            exchange.chunk_ns.append(exchange.end_ns)
            tokens = exchange.completion_tokens if exchange.completion_tokens is not None else ids_tokens
            exchange.chunk_tokens.append(tokens if tokens is not None else 1)
            exchange.tokens_estimated = tokens is None


class Streams:
    """The requests timed per chunk on one pool: `exchange` sends one and records its response; the watchdog
    aborts the idle ones. `head` is every request's constant header lines (`Host` and the credentials among them),
    `scrub` hides secrets from error messages."""

    def __init__(
        self,
        pool: Pool,
        *,
        head: bytes,
        scrub: Callable[[str], str],
        connect_timeout_s: float | None,
        idle_timeout_s: float | None,
        total_timeout_s: float | None,
        context_overflow_substrings: Sequence[str],
    ) -> None:
        self.pool = pool
        self.head = head
        self.scrub = scrub
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.total_timeout_s = total_timeout_s
        self.context_overflow_substrings = tuple(context_overflow_substrings)
        self._flights: set[Flight] = set()
        self._watchdog: asyncio.TimerHandle | None = None

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def request_parts(self, path: str, body: Body, extra_headers: Mapping[str, str] | None) -> Payload:
        head = self.head + encode_headers(dict(extra_headers)) if extra_headers else self.head
        endpoint = self.pool.endpoint
        return encode_request("POST", endpoint.target_root + endpoint.prefix + path, head, body)

    async def exchange(
        self, path: str, body: Body, extra_headers: Mapping[str, str] | None, response: StreamResponse
    ) -> Exchange:
        """POST `body` to `path` and record the answer in `response.exchange`; never raises but for a
        cancellation (or an invalid extra header: ValueError)."""
        exchange = response.exchange
        exchange.queued_ns = time.perf_counter_ns()
        payload = self.request_parts(path, body, extra_headers)
        watched = bool(self.idle_timeout_s)  # None or 0: no idle timeout
        flight = response.flight
        total_s = self.total_timeout_s
        try:
            # The watchdog reschedules this Timeout to now to abort the request, and it tells that apart from
            # a cancellation coming from the caller; without a total timeout it has no deadline (no timer).
            async with asyncio.timeout(total_s or None) as flight.timeout:
                if watched:
                    self._flights.add(flight)
                    if self._watchdog is None:
                        self._arm_watchdog()
                try:
                    await send(self.pool, payload, response, sending=response.sending, retrying=response.retrying)
                finally:
                    if watched:
                        self._flights.discard(flight)
            response.finish(self.context_overflow_substrings)
        except ExchangeError as failure:
            kind = failure.kind
            if kind == "http" and overflows(failure.message, self.context_overflow_substrings):
                kind = "context_overflow"
            exchange.fail(kind, self.scrub(failure.message))
        except TimeoutError:  # the watchdog's, the total and the connect timeouts
            if flight.expired:
                exchange.timeout_kind = "idle"
                message = f"idle timeout: no bytes from the server for {self.idle_timeout_s:g} s"
            elif exchange.sent_ns == 0 and not (
                total_s and time.perf_counter_ns() - exchange.queued_ns >= total_s * 1e9
            ):
                exchange.timeout_kind = "connect"
                message = f"connecting timed out after {self.connect_timeout_s:g} s"
            else:
                exchange.timeout_kind = "request"
                message = f"request timeout: the request took longer than {total_s:g} s"
            exchange.fail("timeout", self.scrub(message))
        except HTTPProtocolError as exc:
            exchange.fail("protocol", self.scrub(describe(exc)))
        except OSError as exc:  # refused, reset, closed mid-response
            exchange.fail("connection", self.scrub(describe(exc)))
        return exchange

    def _arm_watchdog(self) -> None:
        assert self.idle_timeout_s
        period = min(WATCHDOG_PERIOD_MAX_S, self.idle_timeout_s / 4)
        self._watchdog = asyncio.get_running_loop().call_later(period, self._watch, period)

    def _watch(self, period: float) -> None:
        """Abort the requests idle for longer than the idle timeout; re-arm only while requests are in flight."""
        assert self.idle_timeout_s
        oldest_ns = time.perf_counter_ns() - int(self.idle_timeout_s * 1e9)
        loop = asyncio.get_running_loop()
        for flight in self._flights:
            if 0 < flight.last_ns < oldest_ns and not flight.expired and flight.timeout is not None:
                flight.expired = True
                flight.timeout.reschedule(loop.time())
        self._watchdog = loop.call_later(period, self._watch, period) if self._flights else None
