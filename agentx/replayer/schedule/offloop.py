"""CPU-heavy work of a run on worker threads, so the event loop keeps dispatching meanwhile.

Planning a session is pure Python: tens of µs for a small session, but over 100 ms to split and plan the largest
session of the AgentX-size corpus. Done on the loop, that holds every lane's dispatch as long (a replay of that corpus
at 32 lanes: dispatch lag p99 35 ms, max 155 ms). `OffLoop.run` does it on a worker thread (one per kind of work, so
one kind never waits behind another) and awaits it, so only the lane or tree that needs it waits. (A body's new
blocks are made on the loop instead, a group at a time: agentx.replayer.schedule.runner, `WARM_GROUP_BLOCKS`.)
While one works, the interpreter can hand itself between threads every `SWITCH_INTERVAL_S` (the default, 5 ms, would
let a worker hold it that long), set back once all are idle. That setting is process-wide, so only an `OffLoop` made
with `fast_switch` (the CLI's, `Runtime.fast_thread_switch`) changes it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

SWITCH_INTERVAL_S: Final = 0.0005
"""The interpreter's thread switch interval while the worker thread runs."""
OFF_LOOP_REQUESTS: Final = 64
"""Sessions with at least this many requests are planned off the loop."""

T = TypeVar("T")


class OffLoop:
    """Worker threads, one per kind of work (a body must not wait behind a plan), started on first use; `run`
    awaits a call on one."""

    def __init__(self, fast_switch: bool = False) -> None:
        self._fast_switch = fast_switch
        self._executors: dict[str, ThreadPoolExecutor] = {}
        self._running = 0
        self._saved_interval_s = 0.0

    async def run(self, kind: str, function: Callable[..., T], *args: object) -> T:
        """`function(*args)` on `kind`'s worker thread. It must only share state with the loop that is safe to
        change from several threads (atomic assignments, values it reads but never writes)."""
        executor = self._executors.get(kind)
        if executor is None:
            executor = self._executors[kind] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"agentx-{kind}")
        if self._running == 0 and self._fast_switch:
            self._saved_interval_s = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, function, *args)
        finally:
            self._running -= 1
            if self._running == 0 and self._fast_switch:
                sys.setswitchinterval(self._saved_interval_s)

    def close(self) -> None:
        """Stop the worker threads (a call still running finishes on its thread; nothing waits for it)."""
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)
        self._executors.clear()
