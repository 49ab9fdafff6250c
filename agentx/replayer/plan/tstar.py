"""Where a lane's first tree joins the recording: its t*, and the snapshot of the session at t* (docs/agentx.md §4d).

An AgentX run does not start every lane at turn 0: each lane's first tree resumes mid-session, at a time t*
drawn per (seed, trace, lane) inside a window of the session's span, so that the server sees steady-state
traffic (long contexts, subagents in flight) from the first profiled second. Recycled trees start at turn 0.

`t_star` draws it: `numpy.default_rng(int.from_bytes(sha256(f"{seed}:{trace_id}:{lane}")[:8], "big"))` then
`uniform(T0 + low·D, T0 + high·D)`, with T0 and D the first and the span of every request start in the tree.

`snapshot(plan, t_star)` says what each step of the tree is at t*, in the plan's terms:

- **done**: recorded start before t*: already happened, never sent (for joins it counts as complete);
- **skipped**: steps of a subagent that never runs from t*: it had finished by t* (every turn before t*);
  its nested subagents go with it;
- **first live**: the first step at or after t* of each agent that is running at t* (the root, a subagent
  that started before t* and has turns left, or one that starts after t* from a spawning turn that had
  started by t*, even one still in flight at t*), due `max(0, t − t*)` after the profiling start;
- **primers**: the turn before each first-live step of the same agent (none for a first-live turn 0), sent
  in warmup with its full prefix, with its lead `t* − t` for the spread schedule;
- every other step follows the plan as usual (e.g. a subagent spawned by a turn replayed after t*);
- **waiting**: first-live steps that join subagents which are live (the root "waiting on children").

A snapshot with nothing live is not `sendable` (the reference skips such a trace for the lane).
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec
import numpy as np

from agentx.replayer.options.replay import DEFAULT_WINDOW
from agentx.replayer.plan.steps import SessionPlan, Step


def t_star(
    seed: int, trace_id: str, lane: int, plan: SessionPlan, window: tuple[float, float] = DEFAULT_WINDOW
) -> float:
    """The lane's t* on the session clock (see the module docstring); 0 for a plan without steps."""
    low, high = window
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"the t* window must satisfy 0 <= low <= high <= 1, got {window}")
    if not plan.steps:
        return 0.0
    starts = [step.request.t for step in plan.steps]
    first, span = min(starts), max(starts) - min(starts)
    digest = hashlib.sha256(f"{seed}:{trace_id}:{lane}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
    return float(rng.uniform(first + low * span, first + high * span))


DONE: Final = 1
"""A step's `Snapshot.settled` byte: it started before t*."""
SKIPPED: Final = 2
"""A step's `Snapshot.settled` byte: its subagent had finished by t* (or never runs from t*, with its parent)."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A tree's state at t* (see the module docstring); every set holds step indices of the plan. Each lane's first
    tree holds one from before the first request, so the settled steps are a byte each rather than sets."""

    t_star: float
    settled: bytes
    """Per step: 0 (sent as the plan says), `DONE` or `SKIPPED` (settled at once, never sent)."""
    first_live: dict[int, float]
    """First-live step → seconds after the profiling start it is due (`max(0, t − t*)`)."""
    primers: dict[int, float]
    """Primer step → its lead `t* − t` (seconds)."""
    waiting: frozenset[int]
    """First-live steps that also wait for live subagents to join."""

    @property
    def sendable(self) -> bool:
        return bool(self.first_live)

    @property
    def done(self) -> frozenset[int]:
        """Steps that started before t*."""
        return frozenset(index for index, state in enumerate(self.settled) if state == DONE)

    @property
    def skipped(self) -> frozenset[int]:
        """Steps of subagents that never run from t*."""
        return frozenset(index for index, state in enumerate(self.settled) if state == SKIPPED)

    @property
    def not_sent(self) -> frozenset[int]:
        """Steps the replay settles at once without a request (done or skipped)."""
        return frozenset(index for index, state in enumerate(self.settled) if state)

    def is_settled(self, index: int) -> bool:
        """Whether step `index` is settled at once without a request (done or skipped)."""
        return self.settled[index] != 0


def _agents(plan: SessionPlan) -> dict[str, list[Step]]:
    """Each agent's steps in turn order, agents in plan order (parents before their subagents)."""
    by_agent: dict[str, list[Step]] = {}
    for step in plan.steps:
        by_agent.setdefault(step.agent_id, []).append(step)
    return by_agent


def snapshot(plan: SessionPlan, t_star: float) -> Snapshot:
    """What every step of `plan` is at `t_star` (module docstring)."""
    steps = plan.steps
    agent_of = {step.index: step.agent_id for step in steps}
    done: set[int] = set()
    skipped: set[int] = set()
    first_live: dict[int, float] = {}
    primers: dict[int, float] = {}
    skipped_agents: set[str] = set()
    for agent_id, turns in _agents(plan).items():
        head = turns[0]
        anchor = steps[head.anchor] if head.anchor is not None else None
        # A subagent inherits its parent's fate: skipped with it (the plan lists parents first).
        parent_skipped = anchor is not None and agent_of[anchor.index] in skipped_agents
        finished = all(turn.request.t < t_star for turn in turns)
        if parent_skipped or (head.depth > 0 and finished):
            skipped_agents.add(agent_id)
            skipped.update(turn.index for turn in turns)
            continue
        live = [turn for turn in turns if turn.request.t >= t_star]
        done.update(turn.index for turn in turns if turn.request.t < t_star)
        if not live:
            continue  # a root that had finished by t*: only its subagents may still run
        first = live[0]
        # Live at t* unless its own start is an ordinary step after a turn the replay sends (a subagent whose
        # spawning turn had not started by t*): then the plan's anchor and delay place it. One whose spawning
        # turn had started, even if still in flight at t*, is live (reference: `aiperf/timing/trajectory_source.py`,
        # the `spawn_turn_not_completed` test, which despite its name tests the start).
        anchor_of_first = steps[first.anchor] if first.anchor is not None else None
        if anchor_of_first is None or anchor_of_first.index in done or anchor_of_first.index in skipped:
            first_live[first.index] = max(0.0, first.request.t - t_star)
            if first.turn > 0:
                primer = turns[first.turn - 1]
                primers[primer.index] = t_star - primer.request.t
    live_steps = set(range(len(steps))) - done - skipped
    waiting = frozenset(index for index in first_live if any(joined in live_steps for joined in steps[index].joins))
    settled = bytearray(len(steps))
    for index in done:
        settled[index] = DONE
    for index in skipped:
        settled[index] = SKIPPED
    return Snapshot(t_star=t_star, settled=bytes(settled), first_live=first_live, primers=primers, waiting=waiting)
