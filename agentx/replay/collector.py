"""The garbage collector on a clock: small pauses at known times instead of one whenever ~700 objects were
allocated.

CPython's automatic collection pauses the event loop at arbitrary moments; every timestamp taken during a
pause is late (PERFORMANCE.md: dispatch lag). During a replay, `quiet_gc` freezes what set-up built (the
trace, the plans: never garbage, never walked again) and switches automatic collection off;
`collect_on_clock` then collects the young generation every 20 ms, a few thousand objects at most, and the
middle one every 5 s, whose pause grows with the requests in flight (~5 ms at 360 in flight). The run's own
code leaves no reference cycles behind per request, so what these collections find is what libraries and
errors leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
from collections.abc import Iterator
from typing import Final

YOUNG_EVERY_S: Final = 0.02
MIDDLE_EVERY_YOUNG: Final = 250
"""The middle generation is collected at every 250th young collection (every 5 s)."""


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


async def collect_on_clock() -> None:
    """Collect the young generation every `YOUNG_EVERY_S`, the middle one every `MIDDLE_EVERY_YOUNG` ticks;
    runs until cancelled."""
    for tick in itertools.count(1):
        await asyncio.sleep(YOUNG_EVERY_S)
        gc.collect(1 if tick % MIDDLE_EVERY_YOUNG == 0 else 0)
