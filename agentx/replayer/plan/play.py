"""One play of a session tree: the session's prepared plan (computed once, reused by every play) and the
mutable state of a play (completion events and times, chat conversations, its correlation id and marker).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, overload

import msgspec
import numpy as np

from agentx.replayer.http.http1 import Body
from agentx.replayer.plan.sessions import ReplaySessions
from agentx.replayer.plan.steps import ChildOffset, SessionPlan, Step, plan_session
from agentx.replayer.plan.tstar import Snapshot
from agentx.replayer.prompts.chat import MessagesText
from agentx.replayer.prompts.conversation import ChatState
from agentx.replayer.prompts.token_json import PromptText
from agentx.trace.chains import CHAIN_KINDS
from agentx.trace.model import Agent, Request, Session
from agentx.trace.stats import StartOrderHits, prefix_cache_hits

_MADE: Final = threading.Lock()
"""Held while a play makes its chat state or its table of last prompts, which builds on two threads may ask for at
once (agentx.replayer.schedule.offloop)."""
CHECKPOINT_TURNS: Final = 64
"""`StepIds` keeps an agent's full hash ids every this many turns."""


class StepIds(Sequence[tuple[int, ...]]):
    """Each step's full hash ids (`ids[step.index]`), rebuilt when asked from the trace's delta encoding (a request
    keeps its predecessor's first `hash_ids_kept` ids and appends `hash_ids_added`), from the last ids it built for the
    step's agent when that is on the way (a play asks for its agent's turns in order, its body and then its block
    counts), else from the agent's ids kept every `CHECKPOINT_TURNS` turns.

    Kept whole for every step, the ids of an AgentX-size session (~1,400 a turn over ~250 turns) weigh ~2.5 MB, and a
    run keeps the plans of every session it draws: 160 MB for 64 of that corpus's sessions, 1 GB for all 400. Worker
    threads may read it (agentx.replayer.schedule.offloop): the last ids built are replaced whole."""

    __slots__ = ("_checkpoints", "_last", "_requests", "_where")

    def __init__(self, steps: Sequence[Step], agents: Iterable[Agent]) -> None:
        self._where = tuple((step.agent_id, step.turn) for step in steps)
        self._requests: dict[str, list[Request]] = {}
        self._checkpoints: dict[str, list[tuple[int, ...]]] = {}
        self._last: dict[str, tuple[int, tuple[int, ...]]] = {}
        """Per agent: the last turn whose ids were built, and its ids."""
        for agent in agents:
            self._requests[agent.agent_id] = agent.requests
            kept = self._checkpoints[agent.agent_id] = []
            for turn, ids in enumerate(agent.iter_hash_ids()):
                if turn % CHECKPOINT_TURNS == 0:
                    kept.append(ids)

    def __len__(self) -> int:
        return len(self._where)

    @overload
    def __getitem__(self, index: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[tuple[int, ...], ...]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, ...] | tuple[tuple[int, ...], ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        agent_id, turn = self._where[index]
        base = turn - turn % CHECKPOINT_TURNS
        last = self._last.get(agent_id)
        if last is not None and base <= last[0] <= turn:
            built, ids = last
        else:
            built, ids = base, self._checkpoints[agent_id][base // CHECKPOINT_TURNS]
        if built < turn:
            for request in self._requests[agent_id][built + 1 : turn + 1]:
                ids = ids[: request.hash_ids_kept] + request.hash_ids_added
            self._last[agent_id] = (turn, ids)
        return ids


class PreparedSession(msgspec.Struct, frozen=True, gc=False):
    """A session's plan plus each step's full hash ids (computed once per session, reused on recycling)."""

    plan: SessionPlan
    hash_ids: Sequence[tuple[int, ...]]
    """Per step: its full hash ids (a `StepIds`)."""
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
    hash_ids = StepIds(plan.steps, (agent for agent, _, _ in session.agents()))
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


class StepFlags:
    """One flag per step of a play, set once (a request went out, a step settled), that tasks can wait on.

    A flag costs a byte; a waiter, a future while it waits. An `asyncio.Event` per step (~0.8 KB with its deque)
    made a play of a few dozen steps weigh ~50 KB, so that tens of thousands of lanes took gigabytes before their
    first request."""

    __slots__ = ("_flags", "_waiters")

    def __init__(self, steps: int) -> None:
        self._flags = bytearray(steps)
        self._waiters: dict[int, list[asyncio.Future[None]]] | None = None

    def __len__(self) -> int:
        return len(self._flags)

    def is_set(self, index: int) -> bool:
        return bool(self._flags[index])

    def set(self, index: int) -> None:
        """Set step `index`'s flag and wake whoever waits on it."""
        self._flags[index] = 1
        if self._waiters is not None:
            for waiter in self._waiters.pop(index, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self, index: int) -> None:
        """Until step `index`'s flag is set (at once if it is)."""
        if self._flags[index]:
            return
        if self._waiters is None:
            self._waiters = {}
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(index, []).append(waiter)
        try:
            await waiter
        finally:
            waiting = self._waiters.get(index)
            if waiting is not None and waiter in waiting:  # cancelled before the flag was set
                waiting.remove(waiter)
                if not waiting:
                    del self._waiters[index]


class Play:
    """The state of one play of a session tree: completion flags and times of its steps.

    `snapshot` (agentx mode, a lane's first tree) says which steps are settled at t* without a request and
    when the first live ones are due; `marker` is the tree's cache-bust marker (None: no cache-bust). Its state
    changes only through its methods (`begin`, `mark_sent`, `complete`, `settle`, `end_agent`, the prebuilt
    bodies', the last prompts' and the chat's); other modules read it. It is small (slots, flags and times as arrays,
    its chat, headers, last prompts and prebuilt bodies made when first used): a lane holds one from before its first
    request on.
    """

    __slots__ = (
        "_chat",
        "_headers",
        "_texts",
        "affinity_headers",
        "completed_ns",
        "correlation_ids",
        "done",
        "ended_agents",
        "lane",
        "marker",
        "play",
        "prebuilt",
        "prepared",
        "reached_gate",
        "request_ids",
        "root_agent_id",
        "sent",
        "sent_ns",
        "snapshot",
        "start_ns",
    )

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
        self.done = StepFlags(n)
        """Set when a step is over, sent or not."""
        self.sent = StepFlags(n)
        """Set when a step's request goes out (or the step is settled without one)."""
        self.reached_gate = StepFlags(n)
        """Set when a step has come to the cache-pressure gate, sent through it or held for profiling (or when it is
        settled); a subagent's first turn waits on its parent's under the per-lane stage."""
        self.completed_ns = array("q", bytes(8 * n))
        self.sent_ns = array("q", bytes(8 * n))
        """When each step's request went out (0: not sent)."""
        self.request_ids = [""] * n
        """Per step sent: its request's `X-Request-ID` ("": not sent), which the requests it releases record."""
        self.prebuilt: dict[int, tuple[str, int, Body]] | None = None
        """Bodies built before the play's clock started: step → (phase, prompt tokens, body)."""
        self._chat: ChatState | None = None
        self._texts: dict[str, PromptText | MessagesText] | None = None
        self.snapshot = snapshot
        self.marker = marker
        self.ended_agents: frozenset[str] = frozenset()
        """Agents whose context overflowed: their later turns are not sent (the root's: the whole tree's)."""
        self.affinity_headers = affinity_headers
        self.correlation_ids: dict[str, str] | None = None
        """Per agent session of this play: its `X-Correlation-ID` (made when first asked for)."""
        self._headers: dict[str, dict[str, str]] | None = None
        self.root_agent_id = next((step.agent_id for step in prepared.plan.steps if step.depth == 0), "")

    @property
    def chat(self) -> ChatState:
        """`--api chat`: each agent's conversation, advanced in turn order (a turn's anchor is its previous turn)."""
        if self._chat is None:
            with _MADE:  # a body built on the worker thread and one on the loop may both ask first
                if self._chat is None:
                    self._chat = ChatState()
        return self._chat

    def begin(self, start_ns: int) -> None:
        """The play's clock starts at `start_ns` (its steps' offsets count from there)."""
        self.start_ns = start_ns

    def mark_sent(self, index: int, request_id: str) -> None:
        """Step `index`'s request, `request_id`, goes out now."""
        self.sent_ns[index] = time.perf_counter_ns()
        self.request_ids[index] = request_id
        self.sent.set(index)

    def complete(self, index: int, end_ns: int) -> None:
        """Step `index`'s request ended at `end_ns`."""
        self.completed_ns[index] = end_ns

    def settle(self, index: int) -> None:
        """Step `index` is over, sent or not: its dependants may go (completed now unless it was already)."""
        if not self.completed_ns[index]:
            self.completed_ns[index] = time.perf_counter_ns()
        self.sent.set(index)
        self.reached_gate.set(index)
        self.done.set(index)

    def end_agent(self, agent_id: str) -> None:
        """`agent_id`'s context overflowed: its later turns are not sent (the root's: the whole tree's)."""
        self.ended_agents |= {agent_id}

    def last_text(self, agent_id: str) -> PromptText | MessagesText | None:
        """`agent_id`'s last prompt as JSON text (agentx.replayer.plan.bodies), None before its first."""
        return None if self._texts is None else self._texts.get(agent_id)

    def keep_text(self, agent_id: str, text: PromptText | MessagesText) -> None:
        """`text` is `agent_id`'s last prompt: its next turn's is built from it."""
        if self._texts is None:
            with _MADE:
                if self._texts is None:
                    self._texts = {}
        self._texts[agent_id] = text

    def forget_texts(self) -> None:
        """The play is over: its agents' last prompts are not needed."""
        self._texts = None

    def keep_prebuilt(self, index: int, phase: str, sent_tokens: int, body: Body) -> None:
        """Step `index`'s body, built for `phase` before the play's clock started."""
        if self.prebuilt is None:
            self.prebuilt = {}
        self.prebuilt[index] = (phase, sent_tokens, body)

    def take_prebuilt(self, index: int) -> tuple[str, int, Body] | None:
        """Step `index`'s prebuilt body (phase, prompt tokens, body), once; None if there is none."""
        return None if self.prebuilt is None else self.prebuilt.pop(index, None)

    def correlation_id(self, agent_id: str) -> str:
        """The agent session's correlation id: one per agent of each play (each subagent its own), as the
        reference's (docs/agentx.md §2d); a UUID4 in its textual form."""
        if self.correlation_ids is None:
            self.correlation_ids = {}
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
        if self._headers is None:
            self._headers = {}
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
