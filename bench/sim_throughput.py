"""Simulator throughput benchmark: concurrent streams and chunks/s that `agentx sim` sustains on one core.

Starts `agentx sim` (a fresh process for every run, pinned to one core, at a higher priority) and loads
it from another process pinned to the other core (bench/loadgen.py: raw uvloop keep-alive connections,
closed loop, `POST /v1/completions` streaming 256 tokens with `ignore_eos`). For each concurrency level,
interleaved `--repeat` times:

- paced: the step model makes a step cost `N / rate` seconds at N running sequences, so every level
  offers the same chunk rate (default 60,000/s, 20% above the target); the question is whether the
  server keeps its step clock at that rate, and how much of its core that takes (CPU per chunk, and the
  chunk rate at which it would fill the core);
- peer: a minimal step-clocked SSE server kept in this file (raw protocol, msgspec, one write per chunk),
  paced alike: about the least any Python server doing this work costs; sim ÷ peer CPU per chunk is
  taken run by run, so it holds when the machine drifts;
- flat out (`--flat`): every step-time coefficient zero, steps back to back.

Then the server's CPU with no stream and with 1 stream at a 10 ms step. Prints figures; never fails on a
number. See bench/README.md.

Usage: .venv/bin/python bench/sim_throughput.py [--quick] [--levels 250,500,1000,2000,4000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec

TARGET_STREAMS = 2_000
TARGET_CHUNKS_PER_S = 50_000.0
KEPT_UP_RATE = 0.97
"""The clock kept up when the client counted at least this fraction of the chunks the step model offers..."""
KEPT_UP_MEAN_LAG_STEPS = 0.1
KEPT_UP_MEAN_LAG_S = 0.001
"""...and the server's steps were late on average (when it says) by less than this fraction of a step, or
than the event loop's timer resolution (libuv's timers count milliseconds), whichever is larger."""
HICCUP_LATE_S = 0.005
"""Hiccups: some steps late by more than a step (and more than this, the scheduling noise of a shared core):
a sampled step lag above that, or a client p99 gap between chunks above a step plus that."""
CLIENT_BOUND_PERCENT = 90.0
"""A flat-out run whose client used this much of its core may have measured the client."""
IDLE_STEP_S = 0.010
HOST = "127.0.0.1"
BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LOADGEN = BENCH / "loadgen.py"
STARTUP_TIMEOUT_S = 60.0
METRICS_POLL_S = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# the servers under test


@dataclass(frozen=True)
class _Engine:
    """The step model of one run; prefill and attention cost nothing here, so a step of N sequences costs
    `step_overhead_s + decode_s_per_token · N`."""

    step_overhead_s: float
    decode_s_per_token: float
    prefill_s_per_token: float = 0.0
    attention_s_per_kv_token: float = 0.0

    def step_s(self, running: int) -> float:
        return self.step_overhead_s + self.decode_s_per_token * running


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _sim_command(
    port: int, engine: _Engine, max_streams: int, extra: Sequence[str], entry: Path | None = None
) -> list[str]:
    """`agentx sim` with a KV cache, batch and token budget that never limit `max_streams` streams."""
    return [
        sys.executable,
        *([str(entry)] if entry else ["-m", "agentx.cli"]),
        "sim",
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-num-seqs",
        str(max(1024, 2 * max_streams)),
        "--max-num-batched-tokens",
        str(max(16_384, 32 * max_streams)),
        "--num-gpu-blocks",
        str(max(262_144, 64 * max_streams)),
        "--step-overhead-s",
        repr(engine.step_overhead_s),
        "--decode-s-per-token",
        repr(engine.decode_s_per_token),
        "--prefill-s-per-token",
        repr(engine.prefill_s_per_token),
        "--attention-s-per-kv-token",
        repr(engine.attention_s_per_kv_token),
        *extra,
    ]


def _peer_command(port: int, engine: _Engine) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--worker-peer",
        str(port),
        repr(engine.step_overhead_s),
        repr(engine.decode_s_per_token),
    ]


def _pin_and_raise(cpu: int, niceness: int, realtime: int = 0) -> Callable[[], None]:
    """Pin to `cpu` and raise the priority to `niceness`, or to real-time round-robin `realtime` if > 0."""

    def setup() -> None:  # runs in the child between fork and exec
        os.sched_setaffinity(0, {cpu})
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
        if realtime > 0:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(realtime))

    return setup


@dataclass
class _Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def log_tail(self, lines: int = 2) -> str:
        """The last lines of the server's output, and where the rest is."""
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = []
        return " | ".join([*(line.strip() for line in tail), f"log: {self.log}"])


@contextlib.contextmanager
def _serve(
    command_for_port: Callable[[int], list[str]], cpu: int, niceness: int, realtime: int, log: Path
) -> Iterator[_Server]:
    """Start a server on a free loopback port, wait until it answers, stop it on exit."""
    port = _free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command_for_port(port),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_pin_and_raise(cpu, niceness, realtime),
        )
    server = _Server(process, port, log)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}: {server.log_tail()}")
            try:
                with urllib.request.urlopen(server.url("/v1/models"), timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not answering after {STARTUP_TIMEOUT_S:.0f} s: {server.log_tail()}")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _priority(pid: int) -> str:
    if os.sched_getscheduler(pid) in (os.SCHED_RR, os.SCHED_FIFO):
        return f"real-time {os.sched_getparam(pid).sched_priority}"
    return f"nice {os.getpriority(os.PRIO_PROCESS, pid)}"


# ---------------------------------------------------------------------------------------------
# the server's /metrics


Samples = dict[str, float]
"""Prometheus samples, keyed by `name{labels}` text; `name` alone for unlabelled samples."""


def _scrape(server: _Server) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(server.url("/metrics"), timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples


def _base(key: str) -> str:
    return key.split("{", 1)[0]


def _sum_named(samples: Samples, name: str) -> float | None:
    values = [value for key, value in samples.items() if _base(key) == name]
    return sum(values) if values else None


def _find(samples: Samples, *words: str, suffix: str = "") -> str | None:
    """The first metric name containing every word (and ending with `suffix`)."""
    for key in sorted(samples):
        name = _base(key)
        if all(word in name for word in words) and name.endswith(suffix):
            return name
    return None


class _MetricsPoller(threading.Thread):
    """Scrapes /metrics every METRICS_POLL_S during the window, for gauges that change step by step."""

    def __init__(self, server: _Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stopped = threading.Event()
        self.scrapes: list[Samples] = []

    def run(self) -> None:
        while not self.stopped.wait(METRICS_POLL_S):
            self.scrapes.append(_scrape(self.server))


@dataclass
class _ClockFigures:
    """What the server says about its step clock over the window."""

    lag_metric: str | None = None
    lag_kind: str = ""
    lag_s: float | None = None
    """The typical lag: the window's mean when the server exposes a sum, else the median of the samples."""
    lag_max_s: float | None = None
    steps_metric: str | None = None
    steps: float | None = None
    """Steps between the two scrapes that bracket the window."""
    scrape_span_s: float | None = None
    """Time between those scrapes' answers (a busy server answers late: the window is not the span)."""
    generation_tokens: float | None = None


LAG_GAUGE = "agentx_sim_step_lag_seconds"
_SERIES_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


def _delta(before: Samples, after: Samples, name: str) -> float | None:
    end, start = _sum_named(after, name), _sum_named(before, name)
    return None if end is None or start is None else end - start


def _clock_figures(before: Samples, polled: list[Samples], after: Samples, span_s: float) -> _ClockFigures:
    figures = _ClockFigures(scrape_span_s=span_s)
    if not after:
        return figures
    steps_name = _find(after, "steps", suffix="_total") or _find(after, "steps")
    if steps_name is not None:
        figures.steps_metric = steps_name
        figures.steps = _delta(before, after, steps_name)
    tokens_name = _find(after, "generation_tokens", suffix="_total")
    if tokens_name is not None:
        figures.generation_tokens = _delta(before, after, tokens_name)
    histogram = _find(after, "lag", suffix="_count")
    if histogram is not None:  # a histogram of per-step lag: the window's mean and its highest bucket
        name = histogram.removesuffix("_count")
        figures.lag_metric, figures.lag_kind = name, "histogram"
        count = _delta(before, after, histogram) or 0.0
        total = _delta(before, after, f"{name}_sum") or 0.0
        figures.lag_s = total / count if count else None
        buckets = sorted(
            (float(key.split('le="', 1)[1].split('"', 1)[0]), after[key] - before.get(key, 0.0))
            for key in after
            if _base(key) == f"{name}_bucket"
        )
        reached = [bound for bound, hits in buckets if hits >= count]
        figures.lag_max_s = min(reached) if reached and count else None  # an upper bound of the max
        return figures
    gauge = LAG_GAUGE if any(_base(key) == LAG_GAUGE for key in after) else None
    if gauge is None:
        gauge = next(
            (_base(key) for key in sorted(after) if "lag" in key and not _base(key).endswith(_SERIES_SUFFIXES)), None
        )
    if gauge is not None:  # the last step's lag, sampled every METRICS_POLL_S
        figures.lag_metric, figures.lag_kind = gauge, f"gauge sampled every {METRICS_POLL_S:g} s"
        values = [value for scrape in [*polled, after] if (value := _sum_named(scrape, gauge)) is not None]
        if values:
            figures.lag_max_s = max(values)
            figures.lag_s = statistics.median(values)
    lag_total = _find(after, "lag", suffix="_total")
    if lag_total is not None and figures.steps:  # a running sum of every step's lag: the window's mean
        lag_sum = _delta(before, after, lag_total)
        if lag_sum is not None:
            figures.lag_s = lag_sum / figures.steps
            figures.lag_kind += f"; mean from {lag_total}"
    return figures


# ---------------------------------------------------------------------------------------------
# one run


@dataclass
class _Run:
    mode: str
    """paced (the sim at `rate`), peer (the peer, paced alike), flat (the sim flat out) or idle."""
    streams: int
    rate: float | None
    step_s: float | None
    """The step model's step time at `streams` running sequences (paced and idle runs)."""
    client: dict[str, Any]
    server_cpu_percent: float
    server_rss_mb: float
    server_priority: str
    clock: _ClockFigures
    window_s: float
    max_tokens: int

    @property
    def chunks_per_s(self) -> float:
        return float(self.client["chunks_per_s"])

    @property
    def offered_chunks_per_s(self) -> float | None:
        # A request is prefilled (its first token) then decoded for max_tokens - 1 steps, and the next
        # request on the connection joins the step after its last: max_tokens chunks per max_tokens + 1 steps.
        if not self.step_s:
            return None
        return self.streams / self.step_s * self.max_tokens / (self.max_tokens + 1)

    @property
    def server_us_per_chunk(self) -> float | None:
        chunks = self.client["chunks"]
        return self.server_cpu_percent / 100 * self.window_s / chunks * 1e6 if chunks else None

    @property
    def ceiling_chunks_per_s(self) -> float | None:
        """The chunk rate at which the server would fill its core, at this run's CPU per chunk."""
        return self.chunks_per_s / (self.server_cpu_percent / 100) if self.server_cpu_percent > 0 else None

    @property
    def client_us_per_chunk(self) -> float | None:
        chunks = self.client["chunks"]
        return float(self.client["cpu_s"]) / chunks * 1e6 if chunks else None

    @property
    def actual_step_ms(self) -> float | None:
        """Mean wall time of a step over the window, from the server's step counter."""
        steps, span = self.clock.steps, self.clock.scrape_span_s
        return span / steps * 1e3 if steps and span else None

    @property
    def rate_ratio(self) -> float | None:
        offered = self.offered_chunks_per_s
        return self.chunks_per_s / offered if offered else None

    @property
    def kept_up(self) -> bool:
        """The step clock kept pace over the window: the offered chunk rate arrived, steps were on time on average."""
        ratio = self.rate_ratio
        if ratio is None or self.step_s is None or ratio < KEPT_UP_RATE or self.client["errors"]:
            return False
        lag = self.clock.lag_s
        return lag is None or lag <= max(KEPT_UP_MEAN_LAG_STEPS * self.step_s, KEPT_UP_MEAN_LAG_S)

    @property
    def hiccups(self) -> bool:
        """Some steps were late by more than a step (or 5 ms): a sampled lag, or the client's p99 gap, shows it."""
        if self.step_s is None:
            return False
        late = max(self.step_s, HICCUP_LATE_S)
        lag = self.clock.lag_max_s
        gap = (self.client.get("gap_s") or {}).get("p99")
        return (lag is not None and lag > late) or (gap is not None and gap > self.step_s + late)


def _measure(
    server: _Server, args: argparse.Namespace, streams: int
) -> tuple[dict[str, Any], float, float, _ClockFigures, float]:
    """Load `server` with `streams` streams; client figures, server CPU %, RSS, clock figures, window."""
    command = [
        sys.executable,
        str(LOADGEN),
        "--host",
        HOST,
        "--port",
        str(server.port),
        "--streams",
        str(streams),
        "--warmup",
        repr(args.warmup),
        "--duration",
        repr(args.duration),
        "--max-tokens",
        str(args.max_tokens),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--model",
        args.model,
        "--cpu",
        str(args.client_cpu),
        "--hold",
        "30",
    ]
    limit_s = 90 + args.warmup + args.duration
    client = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin_and_raise(args.client_cpu, args.client_nice, args.realtime // 2),
    )
    timer = threading.Timer(limit_s, client.kill)
    timer.start()
    poller = _MetricsPoller(server)
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        if line.strip() != "start":
            raise RuntimeError(f"load client failed before its window ({line!r})")
        cpu0, t0 = _cpu_s(server.pid), time.perf_counter()
        before = _scrape(server)
        t_before = time.perf_counter()
        poller.start()
        line = client.stdout.readline()
        cpu1, t1 = _cpu_s(server.pid), time.perf_counter()
        rss = _rss_mb(server.pid)
        poller.stopped.set()
        poller.join()
        after = _scrape(server)
        t_after = time.perf_counter()
        assert client.stdin is not None
        client.stdin.close()  # the client holds its load until now, so that its exit is not in `after`
        client.wait()
        if client.returncode or not line.strip():
            raise RuntimeError(f"load client failed (exit {client.returncode})")
    finally:
        timer.cancel()
        poller.stopped.set()
        if client.poll() is None:
            client.kill()
            client.wait()
    result: dict[str, Any] = json.loads(line)
    window = t1 - t0
    clock = _clock_figures(before, poller.scrapes, after, t_after - t_before)
    return result, 100 * (cpu1 - cpu0) / window, rss, clock, window


def _run(args: argparse.Namespace, mode: str, streams: int, rate: float | None, number: int) -> _Run:
    if rate is not None:
        engine = _Engine(step_overhead_s=0.0, decode_s_per_token=1 / rate)
    elif mode == "idle":
        engine = _Engine(step_overhead_s=IDLE_STEP_S, decode_s_per_token=0.0)
    else:
        engine = _Engine(step_overhead_s=0.0, decode_s_per_token=0.0)
    if mode == "peer" or args.against == "peer":

        def command(port: int) -> list[str]:
            return _peer_command(port, engine)

    else:

        def command(port: int) -> list[str]:
            return _sim_command(port, engine, max(args.levels), args.sim_arg, args.sim_entry)

    log = args.out / f"sim_throughput.{mode}.{streams}.{number}.log"
    with _serve(command, args.server_cpu, args.nice, args.realtime, log) as server:
        priority = _priority(server.pid)
        client, cpu, rss, clock, window = _measure(server, args, streams)
    log.unlink(missing_ok=True)
    step = engine.step_s(streams) if (rate is not None or mode == "idle") and streams else None
    return _Run(mode, streams, rate, step, client, cpu, rss, priority, clock, window, args.max_tokens)


# ---------------------------------------------------------------------------------------------
# report


def _cell(values: Sequence[float | None], fmt: str, spread: bool = True) -> str:
    """The median, and the min–max when there are several values."""
    present = [value for value in values if value is not None]
    if not present:
        return "—"
    median = fmt.format(statistics.median(present))
    if not spread or len(present) < 2:
        return median
    return f"{median} ({fmt.format(min(present))}–{fmt.format(max(present))})"


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = [list(header), *map(list, rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for number, row in enumerate(table):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in pairs]
        print("  ".join(cells).rstrip())
        if number == 0:
            print("  ".join("-" * width for width in widths))


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def _gap_ms(run: _Run, key: str) -> float | None:
    return _ms((run.client.get("gap_s") or {}).get(key))


def _thousands(value: float | None) -> float | None:
    return None if value is None else value / 1e3


def _count(runs: Sequence[_Run], test: Callable[[_Run], bool]) -> str:
    return f"{sum(1 for run in runs if test(run))}/{len(runs)}"


def _paced_table(runs: list[_Run], args: argparse.Namespace, rate: float) -> None:
    rows = []
    for streams in args.levels:
        paced = [run for run in runs if run.mode == "paced" and run.streams == streams and run.rate == rate]
        if not paced:
            continue
        rows.append(
            [
                f"{streams:,}",
                _cell([_ms(run.step_s) for run in paced], "{:.1f}", spread=False),
                _cell([run.actual_step_ms for run in paced], "{:.1f}", spread=False),
                _cell([run.chunks_per_s for run in paced], "{:,.0f}"),
                _cell([run.rate_ratio for run in paced], "{:.3f}", spread=False),
                _cell([run.client["requests_per_s"] for run in paced], "{:,.0f}", spread=False),
                _cell([run.server_cpu_percent for run in paced], "{:.0f}"),
                _cell([run.server_us_per_chunk for run in paced], "{:.2f}"),
                _cell([_thousands(run.ceiling_chunks_per_s) for run in paced], "{:.0f}k", spread=False),
                _cell([run.client["cpu_percent"] for run in paced], "{:.0f}", spread=False),
                _cell([run.client_us_per_chunk for run in paced], "{:.1f}", spread=False),
                _cell([_ms(run.clock.lag_s) for run in paced], "{:.2f}", spread=False),
                _cell([_ms(run.clock.lag_max_s) for run in paced], "{:.1f}"),
                _cell([_gap_ms(run, "p50") for run in paced], "{:.1f}", spread=False),
                _cell([_gap_ms(run, "p99") for run in paced], "{:.1f}"),
                _cell([_gap_ms(run, "max") for run in paced], "{:.0f}", spread=False),
                _cell([run.server_rss_mb for run in paced], "{:.0f}", spread=False),
                _count(paced, lambda run: run.kept_up),
                _count(paced, lambda run: run.hiccups),
            ]
        )
    print(
        f"\nPaced at {rate:,.0f} chunks/s: step = N / {rate:,.0f} s at N running sequences. Medians (min–max) of "
        f"{args.repeat} run(s), {args.duration:g} s windows after {args.warmup:g} s of warm-up.\n"
    )
    _print_table(
        [
            "streams",
            "step ms",
            "actual",
            "chunks/s",
            "÷ offered",
            "req/s",
            "srv CPU%",
            "srv µs/chunk",
            "≈ ceiling",
            "cli CPU%",
            "cli µs/chunk",
            "lag mean ms",
            "lag max ms",
            "gap p50",
            "gap p99",
            "gap max",
            "srv MB",
            "kept up",
            "hiccups",
        ],
        rows,
    )


def _peer_table(runs: list[_Run], args: argparse.Namespace) -> None:
    rows = []
    for streams in args.levels:
        sims = [run for run in runs if run.mode == "paced" and run.streams == streams and run.rate == args.rates[0]]
        peers = [run for run in runs if run.mode == "peer" and run.streams == streams]
        if not peers:
            continue
        ratios = [
            sim.server_us_per_chunk / peer.server_us_per_chunk
            for sim, peer in zip(sims, peers, strict=False)
            if sim.server_us_per_chunk and peer.server_us_per_chunk
        ]
        rows.append(
            [
                f"{streams:,}",
                _cell([run.chunks_per_s for run in peers], "{:,.0f}", spread=False),
                _cell([run.server_cpu_percent for run in peers], "{:.0f}"),
                _cell([run.server_us_per_chunk for run in peers], "{:.2f}"),
                _cell([_thousands(run.ceiling_chunks_per_s) for run in peers], "{:.0f}k", spread=False),
                _cell([_gap_ms(run, "p99") for run in peers], "{:.1f}", spread=False),
                _cell([_gap_ms(run, "max") for run in peers], "{:.0f}", spread=False),
                _cell(ratios, "{:.2f}"),
            ]
        )
    if not rows:
        return
    print(
        f"\nPeer, paced alike at {args.rates[0]:,.0f} chunks/s: a minimal step-clocked SSE server (raw protocol, "
        "msgspec, one write per chunk).\nsim ÷ peer: server CPU per chunk, run by run.\n"
    )
    _print_table(
        ["streams", "chunks/s", "CPU%", "µs/chunk", "≈ ceiling", "gap p99", "gap max", "sim ÷ peer µs/chunk"], rows
    )


def _flat_table(runs: list[_Run], args: argparse.Namespace) -> None:
    rows = []
    for streams in args.levels:
        flat = [run for run in runs if run.mode == "flat" and run.streams == streams]
        if not flat:
            continue
        busy = sum(1 for run in flat if run.client["cpu_percent"] >= CLIENT_BOUND_PERCENT)
        rows.append(
            [
                f"{streams:,}",
                _cell([run.chunks_per_s for run in flat], "{:,.0f}"),
                _cell([run.server_cpu_percent for run in flat], "{:.0f}"),
                _cell([run.server_us_per_chunk for run in flat], "{:.2f}", spread=False),
                _cell([run.actual_step_ms for run in flat], "{:.2f}", spread=False),
                _cell([run.client["cpu_percent"] for run in flat], "{:.0f}"),
                _cell([_gap_ms(run, "p50") for run in flat], "{:.1f}", spread=False),
                f"client ≥ {CLIENT_BOUND_PERCENT:.0f}% CPU in {busy} run(s)" if busy else "",
            ]
        )
    if not rows:
        return
    print(
        "\nFlat out: every step-time coefficient 0, steps back to back (the running set swings in waves; the\n"
        "CPU-per-chunk ceiling of the paced runs is the steadier figure).\n"
    )
    _print_table(["streams", "chunks/s", "srv CPU%", "srv µs/chunk", "step ms", "cli CPU%", "gap p50", "note"], rows)


def _idle_table(runs: list[_Run]) -> None:
    rows = []
    for streams in (0, 1):
        chosen = [run for run in runs if run.mode == "idle" and run.streams == streams]
        if chosen:
            rows.append(
                [
                    str(streams),
                    _cell([run.server_cpu_percent for run in chosen], "{:.1f}"),
                    _cell([run.chunks_per_s for run in chosen], "{:.1f}", spread=False),
                    _cell([_gap_ms(run, "p50") for run in chosen], "{:.2f}", spread=False),
                    _cell([_gap_ms(run, "p99") for run in chosen], "{:.2f}", spread=False),
                    _cell([_ms(run.clock.lag_s) for run in chosen], "{:.2f}", spread=False),
                    _cell([run.server_rss_mb for run in chosen], "{:.0f}", spread=False),
                ]
            )
    if rows:
        print(f"\nIdle: the server with no stream, and with 1 stream at a {IDLE_STEP_S * 1e3:.0f} ms step.\n")
        _print_table(["streams", "srv CPU%", "chunks/s", "gap p50 ms", "gap p99 ms", "lag mean ms", "srv MB"], rows)


def _report(runs: list[_Run], args: argparse.Namespace) -> None:
    if not runs:
        print("\nNo run succeeded: nothing to report.")
        return
    some = next((run for run in runs if run.clock.lag_metric or run.clock.steps_metric), None)
    print()
    if some is None:
        print("The server exposes no step-lag or step-count metric on /metrics: the clock verdict rests on the")
        print("client's chunk rate alone (suggested: a per-step lag histogram, agentx_sim_step_lag_seconds).")
    else:
        print(
            f"Server clock metrics: lag = {some.clock.lag_metric or 'none'} ({some.clock.lag_kind or '—'}); "
            f"steps = {some.clock.steps_metric or 'none'}."
        )
    for rate in args.rates:
        _paced_table(runs, args, rate)
    _peer_table(runs, args)
    _flat_table(runs, args)
    _idle_table(runs)

    print()
    targets = f"≥ {TARGET_STREAMS:,} streams and ≥ {TARGET_CHUNKS_PER_S:,.0f} chunks/s, clock kept"
    best: tuple[int, float, bool] | None = None
    for rate in args.rates:
        for streams in args.levels:
            paced = [run for run in runs if run.mode == "paced" and run.streams == streams and run.rate == rate]
            if not paced:
                continue
            chunks = statistics.median(run.chunks_per_s for run in paced)
            kept = 2 * sum(1 for run in paced if run.kept_up) > len(paced)
            hiccups = 2 * sum(1 for run in paced if run.hiccups) > len(paced)
            met = kept and streams >= TARGET_STREAMS and chunks >= TARGET_CHUNKS_PER_S
            if met and (best is None or (streams, chunks) > best[:2]):
                best = (streams, chunks, hiccups)
    if best is None:
        print(f"Targets ({targets}): no paced level met both in most of its runs.")
    else:
        streams, chunks, hiccups = best
        print(
            f"Targets ({targets}): met up to {streams:,} streams at {chunks:,.0f} chunks/s"
            f"{' (with hiccups: some steps late by more than a step)' if hiccups else ''}."
        )
    priorities = ", ".join(sorted({run.server_priority for run in runs}))
    client = f"real-time {args.realtime // 2}" if args.realtime > 1 else f"nice {args.client_nice}"
    print(
        f"Server on core {args.server_cpu} at {priorities}, client on core {args.client_cpu} at {client}; "
        f"load average at the end {os.getloadavg()[0]:.2f}."
    )


# ---------------------------------------------------------------------------------------------
# the peer: a minimal step-clocked SSE server (`--worker-peer PORT OVERHEAD_S PER_TOKEN_S`)


class _Choice(msgspec.Struct):
    index: int
    text: str
    logprobs: None
    finish_reason: str | None
    stop_reason: None


class _Chunk(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[_Choice]


class _PeerRequest(msgspec.Struct):
    max_tokens: int = 16
    model: str = "peer"


class _PeerSeq:
    __slots__ = ("left", "made", "rid", "transport")

    def __init__(self, transport: asyncio.Transport, rid: str, tokens: int) -> None:
        self.transport = transport
        self.rid = rid
        self.left = tokens
        self.made = 0


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
_SSE_END = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


class _Peer:
    def __init__(self, overhead_s: float, per_token_s: float) -> None:
        self.overhead_s = overhead_s
        self.per_token_s = per_token_s
        self.running: list[_PeerSeq] = []
        self.waiting: list[_PeerSeq] = []
        self.wake = asyncio.Event()
        self.requests = 0
        self.steps = 0
        self.lag_s = 0.0
        self.encoder = msgspec.json.Encoder()

    def metrics(self) -> bytes:
        body = (
            f"# TYPE peer_steps_total counter\npeer_steps_total {self.steps}\n"
            f"# TYPE peer_step_lag_seconds gauge\npeer_step_lag_seconds {self.lag_s!r}\n"
        ).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)

    def submit(self, seq: _PeerSeq) -> None:
        self.waiting.append(seq)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        encode = self.encoder.encode
        created = int(time.time())
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                deadline = loop.time()
            self.running.extend(self.waiting)
            self.waiting.clear()
            deadline += self.overhead_s + self.per_token_s * len(self.running)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self.steps += 1
            self.lag_s = max(0.0, loop.time() - deadline)  # late start; a step's own work is not lag
            still: list[_PeerSeq] = []
            for seq in self.running:
                if seq.transport.is_closing():
                    continue
                seq.left -= 1
                seq.made += 1
                last = seq.left <= 0
                choice = _Choice(0, f" t{seq.made}", None, "length" if last else None, None)
                payload = b"data: " + encode(_Chunk(seq.rid, "text_completion", created, "peer", [choice])) + b"\n\n"
                frame = b"%x\r\n%b\r\n" % (len(payload), payload)
                seq.transport.write(frame + _SSE_END if last else frame)
                if not last:
                    still.append(seq)
            self.running = still


class _PeerProtocol(asyncio.Protocol):
    def __init__(self, peer: _Peer) -> None:
        self.peer = peer
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
                request = msgspec.json.decode(body, type=_PeerRequest)
                self.peer.requests += 1
                self.transport.write(_SSE_HEAD)
                self.peer.submit(_PeerSeq(self.transport, f"cmpl-{self.peer.requests}", request.max_tokens))
            elif head.startswith(b"get /metrics"):
                self.transport.write(self.peer.metrics())
            else:
                self.transport.write(_JSON_OK)


def _serve_peer(port: int, overhead_s: float, per_token_s: float) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        peer = _Peer(overhead_s, per_token_s)
        server = await loop.create_server(lambda: _PeerProtocol(peer), HOST, port, backlog=4096)
        async with server:
            await peer.run()

    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())


# ---------------------------------------------------------------------------------------------
# main


def _numbers(text: str) -> list[int]:
    return sorted({int(float(part)) for part in text.split(",") if part.strip()})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run: 2 levels, 1 run each, short windows")
    parser.add_argument("--levels", type=_numbers, help="concurrency levels (default 250,500,1000,2000,4000)")
    parser.add_argument("--rates", type=_numbers, help="chunks/s the paced step model offers (default 60000)")
    parser.add_argument("--repeat", type=int, help="runs of each figure (default 3; 1 with --quick)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up after connecting (default 3)")
    parser.add_argument("--duration", type=float, help="seconds of each measurement window (default 8)")
    parser.add_argument("--flat", action="store_true", help="also run the sim flat out (steps back to back)")
    parser.add_argument("--no-peer", dest="peer", action="store_false", help="skip the peer server")
    parser.add_argument("--no-idle", dest="idle", action="store_false", help="skip the idle runs")
    parser.add_argument(
        "--against", choices=["sim", "peer"], default="sim", help="the server under test (peer: check the harness)"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--model", default="agentx-sim")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--nice", type=int, default=-10, help="the server's priority, if permitted (default -10)")
    parser.add_argument("--client-nice", type=int, default=-5, help="the client's, if permitted (default -5)")
    parser.add_argument(
        "--realtime",
        type=int,
        default=0,
        metavar="P",
        help="run the server at real-time round-robin priority P and the client at P/2 (shields both from other "
        "processes on a shared machine; the kernel still keeps 5%% of each core for the rest)",
    )
    parser.add_argument(
        "--sim-arg", action="append", default=[], help="an extra argument for `agentx sim`, e.g. --sim-arg=--seed=3"
    )
    parser.add_argument("--sim-entry", type=Path, help="run this script (given `sim ...`) instead of -m agentx.cli")
    parser.add_argument("--out", type=Path, default=BENCH / "out", help="where server logs go (kept on failure)")
    parser.add_argument("--worker-peer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_peer:
        port, overhead, per_token = args.worker_peer
        _serve_peer(int(port), float(overhead), float(per_token))
        return
    args.levels = args.levels or ([500, 2_000] if args.quick else [250, 500, 1_000, 2_000, 4_000])
    args.rates = args.rates or [60_000]
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 3.0)
    args.duration = args.duration if args.duration is not None else (4.0 if args.quick else 8.0)
    os.sched_setaffinity(0, {args.client_cpu})

    plan: list[tuple[str, int, float | None]] = []
    for streams in args.levels:
        plan += [("paced", streams, rate) for rate in args.rates]
        if args.peer and args.against == "sim":
            plan.append(("peer", streams, args.rates[0]))
        if args.flat:
            plan.append(("flat", streams, None))
    if args.idle:
        plan += [("idle", 0, None), ("idle", 1, None)]
    print(
        f"{len(plan) * args.repeat} runs against {args.against}: {len(plan)} × {args.repeat}, interleaved; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: list[_Run] = []
    started = time.monotonic()
    for number in range(args.repeat):
        for mode, streams, rate in plan:
            try:
                run = _run(args, mode, streams, rate, number)
            except RuntimeError as exc:
                print(f"  run {number + 1} {mode} {streams}: failed: {exc}", flush=True)
                continue
            runs.append(run)
            ratio = run.rate_ratio
            lag = run.clock.lag_max_s if run.step_s else None
            print(
                f"  run {number + 1}/{args.repeat} {mode:5} {streams:>5,} streams"
                f"{f' at {rate:,.0f}/s' if rate else ''}: {run.chunks_per_s:>9,.0f} chunks/s"
                f"{f' ({ratio:.3f} of offered)' if ratio else ''}, server CPU {run.server_cpu_percent:.0f}%, "
                f"client CPU {run.client['cpu_percent']:.0f}%"
                f"{f', lag max {lag * 1e3:.1f} ms' if lag is not None else ''}"
                f"{', errors ' + str(run.client['errors']) if run.client['errors'] else ''}",
                flush=True,
            )
    print(f"({time.monotonic() - started:.0f} s)")
    _report(runs, args)


if __name__ == "__main__":
    main()
