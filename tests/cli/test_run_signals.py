"""The command line's stop signals around a run's event loop (agentx.cli.common.run_interruptibly): one that lands
while the loop is made or closed waits for the run as a stop, never an interrupt raised inside the loop's own code
(which left a half-made loop, or tasks destroyed pending, and their messages after the one line a stop prints)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import pytest

from agentx.cli.common import run_interruptibly, stop_signals_raise
from agentx.replayer.schedule.hooks import RunHooks


@contextlib.contextmanager
def signalled(count: int, *, on_exit: bool = False) -> Iterator[None]:
    """Raise SIGINT `count` times as the run's context is entered (after its loop is made), or as it is left."""
    if not on_exit:
        for _ in range(count):
            signal.raise_signal(signal.SIGINT)
    yield
    if on_exit:
        for _ in range(count):
            signal.raise_signal(signal.SIGINT)


async def stops_seen(hooks: RunHooks) -> int:
    await asyncio.sleep(0)
    assert hooks.stops is not None
    return hooks.stops.count


def test_a_stop_signal_as_the_loop_is_made_reaches_the_run_as_a_stop() -> None:
    with stop_signals_raise():
        assert run_interruptibly(stops_seen, None, signalled(1)) == 1
        assert run_interruptibly(stops_seen, None, signalled(2)) == 2


def test_a_third_stop_signal_before_the_run_cancels_it() -> None:
    with stop_signals_raise(), pytest.raises(asyncio.CancelledError):
        run_interruptibly(stops_seen, None, signalled(3))


def test_a_stop_signal_as_the_run_ends_is_no_interrupt() -> None:
    with stop_signals_raise():
        assert run_interruptibly(stops_seen, None, signalled(1, on_exit=True)) == 0
    with stop_signals_raise(), pytest.raises(KeyboardInterrupt):  # after the run's handling: the command's own
        signal.raise_signal(signal.SIGINT)


def test_stop_signals_during_the_run_are_stops() -> None:
    async def stopped_twice(hooks: RunHooks) -> int:
        assert hooks.stops is not None
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):
            await asyncio.sleep(0)
        return hooks.stops.count

    with stop_signals_raise():
        assert run_interruptibly(stopped_twice) == 2
