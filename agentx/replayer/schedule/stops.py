"""How a caller ends a run early: `RunStops`, what Ctrl-C is to `agentx replay`, and `Cancellation`, the caller's
task cancelled.

A stop is not a cancellation. A stop asks the run to end early and return its (partial) result: the first ends it as
its deadline would (no new tree or request; those in flight get the grace period), the second ends the grace period
(the requests still in flight are recorded cancelled). Cancelling the task that awaits a replay also ends the run, at
once and with its files written, and then raises `CancelledError` as asyncio's contract asks (agentx.run.replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

OnStop = Callable[[int], None]
"""Called with the number of stops given so far (1: graceful, 2: the grace period ends)."""


class RunStops:
    """Stops for a run (module docstring), given with `stop()` from any thread; a run hears them through its
    `RunHooks.stops` while it runs, and a stop given before it started stops it as it starts."""

    def __init__(self) -> None:
        self.count = 0
        """Stops given so far."""
        self._listeners: list[OnStop] = []
        # Reentrant: a signal handler may stop while the thread it interrupted holds the lock.
        self._lock = threading.RLock()

    def stop(self) -> None:
        """Stop the run once more: the first time gracefully, the second ending the grace period."""
        with self._lock:  # held while the listeners hear it: each hears the stops in order, once
            self.count += 1
            for listener in self._listeners:
                listener(self.count)

    @contextlib.contextmanager
    def listening(self, on_stop: OnStop) -> Iterator[None]:
        """While entered, `on_stop(count)` for each stop, in the thread that gives it (so it only hands the stop on:
        to a loop's `call_soon_threadsafe`, a pipe); at entry, once for each stop given before."""
        with self._lock:
            self._listeners.append(on_stop)
            for count in range(1, self.count + 1):
                on_stop(count)
        try:
            yield
        finally:
            with self._lock:
                self._listeners.remove(on_stop)


class Cancellation:
    """Made where a run is asked for: `requested` once the task that asked has been cancelled since (asyncio counts a
    task's cancellations not yet taken back; an embedding program may hold some of its own). The layers that finish
    a run's files before they let the cancellation go on ask it."""

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.before = self.task.cancelling() if self.task is not None else 0

    @property
    def requested(self) -> bool:
        return self.task is not None and self.task.cancelling() > self.before
