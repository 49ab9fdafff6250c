"""`SimServer`: the simulator in a child process on a free loopback port, for tests and harnesses.

    with SimServer(spec_k=3, acceptance_length=2.5, time_scale=0.01) as sim:
        ...  # talk to sim.url over HTTP; the served model is sim.model

The child is `python -P -m agentx.cli sim --json --port 0 ...`, started with exactly the flags a human would
type (an API key goes in its environment, `AGENTX_SIM_API_KEY`, never on the command line); it prints one JSON
line {url, model, pid} once it listens. On exit it gets SIGTERM (a clean shutdown), then SIGKILL if it has not
exited within `stop_timeout_s`.
"""

from __future__ import annotations

import os
import selectors
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import IO, Any

import msgspec

from agentx.errors import SimServerError
from agentx.sim.engine.loop import EngineConfig
from agentx.sim.faults import FaultConfig
from agentx.sim.options import SimOptions, cli_args
from agentx.sim.power import PowerModel


class _Ready(msgspec.Struct):
    url: str
    model: str
    pid: int


class SimServer:
    """A simulator child process. Engine settings come as an EngineConfig or as its fields by keyword."""

    def __init__(
        self,
        engine: EngineConfig | None = None,
        *,
        faults: FaultConfig | None = None,
        power: PowerModel | None = None,
        acceptance_length: float | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        extra_args: tuple[str, ...] = (),
        tls_cert: str | None = None,
        tls_key: str | None = None,
        api_key: str | None = None,
        **engine_fields: Any,
    ) -> None:
        """`tls_cert` and `tls_key`: serve https; `api_key`: require `Authorization: Bearer <api_key>`; `power`: the
        GPUs' power served at `/dcgm/metrics` (agentx.sim.power)."""
        config = msgspec.structs.replace(engine or EngineConfig(), **engine_fields)
        self.options = SimOptions(
            host=host,
            port=0,
            engine=config,
            faults=faults or FaultConfig(),
            power=power or PowerModel(),
            tls_cert=tls_cert,
            tls_key=tls_key,
            api_key=api_key,
        )
        self.acceptance_length = acceptance_length
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_args = extra_args
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._ready: _Ready | None = None

    @property
    def command(self) -> list[str]:
        args = cli_args(self.options, acceptance_length=self.acceptance_length)
        # -P: the working directory stays off sys.path, so a user's html.py or json.py there cannot shadow the
        # standard library in the child.
        return [sys.executable, "-P", "-m", "agentx.cli", "sim", "--json", *args, *self.extra_args]

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:41234 (OpenAI clients want url + "/v1")."""
        return self._started().url

    @property
    def model(self) -> str:
        return self._started().model

    @property
    def pid(self) -> int:
        return self._started().pid

    def _started(self) -> _Ready:
        if self._ready is None:
            raise RuntimeError("the simulator is not running: use `with SimServer(...) as sim` or start()")
        return self._ready

    def start(self) -> SimServer:
        if self._process is not None:
            raise RuntimeError("the simulator is already started")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - outlives this call; closed by __exit__
        environment = dict(os.environ)
        environment.pop("AGENTX_SIM_API_KEY", None)
        if self.options.api_key:
            environment["AGENTX_SIM_API_KEY"] = self.options.api_key
        self._process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=environment
        )
        try:
            deadline = time.monotonic() + self.startup_timeout_s
            self._ready = msgspec.json.decode(self._read_ready_line(deadline), type=_Ready)
            self._wait_healthy(deadline)
            extra = self.options.faults
            if extra.seed is not None or extra.refuse_connections_s:
                self.set_faults(extra)  # settings that exist only at runtime, not as flags
        except BaseException:
            self.stop()
            raise
        return self

    def _read_ready_line(self, deadline: float) -> bytes:
        process = self._process
        assert process is not None and process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            line = b""
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._failure(f"did not report ready within {self.startup_timeout_s} s")
                if selector.select(timeout=min(left, 0.1)):
                    chunk = os.read(process.stdout.fileno(), 4096)
                    if not chunk:
                        process.wait(timeout=self.stop_timeout_s)
                        raise self._failure(f"exited with status {process.returncode} before it was ready")
                    line += chunk
        return line

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1.0, context=self._tls()) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise self._failure("never answered /health")
            time.sleep(0.02)

    def _tls(self) -> ssl.SSLContext | None:
        """For talking to the child itself over https: its own certificate is not checked (whoever connects to
        it for a run does, with the settings of that run)."""
        if self.options.tls_cert is None:
            return None
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    def _control(self, data: bytes | None = None) -> urllib.request.Request:
        """A request to `/sim/faults` (a POST of `data` when given), with the API key if the child wants one."""
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        return urllib.request.Request(
            self.url + "/sim/faults", data=data, headers=headers, method="POST" if data is not None else "GET"
        )

    def _failure(self, what: str) -> SimServerError:
        return SimServerError(f"agentx sim {what}\ncommand: {' '.join(self.command)}\nstderr:\n{self.stderr()}")

    def stderr(self) -> str:
        """Everything the child wrote to stderr so far."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stop(self) -> int | None:
        """Stop the child (SIGTERM, then SIGKILL after `stop_timeout_s`); its exit status."""
        process, self._process, self._ready = self._process, None, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def get_faults(self) -> FaultConfig:
        """The live fault settings (`refuse_connections_s`: what is left of the refusal window)."""
        with urllib.request.urlopen(self._control(), timeout=5.0, context=self._tls()) as response:
            return msgspec.json.decode(response.read(), type=FaultConfig)

    def set_faults(self, faults: FaultConfig) -> FaultConfig:
        """Replace the fault settings at runtime; a refusal window or a seed in them starts now."""
        request = self._control(msgspec.json.encode(faults))
        with urllib.request.urlopen(request, timeout=5.0, context=self._tls()) as response:
            return msgspec.json.decode(response.read(), type=FaultConfig)
