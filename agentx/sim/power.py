"""`GET /dcgm/metrics`: the simulator's GPUs' power, as a DCGM exporter serves it (Prometheus text).

The model: `gpus` GPUs, each drawing `idle_w` watts all the time plus `per_token_j` joules for every token the
engine processes (prompt tokens it computes, cached ones not, and generated tokens), the tokens shared evenly among
the GPUs (tensor parallelism: every GPU works on every token). Per GPU, at wall time t since the server started:

    energy(t) = idle_w · t + per_token_j · tokens(t) / gpus     (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, in mJ)
    power(t)  = (energy(t) − energy(t_prev)) / (t − t_prev)      (DCGM_FI_DEV_POWER_USAGE, W)

where t_prev is the previous scrape (the start, for the first): the gauge is the mean power since the last scrape,
so the counter's difference and the gauge integrated over the scrapes agree. Wall time, not simulated time: a replay
measures wall time, and `--time-scale` changes how many tokens a wall second holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Final

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError

POWER_METRIC: Final = "DCGM_FI_DEV_POWER_USAGE"
ENERGY_METRIC: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_UUID_PREFIX: Final = "GPU-00000000-0000-0000-0000-"


class PowerModel(msgspec.Struct, frozen=True, kw_only=True):
    """The simulated GPUs' power (module docstring)."""

    gpus: Annotated[int, Meta(ge=1)] = 8
    idle_w: Annotated[float, Meta(ge=0)] = 150.0
    """Watts each GPU draws whether or not it works."""
    per_token_j: Annotated[float, Meta(ge=0)] = 0.5
    """Joules per token processed, over all the GPUs together."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.idle_w < 0 or self.per_token_j < 0:
            raise ConfigError(f"power model: gpus ≥ 1 and watts and joules ≥ 0, got {self}")


class PowerMeter:
    """The GPUs' energy and power from a count of processed tokens read at scrape time (`tokens`); `clock` in s."""

    def __init__(
        self, model: PowerModel, tokens: Callable[[], int], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.model = model
        self._tokens = tokens
        self._clock = clock
        self._start = clock()
        self._last_t = 0.0
        self._last_j = 0.0

    def energy_j(self, at_s: float, tokens: int) -> float:
        """One GPU's energy `at_s` seconds after the start with `tokens` processed."""
        return self.model.idle_w * at_s + self.model.per_token_j * tokens / self.model.gpus

    def read(self) -> tuple[float, float]:
        """(power W, energy J) of one GPU now: the mean power since the previous read, and the counter."""
        now = self._clock() - self._start
        energy = self.energy_j(now, self._tokens())
        span = now - self._last_t
        power = (energy - self._last_j) / span if span > 0 else self.model.idle_w
        self._last_t, self._last_j = now, energy
        return power, energy

    def render(self, hostname: str = "agentx-sim") -> bytes:
        """DCGM exporter text: one power and one energy series per GPU (labels `gpu`, `UUID`, `Hostname`)."""
        power, energy = self.read()
        lines = [
            f"# HELP {POWER_METRIC} Power draw (in W).",
            f"# TYPE {POWER_METRIC} gauge",
            *(f"{POWER_METRIC}{{{_labels(i, hostname)}}} {power:.6f}" for i in range(self.model.gpus)),
            f"# HELP {ENERGY_METRIC} Total energy consumption since boot (in mJ).",
            f"# TYPE {ENERGY_METRIC} counter",
            *(f"{ENERGY_METRIC}{{{_labels(i, hostname)}}} {energy * 1e3:.3f}" for i in range(self.model.gpus)),
        ]
        return ("\n".join(lines) + "\n").encode()


def _labels(gpu: int, hostname: str) -> str:
    uuid = f"{_UUID_PREFIX}{gpu:012d}"
    return f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="agentx-sim",Hostname="{hostname}"'
