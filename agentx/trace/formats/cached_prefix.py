"""Hash ids for rounds known only by their token counts: how long the prompt was and how much of it the provider
found cached.

TraceLab rounds, Codex CLI rollouts and OpenTelemetry GenAI spans hold no text and no block ids, only a round's
input tokens and the cached part of them. The ids are built so that each round's cached prefix is the run of blocks
it shares with what came before, with block size `B`:

- a round of `in_tokens` tokens has `ceil(in_tokens / B)` ids (the last block partial, as in Weka traces);
- its cached prefix covers `cached_tokens // B` whole blocks (rounded down: a block counts as cached only whole);
- an agent's later round keeps that many leading ids of the agent's previous round and adds fresh ones; where the
  cached prefix is longer than the previous prompt (a provider also caches the answer it wrote, which the next prompt
  carries, and which a replay, whose server writes its own answer, cannot share), it keeps the previous round's ids
  and the round is counted as `beyond_previous`;
- an agent's first round shares its cached prefix with the longest first round of its preamble key before it
  (sessions of one model and kind of agent begin with the same system prompt and tools: an earlier session's prompt
  wrote what a later one finds cached), and where its cached prefix is longer still, the rest are blocks of their own.

So a round shares exactly `cached_tokens // B` blocks, at most a block's worth of tokens short of its cached prefix,
except a `beyond_previous` round, which shares every block of its previous prompt. The ids are global (scope
"global"), preambles being shared across sessions.

How the new blocks are numbered keeps a release-sized corpus small: the first new block of every round (and every
block of a preamble) gets an id of its own, numbered from `LOCAL_IDS` up; the rest of the round's new blocks are
numbered 1, 2, 3, ... in every round, from one shared table of ints. A prompt's content past its first new block can
then repeat another's, but never after the same prefix: a cache of chained blocks (vLLM's, the simulator's), a radix
tree (SGLang's) and agentx's own counts of leading blocks seen all stop at the first new block, which no prompt sent
before. One distinct int per new block took ~36 bytes; a reference to the shared table takes 8 (TraceLab's 665k
rounds hold ~50M new blocks: bench/tracelab_read.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

LOCAL_IDS: Final = 1 << 16
"""The shared numbers 1 ... LOCAL_IDS - 1 of a round's new blocks after its first; ids of their own start here."""
_LOCAL: Final = tuple(range(LOCAL_IDS))


class CachedPrefixIds:
    """Builds each round's ids from its input and cached token counts (the rule above), a session after another."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.beyond_previous = 0
        """Rounds whose cached prefix was longer than their agent's previous prompt (capped at it)."""
        self._next_id = LOCAL_IDS
        self._preambles: dict[str, tuple[int, ...]] = {}
        """Preamble key → the ids of its longest first round so far."""

    def first_round(self, preamble_key: str, in_tokens: int, cached_tokens: int) -> tuple[int, ...]:
        """An agent's first round: the leading blocks of the longest first round of its preamble key so far (run on
        with ids of their own where its cached prefix is longer still), then fresh ids."""
        count, cached = self._blocks(in_tokens, cached_tokens)
        longest = self._preambles.get(preamble_key, ())
        if len(longest) < cached:
            longest += self._own(cached - len(longest))
        ids = longest[:cached] + self._fresh(count - cached)
        if len(ids) > len(self._preambles.get(preamble_key, ())):
            self._preambles[preamble_key] = ids
        return ids

    def next_round(self, previous: Sequence[int], in_tokens: int, cached_tokens: int) -> tuple[int, tuple[int, ...]]:
        """A later round of an agent whose last prompt's ids were `previous`: (ids kept from it, ids added)."""
        count, cached = self._blocks(in_tokens, cached_tokens)
        if cached > len(previous):
            self.beyond_previous += 1
            cached = len(previous)
        return cached, self._fresh(count - cached)

    def _blocks(self, in_tokens: int, cached_tokens: int) -> tuple[int, int]:
        """(ids of the round, whole blocks of its cached prefix)."""
        size = self.block_size
        in_tokens = max(0, in_tokens)
        return -(-in_tokens // size), min(max(0, cached_tokens), in_tokens) // size

    def _fresh(self, count: int) -> tuple[int, ...]:
        """A round's `count` new blocks: an id of its own, then the shared numbers."""
        if count <= 0:
            return ()
        if count > LOCAL_IDS:
            return self._own(count)
        return self._own(1) + _LOCAL[1:count]

    def _own(self, count: int) -> tuple[int, ...]:
        """`count` ids no other block has."""
        start = self._next_id
        self._next_id += count
        return tuple(range(start, self._next_id))


def shared_blocks(previous: Sequence[int], ids: Sequence[int]) -> int:
    """How many leading ids `ids` shares with `previous`."""
    shared = 0
    for mine, theirs in zip(ids, previous, strict=False):
        if mine != theirs:
            break
        shared += 1
    return shared
