"""What every scraper of a run shares: a tick every interval, and the gaps between due requests it sends and reads
in, so that a scrape never delays a request (agentx.replayer.telemetry.scrape: the server's `/metrics`;
agentx.replayer.telemetry.gpu: the GPUs' power)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

SEND_PATIENCE_S: Final = 0.1
"""How long a scrape waits for a gap between due requests before it is sent anyway."""
READ_PATIENCE_S: Final = 0.5
"""How long an answer waits for such a gap before it is read anyway."""


class QuietWaiter(Protocol):
    """What a scraper needs of the run's dispatch clock (agentx.replayer.schedule.clock.DispatchClock): to wait for a
    gap between due requests."""

    async def until_quiet(self, span_ns: int, patience_s: float) -> None: ...


async def scrape_every(interval_s: float, scrape: Callable[[], Awaitable[bool]]) -> None:
    """Call `scrape` every `interval_s` until it returns False; a scrape that overran skips the ticks it covered."""
    interval_ns = max(1, int(interval_s * 1e9))
    due_ns = time.perf_counter_ns()
    while await scrape():
        due_ns += interval_ns
        now_ns = time.perf_counter_ns()
        if due_ns < now_ns:
            due_ns += -(-(now_ns - due_ns) // interval_ns) * interval_ns
        await asyncio.sleep((due_ns - now_ns) / 1e9)
