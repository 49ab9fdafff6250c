"""A shard's clock against the driver's: round trips, the midpoint, the bound (docs/distributed.md, "One timeline").

Each round the driver reads its clock, asks the shard for its own, and reads its clock again as the answer arrives.
The shard's reading happened somewhere inside that round trip, so with the driver's midpoint as its estimate the
error is at most half the round trip, whatever the two directions took. The quickest of several rounds gives the
tightest bound; that bound, not a statistical spread, is what run.json reports.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import msgspec

CLOCK_ROUNDS: Final = 16
"""Round trips per measurement: the quickest of 16 is within ~10% of the floor on a loaded 2-core host."""
CLOCK_WARN_NS: Final = 1_000_000
"""A bound (or a drift over the run) above this is announced: timestamps across shards may be off by as much."""


class ClockRound(msgspec.Struct, frozen=True):
    """One question and answer, each on its own clock (ns)."""

    asked_ns: int
    """The driver's clock as the question left."""
    shard_ns: int
    """The shard's clock as it answered."""
    answered_ns: int
    """The driver's clock as the answer arrived."""


class ClockOffset(msgspec.Struct, frozen=True):
    """A shard's clock minus the driver's, within ± `error_ns`."""

    offset_ns: int
    error_ns: int
    rounds: int

    def to_shard(self, driver_ns: int) -> int:
        """The shard's reading at the instant the driver's clock reads `driver_ns`."""
        return driver_ns + self.offset_ns


def estimate(rounds: Sequence[ClockRound]) -> ClockOffset:
    """The offset from the quickest round: the shard's reading minus the driver's midpoint, ± half the round trip."""
    if not rounds:
        raise ValueError("a clock offset needs at least one round trip")
    best = min(rounds, key=lambda r: r.answered_ns - r.asked_ns)
    trip_ns = best.answered_ns - best.asked_ns
    if trip_ns < 0:
        raise ValueError(f"a round trip ended before it began ({best})")
    # The exact midpoint may fall on half a nanosecond: rounding it costs at most that, so the bound rounds up.
    offset_ns = best.shard_ns - (best.asked_ns + best.answered_ns) // 2
    return ClockOffset(offset_ns=offset_ns, error_ns=(trip_ns + 1) // 2 + 1, rounds=len(rounds))


async def measure(
    ask: Callable[[], Awaitable[int]],
    *,
    rounds: int = CLOCK_ROUNDS,
    now_ns: Callable[[], int] = time.perf_counter_ns,
) -> ClockOffset:
    """`estimate` over `rounds` round trips of `ask()`, which returns the shard's clock."""
    samples = []
    for _ in range(rounds):
        asked_ns = now_ns()
        shard_ns = await ask()
        samples.append(ClockRound(asked_ns=asked_ns, shard_ns=shard_ns, answered_ns=now_ns()))
    return estimate(samples)
