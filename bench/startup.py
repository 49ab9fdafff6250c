"""Start-up to first request: `agentx replay` from process start to the first replay request at the server.

Targets (bench/README.md): < 0.5 s on a small trace and < 3 s on an AgentX-size corpus (~100k requests).
A mock server in this process answers `/v1/models` and every POST (one token, then `[DONE]`) and notes when
the first request carrying an `X-Correlation-ID` arrives (the stream-usage probe carries none, so it is
counted as start-up work, as it is). The clock starts just before the `agentx replay` subprocess is
spawned, so interpreter start, imports, trace load, planning, the `/v1/models` probe and the first
request's body are all inside. The subprocess is then interrupted (Ctrl-C). Several runs, median and
min–max; never fails on a number. See bench/README.md.

Usage: .venv/bin/python bench/startup.py [--scale 1.0] [--repeat 3] [--concurrency 1,64] [--out bench/out]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_io import FULL_SESSIONS, generate_corpus  # a sibling script, not a package

ROOT = Path(__file__).resolve().parent.parent
SMALL_TRACE = ROOT / "traces" / "sample.arrow"
TARGETS_S = {"small": 0.5, "agentx-size": 3.0}
_ANSWER = (
    b'data: {"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
)


class _Mock:
    """An OpenAI-ish server on a thread of its own; `first_request_at` is set at the first replay request."""

    def __init__(self) -> None:
        self.first_request_at: float | None = None
        self.seen = threading.Event()
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait()

    def reset(self) -> None:
        self.first_request_at = None
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
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if "X-Correlation-ID" in request.headers and self.first_request_at is None:
            self.first_request_at = time.monotonic()
            self.seen.set()
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_ANSWER)
        return response


def _corpus(out: Path, sessions: int) -> Path:
    """The AgentX-size corpus as Arrow, generated once and kept (bench/out is git-ignored)."""
    arrow = out / f"startup-corpus-{sessions}.arrow"
    if arrow.exists():
        return arrow
    from agentx import load_trace, save_trace

    jsonl = out / f"startup-corpus-{sessions}.weka.jsonl"
    print(f"generating a {sessions}-session corpus (once) ...", flush=True)
    generate_corpus(jsonl, sessions)
    save_trace(load_trace(jsonl), arrow)
    jsonl.unlink()
    return arrow


def _one_run(mock: _Mock, trace: Path, work: Path, concurrency: int) -> float | None:
    mock.reset()
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(trace),
        "--url", f"http://127.0.0.1:{mock.port}", "--model", "m",
        "--concurrency", str(concurrency), "--sessions", str(concurrency), "--delay-scale", "0", "--out", str(work),
        "--overwrite",  # the same work folder every run
    ]  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    seen = mock.seen.wait(timeout=60)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    if not seen or mock.first_request_at is None:
        print(f"  no request arrived; agentx said: {stderr.decode(errors='replace')[-500:]}")
        return None
    return mock.first_request_at - started


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 400-session corpus")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        default="1,64",
        help="lanes (comma-separated): the AgentX scenario prepares every lane's first tree (and its t*) before "
        "the first request, so start-up grows with them",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sessions = max(1, round(FULL_SESSIONS * args.scale))
    traces = {"small": SMALL_TRACE, "agentx-size": _corpus(args.out, sessions)}
    levels = [int(part) for part in args.concurrency.split(",") if part.strip()]
    mock = _Mock()
    times: dict[tuple[str, int], list[float]] = {(name, level): [] for name in traces for level in levels}
    for _ in range(args.repeat):
        for (name, level), values in times.items():  # interleaved: a drift in machine speed touches all alike
            elapsed = _one_run(mock, traces[name], args.out / f"startup-run-{name}", level)
            if elapsed is not None:
                values.append(elapsed)
    print(f"\nstart-up to first request (agentx replay subprocess, {args.repeat} runs; median (min–max))")
    for (name, level), values in times.items():
        trace = traces[name]
        label = f"{name}, c{level}"
        if not values:
            print(f"  {label:18s} no successful run")
            continue
        figure = f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"
        size = f"{trace.stat().st_size / 1e6:.1f} MB"
        print(f"  {label:18s} {figure:24s} target < {TARGETS_S[name]:.1f} s   ({trace.name}, {size})")


if __name__ == "__main__":
    main()
