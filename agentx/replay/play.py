"""One play of a session tree: the session's prepared plan (computed once, reused by every play) and the
mutable state of a play (completion events and times, chat conversations, its correlation id and marker).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import msgspec
import numpy as np

from agentx.replay.conversation import Conversation
from agentx.replay.plan import ChildOffset, SessionPlan, plan_session
from agentx.trace.model import Trace
from agentx.trace.stats import prefix_cache_hits


class PreparedSession(msgspec.Struct, frozen=True):
    """A session's plan plus each step's full hash ids (computed once per session, reused on recycling)."""

    plan: SessionPlan
    hash_ids: tuple[tuple[int, ...], ...]
    prefix_tokens: dict[str, int]
    """Per agent: its turn-0 tool + system tokens (the chat system message, semantics §1e)."""
    hit_blocks: tuple[int, ...]
    """Per step: the theoretical prefix-cache hit in blocks (semantics §6, causal rule)."""
    total_blocks: tuple[int, ...]


def prepare(trace: Trace, index: int, child_offset: ChildOffset, hits: Hits) -> PreparedSession:
    """The plan of session `index` with everything a play needs from the trace."""
    session = trace.sessions[index]
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
    return PreparedSession(plan, hash_ids, prefix_tokens, hit_blocks, total_blocks)


class Hits:
    """Theoretical prefix-cache hits per session: computed per session for session-scoped ids (a session is
    its own namespace, so start-up does not pay for the whole corpus), once for the whole trace otherwise."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._whole: tuple[np.ndarray, np.ndarray] | None = None
        self._first_rows: list[int] = []

    def of(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        trace = self.trace
        if trace.hash_id_scope == "session":
            alone = Trace(sessions=[trace.sessions[index]], block_size=trace.block_size, hash_id_scope="session")
            return prefix_cache_hits(alone)
        if self._whole is None:
            self._whole = prefix_cache_hits(trace)
            self._first_rows = [0, *itertools.accumulate(s.request_count for s in trace.sessions)]
        start, end = self._first_rows[index], self._first_rows[index + 1]
        return self._whole[0][start:end], self._whole[1][start:end]


class Play:
    """The state of one play of a session tree: completion events and times of its steps."""

    def __init__(
        self, prepared: PreparedSession, lane: int, play: int, start_ns: int, affinity_headers: tuple[str, ...] = ()
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
        self.conversations: dict[str, Conversation] = {}
        """`--api chat`: each agent's conversation, advanced in turn order (a turn's anchor is its previous turn)."""
        self.last_out_tokens: dict[str, int] = {}
        # One id per play of a tree: its requests share prefixes, so a router keeping them together helps.
        correlation_id = uuid.uuid4().hex
        self.headers = {"X-Correlation-ID": correlation_id}
        self.headers.update((name, correlation_id) for name in affinity_headers)
