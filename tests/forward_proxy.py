"""A forward HTTP proxy for tests, on a free loopback port in a thread of its own: plain-http requests in absolute form
(each relayed on a fresh upstream connection, its answer relayed as it comes) and `CONNECT` tunnels. Every host
it is asked for is reached at 127.0.0.1, so a test can name a server no resolver knows and still talk to loopback
only. It notes what it was asked (`Asked`), and with `credentials` answers 407 to a request without them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from types import TracebackType
from urllib.parse import urlsplit

import msgspec


class Asked(msgspec.Struct, frozen=True):
    method: str
    target: str
    """The request target as the proxy got it: an absolute URL, or `host:port` for CONNECT."""
    authorization: str | None
    """The `Proxy-Authorization` value, if any."""


class ForwardProxy:
    """Use as `with ForwardProxy() as proxy:`; `proxy.url` is `http://127.0.0.1:PORT`."""

    def __init__(self, credentials: str | None = None) -> None:
        """`credentials`: `user:password` the proxy wants (407 Proxy Authentication Required otherwise)."""
        self.wanted = None if credentials is None else "Basic " + base64.b64encode(credentials.encode()).decode()
        self.asked: list[Asked] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> ForwardProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._client, "127.0.0.1", 0), self._loop)
        self._server = future.result(timeout=10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Stopped by cancellation, it ends quietly: asyncio's stream callback would log a cancelled task's error.
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                authorization = headers.get("proxy-authorization")
                self.asked.append(Asked(method, target, authorization))
                if self.wanted is not None and authorization != self.wanted:
                    writer.write(
                        b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n"
                        b"Content-Length: 0\r\n\r\n"
                    )
                    await writer.drain()
                    if method == "CONNECT":
                        return
                    await reader.readexactly(int(headers.get("content-length", "0")))
                    continue
                if method == "CONNECT":
                    await self._tunnel(target, reader, writer)
                    return
                await self._forward(method, target, lines[1:], headers, reader, writer)
        finally:
            writer.close()

    async def _tunnel(self, authority: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = int(authority.rpartition(":")[2])
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)

    async def _forward(
        self,
        method: str,
        target: str,
        lines: list[str],
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        parts = urlsplit(target)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        kept = [
            line
            for line in lines
            if line and line.partition(":")[0].strip().lower() not in ("connection", "proxy-authorization")
        ]
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        upstream_head = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""])
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", parts.port or 80)
        up_writer.write(upstream_head.encode("latin-1") + body)
        await up_writer.drain()
        await _pipe(up_reader, writer, close=False)  # the answer's own framing tells the client where it ends
        up_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, close: bool = True) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    if close:
        writer.close()
