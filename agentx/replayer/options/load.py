"""How a replay offers load: a tagged union by `mode` (`AgentxLoad`, `ClosedLoad`: lanes of session trees;
`TraceLoad`, `RateLoad`: open loop), the `load` part of `ReplayOptions` (agentx.replayer.options.replay)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError
from agentx.replayer.options.fields import Fraction, Seconds

Mode = Literal["agentx", "closed", "trace", "rate"]
DEFAULT_WINDOW: Final = (0.25, 0.75)
"""Where in each session's span a lane's t* falls, as InferenceX runs AgentX (the scenario file's own default is
0.0–1.0); agentx.replayer.plan.tstar."""


Concurrency = Annotated[int, Meta(ge=1)]


class AgentxLoad(msgspec.Struct, frozen=True, kw_only=True, tag="agentx", tag_field="mode"):
    """The AgentX scenario (docs/agentx.md §4d–§4e): lanes resume at t* after a warmup, recycled trees start at
    turn 0, and every tree carries a cache-bust marker."""

    mode: ClassVar[Mode] = "agentx"
    concurrency: Concurrency = 1
    """Lanes (session trees)."""
    ramp_s: Seconds = 0.0
    """Spread the lanes' first trees over this many seconds."""
    tstar_window: tuple[Fraction, Fraction] = DEFAULT_WINDOW
    """InferenceX runs 0.25–0.75, the scenario file 0–1."""
    warmup: Literal["spread", "burst"] = "spread"
    """`spread`: each primer goes out so that every lane's t* coincides at the profiling start; `burst` (the
    reference's `--burst-phase-starts`): all primers at once."""
    warmup_requests_per_lane: Annotated[int, Meta(ge=0)] = 0
    """Cache-pressure requests per lane after the primers (InferenceX: 10)."""
    warmup_max_tokens: Annotated[int, Meta(ge=1)] | None = 1
    """The reference's code sends 1; None: the recorded output."""
    cache_bust: Literal["marker", "salt", "off"] = "marker"
    """A per-tree marker in every prompt, or as cache_salt, or none."""
    benchmark_id: str | None = None
    """The run-level key of the cache-bust markers (docs/agentx.md §2e); None: the run id, fresh every run."""

    def __post_init__(self) -> None:
        low, high = self.tstar_window
        if not 0.0 <= low <= high <= 1.0:
            raise ConfigError(f"tstar_window must satisfy 0 <= low <= high <= 1, got {self.tstar_window}")


class ClosedLoad(msgspec.Struct, frozen=True, kw_only=True, tag="closed", tag_field="mode"):
    """Lanes of session trees, every tree from turn 0: no warmup, no marker."""

    mode: ClassVar[Mode] = "closed"
    concurrency: Concurrency = 1
    """Lanes (session trees)."""
    ramp_s: Seconds = 0.0
    """Spread the lanes' first trees over this many seconds."""


class TraceLoad(msgspec.Struct, frozen=True, kw_only=True, tag="trace", tag_field="mode"):
    """Open loop: each session starts at its recorded start (÷ `speedup`); records have `lane = -1`."""

    mode: ClassVar[Mode] = "trace"
    speedup: Annotated[float, Meta(gt=0)] = 1.0
    """Divides the recorded arrival times and, with `delay_scale`, every delay within a tree."""


class RateLoad(msgspec.Struct, frozen=True, kw_only=True, tag="rate", tag_field="mode"):
    """Open loop: sessions arrive at `rate` per second (agentx.replayer.plan.arrivals)."""

    mode: ClassVar[Mode] = "rate"
    rate: Annotated[float, Meta(gt=0)]
    """Session arrivals per second."""
    burstiness: Annotated[float, Meta(gt=0)] = 1.0
    """Gamma shape of the gaps (1: Poisson)."""


Load = AgentxLoad | ClosedLoad | TraceLoad | RateLoad
LaneLoad = AgentxLoad | ClosedLoad
LOADS: Final = (AgentxLoad, ClosedLoad, TraceLoad, RateLoad)


def lanes(load: Load) -> int:
    """Lanes of a closed-loop load; 0 for an open loop, which has none."""
    return load.concurrency if isinstance(load, AgentxLoad | ClosedLoad) else 0
