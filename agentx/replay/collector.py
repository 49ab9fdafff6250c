"""The garbage collector on a clock: small pauses at known times instead of one whenever ~700 objects were
allocated.

CPython's automatic collection pauses the event loop at arbitrary moments; every timestamp taken during a
pause is late (PERFORMANCE.md: dispatch lag). During a replay, `quiet_gc` freezes what set-up built (the
trace, the plans: never garbage, never walked again) and switches automatic collection off;
`collect_on_clock` then collects the young generation every 10 ms, a few thousand objects at most, and the
middle one every 1–10 s, more rarely as its pause grows with the requests in flight. The run's own
code leaves no reference cycles behind per request, so what these collections find is what libraries and
errors leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Final

from agentx.replay.clock import DispatchClock

YOUNG_EVERY_S: Final = 0.01
"""Short enough that a young collection stays under 1 ms at 1,000 requests/s (every 20 ms: up to 2 ms)."""
MIDDLE_EVERY_S: Final = (1.0, 10.0)
"""The middle generation's period bounds; within them the period is `MIDDLE_PAUSE_SHARE`⁻¹ × its last pause."""
MIDDLE_PAUSE_SHARE: Final = 0.0005
"""Middle collections take at most this share of the time: rare long pauses under heavy load (~6 ms at 360
requests in flight: every 10 s, delaying ~6 of 10,000 requests at 1,000/s), every few seconds when they are short
(setup C at 200/s: ~1.5 ms)."""


QUIET_SPAN_NS: Final = 2_000_000
"""A collection waits (up to its own period) for a moment when no request is due within this span."""


@contextlib.contextmanager
def quiet_gc(enabled: bool) -> Iterator[None]:
    """Collect and freeze the heap and turn automatic collection off for the block (restored after)."""
    if not enabled:
        yield
        return
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def freeze_new() -> None:
    """Move what the run built since the last collection out of the collector's sight, as `quiet_gc` does
    with set-up: a large session planned mid-run (agentx.replay.offloop) is tens of thousands of new tuples,
    which the next young collection would walk on the loop (95 ms for the largest session of the AgentX-size
    corpus). Requests in flight are frozen with it; they leave no reference cycles behind, and `quiet_gc`
    unfreezes everything at the end."""
    gc.freeze()


async def collect_on_clock(clock: DispatchClock | None = None) -> None:
    """Collect the young generation every `YOUNG_EVERY_S`, the middle one on its own period (see
    `MIDDLE_PAUSE_SHARE`), each in a gap between due requests when `clock` is given; runs until cancelled."""
    shortest_s, longest_s = MIDDLE_EVERY_S
    middle_due = time.perf_counter() + shortest_s
    while True:
        await asyncio.sleep(YOUNG_EVERY_S)
        if clock is not None:
            await clock.until_quiet(QUIET_SPAN_NS, YOUNG_EVERY_S)
        started = time.perf_counter()
        if started < middle_due:
            gc.collect(0)
            continue
        gc.collect(1)
        ended = time.perf_counter()
        middle_due = ended + min(longest_s, max(shortest_s, (ended - started) / MIDDLE_PAUSE_SHARE))
