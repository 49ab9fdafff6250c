"""A lean HTTP/1.1 client: one keep-alive connection per `HttpConnection`, pooled by `agentx.replayer.http.pool`.

Every call to the server goes through it: the replay's streamed requests, and the probes, JSON calls and `/metrics`
scrapes (`agentx.replayer.http.calls`), so the replayer needs no other HTTP library. Why not aiohttp (the simulator
still serves with it): per request in flight aiohttp keeps ~250 objects the garbage collector must walk and wakes a
task for every read; at 1,000 requests/s the collector's pauses and the per-request cost alone break the
dispatch-lag target (bench/README.md, Targets), and importing it costs ~120 ms and ~13 MB before a replay's first
request. Here a connection is an `asyncio.Protocol` that hands each read's body bytes to the caller's `Sink` inside
`data_received`, stamped with the read's arrival time, with no task switch between the socket and the parser.

It speaks exactly what OpenAI-compatible servers answer: a status line and headers, then a body framed by
`Transfer-Encoding: chunked`, `Content-Length`, or the connection's close. A streamed response's `Sink` parses
as the bytes come; `WholeBody` gathers a plain one (a model list, `/metrics`). A connection goes back to the
pool only after a complete response that did not ask to close; a request that finds its reused connection
closed by the server before a single response byte is sent again once on a fresh connection (servers such as
llama.cpp's close kept-alive connections at will).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from agentx.replayer.http.proxy import Proxy

HEAD_MAX_BYTES: Final = 64 * 1024
"""A response head larger than this is a protocol error (no OpenAI-compatible server sends one)."""


class Sink(Protocol):
    """Receives one response as it arrives. `data` may raise to abort the exchange (the connection is then
    closed, never reused). `whole` is read once the body's framing has ended: False when what the body carried says
    it was cut short (an event stream without its end), so the rest may still come on the connection, which is
    then not reused."""

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None: ...

    def data(self, chunk: bytes, now_ns: int) -> None: ...

    @property
    def whole(self) -> bool: ...


class HTTPProtocolError(Exception):
    """The server's bytes are not a well-formed HTTP/1.1 response."""


class ConnectionClosedError(ConnectionError):
    """The connection ended before the response was complete."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class Endpoint:
    """Where requests go: scheme, host, port, path prefix, TLS context, the `Host` header, and the proxy they go
    through (agentx.replayer.http.proxy), if any."""

    __slots__ = ("host", "host_header", "port", "prefix", "proxy", "ssl", "target_root")

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None = None, proxy: Proxy | None = None) -> None:
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
        self.proxy = proxy
        # A proxy is asked for a plain-http server's resource by its whole URL (RFC 9112 §3.2.2, absolute form); a
        # CONNECT tunnel carries the requests as the server itself takes them.
        self.target_root = f"http://{self.host_header}" if proxy is not None and self.ssl is None else ""
        """What goes before a request's path (the prefix's included) in its request line."""


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


class Pieces(NamedTuple):
    """A body in pieces, written one after the other (a vectored write), never joined into one buffer (a long
    prompt's text, kept in pieces: agentx.replayer.prompts.spliced); and its length in bytes."""

    parts: Sequence[bytes | memoryview]
    length: int


Body = bytes | Pieces
"""A request's body."""
Payload = tuple[bytes, Body]
"""One request's bytes in two parts: its head and its body (written one after the other, so a large body, a long
prompt, is never copied into a second buffer while it is in flight)."""


def body_length(body: Body) -> int:
    return len(body) if isinstance(body, bytes) else body.length


def encode_request(method: str, target: str, head: bytes, body: Body | None = None) -> Payload:
    """One request: the request line, `head` (encoded header lines, `Host` among them), `Content-Length` when there
    is a body (a GET has none) and the blank line; then the body."""
    length = b"Content-Length: %d\r\n" % body_length(body) if body is not None else b""
    return b"".join((b"%s %s HTTP/1.1\r\n" % (method.encode(), target.encode()), head, length, b"\r\n")), body or b""


class WholeBody:
    """A `Sink` that keeps a whole response: status, reason, headers and the body, decoded from its framing
    (`Content-Length`, chunked, or up to the connection's close). A body longer than `max_bytes` aborts the
    exchange with an HTTPProtocolError."""

    __slots__ = ("_parts", "_size", "headers", "max_bytes", "reason", "status")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        """Names in lower case; repeated headers joined with ", "."""
        self._parts: list[bytes] = []
        self._size = 0

    def head(self, status: int, reason: str, headers: dict[str, str], now_ns: int) -> None:
        self.status, self.reason, self.headers = status, reason, headers

    def data(self, chunk: bytes, now_ns: int) -> None:
        self._size += len(chunk)
        if self._size > self.max_bytes:
            raise HTTPProtocolError(f"the response body is longer than {self.max_bytes} bytes")
        self._parts.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    @property
    def whole(self) -> bool:
        return True


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class HttpConnection(asyncio.Protocol):
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

    def send(self, payload: Payload, sink: Sink) -> asyncio.Future[bool]:
        """Write one request; the future gives whether the connection may be reused once it completes."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.transport is None or self.closed:
            done.set_exception(ConnectionClosedError("the connection closed before the request", before_response=True))
            return done
        self._sink, self._done = sink, done
        self._state, self._buffer, self._received, self._keep_alive = _HEAD, b"", 0, True
        self.requests += 1
        head, body = payload
        self.transport.write(head)  # asyncio's TCP transports set TCP_NODELAY: no wait between the two
        if isinstance(body, bytes):
            if body:
                self.transport.write(body)
        else:
            self.transport.writelines(body.parts)  # uvloop writes the pieces as they are (a vectored write)
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
            if not data.strip(b"\r\n"):
                return  # blank lines after a response: a server's stray CRLF, which a client ignores (RFC 9112 §2.2)
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
            self._finish(self._keep_alive and sink.whole)

    def _parse(self, data: bytes, sink: Sink, now_ns: int) -> bytes:
        """Advance the response state machine over `data`; returns the body bytes it carried."""
        state = self._state
        if state == _LENGTH and len(data) < self._left and not self._buffer:
            self._left -= len(data)  # the common case: one read, part of a known-length body
            return data
        if state == _CHUNK_SIZE and not self._buffer:
            # The common case of a stream: one read, one whole chunk (its size line, its data, its CRLF).
            eol = data.find(b"\r\n", 0, 18)
            if eol > 0:
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = 0  # an extension, or a malformed line: the general path below decides
                if size > 0 and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
                    return data[eol + 2 : eol + 2 + size]
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        pieces: list[bytes] = []
        position = 0
        size = len(data)
        while position < size and self._state != _DONE:
            state = self._state
            if state == _HEAD:
                while data.startswith(b"\r\n", position) or data.startswith(b"\n", position):
                    position += 1 if data[position] == 0x0A else 2  # blank lines before the status line
                if position == size:
                    break
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
        # collector runs rarely (agentx.replayer.schedule.collector): every failed request kept its connection, socket,
        # response and frames meanwhile: the replay's memory grew by megabytes a second under a fault mix.
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
