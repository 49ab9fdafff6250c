"""The replay's own prefix-cache bound: an infinite cache of the prompts the run sent, in the order it sent them.

The trace's theoretical hit (`PreparedSession.hit_blocks`, the reference's figure) is fixed per turn: it counts the
blocks the trace produced before the turn, whatever the run did. A replay departs from that in two ways a server's cache
sees: a session played again without a cache-bust marker (closed or rate mode recycling it) resends content the server
has already cached, so its first turn hits nearly all of its prompt where the trace says 0; and a play resumed at t*
never sent the turns before it. `SentBlocks` counts, per request as it goes out, the leading run of its hash-id blocks
whose content the run had already sent: the same ids under the same cache-bust marker and hash-id scope give the same
content (agentx.replayer.prompts.tokens, agentx.replayer.prompts.chat). No server that caches whole prompt blocks can
hit more, short of blocks its own decoding filled, whose tokens agentx's next prompts never repeat.
"""

from __future__ import annotations

from typing import Final

from agentx.replayer.plan.play import Play
from agentx.replayer.plan.steps import Step

DENSE_IDS: Final = 1 << 24
"""Ids below this are kept one byte each (traces number their blocks densely from 0 or 1); others in a set."""


class Seen:
    """The blocks of one content key sent so far: a byte per id for small ids, a set for the rest."""

    __slots__ = ("_dense", "_sparse")

    def __init__(self) -> None:
        self._dense = bytearray()
        self._sparse: set[int] = set()

    def hit_then_add(self, ids: tuple[int, ...]) -> int:
        """How many of `ids`, from the first, were seen before; then every one of them is seen."""
        dense, sparse = self._dense, self._sparse
        hit = 0
        for block in ids:
            if 0 <= block < DENSE_IDS:
                if block >= len(dense) or not dense[block]:
                    break
            elif block not in sparse:
                break
            hit += 1
        for block in ids:
            if 0 <= block < DENSE_IDS:
                if block >= len(dense):
                    dense.extend(bytes(min(DENSE_IDS, max(block + 1, 2 * len(dense))) - len(dense)))
                dense[block] = 1
            else:
                sparse.add(block)
        return hit


class SentBlocks:
    """Blocks sent so far, per content key: a play with a cache-bust marker is its own key (freed when the play
    ends); without one, the session's (session-scoped hash ids) or the whole run's (global ones), kept for the run
    at about a byte per block id."""

    def __init__(self, session_scope: bool) -> None:
        self.session_scope = session_scope
        self._unmarked: dict[str, Seen] = {}
        self._marked: dict[int, Seen] = {}
        """Per play with a marker (by `id(play)`), until the play ends (`forget`)."""

    def hit(self, play: Play, step: Step) -> int:
        """The leading blocks of `step`'s prompt already sent, then its blocks counted as sent."""
        return self._seen(play).hit_then_add(play.prepared.hash_ids[step.index])

    def forget(self, play: Play) -> None:
        """`play` ended: its marker's blocks can never be sent again."""
        self._marked.pop(id(play), None)

    def _seen(self, play: Play) -> Seen:
        if play.marker is not None:
            table, key = self._marked, id(play)
            seen = table.get(key)
            if seen is None:
                seen = table[key] = Seen()
            return seen
        name = play.prepared.plan.session_id if self.session_scope else ""
        found = self._unmarked.get(name)
        if found is None:
            found = self._unmarked[name] = Seen()
        return found
