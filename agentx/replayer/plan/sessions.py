"""The trace as a run replays it: over-long sessions left out (docs/agentx.md §4f) at start; flattened agents split out
(§3b) and idle gaps warped (§4c, load-time kind) per session, when the session is first played.

Splitting is the costly part of start-up on real corpora (about 8 ms a session on the AgentX-size one, the
reference spends minutes on it), and a run rarely plays every session of a corpus, so it is paid where a
tree is drawn, as the rest of its plan is, and never for sessions the run does not reach. The counts of what
was split therefore cover the sessions played; `agentx inspect` reports the whole trace's.
"""

from __future__ import annotations

import msgspec

from agentx.trace.chains import ChainCounts, ChainRules, split_flattened_agents
from agentx.trace.model import Session, Trace
from agentx.trace.warp import warp_idle_gaps


class ReplaySessions:
    """`trace`'s sessions with the run's transformations applied on first use (module docstring)."""

    def __init__(
        self,
        trace: Trace,
        *,
        chain_rules: ChainRules | None,
        max_context_length: int | None = None,
        warp_cap_s: float | None = None,
    ) -> None:
        """`chain_rules` None: no splitting; `warp_cap_s` None: no load-time idle cap."""
        self.dropped: list[str] = []
        """Sessions left out because a request's `in + out` exceeds `max_context_length`."""
        if max_context_length is not None:
            kept = []
            for session in trace.sessions:
                if _peak_context(session) > max_context_length:
                    self.dropped.append(session.session_id)
                else:
                    kept.append(session)
            if self.dropped:
                trace = msgspec.structs.replace(trace, sessions=kept)
        self.trace = trace
        """The sessions kept, as recorded (splitting and warping change no session's start or request sizes)."""
        self.chain_rules = chain_rules
        self.warp_cap_s = warp_cap_s
        self.chains_by_session: dict[str, int] = {}
        """Agents split out of each session played so far (0: nothing flattened)."""
        self._sessions: list[Session | None] = [None] * len(trace.sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def session(self, index: int) -> Session:
        """Session `index` as the run replays it (transformed once, then cached)."""
        session = self._sessions[index]
        if session is None:
            session = self._sessions[index] = self._transform(self.trace.sessions[index])
        return session

    def whole(self) -> Trace:
        """The trace with every session transformed (what a trace-wide computation needs)."""
        return msgspec.structs.replace(self.trace, sessions=[self.session(i) for i in range(len(self))])

    @property
    def flattened_chains(self) -> int:
        return sum(self.chains_by_session.values())

    def _transform(self, session: Session) -> Session:
        if self.chain_rules is not None:
            counts = ChainCounts()
            if session.root.subagents or len(session.root.requests) > 1:  # one request alone holds no chain
                session = split_flattened_agents(
                    session, self.chain_rules, block_size=self.trace.block_size, counts=counts
                )
            self.chains_by_session[session.session_id] = counts.chains
        if self.warp_cap_s is not None:
            session = warp_idle_gaps(session, self.warp_cap_s)
        return session


def _peak_context(session: Session) -> int:
    return max((r.in_tokens + r.out_tokens for agent, _, _ in session.agents() for r in agent.requests), default=0)
