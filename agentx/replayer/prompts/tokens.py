"""Synthetic prompts as token-id lists, for `--api completions`.

A request's prompt is rebuilt from its trace record alone (docs/agentx.md §1d, §2a):

- the first `m = min(len(hash_ids), in_tokens // block_size)` hash ids each give one block of
  `block_size` tokens, deterministic per (seed, scope key, hash id), so requests that share leading hash
  ids share leading tokens and hit the server's prefix cache exactly as recorded;
- surplus ids (including the id of a partial last block) are ignored; the missing blocks and the
  remainder `in_tokens % block_size` become filler, deterministic per (seed, session, turn) and tied to
  no id;
- the prompt is always exactly `in_tokens` ids (plus an optional caller-supplied prefix, the hook for
  the §2e cache-bust marker, which the trace's `in` does not count either).

Token ids come from a `TokenSpace`, split in two disjoint ranges: blocks draw from the low part, filler
from the high part, so filler can never equal block content and never creates a false cache hit. The
first two tokens of a block encode its hash id (offset per seed and scope), so two different blocks of
one scope never start with the same token pair, and never with the same first token unless their ids
differ by a multiple of the block range's width: even a server that caches at token granularity
(SGLang's radix tree) sees no accidental common prefix between different blocks.

Performance (targets: bench/README.md): blocks are cached by (scope key, hash id) in a bounded LRU, as an
AgentX session resends its whole prefix every turn, and their ids are interned from one shared table,
so a cached block costs ~0.6 KB rather than ~2.4 KB of fresh int objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
import numpy as np

from agentx.trace.model import Request

DEFAULT_TOKEN_LOW: Final = 1000
DEFAULT_TOKEN_HIGH: Final = 30000
"""[1000, 30000) is inside the vocabulary of every common tokenizer (GPT-2's 50257, Llama 2's 32000,
Llama 3's 128256, Qwen's 151k, ...) and clear of the low ids where special and byte tokens usually sit.
The project's simulator (vocab 32000 by default, ordinary words from id 356 = `FIRST_WORD_ID`) accepts it
too; against a simulator run with a smaller `--vocab-size V`, use `TokenSpace(356, V)`."""

DEFAULT_CACHE_TOKENS: Final = 1 << 22
"""The block cache holds ~4M tokens (65,536 blocks of 64 tokens, 8,192 of Mooncake's 512): the full prefixes of
~45 concurrent 90k-token sessions, ~35 MB whatever the block size (a cached block is a tuple of one pointer a token).
Bounded by a count of blocks instead, it grew eightfold with 512-token blocks: a replay of a Mooncake trace reached
~300 MB within seconds (bench/startup.py). A miss only costs a few µs of regeneration, never correctness."""


def default_cache_blocks(block_size: int) -> int:
    """Blocks of `block_size` tokens that make `DEFAULT_CACHE_TOKENS`."""
    return max(1, DEFAULT_CACHE_TOKENS // max(1, block_size))


FILLER_SHARE_DIVISOR: Final = 16
"""Filler takes 1/16 of the space (at least one id): it needs no variety beyond not being block content."""

_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)


def _mix64(
    values: np.ndarray[tuple[int, ...], np.dtype[np.uint64]],
) -> np.ndarray[tuple[int, ...], np.dtype[np.uint64]]:
    """splitmix64's finalizer, elementwise (uint64 arithmetic wraps, as the algorithm intends)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


DEFAULT_STREAM_OPTIONS: Final[Mapping[str, object]] = {"include_usage": True, "continuous_usage_stats": True}


class TokenSpace(msgspec.Struct, frozen=True):
    """The token ids `[low, high)` that prompts draw from: blocks from `[low, filler_low)`, filler from
    `[filler_low, high)`."""

    low: int = DEFAULT_TOKEN_LOW
    high: int = DEFAULT_TOKEN_HIGH

    def __post_init__(self) -> None:
        if self.low < 0 or self.high - self.low < 2:
            raise ValueError(
                f"token space must be [low, high) with 0 <= low and at least 2 ids, got [{self.low}, {self.high})"
            )

    @property
    def filler_low(self) -> int:
        return self.high - max(1, (self.high - self.low) // FILLER_SHARE_DIVISOR)

    @property
    def block_width(self) -> int:
        return self.filler_low - self.low

    @property
    def filler_width(self) -> int:
        return self.high - self.filler_low


def _digest_u32(key: str, count: int) -> np.ndarray[tuple[int], np.dtype[np.uint32]]:
    """`count` deterministic pseudo-random uint32 from `key`, vectorized for long filler (SHAKE-128 output,
    read little-endian so every platform agrees; ~3x faster than seeding a numpy Generator)."""
    return np.frombuffer(hashlib.shake_128(key.encode()).digest(4 * count), dtype="<u4")


class BlockTokens:
    """The deterministic tokens of each hash-id block, with a bounded, direct-mapped cache.

    `scope_key` is the session id when the trace's `hash_id_scope` is "session" and "" when it is
    "global". Equal (seed, scope key, id) give identical tokens; within one scope, different ids give
    blocks whose first two tokens differ (ids below `block_width ** 2`, ~7e8 by default) — see the
    module docstring. Returned lists are shared with the cache: never modify them.
    """

    def __init__(
        self,
        seed: int,
        block_size: int,
        space: TokenSpace | None = None,
        cache_blocks: int | None = None,
    ) -> None:
        """`cache_blocks`: the cache's size in blocks (default: `default_cache_blocks(block_size)`; 0: none)."""
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if cache_blocks is None:
            cache_blocks = default_cache_blocks(block_size)
        if cache_blocks < 0:
            raise ValueError(f"cache_blocks must be non-negative, got {cache_blocks}")
        self.seed = seed
        self.block_size = block_size
        self.space = space if space is not None else TokenSpace()
        self.cache_blocks = cache_blocks
        # Slot `(id ^ hash(scope)) % slots` holds the last block made that maps there: no dict, because a dict
        # that evicts rehashes all its entries every ~1.7 × its size insertions, a pause of several ms at 65k
        # blocks that landed on due requests (1,000 requests/s of fresh blocks: every ~1.8 s). Consecutive ids
        # of one scope take consecutive slots, so a session's prefix does not evict itself. A slot is one
        # (id, scope, tokens) tuple, replaced whole: a body built on a worker thread (agentx.replayer.schedule.offloop)
        # and one built on the loop never see half of another's block. Tuples of ints leave the garbage
        # collector's lists once seen, so tens of thousands of cached blocks add nothing to its pauses.
        self._slot_count = cache_blocks
        self._slots: list[tuple[int, str, tuple[int, ...]] | None] = [None] * cache_blocks
        self._filled = 0
        self._low = self.space.low
        self._width = self.space.block_width
        # The last scope's (key, offset, 64-bit key), replaced whole for the same reason.
        self._scope: tuple[str, int, np.uint64] | None = None
        # One int object per id: cached blocks hold pointers into this table, not fresh ints.
        self._ids = np.array(range(self.space.high), dtype=object)
        self.hits = 0
        self.misses = 0
        """Blocks found in and missing from the cache (counted without a lock: approximate while a worker
        thread builds bodies too)."""

    def block(self, scope_key: str, hash_id: int) -> tuple[int, ...]:
        """The `block_size` tokens of block `hash_id` in scope `scope_key` (shared: do not modify)."""
        out: list[int] = []
        self.extend(out, scope_key, (hash_id,))
        return tuple(out)

    def extend(self, out: list[int], scope_key: str, hash_ids: Sequence[int]) -> None:
        """Append the blocks of `hash_ids`, in order, to `out`. The hot path: cached blocks are only looked
        up and concatenated; the missing ones are made together, in one vectorized pass."""
        count, slots = self._slot_count, self._slots
        salt = hash(scope_key)
        found: list[tuple[int, ...] | None] = []
        missing: dict[int, tuple[int, ...]] = {}
        for hash_id in hash_ids:
            tokens = None
            if count:
                held = slots[(hash_id ^ salt) % count]
                if held is not None and held[0] == hash_id and held[1] == scope_key:
                    tokens = held[2]
            if tokens is None:
                missing[hash_id] = ()
            found.append(tokens)
        if missing:
            made = self._make(scope_key, list(missing))
            for hash_id, tokens in zip(missing, made, strict=True):
                missing[hash_id] = tokens
                if count:
                    slot = (hash_id ^ salt) % count
                    self._filled += slots[slot] is None
                    slots[slot] = (hash_id, scope_key, tokens)
        self.misses += len(missing)
        self.hits += len(hash_ids) - len(missing)
        extend = out.extend
        for hash_id, tokens in zip(hash_ids, found, strict=True):
            extend(missing[hash_id] if tokens is None else tokens)

    def blocks(self, scope_key: str, hash_ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The tokens of each block of `hash_ids` in scope `scope_key`, the missing ones made together (shared: do not
        modify)."""
        out: list[int] = []
        self.extend(out, scope_key, hash_ids)
        size = self.block_size
        return [tuple(out[start : start + size]) for start in range(0, len(out), size)]

    def _make(self, scope_key: str, hash_ids: list[int]) -> list[tuple[int, ...]]:
        rows: list[list[int]] = self._ids[self.matrix(scope_key, hash_ids)].tolist()
        return list(map(tuple, rows))

    def matrix(self, scope_key: str, hash_ids: Sequence[int]) -> np.ndarray[tuple[int, int], np.dtype[np.int64]]:
        """The tokens of the blocks of `hash_ids` in one scope, a row each, made anew (no cache): a counter-based hash
        (splitmix64) of the scope's key, the id and the position, so each block is the same whichever others it is
        made with."""
        scope = self._scope
        if scope is None or scope[0] != scope_key:
            # Misses cluster by session, so remembering the last scope's keys is enough (and bounded).
            digest = hashlib.shake_128(f"{self.seed}:{scope_key}".encode()).digest(16)
            scope = (scope_key, int.from_bytes(digest[:8], "little"), np.uint64(int.from_bytes(digest[8:], "little")))
            self._scope = scope
        _, offset, scope_key64 = scope
        low, width, size = self._low, self._width, self.block_size
        ids = np.array(hash_ids, dtype=np.int64)
        # The leading pair spells (id + offset) in base `width`: distinct ids of a scope never share it.
        code = (ids % (width * width) + offset % (width * width)) % (width * width)
        matrix = np.empty((len(hash_ids), max(size, 2)), dtype=np.int64)
        matrix[:, 0] = code % width
        matrix[:, 1] = code // width
        if size > 2:
            positions = np.arange(1, size - 1, dtype=np.uint64) * _GOLDEN
            base = _mix64(ids.view(np.uint64) * _GOLDEN + scope_key64)
            matrix[:, 2:] = _mix64(base[:, None] + positions[None, :]) % np.uint64(width)
        matrix += low
        return matrix[:, :size]

    def __len__(self) -> int:
        """Blocks held by the cache."""
        return self._filled


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (tuples compare at C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual growth turn
        return n
    low, high = 0, n  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def filler(seed: int, session_id: str, turn_key: int | str, n: int, space: TokenSpace | None = None) -> list[int]:
    """`n` filler tokens for one turn of one session, deterministic, drawn from the filler range only
    (disjoint from every block's tokens)."""
    result: list[int] = filler_ids(seed, session_id, turn_key, n, space).tolist()
    return result


def filler_ids(
    seed: int, session_id: str, turn_key: int | str, n: int, space: TokenSpace | None = None
) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    """`filler`'s tokens as an array."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    space = space if space is not None else TokenSpace()
    draws = _digest_u32(f"{seed}:{session_id}:turn_{turn_key}:filler", n) % space.filler_width + space.filler_low
    return draws.astype(np.int64)


def prompt_token_ids(
    request: Request,
    hash_ids: Sequence[int],
    block_size: int,
    blocks: BlockTokens,
    session_id: str,
    turn_key: int | str,
    scope_key: str,
    *,
    prefix_ids: Sequence[int] = (),
) -> list[int]:
    """The prompt of `request`: exactly `request.in_tokens` ids (§1d), after `prefix_ids`.

    `hash_ids` is the request's full id list (`Agent.iter_hash_ids()`), `scope_key` the session id or ""
    (see `BlockTokens`), `turn_key` keys the filler (the request's index in its agent, say). `prefix_ids`
    is the hook for the §2e cache-bust marker: prepended as is, and not counted in `in_tokens`.
    `in_tokens == 0` gives just `prefix_ids` (the caller warns).
    """
    if block_size != blocks.block_size:
        raise ValueError(f"block_size {block_size} differs from the BlockTokens' {blocks.block_size}")
    in_tokens = request.in_tokens
    covered = min(len(hash_ids), in_tokens // block_size)
    out = list(prefix_ids)
    blocks.extend(out, scope_key, hash_ids[:covered])
    rest = in_tokens - covered * block_size
    if rest > 0:
        out += filler(blocks.seed, session_id, turn_key, rest, blocks.space)
    return out


def completions_body(
    model: str,
    prompt_ids: Sequence[int] | msgspec.Raw,
    max_tokens: int,
    *,
    min_tokens: int | None = None,
    ignore_eos: bool = True,
    stream_options: Mapping[str, object] | None = DEFAULT_STREAM_OPTIONS,
    return_token_ids: bool | None = None,
    extra_body: Mapping[str, object] | None = None,
    cache_salt: str | None = None,
) -> bytes:
    """The JSON body of a streamed `POST /v1/completions` with a token-id prompt (or its JSON text, as `msgspec.Raw`).

    `min_tokens` defaults to `max_tokens` and `ignore_eos` to true, so the server generates exactly the
    recorded output length. `stream_options=None` omits the field (for servers that reject
    `continuous_usage_stats`); `return_token_ids` and `cache_salt` are sent only when given. `extra_body`
    is merged at the top level last: its keys win over every field above.
    """
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens if min_tokens is None else min_tokens,
        "ignore_eos": ignore_eos,
        "stream": True,
    }
    if stream_options is not None:
        body["stream_options"] = dict(stream_options)
    if return_token_ids is not None:
        body["return_token_ids"] = return_token_ids
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if extra_body:
        body.update(extra_body)
    return msgspec.json.encode(body)
