"""A lean start: `import agentx` and the command line load no heavy dependency before a command
needs it. Which modules load is pinned here; how long start-up takes is a figure of bench/startup.py, not a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from paths import SAMPLE_MOONCAKE

import agentx

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

INIT = Path(agentx.__file__)


def _loaded_after(code: str) -> set[str]:
    """The modules loaded in a fresh interpreter after running `code` (its own output is dropped)."""
    script = (
        "import contextlib, io, sys\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    {code}\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    modules = set(done.stdout.split())
    assert "agentx" in modules, done.stdout + done.stderr  # the code ran to its end
    return modules


def _packages(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


HEAVY = {"numpy", "pyarrow", "aiohttp", "rich", "prometheus_client", "matplotlib", "tokenizers", "uvloop", "ray"}
"""Each costs tens of milliseconds (aiohttp ~150 ms, pyarrow with numpy ~100 ms) or megabytes; Ray only a `--ray`
run may load."""


def test_import_agentx_loads_nothing_heavy() -> None:
    assert _packages(_loaded_after("import agentx")) & (HEAVY | {"asyncio", "msgspec", "click"}) == set()
    assert _packages(_loaded_after("from agentx import ReplayOptions; from agentx.trace import Trace")) & HEAVY == set()


def test_a_jsonl_trace_loads_without_pyarrow_or_numpy() -> None:
    loaded = _loaded_after(f"import agentx; agentx.trace.load_trace({str(SAMPLE_MOONCAKE)!r})")
    assert _packages(loaded) & HEAVY == set()


def test_the_command_line_and_its_help_load_nothing_heavy() -> None:
    commands = [["--help"], *([name, "--help"] for name in ("replay", "sweep", "decode", "sim", "inspect", "report"))]
    code = f"from agentx.cli import main\n    for args in {commands!r}:\n        main(args, standalone_mode=False)"
    assert _packages(_loaded_after(code)) & (HEAVY | {"asyncio"}) == set()


def test_a_replay_starts_without_what_only_its_end_needs() -> None:
    """rich draws the summary (and live progress on a terminal only), pyarrow.compute and prometheus_client serve
    the summary and the /metrics scrape: none is needed before the first request."""
    loaded = _loaded_after(
        "import agentx.cli.commands.replay, agentx.cli.display.progress, agentx.run.replay, "
        "agentx.replayer.prompts.calibrate"
    )
    assert _packages(loaded) & {"rich", "prometheus_client", "matplotlib", "tokenizers"} == set()
    assert "pyarrow.compute" not in loaded


_SERVE_AND_REPLAY = """
import http.server, sys, tempfile, threading
from agentx.cli import main

ANSWER = (b'data: {"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
          b'"usage":{"prompt_tokens":1,"completion_tokens":1}}\\n\\ndata: [DONE]\\n\\n')

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.answer(200, b'{"data": [{"id": "m"}]}', "application/json")
        else:
            self.answer(404, b'{"detail": "Not Found"}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.answer(200, ANSWER, "text/event-stream")

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}"
out = tempfile.mkdtemp()
args = ["replay", TRACE, "--url", url, "--model", "m", "--mode", "closed", "--concurrency", "1", "--sessions", "2",
        "--delay-scale", "0", "--out", out]
main(args, standalone_mode=False)
import json, pathlib
run = json.loads((pathlib.Path(out) / "run.json").read_text())["run"]
assert run["requests"] == 2 and run["errors"] == 0, run
"""


def test_a_replay_through_the_command_line_never_loads_aiohttp() -> None:
    """Every call of a replay to its server (the model listing, the stream-usage probe, the requests, the /metrics
    scrapes) goes through the replayer's own http1 pool: aiohttp (~120 ms and ~13 MB of imports before the first
    request) is the simulator's, never loaded by a replay against a server of its own, start to end."""
    script = _SERVE_AND_REPLAY.replace("TRACE", repr(str(SAMPLE_MOONCAKE)))
    loaded = _loaded_after(f"exec({script!r})")
    assert "agentx.replayer.run_replay" in loaded and "agentx.replayer.http.calls" in loaded  # the replay ran
    assert _packages(loaded) & {"aiohttp", "yarl", "multidict", "aiohappyeyeballs"} == set()
