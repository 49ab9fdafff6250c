"""A minimal closed-loop streaming load client, much cheaper per chunk than the server it loads.

Each of `--streams` keep-alive connections (raw uvloop protocols, no HTTP library) sends a pre-built
`POST /v1/completions` (`stream: true`, `ignore_eos: true`), parses the HTTP/1.1 response just enough to
count SSE `data:` events and find its end, then sends the next request on the same connection at once.
The first request of connection i asks for `1 + i * max_tokens // streams` tokens, so that the streams
finish at spread-out times instead of all in the same engine step.

Run it as its own process (bench/sim_throughput.py does): it prints `start` when the warm-up ends, then
one JSON line of figures for the measurement window, and exits (with `--hold S`, once its standard input
ends, so that the caller can read the server's state under load first). Error responses, lost
connections and failed connects are counted (`errors`), not raised.

Usage: .venv/bin/python bench/loadgen.py --port 8000 --streams 1000 [--warmup 3] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import random
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, cast

import msgspec

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _LENGTH_BODY = range(5)
_DATA = b"data:"
_DONE = b"[DONE]"
_ERROR_PAUSE_S = 0.01
"""Pause before re-sending after an error response, so that a failing server is not hammered in a hot loop."""


class Counters:
    """Live totals, shared by every connection (one event loop: no locks)."""

    def __init__(self) -> None:
        self.chunks = 0
        """SSE `data:` events other than `[DONE]`."""
        self.requests = 0
        """Responses completed (200, stream ended)."""
        self.errors = 0
        """Non-200 responses, lost connections and failed connects."""
        self.bytes = 0
        self.measuring = False
        self.gaps: list[float] = []
        """Seconds between consecutive reads that carried `data:` events within one response (window only)."""
        self.ttfts: list[float] = []
        """Seconds from sending a request to its first `data:` event (window only)."""


def build_request(host: str, port: int, model: str, prompt: list[int], max_tokens: int) -> bytes:
    body = msgspec.json.encode(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    )
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class Stream(asyncio.Protocol):
    """One keep-alive connection running requests back to back."""

    def __init__(self, counters: Counters, request: bytes, first_request: bytes, lost: asyncio.Future[None]) -> None:
        self.counters = counters
        self.request = request
        self.first_request = first_request
        self.lost = lost
        self.transport: asyncio.Transport | None = None
        self.state = _HEAD
        self.rest = b""
        """Unparsed bytes: a head or a chunk-size line split across reads."""
        self.tail = b""
        """The last bytes of this response's body, to find a `data:` split across reads and the final `[DONE]`."""
        self.need = 0
        """Bytes left in the current chunk (payload and CRLF) or Content-Length body."""
        self.ok = False
        self.keep_alive = True
        self.sent_at = 0.0
        self.last_at = 0.0
        """When the previous read with `data:` events of this response arrived (0: none yet)."""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.send(self.first_request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.state != _HEAD or exc is not None:
            self.counters.errors += 1
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        counters = self.counters
        counters.bytes += len(data)
        if self.state == _CHUNK_SIZE and not self.rest:
            # Fast path, the usual read: exactly one whole HTTP chunk holding whole SSE events.
            eol = data.find(b"\r\n", 0, 10)
            if eol > 0 and data.startswith(_DATA, eol + 2) and data.endswith(b"\n\n\r\n"):
                try:
                    size = int(data[:eol], 16)
                except ValueError:  # a chunk extension: the slow path parses it
                    size = -1
                if size == len(data) - eol - 4:
                    counters.chunks += data.count(_DATA, eol + 2)
                    self.tail = data[-18:-2]
                    self.received(time.perf_counter())
                    return
        if self.rest:
            data = self.rest + data
            self.rest = b""
        chunks_before = counters.chunks
        pos, end = 0, len(data)
        while pos < end:
            state = self.state
            if state == _CHUNK_DATA:
                stop = min(end, pos + self.need)
                payload_stop = min(stop, pos + self.need - 2)  # the chunk's CRLF is not body
                if payload_stop > pos:
                    self.body(data, pos, payload_stop)
                self.need -= stop - pos
                pos = stop
                if not self.need:
                    self.state = _CHUNK_SIZE
            elif state == _CHUNK_SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.rest = data[pos:]
                    break
                size = int(data[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size:
                    self.need = size + 2
                    self.state = _CHUNK_DATA
                else:
                    self.state = _TRAILER
            elif state == _TRAILER:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.rest = data[pos:]
                    break
                empty = eol == pos
                pos = eol + 2
                if empty:  # the blank line after the last chunk (and any trailers)
                    self.finish()
            elif state == _LENGTH_BODY:
                stop = min(end, pos + self.need)
                self.need -= stop - pos
                pos = stop
                if not self.need:
                    self.finish()
            else:
                pos = self.head(data, pos)
                if pos < 0:
                    break
        if counters.chunks != chunks_before:
            self.received(time.perf_counter())

    def received(self, now: float) -> None:
        """Chunks arrived at `now`: record the gap since the previous ones (or the time to the first)."""
        counters = self.counters
        if counters.measuring:
            if self.last_at:
                counters.gaps.append(now - self.last_at)
            else:
                counters.ttfts.append(now - self.sent_at)
        if self.state != _HEAD:  # else the response ended in this read and the next one is already sent
            self.last_at = now

    # parsing

    def head(self, data: bytes, pos: int) -> int:
        """Parse the status line and headers; the position after them, or -1 if they are not all here yet."""
        stop = data.find(b"\r\n\r\n", pos)
        if stop < 0:
            self.rest = data[pos:]
            return -1
        lines = data[pos:stop].lower().split(b"\r\n")
        self.ok = lines[0][9:12] == b"200"
        self.keep_alive = True
        chunked, length = False, 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            value = value.strip()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection":
                self.keep_alive = b"close" not in value
        self.tail = b""
        self.last_at = 0.0
        if chunked:
            self.state = _CHUNK_SIZE
        elif length:
            self.state = _LENGTH_BODY
            self.need = length
        else:
            self.finish()
        return stop + 4

    def body(self, data: bytes, start: int, stop: int) -> None:
        """Count the `data:` events in `data[start:stop]` (response body, chunk framing removed)."""
        tail = self.tail
        count = data.count(_DATA, start, stop)
        if tail and data[start : start + 1] != b"d":  # a `data:` split across reads or chunks
            count += (tail[-4:] + data[start : start + 4]).count(_DATA)
        self.counters.chunks += count
        self.tail = (tail + data[start:stop])[-16:] if stop - start < 16 else data[stop - 16 : stop]

    def finish(self) -> None:
        """The response has ended: count it, then send the next request (or close)."""
        counters = self.counters
        self.state = _HEAD
        self.last_at = 0.0
        if _DONE in self.tail:
            counters.chunks -= 1  # `data: [DONE]` is not a chunk
        if self.ok:
            counters.requests += 1
        else:
            counters.errors += 1
        if not self.keep_alive:
            if self.transport is not None:
                self.transport.close()
        elif self.ok:
            self.send(self.request)
        else:
            asyncio.get_running_loop().call_later(_ERROR_PAUSE_S, self.send, self.request)

    def send(self, request: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.sent_at = time.perf_counter()
        self.transport.write(request)


# ---------------------------------------------------------------------------------------------
# the run


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    last = len(values) - 1
    return {
        "p50": values[last // 2],
        "p90": values[last * 9 // 10],
        "p99": values[last * 99 // 100],
        "max": values[last],
        "mean": sum(values) / len(values),
    }


class LoadGen:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counters = Counters()
        self.stopping = False
        self.connected = 0
        self.streams: set[Stream] = set()
        rng = random.Random(args.seed)
        self.requests: list[tuple[bytes, bytes]] = []
        for index in range(args.streams):
            prompt = [rng.randrange(1, args.vocab) for _ in range(args.prompt_tokens)]
            first_tokens = 1 + index * args.max_tokens // args.streams if args.stagger else args.max_tokens
            self.requests.append(
                (
                    build_request(args.host, args.port, args.model, prompt, args.max_tokens),
                    build_request(args.host, args.port, args.model, prompt, first_tokens),
                )
            )

    async def stream(self, index: int, connect_slots: asyncio.Semaphore) -> None:
        """Keep one connection open (reconnecting if the server closes it) until the run stops."""
        loop = asyncio.get_running_loop()
        request, first_request = self.requests[index]
        while not self.stopping:
            lost: asyncio.Future[None] = loop.create_future()
            try:
                async with connect_slots:
                    transport, protocol = await loop.create_connection(
                        functools.partial(Stream, self.counters, request, first_request, lost),
                        self.args.host,
                        self.args.port,
                    )
            except OSError:
                self.counters.errors += 1
                await asyncio.sleep(0.05)
                continue
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connected += 1
            self.streams.add(protocol)
            first_request = request
            try:
                await lost
            finally:
                self.connected -= 1
                self.streams.discard(protocol)

    async def run(self) -> dict[str, Any]:
        args = self.args
        counters = self.counters
        connect_slots = asyncio.Semaphore(args.connect_concurrency)
        started = time.perf_counter()
        tasks = [asyncio.create_task(self.stream(index, connect_slots)) for index in range(args.streams)]
        while self.connected < args.streams and time.perf_counter() - started < args.connect_timeout:
            await asyncio.sleep(0.05)
        connect_s = time.perf_counter() - started
        gc.collect()
        gc.freeze()
        await asyncio.sleep(args.warmup)

        chunks0, requests0, errors0, bytes0 = counters.chunks, counters.requests, counters.errors, counters.bytes
        cpu0, t0 = time.process_time(), time.perf_counter()
        counters.measuring = True
        print("start", flush=True)
        await asyncio.sleep(args.duration)
        counters.measuring = False
        cpu1, t1 = time.process_time(), time.perf_counter()
        chunks, requests = counters.chunks - chunks0, counters.requests - requests0
        errors, received = counters.errors - errors0, counters.bytes - bytes0
        connected = self.connected

        window = t1 - t0
        result = {
            "streams": args.streams,
            "connected": connected,
            "connect_s": connect_s,
            "window_s": window,
            "chunks": chunks,
            "requests": requests,
            "errors": errors,
            "chunks_per_s": chunks / window,
            "requests_per_s": requests / window,
            "mb_per_s": received / window / 1e6,
            "cpu_s": cpu1 - cpu0,
            "cpu_percent": 100 * (cpu1 - cpu0) / window,
            "gap_s": _percentiles(counters.gaps),
            "ttft_s": _percentiles(counters.ttfts),
        }
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
        sys.stdout.flush()
        if args.hold:
            # Keep the load on until the caller has read the server's state (closing thousands of
            # connections at once would show up there as a late step).
            await self.stdin_closed(args.hold)
        self.stopping = True
        for stream in list(self.streams):
            if stream.transport is not None:
                stream.transport.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return result

    async def stdin_closed(self, timeout: float) -> None:
        """Wait until standard input reaches its end (or `timeout` seconds)."""
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not os.read(0, 4096) and not closed.done():
                closed.set_result(None)

        loop.add_reader(0, readable)
        try:
            await asyncio.wait_for(closed, timeout)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--streams", type=int, default=256, help="concurrent connections, one request in flight each")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after all connections are up")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the measurement window")
    parser.add_argument("--model", default="agentx-sim")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--no-stagger", dest="stagger", action="store_false", help="every request asks max-tokens")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpu", type=int, help="pin this process to this core")
    parser.add_argument("--connect-concurrency", type=int, default=64, help="connects in flight at once")
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    parser.add_argument(
        "--hold", type=float, default=0.0, help="after the figures, keep the load on until stdin ends (at most S s)"
    )
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    runner(LoadGen(args).run())


if __name__ == "__main__":
    main()
