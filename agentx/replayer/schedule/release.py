"""Why a step went when it did: what released it, the delay applied after that, what the idle caps cut, and how long it
waited for other agents past its own due. The records carry it (`released_by_request_id`, `think_s`, `idle_cut_s`,
`join_wait_s`), from which the summary finds each play's critical path (agentx.results.summary.explain.critical_path).

A step is due at `released_ns + think_ns − idle_cut_ns` (agentx.replayer.schedule.due): its anchor's completion (or,
for a branch started from its spawning turn's send, that send) plus its recorded delay, or the play's start or the
profiling start plus its offset. A joined subagent or a barrier completing after that releases it instead, at its
completion with no think; `join_wait_ns` is then how long past its own due it went.
"""

from __future__ import annotations

import msgspec


class Release(msgspec.Struct, kw_only=True, gc=False):
    """The due time of one step and what set it, on the perf-counter clock in ns; changed as the schedule settles it
    (`hold`, `not_before`, `cut_to`)."""

    due_ns: int
    released_ns: int
    """When its release happened: a completion, a send, or the play's or profiling's start."""
    released_by: int | None
    """The step whose completion (or send) released it; None: the play's start or the profiling start."""
    think_ns: int
    """The delay applied after the release, before the idle caps."""
    idle_cut_ns: int = 0
    join_wait_ns: int = 0
    own_due_ns: int = 0
    """When its own agent's schedule had it due (its anchor's release + think − cut), which joins may pass."""

    @classmethod
    def after(cls, released_by: int | None, released_ns: int, think_ns: int) -> Release:
        """Due `think_ns` after a release at `released_ns` by `released_by`."""
        due = released_ns + think_ns
        return cls(due_ns=due, released_ns=released_ns, released_by=released_by, think_ns=think_ns, own_due_ns=due)

    def hold(self, step: int, completed_ns: int) -> None:
        """`step` (a joined subagent's last, or a barrier) completed at `completed_ns` and releases it then, with no
        think: the wait past its own due is a join wait."""
        self.join_wait_ns = max(0, completed_ns - self.own_due_ns)
        self.due_ns = self.released_ns = completed_ns
        self.released_by = step
        self.think_ns = self.idle_cut_ns = 0

    def not_before(self, start_ns: int) -> None:
        """Not due before `start_ns` (the profiling start): when that comes later, it is the release."""
        if start_ns > self.due_ns:
            self.due_ns = self.released_ns = start_ns
            self.released_by = None
            self.think_ns = self.idle_cut_ns = self.join_wait_ns = 0

    def cut_to(self, fired_ns: int) -> None:
        """The idle caps made it fire at `fired_ns`, no later than it was due."""
        cut = max(0, self.due_ns - fired_ns)
        self.idle_cut_ns += cut
        self.due_ns -= cut
        if self.join_wait_ns == 0:
            self.own_due_ns -= cut
