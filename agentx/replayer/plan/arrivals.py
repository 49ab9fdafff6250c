"""Open-loop arrivals: when each session tree starts, independent of how the server keeps up.

- `trace` mode: every session starts at its recorded start (the session's `start_s` plus its first
  request's `t`), relative to the earliest, divided by a speedup factor; Mooncake-style traces of
  single-request sessions thus replay at their timestamps.
- `rate` mode: sessions arrive as a renewal process at `rate` per second with gamma-distributed gaps of
  shape `burstiness` (1: Poisson, exponential gaps; below 1 burstier, above 1 more regular), the
  convention of vLLM's benchmark scripts. Seeded: same seed, same arrival times.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from agentx.trace.model import Session, Trace


def recorded_start_s(session: Session) -> float:
    """A session's start on the trace clock: `start_s` plus its earliest request's `t` (0 if it has none)."""
    starts = [request.t for agent, _, _ in session.agents() for request in agent.requests]
    return session.start_s + (min(starts) if starts else 0.0)


def trace_arrivals(trace: Trace, speedup: float = 1.0) -> list[tuple[float, int]]:
    """(offset in seconds from the first arrival, session index), in time order (ties: trace order)."""
    if speedup <= 0:
        raise ValueError(f"speedup must be positive, got {speedup}")
    starts = [recorded_start_s(session) for session in trace.sessions]
    if not starts:
        return []
    origin = min(starts)
    order = sorted(range(len(starts)), key=lambda i: (starts[i], i))
    return [((starts[i] - origin) / speedup, i) for i in order]


def rate_arrivals(rate_per_s: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless arrival offsets in seconds (the first at 0) of a gamma renewal process (module docstring)."""
    if rate_per_s <= 0:
        raise ValueError(f"rate must be positive, got {rate_per_s}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate_per_s * burstiness)
    offset = 0.0
    yield offset
    while True:
        # Drawn in blocks: one numpy call per 1,024 arrivals keeps a 1,000/s schedule cheap.
        for gap in rng.gamma(burstiness, scale, size=1024):
            offset += float(gap)
            yield offset
