"""Token-id prompts as JSON text (`--api completions`), each turn's built from its agent's previous prompt plus what
the turn adds.

An AgentX turn resends its agent's whole history (~80k tokens) and a few thousand new ones. Rebuilt as a list of ids
and encoded again, every turn costs in proportion to its context (~15 ms at 80k tokens on this project's machines);
kept as text, it costs in proportion to what it adds. The text is the one `msgspec.json.encode` writes for the list
`prompt_token_ids` returns (agentx.replayer.prompts.tokens: the marker's ids, the blocks', the filler's), byte for
byte:

- `IdText` writes ids as decimal text a whole array at a time (a table lookup, no Python loop per id), and keeps
  each block's text (its `block_size` ids, each followed by a comma) in a bounded direct-mapped cache keyed by
  (scope key, hash id), the same scheme as `BlockTokens`'s (safe to share with the body worker thread).
- `PromptText` is one agent's last prompt text, where each of its blocks ends in it, and the ids it covered. The
  next turn's text is that text up to the last block the two turns share (a view, not a copy), then the text of the
  blocks that follow, then the filler, in one join.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Final

import numpy as np

from agentx.replayer.prompts.tokens import BlockTokens, common_prefix_length

COMMA: Final = ord(",")
TEXT_WIDTH: Final = 8
"""Bytes of an id's text and its comma, at most: ids below 10**7 (every vocabulary's)."""


class IdText:
    """Decimal text of token ids of `blocks.space`, and the text of `blocks`' blocks, `cache_blocks` of them cached
    (see the module docstring)."""

    def __init__(self, blocks: BlockTokens, cache_blocks: int) -> None:
        self.blocks = blocks
        high = blocks.space.high
        digits = len(str(max(0, high - 1)))
        if digits + 1 > TEXT_WIDTH:
            raise ValueError(
                f"token ids of up to {TEXT_WIDTH - 1} digits are written as text; the space ends at {high}"
            )
        # Id i's entry: the bytes of "i," right-aligned in `TEXT_WIDTH` bytes, zeros before them, as one uint64, so
        # `table[ids]` gathers a whole array of ids at once and dropping the zero bytes leaves "i," for each, in order.
        values = np.arange(high, dtype=np.int64)
        chars = np.zeros((high, TEXT_WIDTH), dtype=np.uint8)
        chars[:, -1] = COMMA
        rest = values.copy()
        for column in range(TEXT_WIDTH - 2, TEXT_WIDTH - 2 - digits, -1):
            chars[:, column] = np.where(rest > 0, rest % 10 + ord("0"), 0)
            rest //= 10
        chars[values == 0, TEXT_WIDTH - 2] = ord("0")
        self._table = chars.view(np.uint64).ravel()
        self._lengths = np.count_nonzero(chars, axis=1)
        self._slot_count = cache_blocks
        self._slots: list[tuple[int, str, bytes] | None] = [None] * self._slot_count

    def text(self, ids: Sequence[int] | np.ndarray) -> bytes:
        """`ids` written as decimal text, each followed by a comma."""
        return self._table[np.asarray(ids, dtype=np.int64)].tobytes().translate(None, b"\0")

    def block_texts(self, scope_key: str, hash_ids: Sequence[int]) -> list[bytes]:
        """The text of each block of `hash_ids` in scope `scope_key` (its ids, each followed by a comma); the blocks
        not cached are made together, in one vectorized pass."""
        count, slots = self._slot_count, self._slots
        salt = hash(scope_key)
        texts: list[bytes | None] = []
        missing: dict[int, bytes] = {}
        for hash_id in hash_ids:
            text = None
            if count:
                held = slots[(hash_id ^ salt) % count]
                if held is not None and held[0] == hash_id and held[1] == scope_key:
                    text = held[2]
            if text is None:
                missing[hash_id] = b""
            texts.append(text)
        if missing:
            tokens = self.blocks.matrix(scope_key, list(missing))
            ends = np.cumsum(self._lengths[tokens].sum(axis=1)).tolist()
            flat = self._table[tokens].tobytes().translate(None, b"\0")
            start = 0
            for hash_id, end in zip(missing, ends, strict=True):
                made = missing[hash_id] = flat[start:end]
                start = end
                if count:
                    slots[(hash_id ^ salt) % count] = (hash_id, scope_key, made)
        return [missing[hash_id] if text is None else text for hash_id, text in zip(hash_ids, texts, strict=True)]


class PromptText:
    """One agent's last prompt as JSON text: `text` (`[...]`), the ids of the blocks it holds (`covered`), and where
    the text of its k-th block ends (`block_ends[k]`, `block_ends[0]` where the blocks start: after the marker)."""

    __slots__ = ("block_ends", "covered", "marker", "text")

    def __init__(self, text: bytes, covered: tuple[int, ...], block_ends: array[int], marker: bytes) -> None:
        self.text = text
        self.covered = covered
        self.block_ends = block_ends
        self.marker = marker


def prompt_text(
    ids: IdText,
    scope_key: str,
    covered: tuple[int, ...],
    filler_text: bytes,
    marker_text: bytes,
    previous: PromptText | None,
) -> PromptText:
    """The prompt whose blocks are `covered` (in scope `scope_key`), then `filler_text`, after `marker_text` (each
    text an id and a comma at a time), built from `previous` (the agent's last prompt, None: from the cache alone) up
    to the last block they share."""
    kept = 0
    if previous is not None and previous.marker == marker_text:
        kept = common_prefix_length(previous.covered, covered)
    heads: list[bytes | memoryview]
    if kept:
        assert previous is not None
        end = previous.block_ends[kept]
        # The previous text's last id may have closed the list: its comma, there, is the bracket.
        heads = (
            [memoryview(previous.text)[:end]]
            if end < len(previous.text)
            else [memoryview(previous.text)[: end - 1], b","]
        )
        block_ends = previous.block_ends[: kept + 1]
    else:
        heads = [b"[" + marker_text]
        block_ends = array("q", [len(heads[0])])
    added = ids.block_texts(scope_key, covered[kept:])
    end = block_ends[-1]
    for text in added:
        end += len(text)
        block_ends.append(end)
    parts = [*heads, *added, filler_text]
    # The last id's comma becomes the list's closing bracket.
    while parts and not parts[-1]:
        parts.pop()
    last = parts[-1] if parts else b"["
    if len(last) and last[-1:] == b",":
        parts[-1] = memoryview(last)[:-1]
        parts.append(b"]")
    else:
        parts.append(b"]")
    return PromptText(b"".join(parts), covered, block_ends, marker_text)
