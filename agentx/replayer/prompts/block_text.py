"""The text of prompt blocks, written a whole array of blocks at a time and cached.

A block is `block_size` tokens (agentx.replayer.prompts.tokens.BlockTokens); its text is each token's text, in order,
after an optional prefix: a token id and a comma for `--api completions` (agentx.replayer.prompts.token_json), a
calibrated word as it stands inside a JSON string for `--api chat` (agentx.replayer.prompts.chat). Written a token at
a time in Python, a 100k-token prompt of new blocks took ~10 ms; here each token's text sits right-aligned in a
fixed-width table entry, zero bytes before it, so one lookup gathers the text of a whole array of tokens and dropping
the zero bytes leaves it in order (no token's text holds a zero byte: JSON escapes one). Blocks are kept in a bounded
direct-mapped cache keyed by (scope key, hash id), the scheme of `BlockTokens`'s own, which a body built on the worker
thread and one built on the loop share safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from agentx.replayer.prompts.tokens import BlockTokens

GROUP_BLOCKS: Final = 128
"""Blocks made in one pass: ~8k tokens of 64, a few hundred µs in C."""


class BlockText:
    """The text of `blocks`' blocks: `prefix`, then `token_texts[t]` for each token `t`; `cache_blocks` of them kept."""

    def __init__(
        self, blocks: BlockTokens, token_texts: Sequence[bytes], cache_blocks: int, prefix: bytes = b""
    ) -> None:
        texts = [*token_texts, prefix]
        if any(b"\0" in text for text in texts):
            raise ValueError("a token's text holds a zero byte: it cannot be written from the table")
        # Entries of a multiple of 8 bytes: numpy gathers them as fixed-size items.
        width = max(8, -(-max(map(len, texts)) // 8) * 8)
        self._table = np.frombuffer(b"".join(text.rjust(width, b"\0") for text in texts), dtype=f"V{width}")
        self._lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self._prefix = len(texts) - 1 if prefix else None
        """The table's entry of the prefix: written as the first token of every block."""
        self.blocks = blocks
        self._slot_count = cache_blocks
        self._slots: list[tuple[int, str, bytes] | None] = [None] * cache_blocks

    def text(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        """The text of `tokens`, in order (no prefix)."""
        return self._table[np.asarray(tokens, dtype=np.int64)].tobytes().translate(None, b"\0")

    def block_texts(self, scope_key: str, hash_ids: Sequence[int]) -> list[bytes]:
        """The text of each block of `hash_ids` in scope `scope_key`; the blocks not cached are made together."""
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
        made_ids = list(missing)
        # In groups: each call into C holds the interpreter, and a body built on the worker thread must leave the event
        # loop its turn every `OffLoop`'s switch interval, not once a whole 100k-token prompt is written.
        for group in range(0, len(made_ids), GROUP_BLOCKS):
            ids = made_ids[group : group + GROUP_BLOCKS]
            tokens = self.blocks.matrix(scope_key, ids)
            if self._prefix is not None:
                tokens = np.concatenate((np.full((len(tokens), 1), self._prefix, dtype=np.int64), tokens), axis=1)
            ends = np.cumsum(self._lengths[tokens].sum(axis=1)).tolist()
            flat = self._table[tokens].tobytes().translate(None, b"\0")
            start = 0
            for hash_id, end in zip(ids, ends, strict=True):
                made = missing[hash_id] = flat[start:end]
                start = end
                if count:
                    slots[(hash_id ^ salt) % count] = (hash_id, scope_key, made)
        return [missing[hash_id] if text is None else text for hash_id, text in zip(hash_ids, texts, strict=True)]
