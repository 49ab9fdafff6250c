"""Idle caps: replay timers that move earlier when the server would otherwise sit idle (docs/agentx.md §4b, §4c).

Recorded sessions hold long idle gaps (a human reading, a tool running for minutes). Replayed as is, a
benchmark would spend much of its time with nothing in flight. Two caps shorten such gaps without
touching order, spacing or dependencies:

- **System idle cap** (AgentX locks it at 10 s): when nothing is in flight anywhere, every timer pending at
  that moment (next turns, subagent offsets, first turns after t*, primers) moves earlier by one common
  amount, so that the earliest fires at most `system_cap_s` after the system went idle.
- **Per-tree idle cap** (optional, runtime kind): the same, per tree: when a tree has nothing in flight, its
  own pending timers move so that its earliest fires at most `tree_cap_s` after it went idle.

A shift acts once, on the timers pending at that moment, as the reference's `cap_pending_delay`
(`common/loop_scheduler.py`) does: a timer set later, after the next request returns, is measured from that
request's real completion with its full recorded delay. So a jump never shortens a future think time, and a
timer is never due in the past (a shifted one is due at the earliest now). Joins never move: a step waiting
for a subagent waits for its completion, which no shift can bring forward. Every shift is logged in `jumps`
(when, which cap, by how much).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from agentx.replay.clock import DispatchClock


class Tree(Protocol):
    """What the caps need of a play: its in-flight count, its idle start, its pending timers (token → due)."""

    in_flight: int
    idle_since_ns: int | None
    pending_due_ns: dict[int, int]


class IdleCaps:
    """The replay's timers (module docstring). `None` disables a cap."""

    def __init__(
        self, system_cap_s: float | None, tree_cap_s: float | None, clock: DispatchClock | None = None
    ) -> None:
        self.system_cap_ns = None if system_cap_s is None else int(system_cap_s * 1e9)
        self.tree_cap_ns = None if tree_cap_s is None else int(tree_cap_s * 1e9)
        self.skipped_ns = 0
        """Idle time the system cap removed, in all."""
        self.in_flight = 0
        self.idle_since_ns: int | None = time.perf_counter_ns()
        self.trees: set[Tree] = set()
        """Trees with pending timers."""
        self.jumps: list[tuple[int, str, int]] = []
        """(when, "system" or "tree", shift in ns)."""
        self._clock = clock
        self._waiters: set[asyncio.Future[None]] = set()
        self._next_token = 0

    async def wait(self, tree: Tree, due_ns: int, stop: asyncio.Event) -> tuple[bool, int]:
        """Wait until `due_ns`, or the earlier time a cap moves it to; returns (stopped, the due time it
        fired at)."""
        token = self._next_token
        self._next_token += 1
        pending = tree.pending_due_ns
        pending[token] = due_ns
        self.trees.add(tree)
        try:
            self._cap(tree)
            while True:
                due = pending[token]
                if stop.is_set():
                    return True, due
                if due <= time.perf_counter_ns():
                    return False, due
                # Woken at the due time, or earlier by `wake_all` (a shift, the run's stop): look again.
                if self._clock is None:
                    self._clock = DispatchClock(precise=False)  # no fd to close; the runner passes a precise one
                waiter = self._clock.at(due)
                self._waiters.add(waiter)
                try:
                    await waiter
                finally:
                    self._waiters.discard(waiter)
                    waiter.cancel()
        finally:
            del pending[token]
            if not pending:
                self.trees.discard(tree)

    def wake_all(self) -> None:
        """Make every waiter look again (after a shift, or when the run stops)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def started(self, tree: Tree) -> None:
        self.in_flight += 1
        tree.in_flight += 1
        self.idle_since_ns = None
        tree.idle_since_ns = None

    def finished(self, tree: Tree) -> None:
        now = time.perf_counter_ns()
        self.in_flight -= 1
        tree.in_flight -= 1
        if tree.in_flight == 0:
            tree.idle_since_ns = now
        if self.in_flight == 0:
            self.idle_since_ns = now
        self._cap(tree)

    def _cap(self, tree: Tree) -> None:
        """Apply both caps to the timers pending now (called when something goes idle or a timer is set)."""
        now = time.perf_counter_ns()
        shifted = False
        if self.tree_cap_ns is not None and tree.in_flight == 0 and tree.idle_since_ns is not None:
            shift = _shift(tree.idle_since_ns + self.tree_cap_ns, now, [tree])
            if shift > 0:
                self.jumps.append((now, "tree", shift))
                shifted = True
        if self.system_cap_ns is not None and self.in_flight == 0 and self.idle_since_ns is not None:
            shift = _shift(self.idle_since_ns + self.system_cap_ns, now, self.trees)
            if shift > 0:
                self.skipped_ns += shift
                self.jumps.append((now, "system", shift))
                shifted = True
        if shifted:
            self.wake_all()


def _shift(limit_ns: int, now_ns: int, trees: set[Tree] | list[Tree]) -> int:
    """Move the pending timers of `trees` earlier by one amount so that the earliest is due at `limit_ns` (or
    now, if that has passed), none before now; returns the amount (0: the earliest was due soon enough)."""
    dues = [due for tree in trees for due in tree.pending_due_ns.values()]
    if not dues:
        return 0
    shift = min(dues) - max(limit_ns, now_ns)
    if shift <= 0:
        return 0
    for tree in trees:
        pending = tree.pending_due_ns
        for token, due in pending.items():
            pending[token] = max(now_ns, due - shift)
    return shift
