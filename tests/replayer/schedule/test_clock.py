"""The dispatch clock: wake-ups at a perf_counter instant (timerfd on Linux, loop timers elsewhere) and the
gaps between due requests that maintenance work waits for."""

from __future__ import annotations

import asyncio
import random
import sys
import time

import pytest

from agentx.replayer.schedule import clock as clock_module
from agentx.replayer.schedule.clock import DispatchClock

MS = 1_000_000


@pytest.fixture(params=["timerfd", "loop timers"])
def precise(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "loop timers":
        monkeypatch.setattr(clock_module, "_timerfd", lambda: None)
    return bool(request.param == "timerfd")


def test_waiters_wake_in_order_and_never_early(precise: bool) -> None:
    async def main() -> tuple[bool, list[tuple[int, int]]]:
        woken: list[tuple[int, int]] = []
        with DispatchClock() as clock:
            start = time.perf_counter_ns()
            offsets = [random.Random(7).randrange(0, 30 * MS) for _ in range(40)]

            async def one(due_ns: int) -> None:
                await clock.at(due_ns)
                woken.append((due_ns, time.perf_counter_ns()))

            await asyncio.gather(*(one(start + offset) for offset in offsets))
            return clock.precise, woken

    used_timerfd, woken = asyncio.run(main())
    assert used_timerfd == (precise and sys.platform.startswith("linux"))
    assert len(woken) == 40
    assert all(at >= due for due, at in woken), "a waiter woke before its instant"
    dues = [due for due, _ in woken]
    assert dues == sorted(dues)


def test_a_past_instant_and_a_cancelled_waiter(precise: bool) -> None:
    async def main() -> bool:
        with DispatchClock() as clock:
            await clock.at(time.perf_counter_ns() - MS)  # already due: done at once
            gone = clock.at(time.perf_counter_ns() + 5 * MS)
            gone.cancel()
            later = clock.at(time.perf_counter_ns() + 10 * MS)
            await asyncio.wait_for(later, timeout=2)
            return gone.cancelled()

    assert asyncio.run(main())


def test_quiet_gaps(precise: bool) -> None:
    async def main() -> tuple[bool, bool, bool, float]:
        with DispatchClock() as clock:
            empty = clock.quiet_for(2 * MS)
            soon = clock.at(time.perf_counter_ns() + 1 * MS)
            busy = clock.quiet_for(2 * MS)  # a waiter is due within 2 ms
            started = time.perf_counter()
            await clock.until_quiet(2 * MS, patience_s=1.0)  # returns once it woke
            waited_s = time.perf_counter() - started
            far = clock.at(time.perf_counter_ns() + 10_000 * MS)
            quiet_despite_far = clock.quiet_for(2 * MS)
            far.cancel()
            await soon
            return empty, busy, quiet_despite_far, waited_s

    empty, busy, quiet_far, waited_s = asyncio.run(main())
    assert empty and not busy and quiet_far
    assert waited_s < 0.5


def test_patience_bounds_the_wait_for_a_gap(precise: bool) -> None:
    async def main() -> float:
        with DispatchClock() as clock:
            # Always a waiter due within the span: no gap ever comes, the patience ends the wait.
            keep = [clock.at(time.perf_counter_ns() + i * MS) for i in range(1, 200)]
            started = time.perf_counter()
            await clock.until_quiet(300 * MS, patience_s=0.05)
            waited = time.perf_counter() - started
            for waiter in keep:
                waiter.cancel()
            return waited

    waited = asyncio.run(main())
    assert 0.04 <= waited < 1.0
