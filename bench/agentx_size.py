"""Setup D: AgentX-size requests (bench/README.md): what `agentx replay` costs per request, and how honest its timing
stays, when each request carries ~80k prompt tokens and resends a history it sent a moment ago.

The trace is generated (`agentx.synth` with a session model tuned to the Weka traces' statistics: mean `in` ~80k
tokens, p90 ~144k, mean `out` ~540; the project cannot ship real traces) and checked against the public Weka sample
when `../shared/data/weka-sample` is present (its statistics are printed beside the generated ones).

A fast mock server, kept in this file (raw asyncio protocol on uvloop), pinned to core 0 at nice −5, answers
`/v1/completions` and `/v1/chat/completions` with a TTFT of 20 ms and 2 ms a token, `--tokens-per-chunk` tokens a
chunk (4 by default, as speculative decoding sends them), usage in every chunk. Like a batching engine, it steps:
every `tokens-per-chunk` × 2 ms, each running stream gets its next chunk, so a step's chunks leave together. It serves
`/tokenize` and `/detokenize` with the simulator's tokenizer for the chat calibration. It logs, per request, on the
wall clock: when the request's first byte arrived, when its body was complete, when it wrote its first and last chunk,
with its `X-Request-ID` and `X-Correlation-ID` (`GET /log`).

Each run is `agentx replay` through the command line (or agentx-harness 1.0.12's `agentx profile` when `--harness` and
its venv, `.venv-harness`, are there), and the bench samples the client's process tree (CPU from /proc, every 0.2 s)
while it runs. Modes:

- *closed*: `--mode closed --concurrency 16 --delay-scale 0` over windows of 24 consecutive turns of the generated
  sessions (each resumed mid-conversation, as AgentX resumes a lane at its t*, so that contexts are AgentX-size from
  the first request on): 16 lanes, no think time, every lane due at the start;
- *rate*: `--mode rate --rate R --delay-scale 0` over windows of 8 consecutive turns of the same sessions (a session
  arrives mid-conversation, with the context it had there), so that ~R × 7 requests a second (15 sessions/s: ~105
  requests/s) reach a steady state within ~9 s; its window starts 12 s after the first request.

Figures, each beside its target (never a failure):

- client CPU per request over the active window (from the first request + 5 s to the last request sent), and over the
  whole life (process start to exit, ÷ every request); CPU seconds per million input tokens (the window's);
- event-loop lag p99 (run.json: how late a 100 ms timer fired);
- dispatch lag p99 as agentx stamps it (records: sent − due), and as the server sees it: due → the request's first
  byte at the server (the record's due time on the wall clock through run.json's epoch), and a response's end → the
  same agent session's next request (the server's clock only);
- the spread of the requests due together at the start (closed: the first 16 at the server, last − first) and how
  late the last of them arrived after the run's origin;
- peak RSS (`VmHWM`) of the client's main process, and of its whole tree for `--workers`.

Usage: .venv/bin/python bench/agentx_size.py [--modes closed,rate] [--apis completions,chat] [--repeat 2]
           [--duration 40] [--rate 15] [--workers 1,2] [--harness] [--tokens-per-chunk 4] [--out bench/out/setup_d]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_throughput import HOST, _cpu_s, _free_port, _pin_and_raise  # a sibling script, not a package

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WEKA_SAMPLE = ROOT.parent / "shared" / "data" / "weka-sample"
MODEL = "mock"
SESSIONS = 40
SEED = 1_733
LANES = 16
TTFT_S = 0.020
ITL_S = 0.002
CLOSED_TURNS = 24
"""Closed mode: each session is this many consecutive turns of a generated one, resumed mid-conversation (as AgentX
resumes a lane's first session at its t*), so that requests carry AgentX-size contexts from the first second."""
RATE_TURNS = 8
"""Rate mode: each arriving session is this many consecutive turns of a generated one."""
WARMUP_S = 5.0
"""The active window starts this long after the first request reached the server."""
RATE_WARMUP_S = 12.0
"""Rate mode: sessions of 8 turns take ~9 s, so the requests in flight reach their steady state after that."""
SAMPLE_S = 0.2
MOCK_CPU = 0
MOCK_NICE = -5
CLIENT_CPU = 1
"""One process of agentx runs on the other core, as setups A–C run it; `--workers`, the harness and the floor get both
cores (the mock's has its priority)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

TARGET_CPU_MS = 2.0
TARGET_LOOP_LAG_MS = 5.0
TARGET_GAP_P99_MS = 10.0
TARGET_FIRST_SPREAD_MS = 20.0
TARGET_RSS_MB = 200.0
TARGET_RATE_RPS = 100.0
TARGET_RATE_LAG_P99_MS = 5.0
FLOOR_PROMPT_TOKENS = 80_000
FLOOR_OUT_TOKENS = 540
"""The floor client's requests: setup D's mean sizes."""
HARNESS_CPU_RATIO = 70.0
"""The client's CPU per request must be at most 1/70 of the harness's measured in the same run."""


# ---------------------------------------------------------------------------------------------
# the trace


def setup_d_trace(sessions: int = SESSIONS, seed: int = SEED) -> Any:
    """`sessions` Claude-Code-like sessions at AgentX sizes: `agentx.synth`'s agentic-coding preset with longer root
    agents (median 60 requests), ~1,700 tokens added a turn, compaction at ~165k tokens, outputs of median 370, and
    subagents on 1% of turns, which puts the requests' `in` and `out` where the Weka traces have theirs."""
    from agentx.synth.dist import Dist
    from agentx.synth.generation import generate
    from agentx.synth.presets import agentic_coding

    model = agentic_coding()
    profile = model.profiles[0]
    root = msgspec.structs.replace(
        profile.root,
        requests=Dist.lognormal(60, 0.6, low=20, high=400),
        added_tokens=Dist.lognormal(1_700, 1.3, low=32, high=60_000),
        out_tokens=Dist.lognormal(370, 1.0, low=1, high=32_000),
        compact_at_tokens=165_000,
    )
    profile = msgspec.structs.replace(profile, root=root, weight=1.0, spawn_share=0.01)
    return generate(msgspec.structs.replace(model, profiles=(profile,)), sessions=sessions, seed=seed, scope="session")


def turn_windows(trace: Any, turns: int) -> Any:
    """Each root agent's requests cut into sessions of `turns` consecutive requests, each keeping its whole context
    (its first request's ids absolute), subagents left out: sessions that start mid-conversation."""
    from agentx.trace.model import Agent, Session

    windows = []
    for session in trace.sessions:
        requests = list(session.root.requests)
        full_ids = list(session.root.iter_hash_ids())
        for start in range(0, len(requests), turns):
            part = requests[start : start + turns]
            origin = part[0].t
            rebased = [
                msgspec.structs.replace(
                    request,
                    t=request.t - origin,
                    hash_ids_kept=0 if k == 0 else request.hash_ids_kept,
                    hash_ids_added=tuple(full_ids[start]) if k == 0 else request.hash_ids_added,
                )
                for k, request in enumerate(part)
            ]
            root = Agent(
                requests=rebased, tool_tokens=session.root.tool_tokens, system_tokens=session.root.system_tokens
            )
            windows.append(Session(session_id=f"{session.session_id}@{start}", root=root))
    return msgspec.structs.replace(trace, sessions=windows)


def trace_figures(trace: Any) -> dict[str, float]:
    ins: list[int] = []
    outs: list[int] = []
    subagents = 0
    for session in trace.sessions:
        for agent, _, depth in session.agents():
            subagents += depth > 0
            for request in agent.requests:
                ins.append(request.in_tokens)
                outs.append(request.out_tokens)
    ins.sort()
    return {
        "sessions": len(trace.sessions),
        "requests": len(ins),
        "subagents": subagents,
        "in_mean": statistics.fmean(ins),
        "in_p50": ins[len(ins) // 2],
        "in_p90": ins[int(0.9 * len(ins))],
        "out_mean": statistics.fmean(outs),
    }


def _print_trace_figures(trace: Any, closed_trace: Any, rate_trace: Any) -> None:
    rows = [
        ("generated (setup D)", trace_figures(trace)),
        (f"closed: windows of {CLOSED_TURNS} turns", trace_figures(closed_trace)),
        (f"rate: windows of {RATE_TURNS} turns", trace_figures(rate_trace)),
    ]
    if WEKA_SAMPLE.is_dir():
        from agentx.trace.io import load_trace
        from agentx.trace.model import Trace

        loaded = [load_trace(path) for path in sorted(WEKA_SAMPLE.glob("*.json"))]
        sample = Trace(sessions=[s for t in loaded for s in t.sessions], block_size=loaded[0].block_size)
        rows.append((f"Weka sample ({WEKA_SAMPLE.name}, real)", trace_figures(sample)))
    else:
        print(f"(the real Weka sample is not at {WEKA_SAMPLE}: the generator is not checked against it)")
    header = ("sessions", "requests", "subagents", "in mean", "in p50", "in p90", "out mean")
    print(f"{'trace':<34}" + "".join(f"{name:>10}" for name in header))
    for name, f in rows:
        print(
            f"{name:<34}{f['sessions']:>10,}{f['requests']:>10,}{f['subagents']:>10,}{f['in_mean']:>10,.0f}"
            f"{f['in_p50']:>10,}{f['in_p90']:>10,}{f['out_mean']:>10,.0f}"
        )
    print()


# ---------------------------------------------------------------------------------------------
# the mock server (`--worker-mock JSON`)


_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_DONE = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
_MAX_TOKENS = re.compile(rb'"max(?:_completion)?_tokens":(\d+)')
_PROMPT_IDS = re.compile(rb'"prompt":\[')


def _frame(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(data), data)


class _MockLog(msgspec.Struct, array_like=True):
    request_id: str
    correlation_id: str
    first_byte_ns: int
    received_ns: int
    first_chunk_ns: int
    end_ns: int
    prompt_tokens: int
    body_bytes: int


class _Mock:
    """The mock's state, and its step clock: like a batching engine, it writes one chunk to every running stream each
    step (`tokens_per_chunk` × `itl_s`), so the chunks of a step's streams leave together, as a real server's do."""

    def __init__(self, ttft_s: float, itl_s: float, tokens_per_chunk: int) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.tokens_per_chunk = tokens_per_chunk
        self.step_s = tokens_per_chunk * itl_s
        self.log: list[_MockLog] = []
        self.requests = 0
        self.chunks = 0
        self.running: list[_Stream] = []
        self._next_step = 0.0
        self._tokenizer: Any = None

    def admit(self, stream: _Stream) -> None:
        """`stream`'s TTFT has passed: its first chunk now, the next ones with every step."""
        if stream.transport.is_closing():
            return
        stream.emit()
        if stream.left > 0:
            self.running.append(stream)
            if len(self.running) == 1:
                loop = asyncio.get_running_loop()
                self._next_step = loop.time() + self.step_s
                loop.call_at(self._next_step, self.step)

    def step(self) -> None:
        self.running = [stream for stream in self.running if not stream.transport.is_closing() and stream.emit()]
        if self.running:
            self._next_step += self.step_s
            asyncio.get_running_loop().call_at(self._next_step, self.step)

    def calibration(self, path: str, body: bytes) -> bytes:
        """`/tokenize` and `/detokenize` with the simulator's tokenizer: the chat calibration's only need."""
        from agentx.sim import protocol
        from agentx.sim.engine.config import EngineConfig
        from agentx.sim.tokenizer import get_tokenizer

        if self._tokenizer is None:
            self._tokenizer = (EngineConfig(model_name=MODEL, max_model_len=1 << 20), get_tokenizer(32_000))
        config, tokenizer = self._tokenizer
        handler = protocol.tokenize if path == "/tokenize" else protocol.detokenize
        return handler(body, config=config, tokenizer=tokenizer)


class _Stream:
    __slots__ = ("chat", "head", "left", "log", "made", "mock", "prompt", "transport")

    def __init__(self, mock: _Mock, transport: asyncio.Transport, chat: bool, tokens: int, log: _MockLog) -> None:
        self.mock = mock
        self.transport = transport
        self.chat = chat
        self.left = tokens
        self.made = 0
        self.log = log
        self.prompt = log.prompt_tokens
        kind = b"chat.completion.chunk" if chat else b"text_completion"
        self.head = b'{"id":"x-%d","object":"%b","created":0,"model":"mock","choices":[' % (mock.requests, kind)
        asyncio.get_running_loop().call_later(mock.ttft_s, mock.admit, self)

    def _choice(self, text: bytes, finish: bytes) -> bytes:
        if self.chat:
            return b'{"index":0,"delta":{"content":"%b"},"finish_reason":%b}' % (text, finish)
        return b'{"index":0,"text":"%b","logprobs":null,"finish_reason":%b}' % (text, finish)

    def _usage(self) -> bytes:
        return b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            self.prompt,
            self.made,
            self.prompt + self.made,
        )

    def emit(self) -> bool:
        """Write the next chunk (the last with the usage chunk and [DONE]); whether more are to come."""
        tokens = min(self.mock.tokens_per_chunk, self.left)
        self.made += tokens
        self.left -= tokens
        self.mock.chunks += 1
        last = self.left <= 0
        choice = self._choice(b" t" * tokens, b'"length"' if last else b"null")
        out = _frame(self.head + choice + b'],"usage":' + self._usage() + b"}")
        if self.made == tokens:
            self.log.first_chunk_ns = time.time_ns()
        if last:
            out += _frame(self.head + b'],"usage":' + self._usage() + b"}") + _DONE
        self.transport.write(out)
        if last:
            self.log.end_ns = time.time_ns()
            self.mock.log.append(self.log)
        return not last


class _MockProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (agentx and the harness do not pipeline). A body is
    gathered in a bytearray (amortized copies) and only its tail is looked at, plus a count for the usage."""

    def __init__(self, mock: _Mock) -> None:
        self.mock = mock
        self.head = bytearray()
        self.body = bytearray()
        self.body_left: int | None = None
        self.first_byte_ns = 0
        self.request_line = b""
        self.headers: dict[bytes, bytes] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        view = memoryview(data)
        while len(view):
            if self.body_left is None:
                if not self.head:
                    self.first_byte_ns = now
                self.head += view
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = bytes(self.head[:end]).split(b"\r\n")
                rest = bytes(self.head[end + 4 :])
                self.head = bytearray()
                self.request_line = lines[0]
                self.headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    self.headers[name.strip().lower()] = value.strip()
                self.body_left = int(self.headers.get(b"content-length", b"0"))
                self.body = bytearray()
                view = memoryview(rest)
            take = min(self.body_left, len(view))
            self.body += view[:take]
            view = view[take:]
            self.body_left -= take
            if self.body_left == 0:
                self.body_left = None
                self._answer(now)

    def _answer(self, now: int) -> None:
        assert self.transport is not None
        method, path, _ = self.request_line.decode("latin-1").split(" ", 2)
        body = bytes(self.body)
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.mock.requests += 1
            chat = path == "/v1/chat/completions"
            found = None
            for match in _MAX_TOKENS.finditer(body, max(0, len(body) - 1024)):
                found = match
            if found is None:
                found = _MAX_TOKENS.search(body)
            tokens = int(found.group(1)) if found is not None else 16
            if chat:
                prompt = body.count(b" ")
            else:
                start = _PROMPT_IDS.search(body)
                prompt = 0 if start is None else body.count(b",", start.end(), body.find(b"]", start.end())) + 1
            log = _MockLog(
                self.headers.get(b"x-request-id", b"").decode(),
                self.headers.get(b"x-correlation-id", b"").decode(),
                self.first_byte_ns,
                now,
                0,
                0,
                prompt,
                len(body),
            )
            self.transport.write(_SSE_HEAD)
            _Stream(self.mock, self.transport, chat, tokens, log)
        elif method == "POST" and path in ("/tokenize", "/detokenize"):
            from agentx.sim.protocol import ClientError

            try:
                self._json(self.mock.calibration(path, body))
            except ClientError as exc:
                self._json(msgspec.json.encode({"error": {"message": exc.message}}), b"400 Bad Request")
        elif path.startswith("/log"):
            payload = msgspec.json.encode(self.mock.log)
            self.mock.log = []
            self._json(payload)
        elif path.startswith("/stats"):
            self._json(b'{"requests":%d,"chunks":%d}' % (self.mock.requests, self.mock.chunks))
        else:
            self._json(
                msgspec.json.encode(
                    {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1 << 20}]}
                )
            )

    def _json(self, payload: bytes, status: bytes = b"200 OK") -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
            % (status, len(payload), payload)
        )


def _serve_mock(spec: dict[str, Any]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        mock = _Mock(spec["ttft_s"], spec["itl_s"], spec["tokens_per_chunk"])
        server = await loop.create_server(lambda: _MockProtocol(mock), HOST, spec["port"], backlog=4096)
        async with server:
            await server.serve_forever()

    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())


# ---------------------------------------------------------------------------------------------
# one run


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            parents.setdefault(found[0], []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, ()))
    return tree


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class _Sampler(threading.Thread):
    """The client tree's CPU (live processes, plus what exited children left in their parents' counts) and peak RSS,
    every `SAMPLE_S`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[int, float]] = []
        self.peaks: dict[int, float] = {}
        self.stop = threading.Event()
        self._seen: dict[int, float] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in _tree(self.pid):
                found = _stat(pid)
                if found is None:
                    continue
                self._seen[pid] = found[1]
                if (hwm := _vm_hwm_mb(pid)) is not None:
                    self.peaks[pid] = max(self.peaks.get(pid, 0.0), hwm)
            # A child that exited keeps its last count (its CPU is not lost from the sum).
            total = sum(self._seen.values())
            self.samples.append((time.time_ns(), total))
            self.stop.wait(SAMPLE_S)

    def cpu_at(self, wall_ns: int) -> float:
        """The tree's CPU at `wall_ns`, interpolated between the samples around it."""
        samples = self.samples
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            if t0 <= wall_ns <= t1:
                return c0 + (c1 - c0) * (wall_ns - t0) / max(1, t1 - t0)
        return samples[0][1] if wall_ns < samples[0][0] else samples[-1][1]


@dataclass
class _Run:
    client: str
    mode: str
    api: str
    workers: int
    figures: dict[str, float | None] = field(default_factory=dict)
    note: str = ""


def _agentx_command(
    args: argparse.Namespace, mode: str, api: str, workers: int, trace: Path, url: str, out: Path
) -> list[str]:
    load = (
        ["--mode", "closed", "--concurrency", str(LANES)]
        if mode == "closed"
        else ["--mode", "rate", "--rate", str(args.rate), "--session-order", "sequential"]
    )
    return [
        str(ROOT / ".venv" / "bin" / "agentx"), "replay", str(trace),
        "--url", url, "--model", MODEL, "--api", api,
        *load,
        "--delay-scale", "0", "--duration", str(args.duration), "--grace", "5",
        *(["--workers", str(workers)] if workers > 1 else []),
        "--out", str(out), "--overwrite",
    ]  # fmt: skip


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def _run(args: argparse.Namespace, mode: str, api: str, workers: int, client: str, traces: dict[str, Path]) -> _Run:
    port = _free_port()
    url = f"http://{HOST}:{port}"
    spec = {"port": port, "ttft_s": TTFT_S, "itl_s": ITL_S, "tokens_per_chunk": args.tokens_per_chunk}
    mock = subprocess.Popen(
        [sys.executable, __file__, "--worker-mock", json.dumps(spec)],
        preexec_fn=_pin_and_raise(MOCK_CPU, MOCK_NICE),
    )
    run = _Run(client, mode, api, workers)
    out = args.out / f"{client}-{mode}-{api}-w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                _get(f"{url}/v1/models")
                break
            time.sleep(0.05)
        mock_cpu_before = _cpu_s(mock.pid)
        trace = traces[mode]
        if client == "floor":
            return _floor(args, run, port)
        if client == "agentx":
            command = _agentx_command(args, mode, api, workers, trace, url, out)
            env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        else:
            command, env = _harness_command(args, mode, traces["harness"], url, out)
        out.parent.mkdir(parents=True, exist_ok=True)
        console = open(out.parent / f"{out.name}.console.txt", "w")  # noqa: SIM115 (closed below)
        pin = (lambda: os.sched_setaffinity(0, {CLIENT_CPU})) if client == "agentx" and workers == 1 else None
        process = subprocess.Popen(command, stdout=console, stderr=subprocess.STDOUT, env=env, preexec_fn=pin)
        sampler = _Sampler(process.pid)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        sampler.stop.set()
        sampler.join()
        console.close()
        mock_cpu_s = _cpu_s(mock.pid) - mock_cpu_before
        log = [msgspec.convert(row, _MockLog) for row in _get(f"{url}/log")]
        whole_cpu_s = usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status) not in (0, 130):
            run.note = f"exit {os.waitstatus_to_exitcode(status)} (see {out.parent / (out.name + '.console.txt')})"
        run.figures = _figures(run, log, sampler, whole_cpu_s, mock_cpu_s, out)
        run.figures["main_rss_mb"] = sampler.peaks.get(process.pid)
        run.figures["tree_rss_mb"] = sum(sampler.peaks.values())
    finally:
        mock.terminate()
        mock.wait()
    return run


def _floor(args: argparse.Namespace, run: _Run, port: int) -> _Run:
    """The floor: bench/loadgen.py, a raw uvloop client that sends one prebuilt body per connection again and again
    (`FLOOR_PROMPT_TOKENS` token ids: a setup D-size body) and counts the stream's events. What it costs a request is
    what moving the bytes and reading the chunks costs, with nothing built or recorded."""
    command = [
        sys.executable, str(BENCH / "loadgen.py"), "--port", str(port), "--streams", str(LANES),
        "--prompt-tokens", str(FLOOR_PROMPT_TOKENS), "--max-tokens", str(FLOOR_OUT_TOKENS), "--no-stagger",
        "--warmup", str(WARMUP_S), "--duration", str(max(5.0, args.duration - WARMUP_S)),
    ]  # fmt: skip
    answer = subprocess.run(command, capture_output=True, text=True, check=False)
    found = json.loads(answer.stdout.strip().splitlines()[-1]) if answer.returncode == 0 else {}
    if not found:
        run.note = f"loadgen failed: {answer.stderr.strip()[-300:]}"
        return run
    requests = found["requests"]
    run.figures = {
        "requests": requests,
        "window_requests": requests,
        "window_s": found["window_s"],
        "rps": found["requests_per_s"],
        "in_tokens_mean": FLOOR_PROMPT_TOKENS,
        "cpu_ms_per_request": 1e3 * found["cpu_s"] / requests if requests else None,
        "cpu_s_per_m_tokens": found["cpu_s"] / (requests * FLOOR_PROMPT_TOKENS / 1e6) if requests else None,
        "client_cpu_percent": found["cpu_percent"],
    }
    return run


def _figures(
    run: _Run, log: list[_MockLog], sampler: _Sampler, whole_cpu_s: float, mock_cpu_s: float, out: Path
) -> dict[str, float | None]:
    log = [row for row in log if row.request_id or row.correlation_id]  # replay requests, not the probes
    log.sort(key=lambda row: row.first_byte_ns)
    figures: dict[str, float | None] = {"requests": len(log)}
    if not log:
        return figures
    w0 = log[0].first_byte_ns + int((WARMUP_S if run.mode == "closed" else RATE_WARMUP_S) * 1e9)
    w1 = log[-1].first_byte_ns
    window = [row for row in log if w0 <= row.first_byte_ns <= w1]
    span_s = (w1 - w0) / 1e9
    cpu_s = sampler.cpu_at(w1) - sampler.cpu_at(w0)
    figures["window_s"] = span_s
    figures["window_requests"] = len(window)
    figures["rps"] = len(window) / span_s if span_s > 0 else None
    figures["cpu_ms_per_request"] = 1e3 * cpu_s / len(window) if window else None
    figures["whole_cpu_ms_per_request"] = 1e3 * whole_cpu_s / len(log)
    figures["client_cpu_percent"] = 100 * cpu_s / span_s if span_s > 0 else None
    figures["mock_cpu_percent"] = 100 * mock_cpu_s / ((log[-1].end_ns - log[0].first_byte_ns) / 1e9)
    # A response's end → the same agent session's next request, on the server's clock.
    by_session: dict[str, list[_MockLog]] = {}
    for row in log:
        by_session.setdefault(row.correlation_id, []).append(row)
    gaps = [
        (later.first_byte_ns - earlier.end_ns) / 1e6
        for rows in by_session.values()
        for earlier, later in itertools.pairwise(rows)
        if earlier.end_ns and w0 <= later.first_byte_ns
    ]
    figures["gap_p50_ms"] = _percentile(gaps, 50)
    figures["gap_p99_ms"] = _percentile(gaps, 99)
    if run.mode == "closed":  # the lanes' first requests are due together
        first = log[:LANES]
        figures["first_spread_ms"] = (first[-1].first_byte_ns - first[0].first_byte_ns) / 1e6
    figures["body_kb"] = statistics.fmean(row.body_bytes for row in log) / 1e3
    if run.client == "agentx":
        _agentx_figures(figures, log, window, cpu_s, out)
    return figures


def _agentx_figures(
    figures: dict[str, float | None], log: list[_MockLog], window: list[_MockLog], cpu_s: float, out: Path
) -> None:
    from agentx.records.record import read_records, run_info

    records = out / "records.arrow"
    if not records.exists():
        return
    table = read_records(records)
    epoch_ns = run_info(table).wall_epoch_ns
    rows = table.select(["request_id", "scheduled_ns", "sent_ns", "isl_sent_tokens", "phase"]).to_pylist()
    by_id = {row["request_id"]: row for row in rows}
    origin_ns = epoch_ns + min(row["scheduled_ns"] for row in rows)
    tokens = sum(by_id[row.request_id]["isl_sent_tokens"] for row in window if row.request_id in by_id)
    figures["cpu_s_per_m_tokens"] = cpu_s / (tokens / 1e6) if tokens else None
    figures["in_tokens_mean"] = tokens / len(window) if window else None
    ordered = sorted(rows, key=lambda row: row["scheduled_ns"])
    later = ordered[LANES:]
    figures["agentx_lag_p99_ms"] = _percentile([(r["sent_ns"] - r["scheduled_ns"]) / 1e6 for r in later], 99)
    served: list[float] = []
    firsts: list[float] = []
    late = {row["request_id"] for row in ordered[:LANES]}
    for row in log:
        record = by_id.get(row.request_id)
        if record is None:
            continue
        lag_ms = (row.first_byte_ns - (epoch_ns + record["scheduled_ns"])) / 1e6
        (firsts if row.request_id in late else served).append(lag_ms)
    figures["server_lag_p50_ms"] = _percentile(served, 50)
    figures["server_lag_p99_ms"] = _percentile(served, 99)
    if figures.get("first_spread_ms") is not None:
        figures["first_last_late_ms"] = (log[min(LANES, len(log)) - 1].first_byte_ns - origin_ns) / 1e6
    run_json = out / "run.json"
    if run_json.exists():
        summary = json.loads(run_json.read_text()).get("summary") or {}
        loop_lag = summary.get("loop_lag") or {}
        figures["loop_lag_p99_ms"] = 1e3 * loop_lag["p99_s"] if "p99_s" in loop_lag else None


# ---------------------------------------------------------------------------------------------
# agentx-harness 1.0.12 (optional)


HARNESS = ROOT / ".venv-harness" / "bin" / "agentx"


def _harness_command(
    args: argparse.Namespace, mode: str, traces: Path, url: str, out: Path
) -> tuple[list[str], dict[str, str]]:
    """The harness's `agentx profile` on the same sessions, as Weka traces whose turns follow one another without a
    gap (its scenario has no closed mode; with no recorded gap it waits none), chat, 16 lanes."""
    sys.path.insert(0, str(ROOT / "reference_tests"))
    import wordtok  # the reference suite's offline word-level tokenizer

    tokenizer_dir = args.out / "tokenizer"
    hf_home = args.out / "hf"
    if not (tokenizer_dir / "tokenizer.json").exists():
        wordtok.build_tokenizer(tokenizer_dir, [ROOT / ".venv-harness" / "bin" / "python"], [0])
    repo = wordtok.install_in_hf_cache(tokenizer_dir, hf_home)
    command = [
        str(HARNESS), "profile",
        "--model", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--custom-dataset-type", "weka_trace", "--input-file", str(traces),
        "--unsafe-override", "--concurrency", str(LANES),
        "--benchmark-duration", str(args.duration), "--benchmark-grace-period", "5",
        "--tokenizer", repo, "--use-server-token-count",
        "--artifact-dir", str(out), "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "AIPERF_DATASET_MMAP_CACHE_ENABLED": "false",
        "AIPERF_DATASET_MMAP_BASE_PATH": str(out.parent),
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
    return command, env


def _weka_without_gaps(trace: Any, folder: Path) -> Path:
    """The trace as one Weka JSON file per session, each turn starting as the one before ended (no think time)."""
    from agentx.trace.io import save_trace

    folder.mkdir(parents=True, exist_ok=True)
    gapless = []
    for session in trace.sessions:
        t = 0.0
        requests = []
        for request in session.root.requests:
            api = request.api_time or 1.0
            requests.append(msgspec.structs.replace(request, t=t, think_time=0.0, api_time=api))
            t += api
        root = msgspec.structs.replace(session.root, requests=requests, subagents=[])
        gapless.append(msgspec.structs.replace(session, root=root))
    for session in gapless:
        save_trace(msgspec.structs.replace(trace, sessions=[session]), folder / f"{session.session_id}.json")
    return folder


# ---------------------------------------------------------------------------------------------
# the tables


def _cell(values: Sequence[float | None], fmt: str) -> str:
    found = [value for value in values if value is not None and not math.isnan(value)]
    if not found:
        return "—"
    if len(found) == 1:
        return format(found[0], fmt)
    return f"{format(min(found), fmt)}–{format(max(found), fmt)}"


ROWS: list[tuple[str, str, str, str]] = [
    ("requests in the window (req/s)", "window_requests", ",.0f", ""),
    ("req/s", "rps", ".1f", ""),
    ("mean input tokens a request", "in_tokens_mean", ",.0f", ""),
    ("mean body KB", "body_kb", ",.0f", ""),
    ("client CPU ms / request, window", "cpu_ms_per_request", ".2f", f"≤ {TARGET_CPU_MS:g}"),
    ("client CPU ms / request, whole life", "whole_cpu_ms_per_request", ".2f", ""),
    ("client CPU s / M input tokens", "cpu_s_per_m_tokens", ".3f", ""),
    ("client CPU %", "client_cpu_percent", ".1f", ""),
    ("event-loop lag p99 ms", "loop_lag_p99_ms", ".1f", f"≤ {TARGET_LOOP_LAG_MS:g}"),
    ("dispatch lag p99 ms, agentx's stamp", "agentx_lag_p99_ms", ".2f", ""),
    ("due → server first byte p50 ms", "server_lag_p50_ms", ".2f", ""),
    ("due → server first byte p99 ms", "server_lag_p99_ms", ".2f", ""),
    ("end → same session's next p50 ms", "gap_p50_ms", ".2f", ""),
    ("end → same session's next p99 ms", "gap_p99_ms", ".2f", f"≤ {TARGET_GAP_P99_MS:g}"),
    ("first 16 at the server: spread ms", "first_spread_ms", ".1f", f"≤ {TARGET_FIRST_SPREAD_MS:g}"),
    ("first 16: last after the origin ms", "first_last_late_ms", ".1f", ""),
    ("peak RSS MB, main process", "main_rss_mb", ".0f", f"≤ {TARGET_RSS_MB:g}"),
    ("peak RSS MB, process tree", "tree_rss_mb", ".0f", ""),
    ("mock CPU %", "mock_cpu_percent", ".1f", ""),
]


def _print_table(title: str, runs: list[_Run]) -> None:
    columns: dict[str, list[_Run]] = {}
    for run in runs:
        name = (
            run.client
            if run.client != "agentx"
            else f"agentx {run.api}" + (f" w{run.workers}" if run.workers > 1 else "")
        )
        columns.setdefault(name, []).append(run)
    print(f"\n{title}")
    header = ["figure", *columns, "target"]
    rows = [
        [label, *(_cell([r.figures.get(key) for r in group], fmt) for group in columns.values()), target]
        for label, key, fmt, target in ROWS
    ]
    rows = [row for row in rows if any(cell != "—" for cell in row[1:-1])]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
    for name, group in columns.items():
        for run in group:
            if run.note:
                print(f"  {name}: {run.note}")
    if "floor" in columns:
        print(
            "  floor: bench/loadgen.py, one prebuilt 80k-token body per connection resent as each stream ends: what "
            "moving the bytes and reading the chunks costs"
        )


def _ratios(runs: list[_Run]) -> None:
    harness = [r.figures.get("cpu_ms_per_request") for r in runs if r.client == "harness"]
    harness_values = [v for v in harness if v]
    if not harness_values:
        return
    for api in ("completions", "chat"):
        ours = [
            r.figures.get("cpu_ms_per_request")
            for r in runs
            if r.client == "agentx" and r.api == api and r.workers == 1
        ]
        ours_values = [v for v in ours if v]
        if ours_values:
            ratio = statistics.median(harness_values) / statistics.median(ours_values)
            print(
                f"  harness ÷ agentx {api}, CPU per request (medians): {ratio:.0f}× (target ≥ {HARNESS_CPU_RATIO:g}×)"
            )


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="closed,rate")
    parser.add_argument("--apis", default="completions,chat")
    parser.add_argument("--workers", default="1", help="comma-separated --workers values for agentx")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=15.0, help="rate mode: sessions (of 8 turns) a second")
    parser.add_argument("--tokens-per-chunk", type=int, default=4)
    parser.add_argument("--harness", action="store_true", help="also agentx-harness 1.0.12 (closed, chat)")
    parser.add_argument("--no-floor", action="store_true", help="skip the raw client measured as the floor (closed)")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "setup_d")
    parser.add_argument("--worker-mock")
    args = parser.parse_args(argv)
    if args.worker_mock:
        _serve_mock(json.loads(args.worker_mock))
        return
    from agentx.trace.io import save_trace

    args.out.mkdir(parents=True, exist_ok=True)
    trace = setup_d_trace()
    closed_trace, rate_trace = turn_windows(trace, CLOSED_TURNS), turn_windows(trace, RATE_TURNS)
    _print_trace_figures(trace, closed_trace, rate_trace)
    traces = {"closed": args.out / "setup_d_closed.arrow", "rate": args.out / "setup_d_rate.arrow"}
    save_trace(closed_trace, traces["closed"])
    save_trace(rate_trace, traces["rate"])
    harness = args.harness and HARNESS.exists()
    if args.harness and not harness:
        print(f"(agentx-harness skipped: no {HARNESS}; `make .venv-harness/.installed-stamp` installs it)")
    if harness:
        traces["harness"] = _weka_without_gaps(closed_trace, args.out / "setup_d_weka")
    modes = args.modes.split(",")
    apis = args.apis.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    print(
        f"mock: TTFT {TTFT_S * 1e3:g} ms, {ITL_S * 1e3:g} ms a token, {args.tokens_per_chunk} tokens a chunk, core "
        f"{MOCK_CPU}, nice {MOCK_NICE}; {args.duration:g} s runs, {args.repeat} of each, interleaved; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    results: dict[str, list[_Run]] = {mode: [] for mode in modes}
    for number in range(args.repeat):
        for mode in modes:
            plan = [("agentx", api, w) for api in apis for w in workers]
            if mode == "closed" and not args.no_floor:
                plan.append(("floor", "completions", 1))
            if harness and mode == "closed":
                plan.append(("harness", "chat", 1))
            for client, api, w in plan:
                started = time.monotonic()
                run = _run(args, mode, api, w, client, traces)
                results[mode].append(run)
                print(
                    f"  [{number + 1}/{args.repeat}] {mode} {client} {api} w{w}: {run.figures.get('requests', 0):,.0f} "
                    f"requests in {time.monotonic() - started:.0f} s {run.note}",
                    flush=True,
                )
    for mode in modes:
        title = (
            f"closed loop, {LANES} lanes, no think time"
            if mode == "closed"
            else f"rate mode, {args.rate:g} sessions/s of {RATE_TURNS} turns, no think time "
            f"(target: ≥ {TARGET_RATE_RPS:g} req/s with due → server p99 ≤ {TARGET_RATE_LAG_P99_MS:g} ms)"
        )
        _print_table(title, results[mode])
        _ratios(results[mode])


if __name__ == "__main__":
    main()
