"""A lean HTTP/1.1 client for the replay's hot path: POSTs over a pool of keep-alive connections.

Why not aiohttp here (it still serves probes, JSON calls and metrics, with the same TLS context): per request in
flight aiohttp keeps ~250 objects the garbage collector must walk and wakes a task for every read. At 1,000
requests/s the collector's pauses and the per-request cost alone break the dispatch-lag target (bench/README.md,
Targets).
Here a connection is an `asyncio.Protocol` that hands each read's body bytes to the caller's `Sink` inside
`data_received`, stamped with the read's arrival time, with no task switch between the socket and the parser.

It speaks exactly what OpenAI-compatible servers answer: a status line and headers, then a body framed by
`Transfer-Encoding: chunked`, `Content-Length`, or the connection's close. A connection goes back to the
pool only after a complete response that did not ask to close; a request that finds its reused connection
closed by the server before a single response byte is sent again once on a fresh connection (servers such as
llama.cpp's close kept-alive connections at will).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import time
from collections import deque
from typing import Final, Protocol, cast
from urllib.parse import urlsplit

SPARE_CONNECTIONS: Final = 16
"""Idle connections the pool keeps ready beyond those in use, so a burst of arrivals does not wait on connects."""
SERVER_IDLE_MARGIN_S: Final = 1.0
"""A connection idle within this long of the server's announced idle timeout is not reused."""
HEAD_MAX_BYTES: Final = 64 * 1024
"""A response head larger than this is a protocol error (no OpenAI-compatible server sends one)."""


class Sink(Protocol):
    """Receives one response as it arrives. `data` may raise to abort the exchange (the connection is then
    closed, never reused)."""

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None: ...

    def data(self, chunk: bytes, now_ns: int) -> None: ...


class HTTPProtocolError(Exception):
    """The server's bytes are not a well-formed HTTP/1.1 response."""


class ConnectionClosedError(ConnectionError):
    """The connection ended before the response was complete."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class Endpoint:
    """Where requests go: scheme, host, port, path prefix, TLS context, and the `Host` header."""

    __slots__ = ("host", "host_header", "port", "prefix", "ssl")

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context` checks an https server's certificate (default: the system's CAs and the host name)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        default_port = 443 if parts.scheme == "https" else 80
        self.host = parts.hostname
        self.port = parts.port or default_port
        self.prefix = parts.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"


_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name: an RFC 9110 token (no spaces, colons or controls)."""


def check_header(name: str, value: str) -> None:
    """Raise ValueError, naming the header, unless `name: value` is a valid HTTP header line: a token for the
    name, and no control character but tab in the value (CR or LF would split the request)."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)")
    if any((ord(char) < 32 and char != "\t") or ord(char) == 127 for char in value):
        raise ValueError(f"the value of HTTP header {name!r} holds a control character")


def encode_headers(headers: dict[str, str] | None) -> bytes:
    """`Name: value\\r\\n` lines; an invalid name or value is refused (`check_header`)."""
    if not headers:
        return b""
    lines: list[bytes] = []
    for name, value in headers.items():
        check_header(name, value)
        line = f"{name}: {value}"
        try:
            lines.append(line.encode("latin-1"))
        except UnicodeEncodeError:
            lines.append(line.encode())  # opaque bytes, as servers take them
    return b"\r\n".join(lines) + b"\r\n"


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class Connection(asyncio.Protocol):
    """One keep-alive connection: sends a request, parses its response into a `Sink`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since_ns = 0
        self.requests = 0
        self._sink: Sink | None = None
        self._done: asyncio.Future[bool] | None = None
        self._state = _DONE
        self._buffer = b""
        self._left = 0  # body bytes left (Content-Length) or in the current chunk
        self._received = 0
        self._keep_alive = True
        self.server_idle_timeout_s: float | None = None
        """The idle timeout the server announced (`Keep-Alive: timeout=N`), if it did."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == _UNTIL_CLOSE:
            self._finish(keep_alive=False)
        elif self._done is not None and not self._done.done():
            before = self._received == 0
            reason = f": {exc}" if exc else ""
            what = "before any response" if before else "in the middle of the response"
            message = f"the server closed the connection {what}{reason}"
            self._fail(ConnectionClosedError(message, before_response=before))

    def eof_received(self) -> bool | None:
        return None  # close our side too; `connection_lost` settles the response

    def send(self, payload: bytes, sink: Sink) -> asyncio.Future[bool]:
        """Write one request; the future gives whether the connection may be reused once it completes."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.transport is None or self.closed:
            done.set_exception(ConnectionClosedError("the connection closed before the request", before_response=True))
            return done
        self._sink, self._done = sink, done
        self._state, self._buffer, self._received, self._keep_alive = _HEAD, b"", 0, True
        self.requests += 1
        self.transport.write(payload)
        return done

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        now_ns = time.perf_counter_ns()
        self._received += len(data)
        sink = self._sink
        if sink is None or self._state == _DONE:
            self.abort()  # bytes nobody asked for: the connection's framing is lost
            return
        try:
            body = self._parse(data, sink, now_ns)
            if body:
                sink.data(body, now_ns)
        except Exception as exc:  # the sink's own error, or a malformed response
            self.abort()
            self._fail(exc)
            return
        if self._state == _DONE:
            self._finish(self._keep_alive)

    def _parse(self, data: bytes, sink: Sink, now_ns: int) -> bytes:
        """Advance the response state machine over `data`; returns the body bytes it carried."""
        state = self._state
        if state == _LENGTH and len(data) < self._left and not self._buffer:
            self._left -= len(data)  # the common case: one read, part of a known-length body
            return data
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        pieces: list[bytes] = []
        position = 0
        size = len(data)
        while position < size and self._state != _DONE:
            state = self._state
            if state == _HEAD:
                end = data.find(b"\r\n\r\n", position)
                if end < 0:
                    if size - position > HEAD_MAX_BYTES:
                        raise HTTPProtocolError("response head too large")
                    self._buffer = data[position:]
                    return b"".join(pieces)
                self._head(data[position:end], sink, now_ns)
                position = end + 4
            elif state in (_LENGTH, _CHUNK_DATA):
                take = min(self._left, size - position)
                pieces.append(data[position : position + take] if take < size or position else data)
                position += take
                self._left -= take
                if self._left == 0:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
            elif state == _UNTIL_CLOSE:
                pieces.append(data[position:])
                position = size
            else:  # line-framed states: chunk size, the CRLF after chunk data, trailers
                end = data.find(b"\n", position)
                if end < 0:
                    if size - position > HEAD_MAX_BYTES:
                        raise HTTPProtocolError("chunk framing line too long")
                    self._buffer = data[position:]
                    return b"".join(pieces)
                line = data[position:end].rstrip(b"\r")
                position = end + 1
                self._line(line)
        if position < size:
            self._keep_alive = False  # bytes after the response's end: do not trust this connection again
        return b"".join(pieces) if len(pieces) != 1 else pieces[0]

    def _line(self, line: bytes) -> None:
        state = self._state
        if state == _CHUNK_SIZE:
            text = line.split(b";", 1)[0].strip()
            try:
                self._left = int(text, 16)
            except ValueError:
                raise HTTPProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if self._left < 0:
                raise HTTPProtocolError(f"bad chunk size line {line[:40]!r}")
            self._state = _CHUNK_DATA if self._left else _TRAILER
        elif state == _CHUNK_END:
            if line:
                raise HTTPProtocolError("chunk data longer than its declared size")
            self._state = _CHUNK_SIZE
        elif not line:  # the blank line that ends the trailers
            self._state = _DONE

    def _head(self, raw: bytes, sink: Sink, now_ns: int) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise HTTPProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise HTTPProtocolError(f"malformed header line {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if 100 <= status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        connection = headers.get("connection", "").lower()
        self._keep_alive = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        self.server_idle_timeout_s = _keep_alive_timeout_s(headers.get("keep-alive", ""))
        if status in (204, 304):
            self._state = _DONE
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise HTTPProtocolError(f"bad Content-Length {headers['content-length'][:40]!r}") from None
            self._state = _LENGTH if self._left > 0 else _DONE
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        sink.head(status, reason, headers, now_ns)

    def _finish(self, keep_alive: bool) -> None:
        self._state = _DONE
        done, self._sink, self._done = self._done, None, None
        if done is not None and not done.done():
            done.set_result(keep_alive and not self.closed)

    def _fail(self, exc: Exception) -> None:
        # The future is let go of as it is settled: the error's traceback holds this connection (the frames that
        # raised and awaited it), so a connection still holding the future makes a reference cycle. A pooled
        # connection is old, so only a collection of the oldest generation frees that cycle, which the replay's
        # collector runs rarely (agentx.replayer.collector): every failed request kept its connection, socket,
        # response and frames meanwhile (issue 16, item 8).
        self._state = _DONE
        done, self._sink, self._done = self._done, None, None
        if done is not None and not done.done():
            done.set_exception(exc)


def _keep_alive_timeout_s(value: str) -> float | None:
    """`timeout=N` of a `Keep-Alive` header (e.g. `timeout=5, max=100`), in seconds."""
    for part in value.split(","):
        name, _, number = part.strip().partition("=")
        if name.strip().lower() == "timeout":
            try:
                return float(number)
            except ValueError:
                return None
    return None


UNLIMITED_RESERVE: Final = 16384
"""Descriptors `reserve_descriptors` makes room for when the pool has no limit (the open-loop modes)."""


def reserve_descriptors(count: int) -> None:
    """Grow the process's descriptor table now to hold about `count` more, so connections opened mid-run never
    grow it. Linux grows the table by doubling, and in a process with threads each growth waits for an RCU grace
    period: 8 ms measured for the 256th socket, a stall that lands on due requests. The table never shrinks, so
    holding descriptor `n` for a moment is enough (capped by the soft `RLIMIT_NOFILE`)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError):  # not Unix: nothing to reserve against
        return
    highest = count + 64 if soft == resource.RLIM_INFINITY else min(count + 64, soft - 1)
    with contextlib.suppress(OSError), open(os.devnull, "rb") as null:
        if highest > null.fileno():
            os.dup2(null.fileno(), highest)
            os.close(highest)


class Pool:
    """Keep-alive connections to one endpoint, at most `limit` open (0: no limit); the most recently used
    goes first. Creating one reserves descriptors for its connections (`reserve_descriptors`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        limit: int,
        connect_timeout_s: float | None,
        keepalive_timeout_s: float,
        spare: int = SPARE_CONNECTIONS,
    ) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.spare = spare
        self._idle: list[Connection] = []
        self._open = 0
        self._opening = 0
        self._spares: set[asyncio.Task[None]] = set()
        self._server_idle_timeout_s: float | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        reserve_descriptors(limit + spare if limit else UNLIMITED_RESERVE)

    @property
    def open_connections(self) -> int:
        return self._open

    async def acquire(self, *, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection ready for a request, and whether it was waiting in the pool (kept alive after a
        response, or opened ahead as a spare): the server may have closed such a connection since. `fresh`:
        a new connection, whatever is idle."""
        self._top_up()
        while True:
            oldest_ns = time.perf_counter_ns() - int(self._idle_limit_s() * 1e9)
            while self._idle and not fresh:
                connection = self._idle.pop()
                if not connection.closed and connection.idle_since_ns >= oldest_ns:
                    return connection, True
                self._drop(connection)
            if fresh and self._idle and self.limit and self._open >= self.limit:
                self._drop(self._idle.pop(0))  # room for the new connection: the longest idle one goes
            if not self.limit or self._open < self.limit:
                self._open += 1
                try:
                    return await self._connect(), False
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # the slot this waiter was given goes to the next one
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _idle_limit_s(self) -> float:
        """How long a connection may sit idle: ours, or less if the server announced less (with a margin, so
        that a connection is not reused just as the server closes it)."""
        announced = self._server_idle_timeout_s
        if announced is None:
            return self.keepalive_timeout_s
        return min(self.keepalive_timeout_s, max(0.0, announced - SERVER_IDLE_MARGIN_S))

    def release(self, connection: Connection, reusable: bool) -> None:
        if connection.server_idle_timeout_s is not None:
            self._server_idle_timeout_s = connection.server_idle_timeout_s
        if reusable and not connection.closed:
            connection.idle_since_ns = time.perf_counter_ns()
            self._idle.append(connection)
        else:
            self._drop(connection)
        self._wake()

    def close(self) -> None:
        for task in self._spares:
            task.cancel()
        for connection in self._idle:
            connection.abort()
        self._open -= len(self._idle)
        self._idle.clear()

    def _top_up(self) -> None:
        """Open connections in the background until `spare` are idle or opening: a burst of requests then
        finds them ready instead of paying for a connect each (within the limit)."""
        missing = self.spare - len(self._idle) - self._opening
        while missing > 0 and (not self.limit or self._open < self.limit):
            missing -= 1
            self._open += 1
            self._opening += 1
            task = asyncio.ensure_future(self._open_spare())
            self._spares.add(task)
            task.add_done_callback(self._spares.discard)

    async def _open_spare(self) -> None:
        try:
            connection = await self._connect()
        except (OSError, TimeoutError):
            # A request that needs the connection will open one and report the failure; a request waiting for a
            # slot must learn that one came free, or it waits forever for a server that is gone.
            self._open -= 1
            self._wake()
            return
        finally:
            self._opening -= 1
        connection.idle_since_ns = time.perf_counter_ns()
        self._idle.insert(0, connection)  # under the recently used ones: those are reused first
        self._wake()

    async def _connect(self) -> Connection:
        endpoint = self.endpoint
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, protocol = await loop.create_connection(
                Connection,
                endpoint.host,
                endpoint.port,
                ssl=endpoint.ssl,
                server_hostname=endpoint.host if endpoint.ssl is not None else None,
            )
        return protocol

    def _drop(self, connection: Connection) -> None:
        connection.abort()
        self._open -= 1

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
