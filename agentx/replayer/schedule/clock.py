"""Wake-ups at a `perf_counter_ns` instant, to the tens of microseconds: when each request is due.

Event loops time their sleeps in milliseconds: asyncio's selector rounds its timeout up to the next
millisecond and uvloop's clock only advances once per loop iteration, in whole milliseconds. A request
due at t is then sent up to ~1 ms late even on an idle machine, which is most of a p99 dispatch-lag target
of 1–2 ms (bench/README.md, Targets). On Linux a `timerfd`, armed at the earliest due time on `CLOCK_MONOTONIC`
(`perf_counter`'s clock) and watched by the loop like a socket, wakes the loop at that nanosecond instead;
nothing polls. Elsewhere the clock falls back to the loop's own timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Final

QUIET_POLL_S: Final = 0.001
"""How often `until_quiet` looks again for a gap."""

_CLOCK_MONOTONIC: Final = 1
_TFD_NONBLOCK: Final = os.O_NONBLOCK
_TFD_CLOEXEC: Final = 0o2000000
_TFD_TIMER_ABSTIME: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class _TimerFd:
    """A Linux timerfd on CLOCK_MONOTONIC, set to absolute instants (libc through ctypes before Python 3.13,
    which has `os.timerfd_create`)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd: int = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = fd
        self._spec = _Itimerspec()

    def set_at(self, instant_ns: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(max(instant_ns, 1), 1_000_000_000)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the loop may report it readable twice
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)


def _timerfd() -> _TimerFd | None:
    if not sys.platform.startswith("linux") or time.get_clock_info("perf_counter").implementation != (
        "clock_gettime(CLOCK_MONOTONIC)"
    ):
        return None
    try:
        return _TimerFd()
    except (OSError, AttributeError):
        return None


class DispatchClock:
    """`at(instant_ns)` gives a future that completes at that `perf_counter_ns` instant. Use as a context
    manager inside the running loop (it holds a file descriptor); `precise=False` uses the loop's timers."""

    def __init__(self, *, precise: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._timer = _timerfd() if precise else None
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._armed_ns = 0  # the instant the timerfd is set to; 0: disarmed
        if self._timer is not None:
            self._loop.add_reader(self._timer.fd, self._fire)

    @property
    def precise(self) -> bool:
        return self._timer is not None

    def __enter__(self) -> DispatchClock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._loop.remove_reader(self._timer.fd)
            self._timer.close()
            self._timer = None
        for _, _, waiter in self._heap:
            waiter.cancel()
        self._heap.clear()

    def at(self, instant_ns: int) -> asyncio.Future[None]:
        """A future done at `instant_ns` (at once if it has passed). Cancel it to give up the wait."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (instant_ns, next(self._order), waiter))
        if self._timer is None:
            delay_s = (instant_ns - time.perf_counter_ns()) / 1e9
            handle = self._loop.call_later(max(0.0, delay_s), _wake, waiter)
            waiter.add_done_callback(lambda _: handle.cancel())
        elif not self._armed_ns or instant_ns < self._armed_ns:
            self._arm(instant_ns)
        return waiter

    def quiet_for(self, span_ns: int) -> bool:
        """Whether no waiter is due within `span_ns` from now: a gap for work that holds the loop."""
        heap = self._heap
        while heap and heap[0][2].done():
            heapq.heappop(heap)
        return not heap or heap[0][0] - time.perf_counter_ns() > span_ns

    async def until_quiet(self, span_ns: int, patience_s: float) -> None:
        """Return once `quiet_for(span_ns)`, or after `patience_s` whatever is due (so work put off for a gap
        is never put off for long)."""
        deadline = time.perf_counter() + patience_s
        while not self.quiet_for(span_ns) and time.perf_counter() < deadline:
            await asyncio.sleep(QUIET_POLL_S)

    def _arm(self, instant_ns: int) -> None:
        assert self._timer is not None
        self._armed_ns = instant_ns
        self._timer.set_at(instant_ns)

    def _fire(self) -> None:
        assert self._timer is not None
        self._timer.drain()
        heap = self._heap
        now_ns = time.perf_counter_ns()
        while heap and (heap[0][0] <= now_ns or heap[0][2].done()):
            _wake(heapq.heappop(heap)[2])
        self._armed_ns = 0
        if heap:
            self._arm(heap[0][0])


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: a quarter less client CPU per streamed chunk (bench/replay_overhead.py)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency except on Windows
        return None
    return uvloop.new_event_loop
