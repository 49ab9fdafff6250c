"""Start-up to first request: `agentx replay` from process start to the first replay request at the server.

Targets (bench/README.md): < 0.5 s and < 150 MB peak RSS on a small trace (the 20-session sample, and a
6,000-request Mooncake trace), < 3 s and < 400 MB peak RSS on an AgentX-size corpus (~100k requests). A mock
server in this process answers `/v1/models` and every POST (one token, then `[DONE]`) and notes when the
`/v1/models` probe, the first POST (the stream-usage probe) and the first request carrying an `X-Correlation-ID`
(the first replay request: a warmup primer in the AgentX scenario) arrive. Everything is measured through the
command line, from outside the process: the clock starts just before the `agentx replay` subprocess is spawned, so
interpreter start, imports, trace load, planning, the probes and the first request's body are all inside. The
subprocess is then interrupted (Ctrl-C) and stops as a user's would (grace, run.json, the partial summary). agentx/
is byte-compiled first, as an installed package is (`make install` does it for the editable tree).

Peak RSS is the child's `ru_maxrss` from `os.wait4`, taken by a small launcher process (Linux counts the forking
process's resident size into a child's `ru_maxrss`, so this benchmark, a hundred MB with aiohttp and the trace
generator loaded, must not fork it itself); the RSS at the first request is the child's `VmHWM` read from /proc
when that request arrives. `agentx --help` and `agentx replay --help` are timed the same way. Several runs,
interleaved, median and min–max; never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/startup.py [--traces small,mooncake,agentx-size] [--scale 1.0] [--repeat 5]
           [--concurrency 1,64] [--out bench/out]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_io import FULL_SESSIONS, generate_corpus  # a sibling script, not a package

ROOT = Path(__file__).resolve().parent.parent
SMALL_TRACE = ROOT / "traces" / "sample.arrow"
TRACES = ("small", "mooncake", "agentx-size")
TARGETS_S = {"small": 0.5, "mooncake": 0.5, "agentx-size": 3.0}
TARGET_RSS_MB = 150.0
"""Peak RSS of the `agentx replay` process on a small trace (the sample or the Mooncake trace)."""
TARGET_CORPUS_RSS_MB = 400.0
"""Peak RSS of the `agentx replay` process on the AgentX-size corpus at 64 lanes (here to its first request and the
Ctrl-C stop; a whole run's in `corpus_replay.py --peak`)."""
MOONCAKE_REQUESTS = 6_000
MOONCAKE_SEED = 1_731
_ANSWER = (
    b'data: {"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
)
_LAUNCHER = r"""
import json, os, sys, time
command, stderr_path = json.loads(sys.argv[1]), sys.argv[2]
actions = [
    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
    (os.POSIX_SPAWN_OPEN, 2, stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
]
started = time.monotonic()
pid = os.posix_spawn(command[0], command, os.environ, file_actions=actions)
print(started, pid, flush=True)
_, status, usage = os.wait4(pid, 0)
print(time.monotonic(), os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, flush=True)
"""
"""Spawns one command and says when (CLOCK_MONOTONIC, shared by every process), its pid, then when it ended, its
exit code and its own peak RSS in bytes. Started with `-S -I` it is ~10 MB, less than anything it measures."""


class _Mock:
    """An OpenAI-ish server on a thread of its own, noting when the probes and the first replay request arrive."""

    def __init__(self) -> None:
        self.models_at: float | None = None
        self.first_post_at: float | None = None
        self.first_request_at: float | None = None
        self.rss_at_first_request: int | None = None
        self.pid: int | None = None
        self.seen = threading.Event()
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait()

    def reset(self) -> None:
        self.models_at = self.first_post_at = self.first_request_at = None
        self.rss_at_first_request = self.pid = None
        self.seen.clear()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    async def _models(self, _: web.Request) -> web.Response:
        if self.models_at is None:
            self.models_at = time.monotonic()
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        now = time.monotonic()
        if self.first_post_at is None:
            self.first_post_at = now
        if "X-Correlation-ID" in request.headers and self.first_request_at is None:
            self.first_request_at = now
            self.rss_at_first_request = None if self.pid is None else _vm_hwm(self.pid)
            self.seen.set()
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_ANSWER)
        return response


def _vm_hwm(pid: int) -> int | None:
    """Peak RSS so far of process `pid` in bytes (`VmHWM`), None without /proc."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _Launched:
    """One command spawned through the launcher: its pid and start; `finish()` waits for its end and peak RSS."""

    def __init__(self, command: list[str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self._launcher = subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", _LAUNCHER, json.dumps(command), str(stderr_path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self._launcher.stdout is not None
        started, pid = self._launcher.stdout.readline().split()
        self.started = float(started)
        self.pid = int(pid)

    def finish(self, timeout: float = 60) -> tuple[float, int, int]:
        """(when it ended, its exit code, its peak RSS in bytes); killed after `timeout` seconds."""
        try:
            out, _ = self._launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            out, _ = self._launcher.communicate()
        ended, code, rss = out.split()
        return float(ended), int(code), int(rss)

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-500:]


class Measured(NamedTuple):
    """A command's exit code, its peak RSS over its whole life (bytes, `ru_maxrss`), and its peak so far sampled as it
    ran: (`time.time_ns()`, `VmHWM` bytes)."""

    code: int
    peak: int
    samples: list[tuple[int, int]]

    def peak_until(self, wall_ns: int) -> int | None:
        """The peak RSS as last sampled at or before `wall_ns` (None: no sample by then)."""
        before = [hwm for at_ns, hwm in self.samples if at_ns <= wall_ns]
        return before[-1] if before else None


def measure(command: list[str], stderr_path: Path, *, timeout_s: float, every_s: float = 0.05) -> Measured:
    """Run `command` through the launcher (its own peak RSS, not this process's), sampling its `VmHWM` every
    `every_s` seconds, so that the peak of a phase (a run before its end-of-run summary) can be told from the whole."""
    launched = _Launched(command, stderr_path)
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set() and (hwm := _vm_hwm(launched.pid)) is not None:  # an exited process has none
            samples.append((time.time_ns(), hwm))
            done.wait(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, code, peak = launched.finish(timeout_s)
    done.set()
    sampler.join()
    return Measured(code, peak, samples)


def run_end_wall_ns(run_dir: Path) -> int | None:
    """When the run in `run_dir` ended, wall clock (ns): its records' time origin + their last end; None without one.
    What a replay does after it (the summary, run.json) comes after this."""
    from agentx.records.record import read_records, run_info

    records = run_dir / "records.arrow"
    if not records.exists():
        return None
    table = read_records(records)
    if not table.num_rows:
        return None
    return int(run_info(table).wall_epoch_ns + max(table.column("end_ns").to_pylist()))


class _Run:
    """One replay's figures, seconds from spawn and bytes."""

    def __init__(self, models: float | None, probe: float | None, first: float, rss_first: int | None, peak: int):
        self.models = models
        self.probe = probe
        self.first = first
        self.rss_first = rss_first
        self.peak = peak


def _mooncake(out: Path, requests: int = MOONCAKE_REQUESTS, seed: int = MOONCAKE_SEED) -> Path:
    """A Mooncake-like conversation trace (plain rows: every row a session of one request), generated once and kept.

    Shaped like Mooncake's FAST'25 conversation trace: timestamps in 3 s steps (~10 requests a step), every prompt
    starting with the shared block 0, `input_length` of median ~7k tokens (up to 120k), `output_length` of median
    ~350 (up to 2,000), 512-token blocks, and about 40% of the rows continuing an earlier row's prefix.
    """
    path = out / f"startup-mooncake-{requests}.jsonl"
    if path.exists():
        return path
    rng = random.Random(seed)
    next_id = 1
    earlier: list[list[int]] = []
    with path.open("w") as file:
        for row in range(requests):
            input_length = min(120_000, max(64, int(rng.lognormvariate(8.85, 0.9))))
            output_length = min(2_000, max(1, int(rng.lognormvariate(5.8, 0.9))))
            blocks = -(-input_length // 512)
            ids = [0]
            if earlier and rng.random() < 0.4:
                ids = rng.choice(earlier)[:blocks]
            fresh = blocks - len(ids)
            ids = [*ids, *range(next_id, next_id + fresh)]
            next_id += fresh
            earlier.append(ids)
            line = {"timestamp": row // 10 * 3000, "input_length": input_length, "output_length": output_length}
            file.write(json.dumps({**line, "hash_ids": ids}) + "\n")
    return path


def _corpus(out: Path, sessions: int) -> Path:
    """The AgentX-size corpus as Arrow, generated once and kept (bench/out is git-ignored)."""
    arrow = out / f"startup-corpus-{sessions}.arrow"
    if arrow.exists():
        return arrow
    from agentx.trace import load_trace, save_trace

    jsonl = out / f"startup-corpus-{sessions}.weka.jsonl"
    print(f"generating a {sessions}-session corpus (once) ...", flush=True)
    generate_corpus(jsonl, sessions)
    save_trace(load_trace(jsonl), arrow)
    jsonl.unlink()
    return arrow


def _one_run(mock: _Mock, trace: Path, work: Path, concurrency: int) -> _Run | None:
    mock.reset()
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(trace),
        "--url", f"http://127.0.0.1:{mock.port}", "--model", "m",
        "--concurrency", str(concurrency), "--sessions", str(concurrency), "--delay-scale", "0", "--out", str(work),
        "--overwrite",  # the same work folder every run
    ]  # fmt: skip
    launched = _Launched(command, work.with_name(work.name + ".stderr"))
    mock.pid = launched.pid
    if mock.first_request_at is not None:  # it was faster than setting the pid: read it now
        mock.rss_at_first_request = _vm_hwm(launched.pid)
    seen = mock.seen.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):  # it may have ended by itself
        os.kill(launched.pid, signal.SIGINT)
    _, _, peak = launched.finish()
    if not seen or mock.first_request_at is None:
        print(f"  no request arrived; agentx said: {launched.stderr_tail()}")
        return None

    def since(at: float | None) -> float | None:
        return None if at is None else at - launched.started

    return _Run(
        since(mock.models_at), since(mock.first_post_at), mock.first_request_at - launched.started,
        mock.rss_at_first_request, peak,
    )  # fmt: skip


def _help_run(args: list[str], out: Path) -> tuple[float, int] | None:
    """`agentx ARGS` (e.g. `--help`): wall time from spawn to exit, and peak RSS."""
    launched = _Launched([sys.executable, "-m", "agentx.cli", *args], out / "startup-help.stderr")
    ended, code, peak = launched.finish()
    if code != 0:
        print(f"  agentx {' '.join(args)} exited {code}: {launched.stderr_tail()}")
        return None
    return ended - launched.started, peak


def _figure(values: Sequence[float], unit: str, scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "—"
    scaled = [value * scale for value in values]
    return f"{statistics.median(scaled):.{digits}f} {unit} ({min(scaled):.{digits}f}–{max(scaled):.{digits}f})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces",
        default="small,mooncake,agentx-size",
        help=f"which traces (comma-separated, of {', '.join(TRACES)}); agentx-size is generated once (~0.75 GB "
        "of JSONL on the way, a few minutes)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 400-session corpus")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--concurrency",
        default="1,64",
        help="lanes (comma-separated): the AgentX scenario prepares every lane's first tree (and its t*) before "
        "the first request, so start-up grows with them",
    )
    parser.add_argument("--no-help", action="store_true", help="skip timing `agentx --help`")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [name.strip() for name in args.traces.split(",") if name.strip()]
    unknown = sorted(set(names) - set(TRACES))
    if unknown:
        parser.error(f"--traces: unknown {', '.join(unknown)} (known: {', '.join(TRACES)})")
    traces: dict[str, Path] = {}
    for name in names:
        if name == "small":
            traces[name] = SMALL_TRACE
        elif name == "mooncake":
            traces[name] = _mooncake(args.out)
        else:
            traces[name] = _corpus(args.out, max(1, round(FULL_SESSIONS * args.scale)))
    # An installed wheel carries its bytecode, and `make install` compiles the editable tree; without it, a process
    # started with PYTHONDONTWRITEBYTECODE (some CI and sandbox images) compiles ~140 agentx modules every time.
    if not compileall.compile_dir(ROOT / "agentx", quiet=1):
        parser.error("cannot byte-compile agentx/")
    print(
        "agentx byte-compiled first (as installed); PYTHONDONTWRITEBYTECODE is",
        os.environ.get("PYTHONDONTWRITEBYTECODE", "unset"),
    )
    levels = [int(part) for part in args.concurrency.split(",") if part.strip()]
    helps = [] if args.no_help else [["--help"], ["replay", "--help"]]
    mock = _Mock()
    runs: dict[tuple[str, int], list[_Run]] = {(name, level): [] for name in traces for level in levels}
    help_runs: dict[str, list[tuple[float, int]]] = {" ".join(command): [] for command in helps}
    for _ in range(args.repeat):
        for command in helps:  # interleaved: a drift in machine speed touches every figure alike
            figures = _help_run(command, args.out)
            if figures is not None:
                help_runs[" ".join(command)].append(figures)
        for (name, level), values in runs.items():
            run = _one_run(mock, traces[name], args.out / f"startup-run-{name}", level)
            if run is not None:
                values.append(run)

    print(f"\nstart-up through the command line ({args.repeat} runs; median (min–max))")
    for name, measured in help_runs.items():
        wall = _figure([seconds for seconds, _ in measured], "s")
        rss = _figure([peak_rss for _, peak_rss in measured], "MB", 1e-6, 0)
        print(f"  agentx {name:16s} {wall:24s} peak RSS {rss}")
    print(
        "\nagentx replay TRACE --url MOCK --concurrency N --sessions N --delay-scale 0: seconds from spawn to the "
        "/v1/models probe, the stream-usage probe and the first replay request; RSS (MB = 10⁶ bytes) at the first "
        "request and the process's peak (Ctrl-C stop and partial summary included)"
    )
    header = f"  {'trace, lanes':20s} {'models':>6s} {'probe':>6s}  {'first request':24s} {'RSS then':>9s}  peak RSS"
    print(header)
    for (name, level), values in runs.items():
        label = f"{name}, c{level}"
        if not values:
            print(f"  {label:20s} no successful run")
            continue
        models = [run.models for run in values if run.models is not None]
        probes = [run.probe for run in values if run.probe is not None]
        rss_first = [run.rss_first for run in values if run.rss_first is not None]
        first = _figure([run.first for run in values], "s")
        peak = _figure([run.peak for run in values], "MB", 1e-6, 0)
        print(
            f"  {label:20s} {statistics.median(models) if models else float('nan'):6.2f} "
            f"{statistics.median(probes) if probes else float('nan'):6.2f}  {first:24s} "
            f"{statistics.median(rss_first) / 1e6 if rss_first else float('nan'):6.0f} MB  {peak}"
        )
    print("\ntargets and ratios (median ÷ target; at most 1 meets it)")
    for (name, level), values in runs.items():
        if not values:
            continue
        first_s = statistics.median(run.first for run in values)
        line = f"  {name + ', c' + str(level):20s} first request {first_s:.2f} s ÷ {TARGETS_S[name]:.1f} s = "
        line += f"{first_s / TARGETS_S[name]:.2f}"
        peak_mb = statistics.median(run.peak for run in values) / 1e6
        target_mb = TARGET_CORPUS_RSS_MB if name == "agentx-size" else TARGET_RSS_MB
        line += f"   peak RSS {peak_mb:.0f} MB ÷ {target_mb:.0f} MB = {peak_mb / target_mb:.2f}"
        size = traces[name].stat().st_size / 1e6
        print(f"{line}   ({traces[name].name}, {size:.1f} MB)")


if __name__ == "__main__":
    main()
