"""A session as a DAG of steps: what each request waits for and how long, as pure data (no asyncio).

One `Step` per request of every agent (root and nested subagents). A step is dispatched at

    max(completion(anchor) + delay_s, completion of every step in `joins`)

with `completion(None) = 0`, the session's start on the replay clock. The rules (docs/agentx.md §3a, §4a, §8):

- **Later turns of an agent** are anchored to the agent's previous request and wait the recorded
  end-to-start gap `max(0, t_k − (t_{k−1} + api_time_{k−1}))`, an unknown api_time counting as 0: the
  replay measures from the *completion* it observes, so the server's own speed never shifts the script.
- **A subagent's first turn** is anchored to the parent's last request before the spawn (index
  `spawn_after − 1`) and waits `max(0, child_first_t − branch_start_t)` after its completion. A branch is the
  parent's subagents sharing one (anchor, join); its start is their earliest spawn time, so parallel subagents
  launched by one tool call keep their recorded stagger relative to one another, not relative to the anchor's
  end. A branch of the root that began while its spawning request was still running (`branch_start_t < t +
  api_time`, api_time known) starts from that request's *send* instead and waits `max(0, child_first_t − t)`,
  as the reference dispatches such branches when the request is issued (`aiperf/timing/branch_orchestrator.py`,
  `on_credit_issued`).
  This drops the recorded gap between the anchor's end and the branch's spawn (real traces have gaps of
  minutes: the parent's think time while it decided to spawn). `child_offset="anchor_end"` keeps it
  instead, `max(0, child_first_t − anchor_end_t)`, which replays a consistent recording exactly.
- **Joins are tiered** (`agentx.trace.stats.join_index`): a subagent joins the first parent request at or
  after its recorded end, which need not be the next one. That parent request also waits for the
  subagent's *last* step. A subagent no parent request waits for is **background**: nothing waits for it,
  but a lane must still wait for it before recycling its tree (§8.4).
- **Subagents spawned before their parent's first request** (`spawn_after == 0`) have no anchor; the
  reference drops them. We keep them (dropping would silently lose recorded load): they start when their
  parent would start (same anchor, the parent start's delay) plus their recorded lead over it,
  `max(0, child_first_t − parent_first_t)`. For the root that is the session start.
- Nested subagents follow the same rules relative to their own parent. Agents without requests add no
  steps; their own subagents are placed as if the empty agent had started at its spawn time.

Compaction (a shrinking context) is invisible here: timing uses only `t` and `api_time`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec
import numpy as np

from agentx.errors import PlanError
from agentx.replayer.options.replay import SessionOrder
from agentx.trace.chains import CHAIN_KINDS
from agentx.trace.model import Agent, Request, Session
from agentx.trace.stats import join_index

ChildOffset = Literal["branch_start", "anchor_end"]
"""How a subagent's first turn is offset from its anchor's completion: from its branch's earliest spawn
(the reference, §3a) or from the anchor request's recorded end (keeps the recorded spawn gap)."""


class Step(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """One request of one agent, with what must complete before it may be dispatched."""

    index: int
    """Position in `SessionPlan.steps` (agents depth first, then turn order)."""
    agent_id: str
    depth: int
    """0 for the root agent."""
    turn: int
    """Index of the request within its agent."""
    request: Request
    anchor: int | None
    """The step whose completion starts this step's delay clock; None: the session start."""
    delay_s: float
    """Seconds after the anchor's completion (or the session start) before dispatch; never negative."""
    joins: tuple[int, ...] = ()
    """The last steps of the subagents this step waits for, besides its anchor."""
    barriers: tuple[int, ...] = ()
    """Steps of other streams of its scope that must have completed before it is sent (§3c)."""
    background: bool = False
    """The step's agent (or an ancestor subagent) is joined by no parent request."""
    from_anchor_send: bool = False
    """The delay runs from the anchor's *send*, not its completion: the first turn of a branch that began while
    its spawning root request was still running (docs/agentx.md §3a)."""

    @property
    def depends_on(self) -> tuple[int, ...]:
        """Every step that must complete before this one: the anchor (if any, unless the delay runs from its
        send), the joins, then the barriers."""
        anchored = self.anchor is not None and not self.from_anchor_send
        return ((self.anchor,) if anchored and self.anchor is not None else ()) + self.joins + self.barriers


class SessionPlan(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """The DAG of one session: steps plus the views a runner needs."""

    session_id: str
    steps: tuple[Step, ...]
    order: tuple[int, ...]
    """Step indices in a topological order (every dependency before its dependents)."""
    roots: tuple[int, ...]
    """Steps with no dependency at all: ready at the session start (after their delay)."""
    dependents: tuple[tuple[int, ...], ...]
    """For each step, the steps that list it as anchor or join (ascending)."""
    background: tuple[int, ...]
    """Steps nobody in the root's chain waits for; a lane must still wait for them before recycling."""


class _Start(msgspec.Struct, frozen=True):
    """Where an agent's first turn sits: its anchor, its delay, and the session time that corresponds to."""

    anchor: int | None
    delay_s: float
    ref_t: float
    from_anchor_send: bool = False


def _first_t(agent: Agent, fallback_t: float) -> float:
    """The session time an agent starts at: its first request, else its spawn, else `fallback_t`."""
    if agent.requests:
        return agent.requests[0].t
    return agent.t if agent.t is not None else fallback_t


def _spawn_t(sub: Agent, fallback_t: float) -> float:
    """A subagent's recorded spawn time; a trace without one falls back to its first request."""
    return sub.t if sub.t is not None else _first_t(sub, fallback_t)


def plan_session(session: Session, *, child_offset: ChildOffset = "branch_start", barriers: bool = True) -> SessionPlan:
    """Turn a session into its step DAG (see the module docstring for the rules); `barriers` adds §3c's
    cross-stream edges between an agent and the chains split out of it (`_barriers`)."""
    if child_offset not in ("branch_start", "anchor_end"):
        raise ValueError(f"unknown child offset {child_offset!r}")
    steps: list[Step] = []
    root = session.root
    # The session start on the replay clock: the root's first request, else the earliest request at all.
    all_t = (r.t for agent, _, _ in session.agents() for r in agent.requests)
    origin_t = root.requests[0].t if root.requests else min(all_t, default=0.0)

    def add_agent(agent: Agent, depth: int, start: _Start, background: bool) -> tuple[list[int], int | None]:
        """Add `agent`'s steps and its subtree's; return (its step indices, its last step)."""
        # Plan the subagents' placement first (it needs only recorded times), then emit this agent's
        # steps, then the subtrees: joins point at a subagent's last step, known only after its subtree.
        join_of = [join_index(agent, sub) for sub in agent.subagents]
        branch_start: dict[tuple[int, int | None], float] = {}
        for sub, joined_at in zip(agent.subagents, join_of, strict=True):
            if sub.spawn_after > 0:
                key = (sub.spawn_after, joined_at)
                spawn = _spawn_t(sub, agent.requests[sub.spawn_after - 1].end)
                branch_start[key] = min(branch_start.get(key, spawn), spawn)

        own: list[int] = []
        for turn, request in enumerate(agent.requests):
            from_send = False
            if turn == 0:
                anchor, delay_s, from_send = start.anchor, start.delay_s, start.from_anchor_send
            else:
                previous = agent.requests[turn - 1]
                anchor, delay_s = own[-1], max(0.0, request.t - previous.end)
            own.append(len(steps))
            steps.append(
                Step(
                    index=len(steps),
                    agent_id=agent.agent_id,
                    depth=depth,
                    turn=turn,
                    request=request,
                    anchor=anchor,
                    delay_s=delay_s,
                    background=background,
                    from_anchor_send=from_send,
                )
            )

        joins: dict[int, list[int]] = {}
        for sub, joined_at in zip(agent.subagents, join_of, strict=True):
            if sub.spawn_after > 0:
                reference_t = (
                    branch_start[(sub.spawn_after, joined_at)]
                    if child_offset == "branch_start"
                    else agent.requests[sub.spawn_after - 1].end
                )
                first_t = _first_t(sub, reference_t)
                spawning = agent.requests[sub.spawn_after - 1]
                overlaps = (
                    depth == 0
                    and child_offset == "branch_start"
                    and spawning.api_time is not None
                    and spawning.api_time > 0
                    and _before_end_ms(branch_start[(sub.spawn_after, joined_at)], spawning.t, spawning.api_time)
                )
                if overlaps:
                    sub_start = _Start(own[sub.spawn_after - 1], max(0.0, first_t - spawning.t), first_t, True)
                else:
                    sub_start = _Start(own[sub.spawn_after - 1], max(0.0, first_t - reference_t), first_t)
            else:
                # No anchor (the reference drops these): start alongside the parent, offset by the recorded lead.
                first_t = _first_t(sub, start.ref_t)
                sub_start = _Start(start.anchor, start.delay_s + max(0.0, first_t - start.ref_t), first_t)
            _, last = add_agent(sub, depth + 1, sub_start, background or joined_at is None)  # noqa: F821 (see del)
            if joined_at is not None and last is not None:
                joins.setdefault(joined_at, []).append(last)
        for turn, lasts in joins.items():
            step = steps[own[turn]]
            steps[own[turn]] = msgspec.structs.replace(step, joins=tuple(sorted(lasts)))
        return own, (own[-1] if own else None)

    add_agent(root, 0, _Start(None, 0.0, origin_t), background=False)
    del add_agent  # a recursive closure is a reference cycle: left alone, every plan is garbage to collect
    if barriers:
        for index, extra in _barriers(session, steps).items():
            step = steps[index]
            held_by = tuple(sorted(set(extra) - {step.anchor} - set(step.joins)))
            steps[index] = msgspec.structs.replace(step, barriers=held_by)
    return _finish(session.session_id, steps)


def _before_end_ms(start_s: float, t_s: float, api_time_s: float) -> bool:
    """Whether `start_s` falls before the end of a request at `t_s` lasting `api_time_s`, compared in milliseconds
    as the references do (`aiperf/timing/branch_orchestrator.py`, `on_credit_issued`): a branch recorded at its spawning
    turn's end is one rounding away from it, and the side it falls on decides the anchor."""
    return start_s * 1000.0 < t_s * 1000.0 + api_time_s * 1000.0


def _scopes(session: Session) -> list[list[str]]:
    """Groups of agents that are one conversation split in streams (§3c): an agent with the chains
    `agentx.trace.chains` split out of it (its children of a chain kind, or siblings named `<agent>:...`)."""
    scopes: list[list[str]] = []
    for agent, parent, _ in session.agents():
        if agent.subagent_type in CHAIN_KINDS and parent is not None and agent is not session.root:
            continue  # a chain belongs to its owner's scope
        members = [agent.agent_id]
        members += [sub.agent_id for sub in agent.subagents if sub.subagent_type in CHAIN_KINDS]
        if parent is not None:
            prefix = agent.agent_id + ":"
            members += [sibling.agent_id for sibling in parent.subagents if sibling.agent_id.startswith(prefix)]
        if len(members) > 1:
            scopes.append(members)
    return scopes


def _barriers(session: Session, steps: Sequence[Step]) -> dict[int, list[int]]:
    """§3c: a request starting at s also waits, on each other stream of its scope, for the latest request to
    complete that started before s and ended by s, unless that one ended by the start of another such request
    (which started after it); overlapping requests create no edge."""
    by_agent: dict[str, list[Step]] = {}
    for step in steps:
        by_agent.setdefault(step.agent_id, []).append(step)
    extra: dict[int, list[int]] = {}
    for members in _scopes(session):
        streams = [by_agent[m] for m in members if m in by_agent]
        for own in streams:
            for step in own:
                s = step.request.t
                candidates = []
                for other in streams:
                    if other is own:
                        continue
                    completed = [c for c in other if c.request.t < s and c.request.end <= s]
                    if completed:
                        # The latest to complete (reference: `aiperf/timing/replay_dependencies.py`,
                        # `infer_cross_stream_predecessors`), ties to the later start, then the later turn.
                        candidates.append(max(completed, key=lambda c: (c.request.end, c.request.t, c.turn)))
                kept = [
                    c
                    for c in candidates
                    if not any(
                        c.request.t < d.request.t and c.request.end <= d.request.t for d in candidates if d is not c
                    )
                ]
                if kept:
                    extra[step.index] = [c.index for c in kept]
    return extra


def _finish(session_id: str, steps: list[Step]) -> SessionPlan:
    dependents: list[list[int]] = [[] for _ in steps]
    for step in steps:
        for dependency in step.depends_on:
            dependents[dependency].append(step.index)
    order = _topological_order(steps, dependents)
    return SessionPlan(
        session_id=session_id,
        steps=tuple(steps),
        order=tuple(order),
        roots=tuple(step.index for step in steps if not step.depends_on),
        dependents=tuple(tuple(sorted(d)) for d in dependents),
        background=tuple(step.index for step in steps if step.background),
    )


def _topological_order(steps: Sequence[Step], dependents: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's algorithm, smallest ready index first so the order is deterministic."""
    waiting = [len(step.depends_on) for step in steps]
    ready = [step.index for step in steps if waiting[step.index] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for dependent in dependents[index]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) != len(steps):
        stuck = sorted(set(range(len(steps))) - set(order))
        raise PlanError(f"dependency cycle among steps {stuck[:10]}")
    return order


def join_due(anchor_at: float, delay: float, joined_at: Sequence[float]) -> float:
    """When a step is due, from its anchor's completion (or send), its delay, and its joined subagents'
    completions, in any one unit: if the last subagent completed after the anchor, at that moment, with no
    think time (the reference's `_resolve_think_ms` is 0 for an ordinary join); otherwise the anchor plus the
    delay (docs/agentx.md §3a)."""
    last = max(joined_at, default=None)
    if last is not None and last > anchor_at:
        return last
    return anchor_at + delay


def session_order(n_sessions: int, mode: SessionOrder, seed: int = 0) -> Iterator[int]:
    """An endless stream of session indices for lanes to draw from, deterministic under `seed`.

    `sequential`: 0, 1, …, n−1, 0, … (dataset order, wrapping; the Weka loader's preference, §4d);
    `shuffle`: a fresh permutation each pass; `random`: uniform draws with replacement.
    No sessions → an empty stream.
    """
    if n_sessions < 0:
        raise ValueError(f"n_sessions must be non-negative, got {n_sessions}")
    if mode not in ("sequential", "shuffle", "random"):
        raise ValueError(f"unknown session order {mode!r}")
    return _session_order(n_sessions, mode, seed)


def _session_order(n_sessions: int, mode: SessionOrder, seed: int) -> Iterator[int]:
    if n_sessions == 0:
        return
    # numpy's PCG64 streams are stable across versions, unlike `random.shuffle`'s algorithm.
    rng = np.random.default_rng(seed)
    while True:
        if mode == "sequential":
            yield from range(n_sessions)
        elif mode == "shuffle":
            yield from (int(i) for i in rng.permutation(n_sessions))
        else:
            yield int(rng.integers(n_sessions))
