"""Replay overhead benchmark: what `agentx replay` costs and how far its timings are off (targets: bench/README.md).

A minimal mock completions server (kept in this file: raw asyncio protocol on uvloop, msgspec) runs in its
own process pinned to core 0 at a higher priority; it injects a TTFT and an ITL per stream (absolute
`call_at` timers: first chunk at receive + TTFT, then one token per chunk every ITL), ends with a usage
chunk and `data: [DONE]` on a keep-alive connection, and logs when it meant to send and when it sent each
request's first and last chunk (`GET /log`). The client, `run_replay` over a synthetic trace of
one-request sessions (closed loop, `delay_scale=0`, the setup's `ramp_s`), runs in another process pinned
to core 1, under asyncio's default loop and under uvloop (as the CLI when installed), and measures itself
over a steady window (CPU from `getrusage`, RSS, chunk rate, dispatch lag = sent − scheduled).

Client error = client-measured − injected; the server's own emission lag (sent − planned) is printed
alongside, so a late server is not taken for a slow client. Setups A, B and the 1-stream idle cost; setup C
(open loop: `mode="rate"`, Poisson arrivals at 200/s for 2,000 requests, and 1,000/s for 5,000, ~1,000-token
prompts, 32 output tokens) measures dispatch lag client-side (sent − scheduled) and as the mock sees it
(receive − scheduled, each receive matched to its record by the mock's request number), with its split
(queued − scheduled, sent − queued) and the client's GC pauses. AIPerf and inference-perf, when installed in
their own venvs (/tmp/peers, /tmp/peers-ip), run the same load as peers. Prints figures; never fails on a
number. See bench/README.md.

`--cli-peak` instead runs setup A through the command line, `agentx replay` of a 4,096-session trace file against the
mock until 3,000 requests (`--num-requests`), and prints its peak RSS through the run (the process's `VmHWM` when the
last request ended) beside the 150 MB target, and its whole life's peak, the end-of-run summary included.

Usage: .venv/bin/python bench/replay_overhead.py [--setups A,B,idle,C] [--repeat 3] [--duration 20]
       [--loops default,uvloop] [--ramp-s S] [--no-peer] [--no-quiet-gc-column] [--c-prompt unique|shared]
       .venv/bin/python bench/replay_overhead.py --cli-peak [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec

from agentx.replayer.options.replay import ClosedLoad, RateLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.schedule.hooks import RunHooks
from agentx.trace.model import Agent, Request, Session, Trace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_throughput import HOST, _cpu_s, _free_port, _pin_and_raise, _priority, _rss_mb
from startup import measure, run_end_wall_ns

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODEL = "mock"
SERVER_CPU = 0
CLIENT_CPU = 1
SERVER_NICE = -10
WARMUP_S = 3.0
"""The steady window starts this long after the first request (ramp-up excluded)."""


@dataclass(frozen=True)
class Setup:
    name: str
    streams: int
    out_tokens: int
    ttft_s: float
    itl_s: float
    in_tokens: int = 16
    ramp_s: float = 0.0
    """`ReplayOptions.ramp_s`: lane i starts i/streams × ramp_s after the run start."""

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + (self.out_tokens - 1) * self.itl_s

    @property
    def ideal_rps(self) -> float:
        return self.streams / self.e2e_s


# Every request of a setup takes the same time, so a closed loop keeps its lanes' phases for ever: the ramp
# sets the steady state. Without one, B's 1,024 lanes send together once per E2E (~70 µs of client CPU
# each, ~70 ms in all) and their chunks land together every ITL, so the figures measure that burst.
# Spreading the starts over one E2E makes the steady state a closed loop's (sends evenly at the offered
# 400 req/s, chunk arrivals evenly over each ITL); a ramp of one ITL would spread the chunks but still put
# all 1,024 sends in a 40 ms window each cycle (`--ramp-s 0.04` shows it). A keeps no ramp, as its anchors.
SETUPS = {
    "A": Setup("A", 256, 256, 0.050, 0.010),
    "B": Setup("B", 1024, 64, 0.050, 0.040, ramp_s=0.050 + 63 * 0.040),
    "idle": Setup("idle", 1, 256, 0.050, 0.010),
}


# ---------------------------------------------------------------------------------------------
# the mock server (`--worker-server PORT TTFT_S ITL_S`)


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_DONE = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


class _MockRequest(msgspec.Struct):
    max_tokens: int = 16


def _frame(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Mock:
    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.requests = 0
        self.chunks = 0
        """Content chunks written: a peer's chunk rate is counted here (`GET /stats`), not in its own output."""
        self.log: list[tuple[int, int, int, int, int, int]] = []
        """Per finished request, perf_counter_ns: received, first planned, first sent, last planned, last sent; and
        its id (also sent as `usage.prompt_tokens`, so the client's record names it: `isl_server_tokens`)."""


class _Stream:
    __slots__ = ("first_plan", "first_sent", "left", "loop", "made", "mock", "recv_ns", "rid", "start", "transport")

    def __init__(self, mock: _Mock, transport: asyncio.Transport, rid: int, tokens: int) -> None:
        self.mock = mock
        self.transport = transport
        self.rid = rid
        self.left = tokens
        self.made = 0
        self.loop = asyncio.get_running_loop()
        self.recv_ns = time.perf_counter_ns()
        self.start = self.loop.time()
        self.first_plan = self.recv_ns + int(mock.ttft_s * 1e9)
        self.first_sent = 0
        self.loop.call_at(self.start + mock.ttft_s, self.tick)

    def tick(self) -> None:
        if self.transport.is_closing():
            return
        now = time.perf_counter_ns()
        self.made += 1
        self.mock.chunks += 1
        self.left -= 1
        last = self.left <= 0
        head = (
            b'{"id":"cmpl-%d","object":"text_completion","created":0,"model":"mock","choices":[{"index":0,' % self.rid
        )
        if last:
            finish = b'"finish_reason":"length"'
            usage = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
                self.rid,
                self.made,
                self.made + self.rid,
            )
            body = head + b'"text":" t","logprobs":null,%b}],"usage":null}' % finish
            tail = b'{"id":"cmpl-%d","object":"text_completion","created":0,"model":"mock","choices":[],"usage":%b}' % (
                self.rid,
                usage,
            )
            self.transport.write(_frame(body) + _frame(tail) + _DONE)
            plan_last = self.first_plan + int((self.made - 1) * self.mock.itl_s * 1e9)
            self.mock.log.append((self.recv_ns, self.first_plan, self.first_sent or now, plan_last, now, self.rid))
            return
        self.transport.write(_frame(head + b'"text":" t","logprobs":null,"finish_reason":null}],"usage":null}'))
        if self.made == 1:
            self.first_sent = now
        self.loop.call_at(self.start + self.mock.ttft_s + self.made * self.mock.itl_s, self.tick)


class _MockProtocol(asyncio.Protocol):
    def __init__(self, mock: _Mock) -> None:
        self.mock = mock
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            if head.startswith(b"post"):
                request = msgspec.json.decode(body, type=_MockRequest)
                self.mock.requests += 1
                self.transport.write(_SSE_HEAD)
                _Stream(self.mock, self.transport, self.mock.requests, request.max_tokens)
            elif head.startswith(b"get /stats"):
                self._json(b'{"requests":%d,"chunks":%d}' % (self.mock.requests, self.mock.chunks))
            elif head.startswith(b"get /log"):
                payload = msgspec.json.encode(self.mock.log)
                self.mock.log = []
                self._json(payload)
            else:
                self._json(_MODELS)

    def _json(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
            % (len(payload), payload)
        )


def _serve_mock(port: int, ttft_s: float, itl_s: float) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        mock = _Mock(ttft_s, itl_s)
        server = await loop.create_server(lambda: _MockProtocol(mock), HOST, port, backlog=4096)
        async with server:
            await server.serve_forever()

    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())


# ---------------------------------------------------------------------------------------------
# the client (`--worker-client JSON`): run_replay in this process, figures as JSON on stdout


def one_request_sessions(
    count: int, in_tokens: int, out_tokens: int, hash_ids: Callable[[int], tuple[int, ...]], block_size: int = 16
) -> Trace:
    """`count` sessions of one request each; session i's prompt has the blocks `hash_ids(i)`."""

    def request(i: int) -> Request:
        return Request(t=0.0, model=MODEL, in_tokens=in_tokens, out_tokens=out_tokens, hash_ids_added=hash_ids(i))

    sessions = [Session(session_id=f"s{i}", root=Agent(requests=[request(i)])) for i in range(count)]
    return Trace(sessions=sessions, block_size=block_size)


def _client(spec: dict[str, Any]) -> dict[str, Any]:
    imported_ns = time.perf_counter_ns()
    import pyarrow.compute as pc

    from agentx.records.record import read_records, run_info
    from agentx.replayer.run_replay import run_replay

    setup = Setup(**spec["setup"])
    duration_s: float = spec["duration_s"]
    warmup_s = _warmup_s(setup)
    server_pid: int = spec["server_pid"]
    trace = one_request_sessions(4096, setup.in_tokens, setup.out_tokens, lambda i: (i,))
    window: dict[str, float] = {}

    def snapshot(key: str) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        window[f"{key}_ns"] = time.perf_counter_ns()
        window[f"{key}_cpu"] = usage.ru_utime + usage.ru_stime
        window[f"{key}_server_cpu"] = _cpu_s(server_pid)

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        loop.call_later(warmup_s, snapshot, "a")
        loop.call_later(duration_s, snapshot, "b")
        options = ReplayOptions(
            server=Server(url=f"http://{HOST}:{spec['port']}", model=MODEL),
            out_dir=spec["out_dir"],
            load=ClosedLoad(concurrency=setup.streams, ramp_s=setup.ramp_s),
            scenario=Scenario(duration_s=duration_s, delay_scale=0.0),
            runtime=Runtime(grace_s=setup.e2e_s * 3 + 5, quiet_gc=True, fast_thread_switch=True),  # the CLI's
        )
        return await run_replay(trace, options, RunHooks(on_record=see_record))

    # Records are offsets from the run's perf_counter_ns origin. Each is handed to `on_record` a few µs after
    # its end_ns, so the origin is the least (now − end_ns) seen: this needs nothing of the engine's
    # internals (RunInfo.wall_epoch_ns is taken a variable while after the origin).
    origin = [2**63]

    def see_record(record: Any) -> None:
        origin[0] = min(origin[0], time.perf_counter_ns() - record.end_ns)

    if spec.get("uvloop"):
        import uvloop

        result = uvloop.run(main())
    else:
        result = asyncio.run(main())
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    table = read_records(result.records_path)
    if origin[0] < 2**63:
        base = origin[0]
    else:  # no record: map the run's wall-clock start back to perf_counter
        offset = min(time.time_ns() - time.perf_counter_ns() for _ in range(64))
        base = run_info(table).wall_epoch_ns - offset
    a = window["a_ns"] - base
    b = window["b_ns"] - base
    span_s = (b - a) / 1e9
    sent = table.column("sent_ns").to_numpy(zero_copy_only=False)
    end = table.column("end_ns").to_numpy(zero_copy_only=False)
    status = table.column("status").to_pylist()
    lanes = table.column("lane").to_pylist()
    by_lane: dict[int, list[tuple[int, int]]] = {}
    for i in range(len(sent)):
        by_lane.setdefault(lanes[i], []).append((int(sent[i]), int(end[i])))
    cycles: list[float] = []
    gaps: list[float] = []
    for plays in by_lane.values():
        plays.sort()
        for (s0, e0), (s1, _) in itertools.pairwise(plays):
            if a <= s0 and s1 <= b:
                cycles.append((s1 - s0) / 1e9)
                gaps.append((s1 - e0) / 1e9)
    chunks = pc.list_flatten(table.column("chunk_times_ns")).to_numpy(zero_copy_only=False)
    in_window = [i for i in range(len(sent)) if a <= sent[i] and end[i] <= b and status[i] == "ok"]
    done_in_window = int(((end >= a) & (end <= b)).sum())
    chunk_count = int(((chunks >= a) & (chunks <= b)).sum())

    ids = table.column("isl_server_tokens").to_pylist()
    firsts = table.column("first_token_ns").to_pylist()
    lasts = table.column("last_token_ns").to_pylist()

    def col(name: str) -> list[float]:
        values = table.column(name).to_pylist()
        return [float(values[i]) for i in in_window if values[i] is not None]

    cpu_s = window["b_cpu"] - window["a_cpu"]
    return {
        "requests": result.requests,
        "errors": result.errors,
        "rps": done_in_window / span_s,
        "rps_cycle": setup.streams / statistics.fmean(cycles) if cycles else None,
        "recycle_gap_s": gaps,
        "chunks_per_s": chunk_count / span_s,
        "cpu_percent": 100 * cpu_s / span_s,
        "cpu_us_per_chunk": 1e6 * cpu_s / chunk_count if chunk_count else None,
        "server_cpu_percent": 100 * (window["b_server_cpu"] - window["a_server_cpu"]) / span_s,
        "ttft_s": col("ttft_s"),
        "e2e_s": col("e2el_s"),
        "itl_s": col("tpot_s"),
        "dispatch_lag_s": col("dispatch_lag_s"),
        "rss_mb": rss_mb,
        "startup_s": (float(min(sent)) + base - spec["spawn_ns"]) / 1e9 if len(sent) else None,
        "import_s": (imported_ns - spec["spawn_ns"]) / 1e9,
        "origin_ns": base,
        "matched": [
            [ids[i], int(sent[i]) + base, int(firsts[i]) + base, int(lasts[i]) + base]
            for i in in_window
            if ids[i] is not None and firsts[i] is not None and lasts[i] is not None
        ],
        "window_ns": [a + base, b + base],
    }


# ---------------------------------------------------------------------------------------------
# setup C: open-loop Poisson arrivals (`--worker-open-client JSON`)


@dataclass(frozen=True)
class OpenSetup:
    name: str
    rate: float
    """Session arrivals per second (`ReplayOptions(mode="rate")`, burstiness 1: Poisson)."""
    requests: int
    in_tokens: int = 1000
    out_tokens: int = 32
    ttft_s: float = 0.050
    itl_s: float = 0.010

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + (self.out_tokens - 1) * self.itl_s


# Setup C (bench/README.md, Targets) fixes arrivals and lengths, not the server's timing: setup A's TTFT
# 50 ms / ITL 10 ms (E2E 360 ms, ~72 requests in flight at 200/s, ~360 at 1,000/s). The chunk rate (rate × 32)
# does not depend on them. C1000 is the second target: dispatch lag p99 < 1 ms at 1,000 requests/s.
OPEN_SETUPS = {"C200": OpenSetup("C200", 200.0, 2000), "C1000": OpenSetup("C1000", 1000.0, 5000)}
"""`--setups C` runs both."""
BLOCK_C = 16


def _open_client(spec: dict[str, Any]) -> dict[str, Any]:
    from agentx.records.record import read_records, run_info
    from agentx.replayer.run_replay import run_replay

    setup = OpenSetup(**spec["setup"])
    server_pid: int = spec["server_pid"]
    blocks = setup.in_tokens // BLOCK_C
    # `--c-prompt shared`: every request carries the same blocks (the block cache hits, as for a common prefix).
    shared = tuple(range(blocks)) if spec.get("prompt") == "shared" else ()
    # By default distinct hash ids per session (no prefix sharing; the mock ignores the prompt anyway): 62 blocks
    # of 16 plus 8 filler tokens = 1,000 prompt tokens, ~6 KB of JSON per body.
    trace = one_request_sessions(
        setup.requests,
        setup.in_tokens,
        setup.out_tokens,
        lambda i: shared if shared else tuple(range(i * blocks, (i + 1) * blocks)),
        block_size=BLOCK_C,
    )
    origin = [2**63]

    def see_record(record: Any) -> None:
        origin[0] = min(origin[0], time.perf_counter_ns() - record.end_ns)

    async def main() -> Any:
        options = ReplayOptions(
            server=Server(url=f"http://{HOST}:{spec['port']}", model=MODEL),
            out_dir=spec["out_dir"],
            load=RateLoad(rate=setup.rate, burstiness=1.0),
            scenario=Scenario(seed=spec["seed"], sessions=setup.requests),
            runtime=Runtime(grace_s=setup.e2e_s * 3 + 5, quiet_gc=spec.get("quiet_gc", True), fast_thread_switch=True),
        )
        return await run_replay(trace, options, RunHooks(on_record=see_record))

    # The collector's pauses, to tell them from other stalls (only watched: the bench changes nothing here).
    pauses: list[tuple[int, int, int]] = []
    gc_start = [0]

    def watch_gc(phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            gc_start[0] = now
        else:
            pauses.append((gc_start[0], now, info["generation"]))

    gc.callbacks.append(watch_gc)
    usage_a = resource.getrusage(resource.RUSAGE_SELF)
    cpu_a, server_a, at_a = usage_a.ru_utime + usage_a.ru_stime, _cpu_s(server_pid), time.perf_counter_ns()
    if spec.get("uvloop"):
        import uvloop

        result = uvloop.run(main())
    else:
        result = asyncio.run(main())
    gc.callbacks.remove(watch_gc)
    usage_b = resource.getrusage(resource.RUSAGE_SELF)
    cpu_b, server_b, at_b = usage_b.ru_utime + usage_b.ru_stime, _cpu_s(server_pid), time.perf_counter_ns()
    table = read_records(result.records_path)
    if origin[0] < 2**63:
        base = origin[0]
    else:
        offset = min(time.time_ns() - time.perf_counter_ns() for _ in range(64))
        base = run_info(table).wall_epoch_ns - offset

    def ints(name: str) -> list[int | None]:
        return cast(list[int | None], table.column(name).to_pylist())

    span_s = (at_b - at_a) / 1e9
    return {
        "requests": result.requests,
        "errors": result.errors,
        "scheduled_ns": [None if v is None else v + base for v in ints("scheduled_ns")],
        "queued_ns": [None if v is None else v + base for v in ints("queued_ns")],
        "sent_ns": [None if v is None else v + base for v in ints("sent_ns")],
        "ids": ints("isl_server_tokens"),
        "ttft_s": [v for v in table.column("ttft_s").to_pylist() if v is not None],
        "e2e_s": [v for v in table.column("e2el_s").to_pylist() if v is not None],
        "loop_lag_s": list(result.loop_lag_s),
        "gc_pauses_ns": pauses,
        # The whole run (set-up, schedule, drain): a share of the schedule's length, not a steady window.
        "cpu_percent": 100 * (cpu_b - cpu_a) / span_s,
        "server_cpu_percent": 100 * (server_b - server_a) / span_s,
        "run_s": span_s,
    }


def _open_run(
    setup: OpenSetup, out: Path, use_uvloop: bool, seed: int, quiet_gc: bool = True, prompt: str = "unique"
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--worker-server", str(port), repr(setup.ttft_s), repr(setup.itl_s)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
    )
    try:
        _wait_ready(port, server)
        spec = {
            "setup": setup.__dict__,
            "port": port,
            "seed": seed,
            "server_pid": server.pid,
            "out_dir": str(out),
            "uvloop": use_uvloop,
            "quiet_gc": quiet_gc,
            "prompt": prompt,
            "figures_path": str(out / "figures.json"),
        }
        client = subprocess.run(
            [sys.executable, __file__, "--worker-open-client", json.dumps(spec)],
            cwd=ROOT,
            capture_output=True,
            preexec_fn=_pin_and_raise(CLIENT_CPU, 0),
            check=False,
        )
        if client.returncode != 0:
            raise RuntimeError(f"client failed: {client.stderr.decode(errors='replace')[-2000:]}")
        figures: dict[str, Any] = json.loads((out / "figures.json").read_text())
        with urllib.request.urlopen(f"http://{HOST}:{port}/log", timeout=10) as response:
            log: list[list[int]] = json.loads(response.read())
        figures["server_priority"] = _priority(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
    # The mock numbers requests in the order it receives them and returns the number as `usage.prompt_tokens`,
    # which the record keeps as `isl_server_tokens`: each server receive time maps to its record's schedule.
    received = {row[5]: row[0] for row in log}
    figures["server_recv_ns"] = [None if rid is None else received.get(rid) for rid in figures["ids"]]
    return figures


def _open_summary(setup: OpenSetup, run: dict[str, Any]) -> dict[str, float | None]:
    rows = [
        (s, q, t, r)
        for s, q, t, r in zip(run["scheduled_ns"], run["queued_ns"], run["sent_ns"], run["server_recv_ns"], strict=True)
        if s is not None and t is not None
    ]

    def lags(values: list[float]) -> tuple[float | None, float | None, float | None]:
        return _pct(values, 0.5), _pct(values, 0.99), max(values) if values else None

    client = [(t - s) / 1e6 for s, _, t, _ in rows]
    server = [(r - s) / 1e6 for s, _, _, r in rows if r is not None]
    queued = [(q - s) / 1e6 for s, q, _, _ in rows if q is not None]
    pool = [(t - q) / 1e6 for _, q, t, _ in rows if q is not None]
    wire = [(r - t) / 1e6 for _, _, t, r in rows if r is not None]
    scheduled = [s for s, _, _, _ in rows]
    recv = [r for _, _, _, r in rows if r is not None]
    sent = [t for _, _, t, _ in rows]
    nominal_s = (max(scheduled) - min(scheduled)) / 1e9 if scheduled else 0.0
    ttft = [(t - setup.ttft_s) * 1e3 for t in run["ttft_s"]]
    e2e = [(t - setup.e2e_s) * 1e3 for t in run["e2e_s"]]
    c50, c99, cmax = lags(client)
    s50, s99, smax = lags(server)
    return {
        "dispatch lag p50 ms (sent − sched)": c50,
        "dispatch lag p99 ms (sent − sched)": c99,
        "dispatch lag max ms (sent − sched)": cmax,
        "server recv − sched p50 ms": s50,
        "server recv − sched p99 ms": s99,
        "server recv − sched max ms": smax,
        "queued − sched p99 ms": _pct(queued, 0.99),
        "queued − sched max ms": max(queued) if queued else None,
        "sent − queued p99 ms": _pct(pool, 0.99),
        "sent − queued max ms": max(pool) if pool else None,
        "sent → server recv p99 ms": _pct(wire, 0.99),
        "sent → server recv max ms": max(wire) if wire else None,
        "schedule s (last − first arrival)": nominal_s,
        "sends s (last − first sent)": (max(sent) - min(sent)) / 1e9 if sent else None,
        "server recv span s": (max(recv) - min(recv)) / 1e9 if recv else None,
        "event-loop lag max ms": max(run["loop_lag_s"]) * 1e3 if run["loop_lag_s"] else None,
        "GC pauses ≥ 1 ms (count)": float(sum(1 for a, b, _ in run["gc_pauses_ns"] if b - a >= 1_000_000)),
        "GC pause max ms": max((b - a) / 1e6 for a, b, _ in run["gc_pauses_ns"]) if run["gc_pauses_ns"] else None,
        "GC pause total ms": sum(b - a for a, b, _ in run["gc_pauses_ns"]) / 1e6,
        "GC pause max ms, young (gen 0)": max(
            ((b - a) / 1e6 for a, b, g in run["gc_pauses_ns"] if g == 0), default=None
        ),
        "GC pause max ms, middle (gen 1)": max(
            ((b - a) / 1e6 for a, b, g in run["gc_pauses_ns"] if g == 1), default=None
        ),
        "TTFT err p50 ms": _pct(ttft, 0.5),
        "TTFT err p99 ms": _pct(ttft, 0.99),
        "E2E err p50 ms": _pct(e2e, 0.5),
        "client CPU % (whole run)": run["cpu_percent"],
        "server CPU % (whole run)": run["server_cpu_percent"],
        "requests (errors)": float(run["requests"]) + run["errors"] / 1e6,
        "matched at server": float(len(server)),
    }


# ---------------------------------------------------------------------------------------------
# the peers: AIPerf and inference-perf, each in its own venv (optional; never needed for CI)


@dataclass(frozen=True)
class Peer:
    name: str
    venv: Path
    executable: str
    install: str


PEERS = (
    Peer(
        "AIPerf",
        Path(os.environ.get("AGENTX_BENCH_AIPERF_VENV", "/tmp/peers")),
        "aiperf",
        "python -m venv /tmp/peers && /tmp/peers/bin/pip install aiperf; or set AGENTX_BENCH_AIPERF_VENV",
    ),
    Peer(
        "inference-perf",
        Path(os.environ.get("AGENTX_BENCH_INFERENCE_PERF_VENV", "/tmp/peers-ip")),
        "inference-perf",
        "python3.12 -m venv /tmp/peers-ip && /tmp/peers-ip/bin/pip install inference-perf (it needs Python ≥ 3.12); "
        "or set AGENTX_BENCH_INFERENCE_PERF_VENV",
    ),
)

_TOKENIZER_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
vocab = {w: i for i, w in enumerate(["[UNK]", "[BOS]", "[EOS]", "t"] + [f"w{i}" for i in range(1000)])}
tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.save(sys.argv[1] + "/tokenizer.json")
config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "[BOS]",
          "eos_token": "[EOS]", "model_max_length": 1000000}
json.dump(config, open(sys.argv[1] + "/tokenizer_config.json", "w"))
"""


def _peer_missing(peer: Peer) -> str | None:
    if not (peer.venv / "bin" / peer.executable).exists():
        return f"{peer.name} not found in {peer.venv} ({peer.install})"
    return None


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (the peers run a process per service or worker)."""
    found = [pid]
    for current in found:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as children:
                    found.extend(int(child) for child in children.read().split())
    return found


def _tree_cpu_rss(pid: int) -> tuple[float, float]:
    """CPU seconds and RSS (MB) summed over a process tree."""
    cpu = rss = 0.0
    for member in _tree(pid):
        with contextlib.suppress(OSError, ValueError):
            cpu += _cpu_s(member)
            member_rss = _rss_mb(member)
            if not math.isnan(member_rss):  # a process exiting has no VmRSS line any more
                rss += member_rss
    return cpu, rss


def _stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{HOST}:{port}/stats", timeout=5) as response:
        stats: dict[str, int] = json.loads(response.read())
        return stats


def _aiperf_command(peer: Peer, setup: Setup, duration_s: float, port: int, out: Path) -> list[str]:
    command = [
        str(peer.venv / "bin" / peer.executable),
        "profile",
        "--model",
        MODEL,
        "--url",
        f"http://{HOST}:{port}",
        "--endpoint-type",
        "completions",
        "--streaming",
        "--concurrency",
        str(setup.streams),
        "--benchmark-duration",
        f"{duration_s:g}",
        "--prompt-input-tokens-mean",
        str(setup.in_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(setup.out_tokens),
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-legacy-max-tokens",
        "--use-server-token-count",
        "--tokenizer",
        str(out),
        "--ui",
        "none",
        "--output-artifact-dir",
        str(out / "artifacts"),
    ]
    if setup.ramp_s > 0:
        command += ["--concurrency-ramp-duration", f"{setup.ramp_s:g}"]
    return command


def _inference_perf_command(peer: Peer, setup: Setup, duration_s: float, port: int, out: Path) -> list[str]:
    # A concurrent stage runs a number of requests, not a duration: as many as the ideal rate sends in it.
    requests = round(setup.ideal_rps * duration_s)
    lengths = {"type": "fixed", "std_dev": 0, "total_count": requests}
    config = {
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": f"http://{HOST}:{port}", "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(out)},
        "data": {
            "type": "random",
            "input_distribution": {"min": setup.in_tokens, "max": setup.in_tokens, "mean": setup.in_tokens, **lengths},
            "output_distribution": {
                "min": setup.out_tokens,
                "max": setup.out_tokens,
                "mean": setup.out_tokens,
                **lengths,
            },
        },
        "load": {
            "type": "concurrent",
            "stages": [{"num_requests": requests, "concurrency_level": setup.streams}],
            "worker_max_concurrency": setup.streams,
        },
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": False}},
        "storage": {"local_storage": {"path": str(out / "artifacts")}},
    }
    (out / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    return [str(peer.venv / "bin" / peer.executable), "-c", str(out / "config.yml")]


def _aiperf_figures(setup: Setup, out: Path) -> dict[str, float | None]:
    export = json.loads((out / "artifacts" / "profile_export_aiperf.json").read_text())

    def metric(name: str, stat: str, injected: float = 0.0) -> float | None:
        value = export.get(name, {}).get(stat)
        return None if value is None else float(value) - injected * 1e3

    return {
        "req/s (lane cycle)": metric("request_throughput", "avg"),
        "TTFT err p50 ms": metric("time_to_first_token", "p50", setup.ttft_s),
        "TTFT err p99 ms": metric("time_to_first_token", "p99", setup.ttft_s),
        "E2E err p50 ms": metric("request_latency", "p50", setup.e2e_s),
        "E2E err p99 ms": metric("request_latency", "p99", setup.e2e_s),
        "ITL err mean ms": metric("inter_token_latency", "avg", setup.itl_s),
        "ITL err p50 ms": metric("inter_token_latency", "p50", setup.itl_s),
        "ITL err p99 ms": metric("inter_token_latency", "p99", setup.itl_s),
        "requests (errors)": float(metric("request_count", "avg") or 0),
    }


def _inference_perf_figures(setup: Setup, out: Path) -> dict[str, float | None]:
    summary = json.loads((out / "artifacts" / "summary_lifecycle_metrics.json").read_text())
    successes = summary.get("successes", {})
    latency = successes.get("latency", {})

    def metric(name: str, stat: str, injected: float) -> float | None:
        value = latency.get(name, {}).get(stat)
        return None if value is None else (float(value) - injected) * 1e3

    rps = successes.get("throughput", {}).get("requests_per_sec")
    return {
        "req/s (lane cycle)": None if rps is None else float(rps),
        "TTFT err p50 ms": metric("time_to_first_token", "median", setup.ttft_s),
        "TTFT err p99 ms": metric("time_to_first_token", "p99", setup.ttft_s),
        "E2E err p50 ms": metric("request_latency", "median", setup.e2e_s),
        "E2E err p99 ms": metric("request_latency", "p99", setup.e2e_s),
        "ITL err mean ms": metric("inter_token_latency", "mean", setup.itl_s),
        "ITL err p50 ms": metric("inter_token_latency", "median", setup.itl_s),
        "ITL err p99 ms": metric("inter_token_latency", "p99", setup.itl_s),
        "requests (errors)": float(successes.get("count", 0))
        + float(summary.get("failures", {}).get("count", 0)) / 1e6,
    }


def _peer_run(peer: Peer, setup: Setup, duration_s: float, out: Path) -> dict[str, float | None]:
    """One peer run against a fresh mock, same setup, pinned to the client's core, measured alike.

    Its client figures are its own report's (its whole run: it has no steady window of ours), the chunk rate
    is the mock's (content chunks written in our steady window), CPU and RSS are its process tree's.
    """
    out.mkdir(parents=True, exist_ok=True)
    # Their built-in tokenizers download an encoding, a model name needs the HF hub: a local word-level
    # tokenizer keeps the run offline (the mock ignores prompt text; counts come from usage).
    python = peer.venv / "bin" / "python"
    subprocess.run([str(python), "-c", _TOKENIZER_SCRIPT, str(out)], check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--worker-server", str(port), repr(setup.ttft_s), repr(setup.itl_s)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
    )
    build = _aiperf_command if peer.name == "AIPerf" else _inference_perf_command
    command = build(peer, setup, duration_s, port, out)
    log_path = out / "peer.log"
    try:
        _wait_ready(port, server)
        spawn = time.monotonic()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=out,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_pin_and_raise(CLIENT_CPU, 0),
            )
            try:
                while _stats(port)["requests"] == 0:
                    if process.poll() is not None or time.monotonic() - spawn > 120:
                        raise RuntimeError(f"{peer.name} sent no request (see {log_path})")
                    time.sleep(0.02)
                started = time.monotonic()
                time.sleep(_warmup_s(setup))
                cpu_a, _ = _tree_cpu_rss(process.pid)
                chunks_a, at_a = _stats(port)["chunks"], time.monotonic()
                time.sleep(max(1.0, duration_s - _warmup_s(setup) - 0.5))
                cpu_b, rss_mb = _tree_cpu_rss(process.pid)
                chunks_b, at_b = _stats(port)["chunks"], time.monotonic()
                if process.wait(timeout=3 * duration_s + setup.e2e_s * 3 + 120) != 0:
                    raise RuntimeError(f"{peer.name} exited with {process.returncode} (see {log_path})")
            finally:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)
    finally:
        server.terminate()
        server.wait(timeout=10)
    figures = (_aiperf_figures if peer.name == "AIPerf" else _inference_perf_figures)(setup, out)
    span_s = at_b - at_a
    chunks = chunks_b - chunks_a
    cpu_s = cpu_b - cpu_a
    rps = figures["req/s (lane cycle)"]
    figures.update(
        {
            "÷ ideal %": None if rps is None else 100 * rps / setup.ideal_rps,
            "chunks/s": chunks / span_s,
            "client CPU %": 100 * cpu_s / span_s,
            "CPU µs/chunk": 1e6 * cpu_s / chunks if chunks else None,
            "RSS MB": rss_mb,
            "start-up s": started - spawn,
        }
    )
    return figures


def _open_peer_command(peer: Peer, setup: OpenSetup, port: int, out: Path, seed: int) -> list[str]:
    if peer.name == "AIPerf":
        return [
            str(peer.venv / "bin" / peer.executable),
            "profile",
            "--model",
            MODEL,
            "--url",
            f"http://{HOST}:{port}",
            "--endpoint-type",
            "completions",
            "--streaming",
            "--request-rate",
            f"{setup.rate:g}",
            "--arrival-pattern",
            "poisson",
            "--request-count",
            str(setup.requests),
            "--random-seed",
            str(seed),
            "--prompt-input-tokens-mean",
            str(setup.in_tokens),
            "--prompt-input-tokens-stddev",
            "0",
            "--prompt-output-tokens-mean",
            str(setup.out_tokens),
            "--prompt-output-tokens-stddev",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--use-legacy-max-tokens",
            "--use-server-token-count",
            "--tokenizer",
            str(out),
            "--ui",
            "none",
            "--output-artifact-dir",
            str(out / "artifacts"),
        ]
    # inference-perf's `poisson` stage runs for a duration, not a count: as long as the count takes at the rate.
    # Its timer draws a Poisson count per second and spaces those evenly within the second.
    lengths = {"type": "fixed", "std_dev": 0, "total_count": setup.requests}
    config = {
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": f"http://{HOST}:{port}", "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(out)},
        "data": {
            "type": "random",
            "input_distribution": {"min": setup.in_tokens, "max": setup.in_tokens, "mean": setup.in_tokens, **lengths},
            "output_distribution": {
                "min": setup.out_tokens,
                "max": setup.out_tokens,
                "mean": setup.out_tokens,
                **lengths,
            },
        },
        "load": {"type": "poisson", "stages": [{"rate": setup.rate, "duration": round(setup.requests / setup.rate)}]},
        "report": {
            "request_lifecycle": {
                "summary": True,
                "per_stage": False,
                "per_request": True,
                "per_request_fields": {"request": False, "info": False, "response_chunks": False},
            }
        },
        "storage": {"local_storage": {"path": str(out / "artifacts")}},
    }
    (out / "config.yml").write_text(json.dumps(config))
    return [str(peer.venv / "bin" / peer.executable), "-c", str(out / "config.yml")]


def _open_peer_run(peer: Peer, setup: OpenSetup, out: Path, seed: int) -> dict[str, float | None]:
    """One peer run of setup C against a fresh mock; figures from its per-request export joined to the mock's log.

    AIPerf: the schedule is each record's `credit_issued_ns` (wall clock, mapped to perf_counter here), sent is
    its `request_start_ns`. inference-perf exports no per-request schedule: its own `schedule_delay` (start −
    scheduled) fills the client-side rows, and server recv − sched stays empty. Both name the mock's request
    number (AIPerf: `usage_prompt_tokens`; inference-perf: the response's `cmpl-N` id).
    """
    out.mkdir(parents=True, exist_ok=True)
    python = peer.venv / "bin" / "python"
    subprocess.run([str(python), "-c", _TOKENIZER_SCRIPT, str(out)], check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--worker-server", str(port), repr(setup.ttft_s), repr(setup.itl_s)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
    )
    command = _open_peer_command(peer, setup, port, out, seed)
    log_path = out / "peer.log"
    try:
        _wait_ready(port, server)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=out,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_pin_and_raise(CLIENT_CPU, 0),
            )
            try:
                returncode = process.wait(timeout=setup.requests / setup.rate * 4 + 180)
            finally:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)
        if returncode != 0:
            raise RuntimeError(f"{peer.name} exited with {returncode} (see {log_path})")
        with urllib.request.urlopen(f"http://{HOST}:{port}/log", timeout=10) as response:
            server_log: list[list[int]] = json.loads(response.read())
    finally:
        server.terminate()
        server.wait(timeout=10)
    received = {row[5]: row[0] for row in server_log}
    wall_minus_perf = min(time.time_ns() - time.perf_counter_ns() for _ in range(64))
    sched: list[int | None] = []
    start: list[int] = []
    rids: list[int] = []
    own: list[float] = []
    delay: dict[str, float] = {}
    if peer.name == "AIPerf":
        for line in (out / "artifacts" / "profile_export.jsonl").read_text().splitlines():
            row = json.loads(line)
            meta, metrics = row["metadata"], row.get("metrics", {})
            rid = metrics.get("usage_prompt_tokens", {}).get("value")
            if rid is None or meta.get("request_start_ns") is None:
                continue
            issued = meta.get("credit_issued_ns")
            sched.append(None if issued is None else issued - wall_minus_perf)
            start.append(meta["request_start_ns"] - wall_minus_perf)
            rids.append(int(rid))
            if issued is not None:
                own.append((meta["request_start_ns"] - issued) / 1e6)
    else:
        for row in json.loads((out / "artifacts" / "per_request_lifecycle_metrics.json").read_text()):
            head = str(row.get("response") or "")
            at = head.find('"id":"cmpl-')
            if at < 0:
                continue
            rids.append(int(head[at + 11 : head.index('"', at + 11)]))
            start.append(round(float(row["start_time"]) * 1e9))
            sched.append(None)
        summary = json.loads((out / "artifacts" / "summary_lifecycle_metrics.json").read_text())
        delay = summary.get("load_summary", {}).get("schedule_delay", {})
    at_server = [(received[r] - s) / 1e6 for r, s in zip(rids, sched, strict=True) if s is not None and r in received]
    wire = [(received[r] - t) / 1e6 for r, t in zip(rids, start, strict=True) if r in received]
    recv = [received[r] for r in rids if r in received]
    figures: dict[str, float | None] = {
        "dispatch lag p50 ms (sent − sched)": _pct(own, 0.5),
        "dispatch lag p99 ms (sent − sched)": _pct(own, 0.99),
        "dispatch lag max ms (sent − sched)": max(own) if own else None,
        "server recv − sched p50 ms": _pct(at_server, 0.5),
        "server recv − sched p99 ms": _pct(at_server, 0.99),
        "server recv − sched max ms": max(at_server) if at_server else None,
        "sent → server recv p99 ms": _pct(wire, 0.99),
        "sent → server recv max ms": max(wire) if wire else None,
        "schedule s (last − first arrival)": (
            (max(s for s in sched if s is not None) - min(s for s in sched if s is not None)) / 1e9
            if any(s is not None for s in sched)
            else None
        ),
        "sends s (last − first sent)": (max(start) - min(start)) / 1e9 if start else None,
        "server recv span s": (max(recv) - min(recv)) / 1e9 if recv else None,
        "requests (errors)": float(len(rids)),
        "matched at server": float(len(recv)),
    }
    if peer.name != "AIPerf":
        for key, stat in (("p50", "median"), ("p99", "p99"), ("max", "max")):
            value = delay.get(stat)
            figures[f"dispatch lag {key} ms (sent − sched)"] = None if value is None else float(value) * 1e3
    return figures


# ---------------------------------------------------------------------------------------------
# orchestration


def _warmup_s(setup: Setup) -> float:
    """The steady window starts after the ramp has started every lane (and after WARMUP_S in any case)."""
    return max(WARMUP_S, setup.ramp_s + 0.5)


def _wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mock server exited with {process.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{HOST}:{port}/v1/models", timeout=2):
            return
        time.sleep(0.05)
    raise RuntimeError("mock server not answering")


CLI_REQUESTS = 3_000
TARGET_CLI_RSS_MB = 150.0
"""Peak RSS of `agentx replay` through setup A's 3,000 requests (bench/README.md, client memory)."""


def _cli_peak(setup: Setup, out: Path, repeat: int) -> None:
    """Setup A through the command line, `repeat` times, each against a fresh mock (module docstring)."""
    trace_path = out / "setup-a.arrow"
    from agentx.trace.io import save_trace

    save_trace(one_request_sessions(4096, setup.in_tokens, setup.out_tokens, lambda i: (i,)), trace_path)
    runs: list[tuple[float, float]] = []
    for number in range(repeat):
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "--worker-server", str(port), repr(setup.ttft_s), repr(setup.itl_s)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
        )
        work = out / f"cli-peak-{number}"
        try:
            _wait_ready(port, server)
            command = [
                sys.executable, "-m", "agentx.cli", "replay", str(trace_path), "--url", f"http://{HOST}:{port}",
                "--model", MODEL, "--mode", "closed", "--concurrency", str(setup.streams),
                "--num-requests", str(CLI_REQUESTS), "--delay-scale", "0", "--out", str(work), "--overwrite",
            ]  # fmt: skip
            measured = measure(command, work.with_name(work.name + ".stderr"), timeout_s=300)
        finally:
            server.terminate()
            server.wait(timeout=10)
        end_ns = run_end_wall_ns(work)
        through_run = None if end_ns is None else measured.peak_until(end_ns)
        if measured.code != 0 or through_run is None:
            stderr = work.with_name(work.name + ".stderr").read_text(errors="replace")[-500:]
            print(f"  run {number + 1}: the replay exited {measured.code}: {stderr}")
            continue
        runs.append((through_run / 1e6, measured.peak / 1e6))
        print(f"  run {number + 1}: peak RSS {runs[-1][0]:.0f} MB through the run, {runs[-1][1]:.0f} MB in all")
    if not runs:
        return
    through = [run for run, _ in runs]
    whole = [peak for _, peak in runs]
    median = statistics.median(through)
    print(
        f"\nagentx replay, setup A ({setup.streams} lanes, closed loop), {CLI_REQUESTS:,} requests through the command "
        f"line; median (min–max) of {len(runs)} runs\n"
        f"  peak RSS through the run {median:.0f} MB ({min(through):.0f}–{max(through):.0f}) ÷ target "
        f"{TARGET_CLI_RSS_MB:.0f} MB = {median / TARGET_CLI_RSS_MB:.2f}\n"
        f"  peak RSS with the end-of-run summary {statistics.median(whole):.0f} MB ({min(whole):.0f}–{max(whole):.0f})"
        f" ÷ target {TARGET_CLI_RSS_MB:.0f} MB = {statistics.median(whole) / TARGET_CLI_RSS_MB:.2f}"
    )


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _one_run(setup: Setup, duration_s: float, out: Path, use_uvloop: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--worker-server", str(port), repr(setup.ttft_s), repr(setup.itl_s)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
    )
    try:
        _wait_ready(port, server)
        with urllib.request.urlopen(f"http://{HOST}:{port}/log", timeout=5):
            pass  # drop the probe-free log (nothing yet) and warm the path
        spec = {
            "setup": setup.__dict__,
            "duration_s": duration_s,
            "port": port,
            "server_pid": server.pid,
            "out_dir": str(out),
            "uvloop": use_uvloop,
            "figures_path": str(out / "figures.json"),
            "spawn_ns": time.perf_counter_ns(),
        }
        client = subprocess.run(
            [sys.executable, __file__, "--worker-client", json.dumps(spec)],
            cwd=ROOT,
            capture_output=True,
            preexec_fn=_pin_and_raise(CLIENT_CPU, 0),
            check=False,
        )
        if client.returncode != 0:
            raise RuntimeError(f"client failed: {client.stderr.decode(errors='replace')[-2000:]}")
        figures: dict[str, Any] = json.loads((out / "figures.json").read_text())
        with urllib.request.urlopen(f"http://{HOST}:{port}/log", timeout=10) as response:
            log: list[list[int]] = json.loads(response.read())
        figures["server_priority"] = _priority(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
    lo, hi = figures["window_ns"]
    steady = [row for row in log if row[0] >= lo and row[4] <= hi]
    figures["server_first_lag_s"] = [(r[2] - r[1]) / 1e9 for r in steady]
    by_id = {row[5]: row for row in log}
    pairs = [(c, by_id[c[0]]) for c in figures["matched"] if c[0] in by_id]
    figures["to_server_s"] = [(r[0] - c[1]) / 1e9 for c, r in pairs]
    figures["first_delivery_s"] = [(c[2] - r[2]) / 1e9 for c, r in pairs]
    figures["last_delivery_s"] = [(c[3] - r[4]) / 1e9 for c, r in pairs]
    figures["ttft_vs_server_s"] = [((c[2] - c[1]) - (r[2] - r[0])) / 1e9 for c, r in pairs]
    figures["server_last_lag_s"] = [(r[4] - r[3]) / 1e9 for r in steady]
    return figures


def _summary(setup: Setup, run: dict[str, Any]) -> dict[str, float | None]:
    ttft = [t - setup.ttft_s for t in run["ttft_s"]]
    e2e = [t - setup.e2e_s for t in run["e2e_s"]]
    itl = [t - setup.itl_s for t in run["itl_s"]]

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1e3

    return {
        "req/s (lane cycle)": run["rps_cycle"],
        "÷ ideal %": None if run["rps_cycle"] is None else 100 * run["rps_cycle"] / setup.ideal_rps,
        "req/s (ends in window)": run["rps"],
        "chunks/s": run["chunks_per_s"],
        "client CPU %": run["cpu_percent"],
        "CPU µs/chunk": run["cpu_us_per_chunk"],
        "TTFT err p50 ms": ms(_pct(ttft, 0.5)),
        "TTFT err p99 ms": ms(_pct(ttft, 0.99)),
        "E2E err p50 ms": ms(_pct(e2e, 0.5)),
        "E2E err p99 ms": ms(_pct(e2e, 0.99)),
        "ITL err mean ms": ms(statistics.fmean(itl)) if itl else None,
        "ITL err p50 ms": ms(_pct(itl, 0.5)),
        "ITL err p99 ms": ms(_pct(itl, 0.99)),
        "dispatch lag p50 ms": ms(_pct(run["dispatch_lag_s"], 0.5)),
        "dispatch lag p99 ms": ms(_pct(run["dispatch_lag_s"], 0.99)),
        "recycle gap p50 ms": ms(_pct(run["recycle_gap_s"], 0.5)),
        "recycle gap p99 ms": ms(_pct(run["recycle_gap_s"], 0.99)),
        "RSS MB": run["rss_mb"],
        "start-up s": run["startup_s"],
        "server CPU %": run["server_cpu_percent"],
        "client send → server recv p50 ms": ms(_pct(run["to_server_s"], 0.5)),
        "client send → server recv p99 ms": ms(_pct(run["to_server_s"], 0.99)),
        "server 1st send → client p50 ms": ms(_pct(run["first_delivery_s"], 0.5)),
        "server 1st send → client p99 ms": ms(_pct(run["first_delivery_s"], 0.99)),
        "server last send → client p50 ms": ms(_pct(run["last_delivery_s"], 0.5)),
        "TTFT − server's TTFT p50 ms": ms(_pct(run["ttft_vs_server_s"], 0.5)),
        "TTFT − server's TTFT p99 ms": ms(_pct(run["ttft_vs_server_s"], 0.99)),
        "server 1st-chunk lag p50 ms": ms(_pct(run["server_first_lag_s"], 0.5)),
        "server 1st-chunk lag p99 ms": ms(_pct(run["server_first_lag_s"], 0.99)),
        "server last-chunk lag p50 ms": ms(_pct(run["server_last_lag_s"], 0.5)),
        "requests (errors)": float(run["requests"]) + run["errors"] / 1e6,
    }


TARGETS: dict[str, dict[str, str]] = {
    "A": {
        "req/s (lane cycle)": "≥ 95.5 (97% of 98.5)",
        "CPU µs/chunk": "≤ 20",
        "TTFT err p50 ms": "≤ 2",
        "TTFT err p99 ms": "≤ 20",
        "ITL err mean ms": "≤ 0.1",
        "RSS MB": "< 150",
        "start-up s": "< 0.5",
    },
    "B": {"TTFT err p50 ms": "≤ 3", "E2E err p50 ms": "≤ 10", "ITL err mean ms": "≤ 0.1"},
    "idle": {"client CPU %": "≤ 3"},
    "C200": {
        "dispatch lag p99 ms (sent − sched)": "≤ 2",
        "dispatch lag max ms (sent − sched)": "≤ 5",
        "server recv − sched p99 ms": "≤ 2 (bench/README.md)",
        "server recv − sched max ms": "≤ 5 (bench/README.md)",
    },
    "C1000": {
        "dispatch lag p99 ms (sent − sched)": "< 1",
        "server recv − sched p99 ms": "< 1",
    },
}


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


LOOPS = ("default", "uvloop")
"""`default`: asyncio.run's loop; `uvloop`: what the CLI runs when uvloop is installed (agentx.cli)."""


FROZEN = "uvloop, quiet_gc off"
"""Setup C's diagnostic column: the uvloop run with `Runtime(quiet_gc=False)`, a library caller's default. Every other
column runs with the CLI's settings (`CLI_RUNTIME`: the run freezes its set-up and collects on its own clock,
agentx.replayer.schedule.collector), so this one shows what that buys."""


def _label(column: str) -> str:
    if column in LOOPS:
        return column + " loop"
    return column if column == FROZEN else "peer: " + column


def _cell(values: list[float], key: str) -> str:
    if key == "requests (errors)":
        return ", ".join(f"{int(v)} ({round((v - int(v)) * 1e6)})" for v in values)
    if not values:
        return "—"
    if len(values) == 1:
        return _fmt(values[0])
    return f"{_fmt(statistics.median(values))} ({_fmt(min(values))}–{_fmt(max(values))})"


def _title(setup: Setup | OpenSetup) -> str:
    if isinstance(setup, OpenSetup):
        return (
            f'Setup {setup.name}: open loop, Poisson arrivals at {setup.rate:g} requests/s (agentx `mode="rate"`), '
            f"{setup.requests:,} one-request sessions, {setup.in_tokens}-token prompts, {setup.out_tokens} output "
            f"tokens, TTFT {setup.ttft_s * 1e3:g} ms, ITL {setup.itl_s * 1e3:g} ms (E2E {setup.e2e_s * 1e3:,.0f} ms, "
            f"~{setup.rate * setup.e2e_s:,.0f} in flight, {setup.rate * setup.out_tokens:,.0f} chunks/s)"
        )
    return (
        f"Setup {setup.name}: {setup.streams} streams, {setup.in_tokens}-token prompts, {setup.out_tokens} output "
        f"tokens, TTFT {setup.ttft_s * 1e3:g} ms, ITL {setup.itl_s * 1e3:g} ms, ramp {setup.ramp_s:g} s; ideal "
        f"{setup.ideal_rps:.1f} req/s, {setup.ideal_rps * setup.out_tokens:,.0f} chunks/s, E2E "
        f"{setup.e2e_s * 1e3:,.0f} ms"
    )


def _report(setup: Setup | OpenSetup, by_loop: dict[str, list[dict[str, float | None]]]) -> None:
    loops = [loop for loop in by_loop if by_loop[loop]]
    if not loops:
        return
    counts = ", ".join(f"{loop}: {len(by_loop[loop])}" for loop in loops)
    print(f"\n{_title(setup)}. Runs ({counts}): median (min–max)")
    targets = TARGETS.get(setup.name, {})
    header = "".join(f" {_label(loop):<28} |" for loop in loops)
    print(f"| {'figure':<34} |{header} {'target':<22} |")
    print(f"|{'-' * 36}|" + f"{'-' * 30}|" * len(loops) + f"{'-' * 24}|")
    first = by_loop[loops[0]][0]
    for key in first:
        cells = "".join(
            f" {_cell([v for run in by_loop[loop] if (v := run.get(key)) is not None], key):<28} |" for loop in loops
        )
        print(f"| {key:<34} |{cells} {targets.get(key, ''):<22} |")
    peers = [loop for loop in loops if loop not in (*LOOPS, FROZEN)]
    for peer in peers:
        for loop in (loop for loop in loops if loop in LOOPS):
            parts = []
            # Ratios for costs and rates; errors near zero make meaningless ratios, so those are differences.
            for key in ("CPU µs/chunk", "RSS MB", "req/s (lane cycle)"):
                ours, theirs = _median(by_loop[loop], key), _median(by_loop[peer], key)
                if ours is not None and theirs:
                    parts.append(f"{key} ×{ours / theirs:.2f}")
            for key in (
                "TTFT err p50 ms",
                "TTFT err p99 ms",
                "E2E err p50 ms",
                "server recv − sched p99 ms",
                "server recv − sched max ms",
            ):
                ours, theirs = _median(by_loop[loop], key), _median(by_loop[peer], key)
                if ours is not None and theirs is not None:
                    parts.append(f"{key} {ours - theirs:+.1f}")
            print(f"agentx ({loop}) vs {peer}, medians (ratio ×, difference ±): {'; '.join(parts) or '—'}")


def _median(runs: list[dict[str, float | None]], key: str) -> float | None:
    values = [v for run in runs if (v := run.get(key)) is not None]
    return statistics.median(values) if values else None


def _run_open(
    setup: OpenSetup, repeat: int, loops: list[str], tmp: Path, frozen: bool, peers: list[Peer], prompt: str
) -> None:
    """Setup C at one rate: `repeat` rounds of every loop and peer, interleaved; round n uses arrival seed n."""
    if prompt != "unique":
        print(f"Setup {setup.name}: --c-prompt {prompt} (every request carries the same hash blocks)")
    columns = [*loops, FROZEN] if frozen else loops
    by_loop: dict[str, list[dict[str, float | None]]] = {loop: [] for loop in [*columns, *(p.name for p in peers)]}
    for number in range(repeat):
        for peer in peers:
            try:
                figures = _open_peer_run(peer, setup, tmp / f"{setup.name}{number}{peer.executable}", seed=number)
            except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                print(f"setup {setup.name} run {number + 1} ({peer.name}): {exc}")
                continue
            by_loop[peer.name].append(figures)
            print(
                f"  setup {setup.name} run {number + 1} ({peer.name}): server recv − sched p50/p99/max "
                f"{_fmt(figures['server recv − sched p50 ms'])}/{_fmt(figures['server recv − sched p99 ms'])}/"
                f"{_fmt(figures['server recv − sched max ms'])} ms, server recv span "
                f"{_fmt(figures['server recv span s'])} s",
                flush=True,
            )
        for index, loop in enumerate(columns):
            try:
                raw = _open_run(
                    setup,
                    tmp / f"{setup.name}{number}-{index}",
                    loop != "default",
                    seed=number,
                    quiet_gc=loop != FROZEN,
                    prompt=prompt,
                )
            except RuntimeError as exc:
                print(f"setup {setup.name} run {number + 1} ({loop}): {exc}")
                continue
            summary = _open_summary(setup, raw)
            by_loop[loop].append(summary)
            print(
                f"  setup {setup.name} run {number + 1} ({loop}, seed {number}): dispatch lag p50/p99/max "
                f"{_fmt(summary['dispatch lag p50 ms (sent − sched)'])}/"
                f"{_fmt(summary['dispatch lag p99 ms (sent − sched)'])}/"
                f"{_fmt(summary['dispatch lag max ms (sent − sched)'])} ms, server recv − sched p99 "
                f"{_fmt(summary['server recv − sched p99 ms'])} ms, {_fmt(summary['client CPU % (whole run)'])}% "
                f"client CPU ({raw['server_priority']} server)",
                flush=True,
            )
    _report(setup, by_loop)


def main(argv: Sequence[str] | None = None) -> None:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--worker-server"]:
        _serve_mock(int(args_in[1]), float(args_in[2]), float(args_in[3]))
        return
    if args_in[:1] == ["--worker-open-client"]:
        spec = json.loads(args_in[1])
        Path(spec["figures_path"]).write_text(json.dumps(_open_client(spec)))
        return
    if args_in[:1] == ["--worker-client"]:
        spec = json.loads(args_in[1])
        # Through a file, not stdout: an event loop may leave stdout non-blocking, and a line longer than
        # the pipe's buffer is then cut at 64 KiB.
        Path(spec["figures_path"]).write_text(json.dumps(_client(spec)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--setups",
        default="A,B,idle,C",
        help="comma-separated: A, B, idle, C (= C200,C1000: open loop at 200, 1,000/s)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per run (setups A and B)")
    parser.add_argument("--idle-duration", type=float, default=10.0)
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help="comma-separated client event loops, runs interleaved: default (asyncio.run), uvloop (as the CLI)",
    )
    parser.add_argument("--ramp-s", type=float, default=None, help="override every setup's ramp (seconds)")
    parser.add_argument(
        "--no-peer", action="store_true", help="skip the peers (each runs, when installed, once per repeat of A and B)"
    )
    parser.add_argument(
        "--no-quiet-gc-column",
        action="store_true",
        help="setup C: skip the diagnostic uvloop run with quiet_gc off (a library caller's default)",
    )
    parser.add_argument(
        "--c-prompt",
        choices=("unique", "shared"),
        default="unique",
        help="setup C's prompts: distinct hash blocks per request (default), or the same blocks in every request",
    )
    parser.add_argument(
        "--cli-peak", action="store_true", help="setup A's peak RSS through the command line instead (module docstring)"
    )
    args = parser.parse_args(args_in)
    if args.cli_peak:
        with tempfile.TemporaryDirectory(prefix="replay_overhead_") as tmp:
            _cli_peak(SETUPS["A"], Path(tmp), args.repeat)
        return
    loops = [part.strip() for part in args.loops.split(",") if part.strip()]
    for loop in loops:
        if loop not in LOOPS:
            parser.error(f"unknown loop {loop!r} (known: {', '.join(LOOPS)})")
    print(
        f"replay_overhead: server pinned to core {SERVER_CPU} (nice {SERVER_NICE} if permitted), "
        f"client pinned to core {CLIENT_CPU} (loops: {', '.join(loops)}; the CLI uses uvloop when installed); "
        f"cores here: {os.cpu_count()}; steady window from max({WARMUP_S:g} s, ramp + 0.5 s)"
    )
    peers: list[Peer] = []
    for peer in PEERS:
        missing = "--no-peer" if args.no_peer else _peer_missing(peer)
        if missing:
            print(f"Peer {peer.name} skipped: {missing}")
        else:
            peers.append(peer)
    with tempfile.TemporaryDirectory(prefix="replay_overhead_") as tmp:
        names = [part.strip() for part in args.setups.split(",") if part.strip()]
        names = [expanded for name in names for expanded in (OPEN_SETUPS if name == "C" else [name])]
        for name in names:
            if name in OPEN_SETUPS:
                _run_open(
                    OPEN_SETUPS[name], args.repeat, loops, Path(tmp), not args.no_quiet_gc_column, peers, args.c_prompt
                )
                continue
            if name not in SETUPS:
                parser.error(f"unknown setup {name!r} (known: {', '.join([*SETUPS, 'C', *OPEN_SETUPS])})")
            setup = SETUPS[name]
            if args.ramp_s is not None and name != "idle":
                setup = dataclasses.replace(setup, ramp_s=args.ramp_s)
            duration = args.idle_duration if name == "idle" else args.duration
            repeat = 1 if name == "idle" else args.repeat
            by_loop: dict[str, list[dict[str, float | None]]] = {loop: [] for loop in loops}
            setup_peers = [] if name == "idle" else peers
            for peer in setup_peers:
                by_loop[peer.name] = []
            for number in range(repeat):
                for peer in setup_peers:
                    try:
                        figures = _peer_run(peer, setup, duration, Path(tmp) / f"{name}{number}{peer.executable}")
                    except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                        print(f"setup {name} run {number + 1} ({peer.name}): {exc}")
                        continue
                    by_loop[peer.name].append(figures)
                    print(
                        f"  setup {name} run {number + 1} ({peer.name}): {_fmt(figures['req/s (lane cycle)'])} "
                        f"req/s, {_fmt(figures['client CPU %'])}% client CPU, "
                        f"TTFT err p50 {_fmt(figures['TTFT err p50 ms'])} ms",
                        flush=True,
                    )
                for loop in loops:  # interleaved, so that a drift in machine speed touches both loops alike
                    try:
                        raw = _one_run(setup, duration, Path(tmp) / f"{name}{number}{loop}", loop == "uvloop")
                    except RuntimeError as exc:
                        print(f"setup {name} run {number + 1} ({loop}): {exc}")
                        continue
                    summary = _summary(setup, raw)
                    by_loop[loop].append(summary)
                    print(
                        f"  setup {name} run {number + 1} ({loop}): {_fmt(summary['req/s (lane cycle)'])} req/s, "
                        f"{_fmt(summary['client CPU %'])}% client CPU, TTFT err p50 "
                        f"{_fmt(summary['TTFT err p50 ms'])} ms ({raw['server_priority']} server)",
                        flush=True,
                    )
            _report(setup, by_loop)


if __name__ == "__main__":
    main()
