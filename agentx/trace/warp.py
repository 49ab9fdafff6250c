"""The per-tree idle cap, load-time version (docs/agentx.md §4c, the older reference): idle gaps cut out of the
recorded times before the replay starts.

Sort every request start of a session tree (root, subagents, split chains); for each gap `g` between two consecutive
starts longer than the cap, remove `g − cap`: times within the first `cap` seconds of the gap keep their place, times in
the removed part map to the gap's start + cap, and everything later shifts left. Delays are then recomputed from the
warped times, so the replay's end-to-start rule sees the shortened gaps. The newer runtime version
(`agentx/replayer/schedule/idle.py`) acts on the live schedule instead; one run uses one.
"""

from __future__ import annotations

import bisect
import itertools

import msgspec

from agentx.trace.model import Agent, Session


class IdleWarp:
    """The time map of one session tree: `warp(t)` is `t` with every idle gap longer than the cap cut to it."""

    def __init__(self, starts: list[float], cap_s: float) -> None:
        if cap_s < 0:
            raise ValueError(f"idle cap must be non-negative, got {cap_s}")
        self.cap_s = cap_s
        self._kept_until: list[float] = []  # gap start + cap, ascending
        self._removed_s: list[float] = []  # seconds removed by this gap
        self._shift_before: list[float] = [0.0]  # seconds removed by all earlier gaps
        for start, following in itertools.pairwise(sorted(starts)):
            gap = following - start
            if gap > cap_s:
                self._kept_until.append(start + cap_s)
                self._removed_s.append(gap - cap_s)
                self._shift_before.append(self._shift_before[-1] + gap - cap_s)

    @property
    def removed_s(self) -> float:
        """The idle time removed in total."""
        return self._shift_before[-1]

    def warp(self, t: float) -> float:
        # The last gap whose kept part ends before t: t lies in its removed part or after it.
        index = bisect.bisect_left(self._kept_until, t) - 1
        if index < 0:
            return t
        kept_until = self._kept_until[index]
        shift = self._shift_before[index]
        if t < kept_until + self._removed_s[index]:
            return kept_until - shift
        return t - shift - self._removed_s[index]


def warp_idle_gaps(session: Session, cap_s: float) -> Session:
    """`session` with its idle gaps longer than `cap_s` cut to `cap_s` (a new session; durations kept)."""
    starts = [request.t for agent, _, _ in session.agents() for request in agent.requests]
    idle = IdleWarp(starts, cap_s)
    if not idle.removed_s:
        return session
    return msgspec.structs.replace(session, root=_warp_agent(session.root, idle))


def _warp_agent(agent: Agent, idle: IdleWarp) -> Agent:
    requests = []
    previous_end: float | None = None
    for request in agent.requests:
        t = idle.warp(request.t)
        think_time = request.think_time
        if think_time is not None and previous_end is not None:
            think_time = max(0.0, t - previous_end)
        warped = msgspec.structs.replace(request, t=t, think_time=think_time)
        requests.append(warped)
        previous_end = warped.end
    return msgspec.structs.replace(
        agent,
        requests=requests,
        subagents=[_warp_agent(sub, idle) for sub in agent.subagents],
        t=None if agent.t is None else idle.warp(agent.t),
    )
