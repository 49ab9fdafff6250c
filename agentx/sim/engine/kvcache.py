"""The KV-cache block pool with vLLM-style automatic prefix caching.

A sequence's KV cache is a list of fixed-size blocks. A FULL block is identified by a chained hash:
hash(parent block's hash, the block's token ids), the first block's parent being a root that folds in
the request's `cache_salt`, so the same tokens after a different prefix (or salt) never match. Full
blocks are registered under their hash once their KV is computed and can then be shared, reference
counted, by every sequence whose prompt starts with the same blocks. A block whose last user leaves
keeps its contents: it is only evicted, least recently freed first, when a new block is needed.

Partial blocks are never cached. Free blocks that hold nothing cacheable are reused before any
cached block is evicted (vLLM queues them behind cached ones; reusing them first only helps hits).
Python's hash of a tuple of ints is stable across runs (no PYTHONHASHSEED salt), so runs reproduce.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

_ROOT_HASH = 0x5A17_C0DE_0000_0001
"""Parent of a first block without a salt: any fixed int, only consistency matters."""


def root_hash(cache_salt: str | None) -> int:
    """The parent hash of a sequence's first block: requests with different salts share nothing."""
    if cache_salt is None:
        return _ROOT_HASH
    salt = int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest(), "little")
    return hash((_ROOT_HASH, salt))


def block_hash(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The hash of a full block of `token_ids` following the block hashed `parent_hash`."""
    return hash((parent_hash, *token_ids))


def block_hashes(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[int]:
    """Chained hashes of every full block of `token_ids` (a trailing partial block has none)."""
    hashes: list[int] = []
    parent = root_hash(cache_salt)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class KVCache:
    """`num_blocks` blocks of `block_size` tokens; block ids are 0..num_blocks-1.

    The caller owns each sequence's list of block ids; this class tracks reference counts, the
    hash ↔ block map of cached blocks and the free lists. Everything but the hash → block map is sized
    once for `num_blocks`, so a full cache's bookkeeping costs little more than an empty one's: with a
    block → hash dict and an OrderedDict of evictable blocks, the simulator's memory grew by ~35 MB (at
    262,144 blocks) over the first minutes of a long run, as the cache filled (bench/soak.py's target).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_used_blocks = 0
        """Blocks with a reference count > 0."""
        self._ref_counts = [0] * num_blocks
        self._block_of_hash: dict[int, int] = {}
        self._hash_of_block: list[int | None] = [None] * num_blocks
        self._clean: list[int] = list(range(num_blocks - 1, -1, -1))
        """Free blocks holding nothing cached, popped from the end (block 0 first)."""
        # Free blocks still cached, least recently freed first: a doubly linked list through `_next` and
        # `_prev`, whose entry `num_blocks` is both its head and its tail.
        self._next = array("q", [num_blocks]) * (num_blocks + 1)
        self._prev = array("q", [num_blocks]) * (num_blocks + 1)
        self._num_evictable = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._clean) + self._num_evictable

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's kv_cache_usage)."""
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered under a hash, in use or evictable."""
        return len(self._block_of_hash)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def longest_cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """The blocks of the leading run of `hashes` that are cached (stops at the first miss)."""
        blocks: list[int] = []
        for hash_value in hashes:
            block = self._block_of_hash.get(hash_value)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def admit(self, blocks: list[int], hit_blocks: Sequence[int], num_new_blocks: int) -> bool:
        """Append the shared `hit_blocks` then `num_new_blocks` fresh ones to `blocks`, all or nothing.

        A hit block nobody uses sits on the evictable list, so taking it costs a free block too.
        """
        ref_counts = self._ref_counts
        revived = sum(1 for block in hit_blocks if ref_counts[block] == 0)
        if revived + num_new_blocks > self.num_free_blocks:
            return False
        for block in hit_blocks:
            # Taken before allocating, so that eviction cannot pick a block this sequence is about to share.
            if ref_counts[block] == 0:
                self._unlink(block)
                self.num_used_blocks += 1
            ref_counts[block] += 1
        blocks.extend(hit_blocks)
        return self.allocate(blocks, num_new_blocks)

    def allocate(self, blocks: list[int], num_new_blocks: int) -> bool:
        """Append `num_new_blocks` fresh blocks to `blocks`, or change nothing and return False."""
        if num_new_blocks > len(self._clean) + self._num_evictable:
            return False
        ref_counts = self._ref_counts
        hash_of_block = self._hash_of_block
        for _ in range(num_new_blocks):
            if self._clean:
                block = self._clean.pop()
            else:
                block = self._next[self.num_blocks]  # the least recently freed
                self._unlink(block)
                hash_value = hash_of_block[block]
                assert hash_value is not None
                del self._block_of_hash[hash_value]
                hash_of_block[block] = None
            ref_counts[block] = 1
            blocks.append(block)
        self.num_used_blocks += num_new_blocks
        return True

    def register(self, block_id: int, hash_value: int) -> None:
        """Make a block whose KV is now complete findable under its hash.

        When another block already holds the same content (two sequences computed it at the same
        time), that one stays the cached copy and this one is reused as a clean block once freed.
        """
        if hash_value not in self._block_of_hash:
            self._block_of_hash[hash_value] = block_id
            self._hash_of_block[block_id] = hash_value

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; unused cached blocks become evictable.

        Tail blocks are released first so that they are evicted before the prefix blocks, which
        more requests share (as vLLM does).
        """
        ref_counts = self._ref_counts
        hash_of_block = self._hash_of_block
        for block in reversed(blocks):
            ref_counts[block] -= 1
            if ref_counts[block] == 0:
                self.num_used_blocks -= 1
                if hash_of_block[block] is not None:
                    self._append(block)
                else:
                    self._clean.append(block)

    def _append(self, block: int) -> None:
        """Put `block` last (most recently freed) on the evictable list."""
        end = self.num_blocks
        last = self._prev[end]
        self._next[last] = block
        self._prev[block] = last
        self._next[block] = end
        self._prev[end] = block
        self._num_evictable += 1

    def _unlink(self, block: int) -> None:
        """Take `block` off the evictable list."""
        before, after = self._prev[block], self._next[block]
        self._next[before] = after
        self._prev[after] = before
        self._num_evictable -= 1
