"""Long loops of a run's start share the event loop: each lane's first tree and snapshot, the primers' tasks and the
lanes' tasks are made in slices of a few milliseconds, between which the loop serves what is due (a signal that
stops the run, requests already out). At 100,000 lanes each of those loops takes seconds; held in one piece, they
would hold off Ctrl-C and every timer for as long."""

from __future__ import annotations

import asyncio
import time
from typing import Final

SLICE_NS: Final = 5_000_000
"""How long a start-up loop holds the event loop before it yields (5 ms)."""


class Slices:
    """A loop's share of the event loop: `await slices.pause()` once an item yields the loop when the loop has held it
    for `slice_ns` since it last did (a clock read otherwise)."""

    __slots__ = ("_slice_ns", "_until_ns")

    def __init__(self, slice_ns: int = SLICE_NS) -> None:
        self._slice_ns = slice_ns
        self._until_ns = time.perf_counter_ns() + slice_ns

    async def pause(self) -> None:
        if time.perf_counter_ns() >= self._until_ns:
            await asyncio.sleep(0)
            self._until_ns = time.perf_counter_ns() + self._slice_ns
