"""The garbage collector on a clock: small pauses at known times instead of one whenever ~700 objects were
allocated.

CPython's automatic collection pauses the event loop at arbitrary moments; every timestamp taken during a
pause is late (dispatch lag: bench/README.md, Targets). During a replay, `quiet_gc` freezes what set-up built (the
trace, the plans: never garbage, never walked again) and switches automatic collection off;
`collect_on_clock` then collects the young generation every 10 ms, a few thousand objects at most, the
middle one every 1–10 s, more rarely as its pause grows with the requests in flight, and the oldest one
every 10–60 s on the same rule. The run's own code leaves no reference cycles behind per request, so what
these collections find is what libraries and errors leave; a cycle that reaches the oldest generation (one
through a long-lived object, such as a pooled connection or a session tree's play) is freed only by a
collection of that generation, so without the last one it stayed until the end of the run (the replay's memory
grew by megabytes a second under a fault mix).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Final

from agentx.replayer.schedule.clock import DispatchClock

YOUNG_EVERY_S: Final = 0.01
"""Short enough that a young collection stays under 1 ms at 1,000 requests/s (every 20 ms: up to 2 ms)."""
MIDDLE_EVERY_S: Final = (1.0, 10.0)
"""The middle generation's period bounds; within them the period is `MIDDLE_PAUSE_SHARE`⁻¹ × its last pause."""
MIDDLE_PAUSE_SHARE: Final = 0.0005
"""Middle collections take at most this share of the time: rare long pauses under heavy load (~6 ms at 360
requests in flight: every 10 s, delaying ~6 of 10,000 requests at 1,000/s), every few seconds when they are short
(bench/README.md's setup C at 200/s: ~1.5 ms)."""
OLDEST_EVERY_S: Final = (10.0, 60.0)
"""The oldest generation's period bounds, with the same pause share: it holds only what the run made and kept
through two collections (set-up is frozen), ~100k objects at 256 lanes, a pause of a few ms; the bound of a minute
caps how long cyclic garbage that reached it is kept."""


QUIET_SPAN_NS: Final = 2_000_000
"""A collection waits (up to its own period) for a moment when no request is due within this span."""


@contextlib.contextmanager
def quiet_gc(enabled: bool) -> Iterator[None]:
    """Collect and freeze the heap and turn automatic collection off for the block (restored after).

    Process-wide, and `gc.unfreeze()` at the end also unfreezes what the host had frozen: only for a process the
    run owns (the CLI, or a caller that asks with `Runtime.quiet_gc`)."""
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
    with set-up: a large session planned mid-run (agentx.replayer.schedule.offloop) is tens of thousands of new tuples,
    which the next young collection would walk on the loop (95 ms for the largest session of the AgentX-size
    corpus). Requests in flight are frozen with it; they leave no reference cycles behind, and `quiet_gc`
    unfreezes everything at the end."""
    gc.freeze()


def _next_due(ended: float, pause_s: float, bounds_s: tuple[float, float]) -> float:
    shortest_s, longest_s = bounds_s
    return ended + min(longest_s, max(shortest_s, pause_s / MIDDLE_PAUSE_SHARE))


async def collect_on_clock(clock: DispatchClock | None = None) -> None:
    """Collect the young generation every `YOUNG_EVERY_S`, the middle and the oldest ones on their own periods
    (see `MIDDLE_PAUSE_SHARE`), each in a gap between due requests when `clock` is given; runs until cancelled."""
    now = time.perf_counter()
    middle_due = now + MIDDLE_EVERY_S[0]
    oldest_due = now + OLDEST_EVERY_S[0]
    while True:
        await asyncio.sleep(YOUNG_EVERY_S)
        if clock is not None:
            await clock.until_quiet(QUIET_SPAN_NS, YOUNG_EVERY_S)
        started = time.perf_counter()
        if started < middle_due:
            gc.collect(0)
            continue
        generation = 2 if started >= oldest_due else 1
        gc.collect(generation)
        ended = time.perf_counter()
        # A collection of the oldest generation collects the middle one too: both periods start again.
        middle_due = _next_due(ended, ended - started, MIDDLE_EVERY_S)
        if generation == 2:
            oldest_due = _next_due(ended, ended - started, OLDEST_EVERY_S)
