"""The profiling gate of a per-lane cache-pressure stage (docs/agentx.md §4d): it opens when every lane has used its
quota and every pressure request has ended, and not before a lane whose tree ended with the last one has drawn its
next tree, which is handed over to profiling with the others whichever request ended last."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from agentx.records.record import RequestRecord
from agentx.replayer.schedule.warmup import ProfilingGate


def _request(event: asyncio.Event | None = None, then: Callable[[], None] | None = None) -> Awaitable[RequestRecord]:
    """A cache-pressure request that ends when `event` is set (at once without one), calling `then` as it ends."""

    async def request() -> None:
        if event is not None:
            await event.wait()
        if then is not None:
            then()

    return cast("Awaitable[RequestRecord]", request())


def test_the_gate_opens_when_the_last_pressure_request_ends() -> None:
    async def go() -> list[bool]:
        gate = ProfilingGate()
        gate.begin_pressure([0, 1], 1, pooled=False)
        assert gate.take(0) and gate.take(1) and not gate.take(0)
        first = asyncio.Event()
        pressing = asyncio.ensure_future(gate.press(_request(first)))
        await asyncio.sleep(0)  # the first request is in flight
        await gate.press(_request())
        one_in_flight = gate.started.is_set()
        first.set()
        await pressing
        return [one_in_flight, gate.started.is_set()]

    assert asyncio.run(go()) == [False, True]


def test_a_lane_held_for_its_next_tree_keeps_the_gate_shut_until_it_has_one() -> None:
    async def go() -> list[bool]:
        gate = ProfilingGate()
        gate.begin_pressure([0, 1], 1, pooled=False)
        assert gate.take(0)
        await gate.press(_request())
        assert gate.take(1)
        await gate.press(_request(then=lambda: gate.hold(1)))  # lane 1's tree ends with the last request
        shut = gate.started.is_set()
        gate.release(0)  # another lane's new tree: no effect
        still_shut = gate.started.is_set()
        gate.release(1)
        return [shut, still_shut, gate.started.is_set()]

    assert asyncio.run(go()) == [False, False, True]


def test_a_held_lane_with_nothing_left_opens_the_gate() -> None:
    async def go() -> list[bool]:
        gate = ProfilingGate()
        gate.begin_pressure([0], 1, pooled=False)
        assert gate.take(0)
        await gate.press(_request(then=lambda: gate.hold(0)))
        shut = gate.started.is_set()
        gate.lane_done(0)
        return [shut, gate.started.is_set()]

    assert asyncio.run(go()) == [False, True]
