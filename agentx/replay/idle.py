"""Idle caps: replay timers that move earlier when the server would otherwise sit idle (docs/agentx.md §4b, §4c).

Recorded sessions hold long idle gaps (a human reading, a tool running for minutes). Replayed as is, a
benchmark would spend much of its time with nothing in flight. Two caps shorten such gaps without
touching order, spacing or dependencies:

- **System idle cap** (AgentX locks it at 10 s): when nothing is in flight anywhere, every pending timer
  (next turns, subagent offsets, first turns after t*, primers) moves earlier by one common amount, so that
  the earliest fires at most `system_cap_s` after the system went idle.
- **Per-tree idle cap** (optional; InferenceX passes 300 s): the same, per tree: when a tree has nothing in
  flight, its own pending timers move so that its earliest fires at most `tree_cap_s` after it went idle.

A timer is a due time on the `perf_counter_ns` clock minus two shifts, the system's and its tree's; the
shifts only grow. Joins never move: a step waiting for a subagent waits for its completion, which no shift
can bring forward. Every shift is logged in `jumps` (when, which tree, by how much).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from agentx.replay.clock import DispatchClock


class Tree(Protocol):
    """What the caps need of a play: its in-flight count, its idle start and shift, its pending timers."""

    in_flight: int
    idle_since_ns: int | None
    idle_shift_ns: int
    pending_due_ns: dict[int, int]


class IdleCaps:
    """The replay's timers (module docstring). `None` disables a cap."""

    def __init__(
        self, system_cap_s: float | None, tree_cap_s: float | None, clock: DispatchClock | None = None
    ) -> None:
        self.system_cap_ns = None if system_cap_s is None else int(system_cap_s * 1e9)
        self.tree_cap_ns = None if tree_cap_s is None else int(tree_cap_s * 1e9)
        self.shift_ns = 0
        self.in_flight = 0
        self.idle_since_ns: int | None = time.perf_counter_ns()
        self.trees: set[Tree] = set()
        """Trees with pending timers."""
        self.jumps: list[tuple[int, str, int]] = []
        """(when, "system" or "tree", shift in ns)."""
        self._clock = clock
        self._waiters: set[asyncio.Future[None]] = set()
        self._next_token = 0

    def effective_ns(self, tree: Tree, due_ns: int) -> int:
        return due_ns - self.shift_ns - tree.idle_shift_ns

    async def wait(self, tree: Tree, due_ns: int, stop: asyncio.Event) -> tuple[bool, int]:
        """Wait until `due_ns`, as shifted; returns (stopped, the effective due time)."""
        token = self._next_token
        self._next_token += 1
        tree.pending_due_ns[token] = due_ns
        self.trees.add(tree)
        try:
            self._cap(tree)
            while True:
                effective = self.effective_ns(tree, due_ns)
                if stop.is_set():
                    return True, effective
                remaining_s = (effective - time.perf_counter_ns()) / 1e9
                if remaining_s <= 0:
                    return False, effective
                # Woken at the due time, or earlier by `wake_all` (a shift, the run's stop): look again.
                if self._clock is None:
                    self._clock = DispatchClock(precise=False)  # no fd to close; the runner passes a precise one
                waiter = self._clock.at(effective)
                self._waiters.add(waiter)
                try:
                    await waiter
                finally:
                    self._waiters.discard(waiter)
                    waiter.cancel()
        finally:
            del tree.pending_due_ns[token]
            if not tree.pending_due_ns:
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
        """Apply both caps as they stand now (called whenever something goes idle or a timer is set)."""
        shifted = False
        if self.tree_cap_ns is not None and tree.in_flight == 0 and tree.idle_since_ns is not None:
            earliest = self._earliest(tree)
            limit = tree.idle_since_ns + self.tree_cap_ns
            if earliest is not None and earliest > limit:
                tree.idle_shift_ns += earliest - limit
                self.jumps.append((time.perf_counter_ns(), "tree", earliest - limit))
                shifted = True
        if self.system_cap_ns is not None and self.in_flight == 0 and self.idle_since_ns is not None:
            candidates = [e for t in self.trees if (e := self._earliest(t)) is not None]
            limit = self.idle_since_ns + self.system_cap_ns
            if candidates and min(candidates) > limit:
                self.shift_ns += min(candidates) - limit
                self.jumps.append((time.perf_counter_ns(), "system", min(candidates) - limit))
                shifted = True
        if shifted:
            self.wake_all()

    def _earliest(self, tree: Tree) -> int | None:
        if not tree.pending_due_ns:
            return None
        return self.effective_ns(tree, min(tree.pending_due_ns.values()))
