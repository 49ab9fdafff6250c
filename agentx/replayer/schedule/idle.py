"""Idle caps: replay timers that move earlier when the server would otherwise sit idle (docs/agentx.md §4b, §4c).

Recorded sessions hold long idle gaps (a human reading, a tool running for minutes). Replayed as is, a
benchmark would spend much of its time with nothing in flight. Two caps shorten such gaps without
touching order, spacing or dependencies:

- **System idle cap** (AgentX locks it at 10 s): when nothing has been in flight anywhere for `system_cap_s`,
  every timer pending then (next turns, first turns after t*, primers) moves earlier by one common amount, so
  that the earliest fires at once: the system is never idle longer than the cap while a timer waits.
- **Per-tree idle cap** (optional, runtime kind): the same, per tree, after `tree_cap_s` with nothing of that
  tree in flight, on that tree's pending timers.

This is the reference's rule (`aiperf/common/loop_scheduler.py` `cap_pending_delay`, called by
`aiperf/timing/strategies/agentic_replay.py` `enforce_system_idle_cap` once a return has been processed): a shift
acts once, on the timers pending at that moment. A timer set later, after the next request returns, is
measured from that request's real completion with its full recorded delay, so a jump never shortens a future
think time. The reference shifts at the idle start so that the earliest fires at idle start + cap; a watchdog
armed at the idle start and firing at idle start + cap does the same, and sees every timer the completion that
began the idle set, whatever order the waiting steps wake in. A shifted timer is due at the cap, never before
it was set: nothing is due in the past. Joins never move (a join waits for a completion, which no shift brings
forward), nor do subagents' first-turn offsets (the reference sleeps those outside its scheduler). Every shift
is logged in `jumps` (when, which cap, by how much).

That watchdog is the harness's. AIPerf 0.13.0 instead shifts at the return itself (`at_return`): every return that
leaves nothing in flight shifts the timers pending then (those its own dispatch set included) so that the earliest
fires at the return + cap, and what is sent afterwards does not undo it. The two differ when something the caps do
not see goes out in between: AIPerf 0.13.0 sleeps a subagent's first-turn offset outside its scheduler, so a child
starting 50 ms after the return ended agentx's watchdog while the reference had already shifted. Here that is a
`Spell`: the timers pending at such a return and those set before the next completion (its own dispatch), shifted
at the return + cap by the amount the reference computed at the return; a send before the next completion cancels
it (a return-driven send: the reference saw a request in flight), unless it is a first turn slept outside the caps.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Hashable, Iterable

from agentx.replayer.schedule.clock import DispatchClock

Tree = Hashable
"""A play, as the caps know it: a key of its own state here (`TreeState`)."""


class TreeState:
    """The caps' view of one tree, theirs alone: its requests in flight, its idle start, its pending timers."""

    __slots__ = ("idle_since_ns", "in_flight", "pending_due_ns")

    def __init__(self) -> None:
        self.in_flight = 0
        self.idle_since_ns: int | None = None
        self.pending_due_ns: dict[int, int] = {}
        """Token → due time of each timer waiting."""


class IdleCaps:
    """The replay's timers (module docstring). `None` disables a cap."""

    def __init__(
        self,
        system_cap_s: float | None,
        tree_cap_s: float | None,
        clock: DispatchClock | None = None,
        *,
        at_return: bool = False,
    ) -> None:
        self.system_cap_ns = None if system_cap_s is None else int(system_cap_s * 1e9)
        self.tree_cap_ns = None if tree_cap_s is None else int(tree_cap_s * 1e9)
        self.skipped_ns = 0
        """Idle time the system cap removed, in all."""
        self.in_flight = 0
        self.idle_since_ns: int | None = time.perf_counter_ns()
        self.trees: set[TreeState] = set()
        """Trees with pending timers."""
        self._states: dict[Tree, TreeState] = {}
        self.jumps: list[tuple[int, str, int]] = []
        """(when, "system" or "tree", shift in ns)."""
        self._clock = clock
        self._waiters: set[asyncio.Future[None]] = set()
        self._tokens = itertools.count()
        self._set_ns: dict[int, int] = {}
        """When each pending timer was set (a shift never moves it before that)."""
        self._system_watch: asyncio.TimerHandle | None = None
        self._tree_watch: dict[TreeState, asyncio.TimerHandle] = {}
        self.at_return = at_return
        """The system cap as AIPerf 0.13.0's: at each return that leaves nothing in flight (module docstring)."""
        self._spells: list[Spell] = []
        """At-return shifts armed, the latest last; only the latest still takes timers (`Spell.open`)."""

    def state(self, tree: Tree) -> TreeState:
        """`tree`'s state here, made when first asked for."""
        found = self._states.get(tree)
        if found is None:
            found = self._states[tree] = TreeState()
        return found

    @property
    def tracked(self) -> int:
        """How many trees the caps hold state for (each until it is forgotten)."""
        return len(self._states)

    def forget(self, tree: Tree) -> None:
        """`tree` has ended: its state goes (nothing of it is in flight or waiting)."""
        state = self._states.pop(tree, None)
        if state is not None and (handle := self._tree_watch.pop(state, None)) is not None:
            handle.cancel()

    async def wait(self, play: Tree, due_ns: int, stop: asyncio.Event) -> tuple[bool, int]:
        """Wait until `due_ns`, or the earlier time a cap moves it to; returns (stopped, the due time it
        fired at)."""
        tree = self.state(play)
        token = next(self._tokens)
        pending = tree.pending_due_ns
        pending[token] = due_ns
        self._set_ns[token] = time.perf_counter_ns()
        self.trees.add(tree)
        if self._spells and self._spells[-1].open:
            self._spells[-1].timers[token] = tree
        try:
            self._arm(tree)
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
            for spell in self._spells:
                if spell.timers.pop(token, None) is not None:
                    spell.fired_due_ns = min(spell.fired_due_ns, pending[token])
            del pending[token]
            del self._set_ns[token]
            if not pending:
                self.trees.discard(tree)

    def wake_all(self) -> None:
        """Make every waiter look again (after a shift, or when the run stops)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        """Disarm the watchdogs (the run is over)."""
        if self._system_watch is not None:
            self._system_watch.cancel()
            self._system_watch = None
        for spell in self._spells:
            spell.handle.cancel()
        self._spells.clear()
        for handle in self._tree_watch.values():
            handle.cancel()
        self._tree_watch.clear()

    def start_tree_cap(self, cap_s: float, trees: Iterable[Tree], since_ns: int) -> None:
        """Switch the per-tree cap on from `since_ns` (the profiling start, under the harness's rules, §4c): each of
        `trees` with nothing in flight is idle from then, whatever it did before."""
        self.tree_cap_ns = int(cap_s * 1e9)
        for tree in map(self.state, trees):
            if tree.in_flight == 0:
                tree.idle_since_ns = since_ns
                self._arm(tree)

    def started(self, play: Tree, outside_caps: bool = False) -> None:
        """A request of `play` went out; `outside_caps`: a first turn whose offset was slept outside the caps (it
        does not undo an at-return shift)."""
        tree = self.state(play)
        self.in_flight += 1
        tree.in_flight += 1
        self.idle_since_ns = None
        tree.idle_since_ns = None
        if self._spells and self._spells[-1].open and not outside_caps:
            self._spells.pop().handle.cancel()  # a return-driven send: the reference saw a request in flight
        if self._system_watch is not None:
            self._system_watch.cancel()
            self._system_watch = None
        if (handle := self._tree_watch.pop(tree, None)) is not None:
            handle.cancel()

    def finished(self, play: Tree) -> None:
        """A request of `play` ended."""
        tree = self.state(play)
        now = time.perf_counter_ns()
        self.in_flight -= 1
        tree.in_flight -= 1
        if tree.in_flight == 0:
            tree.idle_since_ns = now
        if self.in_flight == 0:
            self.idle_since_ns = now
        if self._spells:
            self._spells[-1].open = False  # the timers set from here on are a later return's
        if self.at_return and self.in_flight == 0 and self.system_cap_ns is not None:
            self._arm_spell(now)
        self._arm(tree)

    def _arm(self, tree: TreeState) -> None:
        """Arm the watchdogs of an idle system and an idle tree that have timers pending (once per idle spell)."""
        loop = asyncio.get_running_loop()
        now = time.perf_counter_ns()
        cap, since = self.system_cap_ns, self.idle_since_ns
        idle_system = since is not None and self.in_flight == 0 and self._system_watch is None and bool(self.trees)
        if cap is not None and since is not None and idle_system and not self.at_return:
            self._system_watch = loop.call_later(max(0.0, (since + cap - now) / 1e9), self._fire_system)
        cap, since = self.tree_cap_ns, tree.idle_since_ns
        idle_tree = since is not None and tree.in_flight == 0 and bool(tree.pending_due_ns)
        if cap is not None and since is not None and idle_tree and tree not in self._tree_watch:
            self._tree_watch[tree] = loop.call_later(max(0.0, (since + cap - now) / 1e9), self._fire_tree, tree)

    def _fire_system(self) -> None:
        self._system_watch = None
        if self.system_cap_ns is None or self.in_flight or self.idle_since_ns is None:
            return
        shift = self._shift(self.idle_since_ns + self.system_cap_ns, self.trees)
        if shift > 0:
            self.skipped_ns += shift
            self.jumps.append((time.perf_counter_ns(), "system", shift))
            self.wake_all()

    def _fire_tree(self, tree: TreeState) -> None:
        self._tree_watch.pop(tree, None)
        if self.tree_cap_ns is None or tree.in_flight or tree.idle_since_ns is None:
            return
        shift = self._shift(tree.idle_since_ns + self.tree_cap_ns, [tree])
        if shift > 0:
            self.jumps.append((time.perf_counter_ns(), "tree", shift))
            self.wake_all()

    def _arm_spell(self, now_ns: int) -> None:
        assert self.system_cap_ns is not None
        spell = Spell(limit_ns=now_ns + self.system_cap_ns)
        spell.timers = {token: tree for tree in self.trees for token in tree.pending_due_ns}
        delay_s = max(0.0, (spell.limit_ns - time.perf_counter_ns()) / 1e9)
        spell.handle = asyncio.get_running_loop().call_later(delay_s, self._fire_spell, spell)
        self._spells.append(spell)

    def _fire_spell(self, spell: Spell) -> None:
        """The shift the reference made at the spell's return: the earliest of its timers (those fired since
        included) due at the return + cap; only its timers still pending move."""
        self._spells.remove(spell)
        dues = [tree.pending_due_ns[token] for token, tree in spell.timers.items()]
        earliest = min([*dues, spell.fired_due_ns])
        shift = earliest - spell.limit_ns
        if not dues or shift <= 0:
            return
        set_ns = self._set_ns
        for token, tree in spell.timers.items():
            pending = tree.pending_due_ns
            pending[token] = max(pending[token] - shift, spell.limit_ns, set_ns[token])
        self.skipped_ns += shift
        self.jumps.append((time.perf_counter_ns(), "system", shift))
        self.wake_all()

    def _shift(self, limit_ns: int, trees: Iterable[TreeState]) -> int:
        """Move the pending timers of `trees` earlier by one amount so that the earliest is due at `limit_ns`,
        none before it was set; returns the amount (0: the earliest was due by then)."""
        trees = list(trees)
        dues = [due for tree in trees for due in tree.pending_due_ns.values()]
        if not dues:
            return 0
        shift = min(dues) - limit_ns
        if shift <= 0:
            return 0
        set_ns = self._set_ns
        for tree in trees:
            pending = tree.pending_due_ns
            for token, due in pending.items():
                pending[token] = max(due - shift, limit_ns, set_ns[token])
        return shift


class Spell:
    """An at-return shift armed (`IdleCaps.at_return`): the timers it moves (token → tree), the earliest due of
    those that fired before it, and when it acts."""

    __slots__ = ("fired_due_ns", "handle", "limit_ns", "open", "timers")

    def __init__(self, limit_ns: int) -> None:
        self.limit_ns = limit_ns
        self.timers: dict[int, TreeState] = {}
        self.fired_due_ns = sys.maxsize
        self.open = True
        """Still taking the timers its return's own dispatch sets (until the next completion or send)."""
        self.handle: asyncio.TimerHandle
