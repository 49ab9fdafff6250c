"""The keep-alive connection pool of `http1`: at most `limit` connections to one endpoint (directly, or through
its proxy: agentx.replayer.http.proxy), spares opened ahead of need, idle connections dropped before the server
would close them, and the process's descriptor table grown before a run so that connections opened mid-run never
stall it. Every call to the server, streamed or not, takes its connection from here
(`agentx.replayer.http.streaming`, `agentx.replayer.http.calls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from agentx.replayer.http.http1 import ConnectionClosedError, Endpoint, HttpConnection, Payload, Sink
from agentx.replayer.http.proxy import ProxyError, tunnel

SPARE_CONNECTIONS: Final = 16
"""Idle connections the pool keeps ready beyond those in use, so a burst of arrivals does not wait on connects."""
SERVER_IDLE_MARGIN_S: Final = 1.0
"""A connection idle within this long of the server's announced idle timeout is not reused."""
UNLIMITED_RESERVE: Final = 16384
"""Descriptors `reserve_descriptors` makes room for when the pool has no limit (the open-loop modes)."""


def reserve_descriptors(count: int) -> None:
    """Grow the process's descriptor table now to hold about `count` more, so connections opened mid-run never
    grow it. Linux grows the table by doubling, and in a process with threads each growth waits for an RCU grace
    period: 8 ms measured for the 256th socket, a stall that lands on due requests. The table never shrinks, so
    holding descriptor `n` for a moment is enough (capped by the soft `RLIMIT_NOFILE`)."""
    try:
        import fcntl
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError):  # not Unix: nothing to reserve against
        return
    highest = count + 64 if soft == resource.RLIM_INFINITY else min(count + 64, soft - 1)
    with contextlib.suppress(OSError), open(os.devnull, "rb") as null:
        if highest > null.fileno():
            # The lowest free descriptor from `highest` up, never one in use: dup2 onto `highest` would close
            # whatever another thread of an embedding program holds there.
            os.close(fcntl.fcntl(null.fileno(), fcntl.F_DUPFD, highest))


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
        self._idle: list[HttpConnection] = []
        self._open = 0
        self._opening = 0
        self._spares: set[asyncio.Task[None]] = set()
        self._server_idle_timeout_s: float | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        reserve_descriptors(limit + spare if limit else UNLIMITED_RESERVE)

    @property
    def open_connections(self) -> int:
        return self._open

    async def acquire(self, *, fresh: bool = False) -> tuple[HttpConnection, bool]:
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

    def release(self, connection: HttpConnection, reusable: bool) -> None:
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

    async def _connect(self) -> HttpConnection:
        endpoint = self.endpoint
        proxy = endpoint.proxy
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            if proxy is None:
                _, protocol = await loop.create_connection(
                    HttpConnection,
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl,
                    server_hostname=endpoint.host if endpoint.ssl is not None else None,
                )
            elif endpoint.ssl is None:
                try:
                    _, protocol = await loop.create_connection(HttpConnection, proxy.host, proxy.port)
                except OSError as exc:
                    raise ProxyError(f"the proxy {proxy.shown} cannot be reached: {exc.strerror or exc}") from None
            else:
                protocol = await tunnel(proxy, endpoint.host, endpoint.port, endpoint.ssl)
        return protocol

    def _drop(self, connection: HttpConnection) -> None:
        connection.abort()
        self._open -= 1

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


async def send(
    pool: Pool,
    payload: Payload,
    sink: Sink,
    *,
    sending: Callable[[], None] | None = None,
    retrying: Callable[[], None] | None = None,
) -> None:
    """Send the request `payload` on a connection of `pool` and wait for the whole response, fed to `sink`. A
    connection that waited in the pool and that the server had closed before answering gets the request again, once,
    on a new connection (`retrying()` says so first). `sending()` is called as the bytes are handed to the socket.
    Raises what the connection raised (OSError, TimeoutError, HTTPProtocolError, the sink's own error)."""
    for attempt in range(2):
        connection, reused = await pool.acquire(fresh=attempt > 0)
        reusable = False
        try:
            if sending is not None:
                sending()
            reusable = await connection.send(payload, sink)
        except ConnectionClosedError as exc:
            if reused and exc.before_response and attempt == 0:
                if retrying is not None:
                    retrying()
                continue
            raise
        finally:
            pool.release(connection, reusable)
        return
