"""The replay's own prefix-cache bound: an infinite cache of the prompts the run sent, in the order it sent them.

The trace's theoretical hit (`PreparedSession.hit_blocks`, the reference's figure) is fixed per turn: it counts the
blocks the trace produced before the turn, whatever the run did. A replay departs from that in two ways a server's cache
sees: a session played again without a cache-bust marker (closed or rate mode recycling it) resends content the server
has already cached, so its first turn hits nearly all of its prompt where the trace says 0; and a play resumed at t*
never sent the turns before it. `SentBlocks` counts, per request as it goes out, the leading run of its hash-id blocks
whose content the run had already sent: the same ids under the same cache-bust marker and hash-id scope give the same
content (agentx.replayer.prompts.tokens, agentx.replayer.prompts.chat). No server that caches whole prompt blocks can
hit more, short of blocks its own decoding filled, whose tokens agentx's next prompts never repeat.

Two more counts say why a cache missed (docs/results.md, "Why the cache missed"): the leading blocks whose ids the run
had sent in the same hash-id namespace under any marker (the blocks past `replayed` up to it differ on purpose, by
their marker), and the leading blocks an LRU cache of the server's own capacity would still hold (`LruBlocks`), fed
the same prompts in the same order: a finite cache's bound, where the infinite one's is `replayed`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, NamedTuple

from agentx.replayer.plan.play import Play
from agentx.replayer.plan.steps import Step
from agentx.replayer.prompts.tokens import common_prefix_length

DENSE_IDS: Final = 1 << 24
"""Ids below this are kept one byte each (traces number their blocks densely from 0 or 1); others in a set."""


class BlockHits(NamedTuple):
    """What the run's caches held of one prompt, in leading hash-id blocks."""

    replayed: int
    """Same ids under the same marker and hash-id scope (the infinite cache's bound)."""
    seen_any_scope: int
    """Same ids in the same hash-id namespace under any marker (≥ `replayed`)."""
    lru: int | None
    """Held by an LRU cache of the server's capacity; None when it is not known."""


class Seen:
    """The blocks of one content key sent so far: a byte per id for small ids, a set for the rest."""

    __slots__ = ("_dense", "_sparse")

    def __init__(self) -> None:
        self._dense = bytearray()
        self._sparse: set[int] = set()

    def copy(self) -> Seen:
        """Another `Seen` holding the same ids, changed apart from this one from now on."""
        twin = Seen()
        twin._dense = bytearray(self._dense)
        twin._sparse = set(self._sparse)
        return twin

    def hit_then_add(self, ids: tuple[int, ...], known: int = 0) -> int:
        """How many of `ids`, from the first, were seen before; then every one of them is seen. The first `known`
        ids are known to be seen already (an agent's previous prompt sent them): they are not looked at again."""
        dense, sparse = self._dense, self._sparse
        hit = known
        for block in ids[known:] if known else ids:
            if 0 <= block < DENSE_IDS:
                if block >= len(dense) or not dense[block]:
                    break
            elif block not in sparse:
                break
            hit += 1
        for block in ids[hit:] if hit else ids:  # the leading run is there already
            if 0 <= block < DENSE_IDS:
                if block >= len(dense):  # bytearray's own growth keeps this amortized, without doubling the table
                    dense.extend(bytes(block + 1 - len(dense)))
                dense[block] = 1
            else:
                sparse.add(block)
        return hit


class LruBlocks:
    """An LRU cache of `capacity` blocks over (content key, block id): a prompt hits its leading blocks still held,
    then all its blocks are used, its first block last, so that an old prompt's tail goes before its prefix (as vLLM
    frees a finished request's blocks, tail first)."""

    __slots__ = ("_blocks", "_keys", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"an LRU capacity must be non-negative, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[tuple[int, int], None] = OrderedDict()
        """(content key's number, block id), least recently used first."""
        self._keys: dict[Hashable, int] = {}
        """Content key (a marker, or a scope name) → its number: a small int hashes faster than the key."""

    def __len__(self) -> int:
        return len(self._blocks)

    def hit_then_use(self, key: Hashable, ids: tuple[int, ...]) -> int:
        """How many of `ids`, from the first, the cache holds under `key`; then every one of them is used."""
        number = self._keys.get(key)
        if number is None:
            number = self._keys[key] = len(self._keys)
        entries = [(number, block) for block in ids]
        blocks = self._blocks
        hit = 0
        for entry in entries:
            if entry not in blocks:
                break
            hit += 1
        if self.capacity == 0:
            return hit
        for entry in reversed(entries):
            if entry in blocks:
                blocks.move_to_end(entry)
            else:
                blocks[entry] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        return hit


class SentBlocks:
    """Blocks sent so far, per content key: a play with a cache-bust marker is its own key (freed when the play
    ends); without one, the session's (session-scoped hash ids) or the whole run's (global ones), kept for the run
    at about a byte per block id. Beside them, per namespace, the ids sent under any marker, and with `lru_blocks`
    an LRU cache of that many blocks (`LruBlocks`)."""

    def __init__(self, session_scope: bool, lru_blocks: int | None = None) -> None:
        self.session_scope = session_scope
        self._unmarked: dict[str, Seen] = {}
        self._marked: dict[int, Seen] = {}
        """Per play with a marker (by `id(play)`), until the play ends (`forget`)."""
        self._any: dict[str, Seen] = {}
        """Per namespace, the ids sent under any marker, made when a marked play first sends in it (until then the
        unmarked table is the same set)."""
        self.lru = LruBlocks(lru_blocks) if lru_blocks is not None else None
        self._last: dict[int, tuple[Play, dict[str, tuple[int, ...]]]] = {}
        """Per live play (by `id(play)`, the play held so that its id is not another's until `forget`), per agent:
        the ids of its last prompt, which every table it reaches holds."""

    def hit(self, play: Play, step: Step) -> BlockHits:
        """What the caches held of `step`'s prompt, then its blocks counted as sent."""
        ids = play.prepared.hash_ids[step.index]
        name = play.prepared.plan.session_id if self.session_scope else ""
        # An agent's turn resends its last prompt's leading ids, which every table it reaches holds since: only the
        # ids past them are looked up, so a turn costs what it adds, not its whole context.
        held = self._last.get(id(play))
        if held is None:
            held = self._last[id(play)] = (play, {})
        last = held[1]
        previous = last.get(step.agent_id)
        known = 0 if previous is None else common_prefix_length(previous, ids)
        last[step.agent_id] = ids
        if play.marker is None:
            replayed = self._seen(play).hit_then_add(ids, known)
            seen_any = self._any.get(name)
            any_scope = replayed if seen_any is None else seen_any.hit_then_add(ids, known)
        else:
            seen_any = self._any.get(name)
            if seen_any is None:
                unmarked = self._unmarked.get(name)
                seen_any = self._any[name] = unmarked.copy() if unmarked is not None else Seen()
            replayed = self._seen(play).hit_then_add(ids, known)
            any_scope = seen_any.hit_then_add(ids, known)
        lru = None if self.lru is None else self.lru.hit_then_use((play.marker is not None, play.marker or name), ids)
        return BlockHits(replayed, any_scope, lru)

    def forget(self, play: Play) -> None:
        """`play` ended: its marker's blocks can never be sent again."""
        self._marked.pop(id(play), None)
        self._last.pop(id(play), None)

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
