"""The replay's own prefix-cache bound: an infinite cache of the prompts the run sent, in the order it sent them.

The trace's theoretical hit (`PreparedSession.hit_blocks`, the reference's figure) is fixed per turn: it counts the
blocks the trace produced before the turn, whatever the run did. A replay departs from that in two ways a server's
cache sees: a session played again without a cache-bust marker (closed or rate mode recycling it) resends content
the server has already cached, so its first turn hits nearly all of its prompt where the trace says 0; and a play
resumed at t* never sent the turns before it. `SentBlocks` counts, per request as it goes out, the leading run of
its hash-id blocks whose content the run had already sent: the same ids under the same cache-bust marker and hash-id
scope give the same content (agentx.replayer.prompts, agentx.replayer.chat). No server that caches whole prompt
blocks can hit more, short of blocks its own decoding filled, whose tokens agentx's next prompts never repeat.
"""

from __future__ import annotations

from agentx.replayer.plan import Step
from agentx.replayer.play import Play


class SentBlocks:
    """Blocks sent so far, per content key: a play with a cache-bust marker is its own key (kept on the play, freed
    with it); without one, the session's (session-scoped hash ids) or the whole run's (global ones)."""

    def __init__(self, session_scope: bool) -> None:
        self.session_scope = session_scope
        self._unmarked: dict[str, set[int]] = {}
        self._marked: dict[int, set[int]] = {}
        """Per play with a marker (by `id(play)`), until the play ends (`forget`)."""

    def hit(self, play: Play, step: Step) -> int:
        """The leading blocks of `step`'s prompt already sent, then its blocks counted as sent."""
        seen = self._seen(play)
        ids = play.prepared.hash_ids[step.index]
        hit = 0
        for block in ids:
            if block not in seen:
                break
            hit += 1
        seen.update(ids)
        return hit

    def forget(self, play: Play) -> None:
        """`play` ended: its marker's blocks can never be sent again."""
        self._marked.pop(id(play), None)

    def _seen(self, play: Play) -> set[int]:
        if play.marker is not None:
            return self._marked.setdefault(id(play), set())
        key = play.prepared.plan.session_id if self.session_scope else ""
        return self._unmarked.setdefault(key, set())
