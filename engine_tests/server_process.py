"""A real inference server as a child process on a free loopback port, for the engine suites (a test helper, not
part of the package): started, waited for until its health endpoint answers, and stopped; its output kept in a
temporary file whose tail goes into every error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import IO, Final, Self

HOST: Final = "127.0.0.1"


class ServerProcessError(RuntimeError):
    """The server could not be found, started, or did not become ready; the message says why."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


BACKGROUND_NICE: Final = 19
"""The lowest CPU priority, for a server that must not starve the client beside it (`ServerProcess.background`)."""


class ServerProcess:
    """A server child process: subclasses give its `name`, `command()` and `env()`."""

    name = "server"
    health_path = "/health"
    background = False
    """Run at the lowest CPU priority (`BACKGROUND_NICE`), the processes of its session and, where Linux groups a
    session's processes for fair CPU shares (autogroups), that group too: a server whose idle loops never sleep would
    otherwise take the client's CPU on a small machine, and the client's timestamps would measure the scheduler."""

    def __init__(self, *, startup_timeout_s: float = 120.0, stop_timeout_s: float = 10.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = 0
        self.startup_s = 0.0
        """How long the last start took until the server answered its health check."""
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port()
        command = self.command()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (held for the server's life, closed by stop)
        # A session of its own, so that stopping it also stops the worker processes it starts.
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=self.env(),
            start_new_session=True,
        )
        if self.background:
            # Before it starts its workers (seconds later), which inherit both.
            try:
                os.setpriority(os.PRIO_PROCESS, self._process.pid, BACKGROUND_NICE)
                _lower_autogroup(self._process.pid)
            except (OSError, ServerProcessError):
                self.stop()
                raise
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerProcessError(f"{self.name} exited with {self._process.returncode}:\n{self.log_tail()}")
            if self._ready():
                self.startup_s = time.monotonic() - started
                return
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise ServerProcessError(f"{self.name} not ready after {self.startup_timeout_s:g} s:\n{tail}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=2) as response:
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

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (a crash, not a shutdown)."""
        process = self._process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def _lower_autogroup(pid: int) -> None:
    """Give the autogroup of `pid`'s new session the lowest share: with autogroups on, the scheduler shares CPU
    between groups first, so a task's own nice value does not yield to a process of another session."""
    path = f"/proc/{pid}/autogroup"
    if os.path.exists(path):
        try:
            with open(path, "w") as autogroup:
                autogroup.write(str(BACKGROUND_NICE))
        except OSError as exc:
            raise ServerProcessError(f"could not lower the CPU share of the server's group ({path}): {exc}") from exc
