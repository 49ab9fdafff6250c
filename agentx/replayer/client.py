"""HTTP client for OpenAI-compatible servers: pooled keep-alive connections, streamed requests timed per chunk.

It knows HTTP and SSE, not traces: callers hand it a path and a pre-encoded JSON body and get back an
`Exchange` of timestamps, token counts, usage and, on failure, an error kind. Server and network failures
never raise; they are recorded in the `Exchange`. `asyncio.CancelledError` propagates untouched.

Every call to the server goes through one `Client`, which carries the credentials (the API key as a bearer
token, explicit headers, or a URL's user and password), the TLS settings (`tls.TLSSettings`, one `SSLContext`
for both transports) and the timeouts. Streamed requests and their responses go through `http1` (a lean HTTP/1.1
pool whose connections hand each read to the SSE parser directly); probes, plain JSON calls and `/metrics`
scrapes through one aiohttp session. Timestamps are
`time.perf_counter_ns()` taken as soon as a read delivers bytes, before any parsing; every event completed
by one read shares that read's timestamp. A request's `sent_ns` is taken when its bytes are handed to the
socket, so time spent queued in the client before that (waiting for a pooled connection, a burst of other
requests on the same loop) is not charged to the server's TTFT; it stays visible as `sent_ns − queued_ns`.

The idle timeout costs no timer per read: one watchdog per client wakes at most once a second while
requests are in flight and aborts those whose last read is older than `idle_timeout_s`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import msgspec

from agentx.errors import ServerError
from agentx.replayer.http1 import (
    SPARE_CONNECTIONS,
    ConnectionClosedError,
    Endpoint,
    HTTPProtocolError,
    Pool,
    encode_headers,
)
from agentx.replayer.options import CONTEXT_OVERFLOW_SUBSTRINGS
from agentx.replayer.sse import DONE, ERROR_EVENT, SSEParser
from agentx.replayer.tls import DEFAULT_TLS, TLSSettings, describe_tls_error, ssl_context
from agentx.replayer.url import base_url as parse_base_url

ErrorKind = Literal["http", "timeout", "connection", "protocol", "context_overflow", "cancelled"]
TimeoutKind = Literal["connect", "idle", "request"]
"""Which timeout ended a request: connecting, no bytes for the idle timeout, or the whole request's limit."""

MESSAGE_MAX_CHARS: Final = 500
_log = logging.getLogger(__name__)
_ERROR_BODY_MAX_BYTES: Final = 64 * 1024
METRICS_TIMEOUT_S: Final = 5.0
"""How long a `/metrics` scrape may take."""
_SECRET_MIN_CHARS: Final = 4
"""Header values shorter than this are not scrubbed from messages (they would mangle them, and hide nothing)."""
WATCHDOG_PERIOD_MAX_S: Final = 1.0
"""The idle watchdog's longest period; a stalled stream is aborted between idle and idle + period after its
last read (a quarter of the idle timeout when that is shorter, so short timeouts stay meaningful)."""


class ServerUnreachable(ServerError):  # noqa: N818 (the name the engine and CLI use)
    """The server did not answer `GET /v1/models` with a 200 (refused, timed out, or an error status)."""


class ModelNotServed(ServerError):  # noqa: N818
    """The server answered, but does not list the requested model."""


class Exchange(msgspec.Struct, kw_only=True, gc=False):
    """One request and what came back. Times are `perf_counter_ns`; 0 means "did not happen"."""

    status: int = 0
    """HTTP status; 0 when no response arrived."""
    queued_ns: int = 0
    """When the request was handed to the client (`stream` / `complete` called), before the connection pool:
    `sent_ns − queued_ns` is the client's own queueing."""
    sent_ns: int = 0
    """When the request's bytes (head and body, one write) were handed to the socket; 0 when they never were
    (e.g. the connection was refused)."""
    headers_ns: int = 0
    first_token_ns: int = 0
    """Arrival of the first non-empty content chunk (text, reasoning or tool-call delta)."""
    last_token_ns: int = 0
    """Arrival of the last non-empty content chunk (a trailing usage-only chunk does not count)."""
    end_ns: int = 0
    """End of the response body, or the moment the failure was seen."""
    chunk_ns: list[int] = msgspec.field(default_factory=list)
    """Arrival time of every content chunk."""
    chunk_tokens: list[int] = msgspec.field(default_factory=list)
    """Tokens in each content chunk, parallel to `chunk_ns`."""
    tokens_estimated: bool = False
    """Some chunk carried neither running usage nor token ids and was counted as one token."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """From the last non-null `usage` (`prompt_tokens_details.cached_tokens`)."""
    finish_reason: str | None = None
    error_kind: ErrorKind | None = None
    timeout_kind: TimeoutKind | None = None
    """With `error_kind == "timeout"`: which timeout it was."""
    error_message: str | None = None
    """At most ~500 characters."""
    connection_retries: int = 0
    """Times the request was sent again because the server had closed its reused connection unanswered."""

    @property
    def ok(self) -> bool:
        return self.error_kind is None


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


class _ErrorBody(msgspec.Struct):
    message: str | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _ErrorBody | str | None = None
    object: str | None = None
    """vLLM before 0.6 put errors at the top level: `{"object": "error", "message": ...}`."""
    message: str | None = None


class _ErrorResponse(msgspec.Struct):
    error: _ErrorBody | str | None = None
    message: str | None = None
    detail: str | None = None


class _Model(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_Model]


_chunk_decoder: Final = msgspec.json.Decoder(_Chunk)
_error_decoder: Final = msgspec.json.Decoder(_ErrorResponse)
_models_decoder: Final = msgspec.json.Decoder(_ModelList)


class _Flight:
    """The watchdog's view of one in-flight request."""

    __slots__ = ("exchange", "expired", "last_ns", "timeout")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.timeout: asyncio.Timeout | None = None
        self.last_ns = 0
        """The last sign of life: the request's bytes written, headers, any read; 0 before the request is
        written, so waiting for a pooled connection is not idle time (the connect has its own timeout)."""
        self.expired = False


class _ExchangeError(Exception):
    """Internal: ends a stream with an error kind (raised inside the read loop, caught in `stream`)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


class Client:
    """Every call to one server: a keep-alive connection pool sized for the concurrency for the streamed
    requests, plus an aiohttp session for probes, JSON calls and `/metrics`, both with the same headers,
    credentials, TLS context and timeouts. Use as `async with`.

    Credentials: an explicit `Authorization` header wins; else the API key is sent as `Authorization: Bearer ...`;
    else a URL's `user:password@` as basic authentication. The key, the password and every header value are
    never logged, never in `repr`, never in an `Exchange` or an exception (messages are scrubbed of them).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        tls: TLSSettings = DEFAULT_TLS,
        limit: int = 1024,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float | None = 300.0,
        total_timeout_s: float | None = None,
        probe_timeout_s: float = 10.0,
        keepalive_timeout_s: float = 60.0,
        context_overflow_substrings: Sequence[str] = CONTEXT_OVERFLOW_SUBSTRINGS,
        spare_connections: int = SPARE_CONNECTIONS,
    ) -> None:
        url, note = parse_base_url(base_url)
        # A URL's user and password become a header like any other credential, never part of a URL that a message,
        # a log line or aiohttp (which would refuse them beside an Authorization header) gets to see.
        parts = urlsplit(url)
        user, password = parts.username, parts.password
        self.base_url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        if note:
            _log.warning("%s: %s", self.base_url, note)
        self.tls = tls
        self._ssl = ssl_context(tls) if parts.scheme == "https" else None
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.total_timeout_s = total_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.spare_connections = spare_connections
        self.context_overflow_substrings = tuple(s.lower() for s in context_overflow_substrings)
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})}
        explicit_auth = next((value for name, value in self._headers.items() if name.lower() == "authorization"), None)
        # What to hide from every message: the values the caller gave (the standard ones above are no secret).
        secrets = {value for value in (headers or {}).values() if len(value) >= _SECRET_MIN_CHARS}
        # An explicit Authorization header is what the caller chose; a key (typically from the environment) does
        # not silently replace it, nor does a key give way to a URL's password.
        if explicit_auth is not None:
            secrets.add(explicit_auth.partition(" ")[2].strip())
        elif api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
            secrets.add(api_key)
        elif user is not None or password is not None:
            pair = f"{unquote(user or '')}:{unquote(password or '')}"
            token = base64.b64encode(pair.encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
            secrets.update((token, unquote(password or ""), password or ""))
        if (user is not None or password is not None) and (explicit_auth is not None or api_key):
            _log.warning(
                "%s: the URL's user and password are not used (an API key or Authorization header is)", self.base_url
            )
        # Longest first, so that a secret holding another is hidden whole.
        self._secrets = tuple(sorted((s for s in secrets if len(s) >= _SECRET_MIN_CHARS), key=len, reverse=True))
        self._endpoint = Endpoint(self.base_url, self._ssl)
        # Every request's constant head lines, encoded once.
        self._fixed_head = encode_headers({"Host": self._endpoint.host_header, "User-Agent": "agentx", **self._headers})
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None
        self._flights: set[_Flight] = set()
        self._watchdog: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        key = ", credentials=<redacted>" if "Authorization" in self._headers or self._secrets else ""
        return f"Client({self.base_url!r}{key}, tls={self.tls!r}, limit={self.limit})"

    __str__ = __repr__

    async def __aenter__(self) -> Client:
        self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def open(self) -> None:
        """Create the session; must run inside the event loop that will use it."""
        if self._session is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=self.limit,
            limit_per_host=0,
            keepalive_timeout=self.keepalive_timeout_s,
            enable_cleanup_closed=False,
            ssl=self._ssl if self._ssl is not None else True,  # True: aiohttp's default (an http:// URL needs none)
        )
        # No sock_read: the idle timeout is the watchdog's (aiohttp's re-arms a timer on every read).
        timeout = aiohttp.ClientTimeout(total=self.total_timeout_s, sock_connect=self.connect_timeout_s)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=timeout,
            raise_for_status=False,
        )
        self._pool = Pool(
            self._endpoint,
            limit=self.limit,
            connect_timeout_s=self.connect_timeout_s,
            keepalive_timeout_s=self.keepalive_timeout_s,
            spare=self.spare_connections,
        )

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Client is not open: use `async with Client(...)` or call open() in the loop")
        return self._session

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text[:MESSAGE_MAX_CHARS]

    async def probe_models(self, require: str | None = None) -> list[str]:
        """The model ids of `GET /v1/models`; raises ServerUnreachable, or ModelNotServed if `require` is absent."""
        session = self._require_session()
        url = self.base_url + "/v1/models"
        try:
            timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s, sock_connect=self.connect_timeout_s)
            async with session.get(url, timeout=timeout, headers={"Accept": "application/json"}) as response:
                body = await response.read()
                if response.status != 200:
                    message = _error_message(body) or response.reason or ""
                    raise ServerUnreachable(self._scrub(f"GET {url}: HTTP {response.status}: {message}"))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ServerUnreachable(self._scrub(f"GET {url}: {_describe(exc)}")) from None
        try:
            models = [model.id for model in _models_decoder.decode(body).data]
        except msgspec.DecodeError as exc:
            raise ServerUnreachable(self._scrub(f"GET {url}: not a model list: {exc}")) from None
        if require is not None and require not in models:
            raise ModelNotServed(f"model {require!r} is not served by {self.base_url} (served: {', '.join(models)})")
        return models

    async def request_json(
        self, method: str, path: str, payload: object | None = None, *, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """A plain JSON request (tokenize, probes): (HTTP status, body). Raises ServerUnreachable on a
        connection failure or timeout (default: the probe timeout)."""
        data = msgspec.json.encode(payload) if payload is not None else None
        return await self._request(method, path, data, timeout_s=timeout_s, accept="application/json")

    async def metrics_text(self, *, timeout_s: float = METRICS_TIMEOUT_S) -> str | None:
        """The server's Prometheus metrics, `GET /metrics` as text; None when it has none to give (another status
        than 200, a failed connection, a timeout, a body that is not text). Only a missing endpoint (404) is
        expected; any other failure, a refused credential or certificate for instance, is logged as a warning,
        since the figures computed from the counters then drop out of the run's summary."""
        try:
            status, body = await self._request("GET", "/metrics", None, timeout_s=timeout_s, accept="text/plain")
        except ServerUnreachable as exc:
            _log.warning("no server counters: %s", exc)
            return None
        if status != 200:
            if status != 404:
                message = self._scrub(_error_message(body))
                _log.warning("no server counters: GET %s/metrics: HTTP %d: %s", self.base_url, status, message)
            return None
        try:
            return body.decode()
        except UnicodeDecodeError:
            _log.warning("no server counters: GET %s/metrics: the answer is not UTF-8 text", self.base_url)
            return None

    async def _request(
        self, method: str, path: str, data: bytes | None, *, timeout_s: float | None, accept: str
    ) -> tuple[int, bytes]:
        session = self._require_session()
        url = self.base_url + path
        try:
            timeout = aiohttp.ClientTimeout(
                total=timeout_s or self.probe_timeout_s, sock_connect=self.connect_timeout_s
            )
            async with session.request(method, url, data=data, timeout=timeout, headers={"Accept": accept}) as response:
                return response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ServerUnreachable(self._scrub(f"{method} {url}: {_describe(exc)}")) from None

    async def stream(
        self,
        path: str,
        body: bytes,
        *,
        extra_headers: Mapping[str, str] | None = None,
        into: Exchange | None = None,
    ) -> Exchange:
        """POST a pre-encoded streaming request body to `path` and record the response as it arrives, in `into`
        when given: a caller that cancels the call still holds what arrived until then."""
        return await self._exchange(path, body, extra_headers, _Response(streamed=True, exchange=into))

    async def complete(
        self,
        path: str,
        body: bytes,
        *,
        extra_headers: Mapping[str, str] | None = None,
        into: Exchange | None = None,
    ) -> Exchange:
        """POST a pre-encoded non-streaming (`"stream": false`) body; the whole answer is one chunk at its end."""
        return await self._exchange(path, body, extra_headers, _Response(streamed=False, exchange=into))

    def _request_bytes(self, path: str, body: bytes, extra_headers: Mapping[str, str] | None) -> bytes:
        head = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n" % (
            (self._endpoint.prefix + path).encode(),
            self._fixed_head,
            len(body),
        )
        extra = encode_headers(dict(extra_headers)) if extra_headers else b""
        return b"".join((head, extra, b"\r\n", body))

    async def _exchange(
        self, path: str, body: bytes, extra_headers: Mapping[str, str] | None, response: _Response
    ) -> Exchange:
        pool = self._pool
        if pool is None:
            raise RuntimeError("Client is not open: use `async with Client(...)` or call open() in the loop")
        exchange = response.exchange
        exchange.queued_ns = time.perf_counter_ns()
        payload = self._request_bytes(path, body, extra_headers)
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
                    await _send(pool, payload, response)
                finally:
                    if watched:
                        self._flights.discard(flight)
            response.finish(self.context_overflow_substrings)
        except _ExchangeError as failure:
            kind = failure.kind
            # Any error answer whose text names a context overflow is one, whatever its status or whether it
            # came as a status or an in-stream error event (reference: `common/scenario/context_overflow.py`,
            # applied to every error record; docs/agentx.md §5).
            if kind == "http" and any(s in failure.message.lower() for s in self.context_overflow_substrings):
                kind = "context_overflow"
            _fail(exchange, kind, self._scrub(failure.message))
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
            _fail(exchange, "timeout", self._scrub(message))
        except HTTPProtocolError as exc:
            _fail(exchange, "protocol", self._scrub(_describe(exc)))
        except OSError as exc:  # refused, reset, closed mid-response
            _fail(exchange, "connection", self._scrub(_describe(exc)))
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


async def _send(pool: Pool, payload: bytes, response: _Response) -> None:
    """Send `payload` on a pooled connection and wait for the whole response. A pooled connection that the
    server had closed before answering gets the request again, once, on a new connection."""
    for attempt in range(2):
        connection, reused = await pool.acquire(fresh=attempt > 0)
        reusable = False
        try:
            response.exchange.sent_ns = response.flight.last_ns = time.perf_counter_ns()
            reusable = await connection.send(payload, response)
        except ConnectionClosedError as exc:
            if reused and exc.before_response and attempt == 0:
                response.exchange.connection_retries += 1
                continue
            raise
        finally:
            pool.release(connection, reusable)
        return


def _fail(exchange: Exchange, kind: ErrorKind, message: str) -> None:
    exchange.end_ns = time.perf_counter_ns()
    exchange.error_kind = kind
    exchange.error_message = message


def _describe(exc: BaseException) -> str:
    tls = describe_tls_error(exc)
    if tls is not None:
        return tls
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's start as text."""
    try:
        parsed = _error_decoder.decode(raw)
    except msgspec.DecodeError:
        return raw[:MESSAGE_MAX_CHARS].decode("utf-8", "replace")
    error = parsed.error
    if isinstance(error, _ErrorBody) and error.message:
        return error.message
    if isinstance(error, str):
        return error
    return parsed.message or parsed.detail or raw[:MESSAGE_MAX_CHARS].decode("utf-8", "replace")


class _Response:
    """One exchange's response, fed by its connection as reads arrive (an `http1.Sink`).

    Streamed: SSE events are decoded as they complete, each content chunk stamped with its read's time.
    Otherwise the body is gathered and decoded at its end. A non-200 answer keeps its body's start for the
    error message. `finish` settles the `Exchange` once the response is complete.
    """

    __slots__ = (
        "_done",
        "_error_body",
        "_feed",
        "_parts",
        "_reason",
        "_running_tokens",
        "_usage",
        "exchange",
        "flight",
        "streamed",
    )

    def __init__(self, *, streamed: bool, exchange: Exchange | None = None) -> None:
        self.exchange = exchange if exchange is not None else Exchange()
        self.flight = _Flight(self.exchange)
        self.streamed = streamed
        self._feed = SSEParser().feed
        self._parts: list[bytes] = []
        self._error_body = b""
        self._reason = ""
        self._usage: _Usage | None = None
        self._running_tokens = 0  # completion_tokens of the running usage as of the last content chunk
        self._done = False

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None:
        self.exchange.headers_ns = self.flight.last_ns = now_ns
        self.exchange.status = status
        self._reason = reason

    def data(self, chunk: bytes, now_ns: int) -> None:
        self.flight.last_ns = now_ns
        if self.exchange.status != 200:
            if len(self._error_body) < _ERROR_BODY_MAX_BYTES:
                self._error_body += chunk[: _ERROR_BODY_MAX_BYTES - len(self._error_body)]
        elif not self.streamed:
            self._parts.append(chunk)
        elif not self._done:  # after [DONE], the rest is only drained so the connection can be reused
            self._events(chunk, now_ns)

    def _events(self, raw: bytes, now_ns: int) -> None:
        """The SSE events that `raw` completed; raises _ExchangeError for protocol and in-band errors."""
        exchange = self.exchange
        for event_type, data in self._feed(raw):
            if data == DONE:
                self._done = True
                return
            if event_type == ERROR_EVENT:
                raise _ExchangeError("http", f"error event: {data[:MESSAGE_MAX_CHARS].decode('utf-8', 'replace')}")
            try:
                chunk = _chunk_decoder.decode(data)
            except msgspec.DecodeError as exc:
                raise _ExchangeError("protocol", f"malformed event ({exc}): {data[:200]!r}") from None
            if chunk.error is not None or chunk.object == "error":
                raise _ExchangeError("http", f"error event: {_error_message(data)}")
            content = False
            ids_tokens = 0
            has_ids = False
            for choice in chunk.choices or ():
                delta = choice.delta
                if choice.text or (
                    delta is not None
                    and (delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)
                ):
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
        """Settle the exchange after its last byte; raises _ExchangeError for an error answer."""
        exchange = self.exchange
        exchange.end_ns = self.flight.last_ns or time.perf_counter_ns()
        if exchange.status != 200:
            raw = self._error_body
            message = _error_message(raw) or self._reason
            kind: ErrorKind = "http"
            lowered = raw.decode("utf-8", "replace").lower()
            if any(s in lowered for s in context_overflow_substrings):
                kind = "context_overflow"
            raise _ExchangeError(kind, f"HTTP {exchange.status}: {message}")
        if not self.streamed:
            self._whole(b"".join(self._parts))
            return
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
            raise _ExchangeError("protocol", "the stream ended without data: [DONE]")

    def _whole(self, raw: bytes) -> None:
        """A non-streaming answer: its content, if any, is one chunk arriving with the end of the body."""
        exchange = self.exchange
        try:
            answer = _chunk_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise _ExchangeError("protocol", f"malformed response ({exc}): {raw[:200]!r}") from None
        if answer.error is not None or answer.object == "error":
            raise _ExchangeError("http", f"error response: {_error_message(raw)}")
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


def _has_content(delta: _Delta) -> bool:
    return bool(delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)
