"""One play of a session tree: the session's prepared plan (computed once, reused by every play) and the
mutable state of a play (completion events and times, chat conversations, its correlation id and marker).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator

import msgspec
import numpy as np

from agentx.replayer.plan.sessions import ReplaySessions
from agentx.replayer.plan.steps import ChildOffset, SessionPlan, plan_session
from agentx.replayer.plan.tstar import Snapshot
from agentx.replayer.prompts.conversation import ChatState
from agentx.trace.chains import CHAIN_KINDS
from agentx.trace.model import Agent, Session
from agentx.trace.stats import StartOrderHits, prefix_cache_hits


class PreparedSession(msgspec.Struct, frozen=True, gc=False):
    """A session's plan plus each step's full hash ids (computed once per session, reused on recycling)."""

    plan: SessionPlan
    hash_ids: tuple[tuple[int, ...], ...]
    prefix_tokens: dict[str, int]
    """Per agent: its turn-0 tool + system tokens (the chat system message, docs/agentx.md §1e)."""
    hit_blocks: tuple[int, ...]
    """Per step: the theoretical prefix-cache hit in blocks (docs/agentx.md §6: a block counts once its request
    started, as the reference's)."""
    total_blocks: tuple[int, ...]
    agent_steps: dict[str, tuple[int, ...]]
    """Per agent: its step indices in turn order."""
    models: tuple[str, ...]
    """Per step: the served model it names (§2f)."""
    top_level: tuple[bool, ...]
    """Per step: the root's or a flat chain's (the output cap applies), not a subagent's (§2d)."""
    parents: dict[str, str]
    """Per agent: its parent agent's id (the root's own entry is absent)."""


def _models_in_file_order(agent: Agent) -> Iterator[str]:
    by_position: dict[int, list[Agent]] = {}
    for sub in agent.subagents:
        by_position.setdefault(sub.spawn_after, []).append(sub)
    for position in range(len(agent.requests) + 1):
        for sub in by_position.get(position, ()):
            yield from _models_in_file_order(sub)
        if position < len(agent.requests):
            yield agent.requests[position].model


def file_order_models(session: Session) -> list[str]:
    """The session's distinct recorded models, main model first, then by first appearance in file order
    (a subagent's requests where its entry stands among its parent's, §2f)."""
    in_order = list(_models_in_file_order(session.root))
    main = session.root.requests[0].model if session.root.requests else (in_order[0] if in_order else "")
    return list(dict.fromkeys([main, *in_order])) if in_order else []


def model_map(session: Session, served: tuple[str, ...]) -> dict[str, str]:
    """Recorded model → served model: the i-th distinct model of `file_order_models` → `served[i % n]`."""
    return {model: served[i % len(served)] for i, model in enumerate(file_order_models(session))}


def prepare(
    sessions: ReplaySessions, index: int, child_offset: ChildOffset, hits: Hits, served: tuple[str, ...] = ("",)
) -> PreparedSession:
    """The plan of session `index` with everything a play needs from the trace; `served` are the models to
    map the session's recorded ones onto (§2f)."""
    session = sessions.session(index)
    plan = plan_session(session, child_offset=child_offset)
    by_agent = {agent.agent_id: list(agent.iter_hash_ids()) for agent, _, _ in session.agents()}
    hash_ids = tuple(by_agent[step.agent_id][step.turn] for step in plan.steps)
    prefix_tokens = {agent.agent_id: agent.tool_tokens + agent.system_tokens for agent, _, _ in session.agents()}
    session_hits, session_totals = hits.of(index)
    # The hit arrays are in the session's row order (agents depth first, then turns): map them to the steps.
    row_of: dict[tuple[str, int], int] = {}
    for agent, _, _ in session.agents():
        for turn in range(len(agent.requests)):
            row_of[(agent.agent_id, turn)] = len(row_of)
    rows = [row_of[(step.agent_id, step.turn)] for step in plan.steps]
    hit_blocks = tuple(int(session_hits[row]) for row in rows)
    total_blocks = tuple(int(session_totals[row]) for row in rows)
    agent_steps: dict[str, list[int]] = {}
    for step in plan.steps:
        agent_steps.setdefault(step.agent_id, []).append(step.index)
    steps_of = {agent: tuple(indices) for agent, indices in agent_steps.items()}
    mapping = model_map(session, served)
    models = tuple(mapping[step.request.model] for step in plan.steps)
    chains = {
        agent.agent_id for agent, parent, depth in session.agents() if depth == 1 and agent.subagent_type in CHAIN_KINDS
    }
    top_level = tuple(step.depth == 0 or step.agent_id in chains for step in plan.steps)
    parents = {agent.agent_id: parent.agent_id for agent, parent, _ in session.agents() if parent is not None}
    return PreparedSession(
        plan, hash_ids, prefix_tokens, hit_blocks, total_blocks, steps_of, models, top_level, parents
    )


class Hits:
    """Theoretical prefix-cache hits per session: computed per session for session-scoped ids (a session is
    its own namespace, so start-up does not pay for the whole corpus); for global ids, in start order only as far
    as the sessions asked for (`StartOrderHits`), so the first request does not wait for the whole trace.

    A block counts as seen once its request has *started*, in recorded start order, as the reference computes
    it (`aiperf/dataset/loader/weka_metric_prepass.py`, `compute_shared_prefix_cache_metrics`; docs/agentx.md §6), not
    once it has ended (`agentx inspect`'s causal default)."""

    def __init__(self, sessions: ReplaySessions) -> None:
        self.sessions = sessions
        self._global: StartOrderHits | None = None
        # A plan made on a worker thread (agentx.replayer.schedule.offloop) and one made on the loop may both ask.
        self._lock = threading.Lock()

    def of(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        sessions = self.sessions
        if sessions.trace.hash_id_scope == "session":
            alone = msgspec.structs.replace(sessions.trace, sessions=[sessions.session(index)])
            return prefix_cache_hits(alone, causal=False)
        with self._lock:
            if self._global is None:
                # A request never starts before its session (t >= 0, which validation checks).
                earliest_s = [session.start_s for session in sessions.trace.sessions]
                self._global = StartOrderHits(earliest_s, sessions.session)
            return self._global.of(index)


class PreparedTrace:
    """Everything runs need from a trace, built per session when first played and kept: the session as
    replayed (`ReplaySessions`), its theoretical hits and its plan. One object serves every run of a sweep, so
    the trace is prepared once; `made_for` names the options it was built with (the runner checks them)."""

    def __init__(
        self, sessions: ReplaySessions, child_offset: ChildOffset, served: tuple[str, ...], made_for: object
    ) -> None:
        self.sessions = sessions
        self.trace = sessions.trace
        self.hits = Hits(sessions)
        self.child_offset = child_offset
        self.served = served
        self.made_for = made_for
        self._plans: dict[int, PreparedSession] = {}

    def cached(self, index: int) -> PreparedSession | None:
        """Session `index`'s plan if it is built already."""
        return self._plans.get(index)

    def prepared(self, index: int) -> PreparedSession:
        """Session `index`'s plan (built on first use, then cached)."""
        plan = self._plans.get(index)
        if plan is None:
            plan = self._plans[index] = prepare(self.sessions, index, self.child_offset, self.hits, self.served)
        return plan


def marker_hex(run_id: str, recycle_pass: int, lane: int, session_id: str) -> str:
    """The cache-bust marker of a tree (docs/agentx.md §2e): 12 hex digits, new for every play."""
    base_trace_id = session_id.split("::", 1)[0]
    return hashlib.sha256(f"{run_id}:{recycle_pass}:{lane}:{base_trace_id}".encode()).hexdigest()[:12]


class Play:
    """The state of one play of a session tree: completion events and times of its steps.

    `snapshot` (agentx mode, a lane's first tree) says which steps are settled at t* without a request and
    when the first live ones are due; `marker` is the tree's cache-bust marker (None: no cache-bust). Its state
    changes only through its methods (`begin`, `mark_sent`, `complete`, `settle`, `end_agent`, the prebuilt
    bodies' and the chat's); other modules read it.
    """

    def __init__(
        self,
        prepared: PreparedSession,
        lane: int,
        play: int,
        start_ns: int,
        affinity_headers: tuple[str, ...] = (),
        *,
        snapshot: Snapshot | None = None,
        marker: str | None = None,
    ) -> None:
        self.prepared = prepared
        self.lane = lane
        self.play = play
        self.start_ns = start_ns
        n = len(prepared.plan.steps)
        self.done = [asyncio.Event() for _ in range(n)]
        self.sent = [asyncio.Event() for _ in range(n)]
        """Set when a step's request goes out (or the step is settled without one)."""
        self.completed_ns = [0] * n
        self.sent_ns = [0] * n
        """When each step's request went out (0: not sent)."""
        self.request_ids = [""] * n
        """Per step sent: its request's `X-Request-ID` ("": not sent), which the requests it releases record."""
        self.prebuilt: dict[int, tuple[str, int, bytes]] = {}
        """Bodies built before the play's clock started: step → (phase, prompt tokens, body)."""
        self.chat = ChatState()
        """`--api chat`: each agent's conversation, advanced in turn order (a turn's anchor is its previous turn)."""
        self.snapshot = snapshot
        self.marker = marker
        self.ended_agents: set[str] = set()
        """Agents whose context overflowed: their later turns are not sent (the root's: the whole tree's)."""
        self.affinity_headers = affinity_headers
        self.correlation_ids: dict[str, str] = {}
        """Per agent session of this play: its `X-Correlation-ID` (made when first asked for)."""
        self._headers: dict[str, dict[str, str]] = {}
        self.root_agent_id = next((step.agent_id for step in prepared.plan.steps if step.depth == 0), "")

    def begin(self, start_ns: int) -> None:
        """The play's clock starts at `start_ns` (its steps' offsets count from there)."""
        self.start_ns = start_ns

    def mark_sent(self, index: int, request_id: str) -> None:
        """Step `index`'s request, `request_id`, goes out now."""
        self.sent_ns[index] = time.perf_counter_ns()
        self.request_ids[index] = request_id
        self.sent[index].set()

    def complete(self, index: int, end_ns: int) -> None:
        """Step `index`'s request ended at `end_ns`."""
        self.completed_ns[index] = end_ns

    def settle(self, index: int) -> None:
        """Step `index` is over, sent or not: its dependants may go (completed now unless it was already)."""
        if not self.completed_ns[index]:
            self.completed_ns[index] = time.perf_counter_ns()
        self.sent[index].set()
        self.done[index].set()

    def end_agent(self, agent_id: str) -> None:
        """`agent_id`'s context overflowed: its later turns are not sent (the root's: the whole tree's)."""
        self.ended_agents.add(agent_id)

    def keep_prebuilt(self, index: int, phase: str, sent_tokens: int, body: bytes) -> None:
        """Step `index`'s body, built for `phase` before the play's clock started."""
        self.prebuilt[index] = (phase, sent_tokens, body)

    def take_prebuilt(self, index: int) -> tuple[str, int, bytes] | None:
        """Step `index`'s prebuilt body (phase, prompt tokens, body), once; None if there is none."""
        return self.prebuilt.pop(index, None)

    def correlation_id(self, agent_id: str) -> str:
        """The agent session's correlation id: one per agent of each play (each subagent its own), as the
        reference's (docs/agentx.md §2d); a UUID4 in its textual form."""
        correlation_id = self.correlation_ids.get(agent_id)
        if correlation_id is None:
            correlation_id = self.correlation_ids[agent_id] = str(uuid.uuid4())
        return correlation_id

    @property
    def root_correlation_id(self) -> str:
        return self.correlation_id(self.root_agent_id)

    def parent_correlation_id(self, agent_id: str) -> str:
        """The parent agent session's correlation id ("" for the root)."""
        parent = self.prepared.parents.get(agent_id)
        return "" if parent is None else self.correlation_id(parent)

    def headers(self, agent_id: str) -> dict[str, str]:
        """The session headers of `agent_id`'s requests (docs/agentx.md §2d, reference
        `aiperf/transports/base_transports.py`): `X-Correlation-ID` carries the agent session's correlation id, as
        do the affinity headers of the play (`X-Session-Affinity` under AIPerf 0.13.0's rules, and the chosen
        ones); Dynamo's also names the parent session."""
        headers = self._headers.get(agent_id)
        if headers is None:
            correlation_id = self.correlation_id(agent_id)
            headers = {"X-Correlation-ID": correlation_id}
            headers.update((name, correlation_id) for name in self.affinity_headers)
            parent = self.parent_correlation_id(agent_id)
            if "X-Dynamo-Session-ID" in self.affinity_headers and parent:
                headers["X-Dynamo-Parent-Session-ID"] = parent
            self._headers[agent_id] = headers
        return headers
