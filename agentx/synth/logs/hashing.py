"""Keyed, chained block hashing and first-seen remapping to small ids.

Each block's digest is BLAKE2b keyed with the secret salt over its parent's digest and its own
tokens, so equal ids mean equal prefixes up to and including that block, and nobody without the
salt can test a guessed text against a digest. Digests never leave this process: the trace holds
only the small ints `IdRemap` hands out in first-seen order.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

from agentx.errors import ConfigError

DIGEST_BYTES = 16
_KEY_BYTES = 64  # BLAKE2b's largest key
_SEPARATOR = "\x00"  # keeps ["ab", "c"] and ["a", "bc"] apart


def random_salt() -> bytes:
    """A fresh secret for one run; it is never written anywhere."""
    return secrets.token_bytes(32)


def read_salt(path: str | os.PathLike[str]) -> bytes:
    """The salt in `path` (trailing whitespace ignored); raises ValueError when empty or unreadable."""
    try:
        data = Path(path).read_bytes().rstrip()
    except OSError as exc:
        raise ConfigError(f"--salt-file {path}: cannot read it ({exc.strerror or exc})") from exc
    if not data:
        raise ConfigError(f"--salt-file {path}: the file is empty; put a long random secret in it")
    return data


def salt_key(salt: bytes) -> bytes:
    """A BLAKE2b key from a salt of any length (long salts are hashed down to 64 bytes)."""
    return salt if 0 < len(salt) <= _KEY_BYTES else hashlib.blake2b(salt, digest_size=_KEY_BYTES).digest()


class ChainHasher:
    """Digests of the `block_size`-token blocks of a token list, chained, under one key."""

    def __init__(self, salt: bytes, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, not {block_size}")
        self.block_size = block_size
        # Copying a keyed state is cheaper than keying a new one per block.
        self._keyed = hashlib.blake2b(key=salt_key(salt), digest_size=DIGEST_BYTES)

    def digests(self, tokens: Sequence[str]) -> list[bytes]:
        """One digest per block; the last block may be partial."""
        size = self.block_size
        parent = b""
        out: list[bytes] = []
        for start in range(0, len(tokens), size):
            state = self._keyed.copy()
            state.update(parent)
            state.update(_SEPARATOR.join(tokens[start : start + size]).encode("utf-8", "surrogatepass"))
            parent = state.digest()
            out.append(parent)
        return out

    def prefix_digest(self, tokens: Sequence[str], digests: Sequence[bytes], length: int) -> bytes:
        """The final digest `digests(tokens[:length])` would end with, reusing `digests` of `tokens`.

        A prompt extends an earlier one of `length` tokens exactly when this equals that prompt's
        final digest.
        """
        if length <= 0:
            return b""
        if length > len(tokens):
            return b""
        full, rest = divmod(length, self.block_size)
        parent = digests[full - 1] if full else b""
        if not rest:
            return parent
        state = self._keyed.copy()
        state.update(parent)
        state.update(_SEPARATOR.join(tokens[full * self.block_size : length]).encode("utf-8", "surrogatepass"))
        return state.digest()


class IdRemap:
    """Digests → 0, 1, 2, ... in first-seen order (one instance per hash-id namespace)."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}

    def ids(self, digests: Iterable[bytes]) -> list[int]:
        table = self._ids
        return [table.setdefault(digest, len(table)) for digest in digests]

    def __len__(self) -> int:
        return len(self._ids)

    def fresh(self) -> int:
        """A new id no digest maps to (unshared filler)."""
        # Longer than any digest, so it can never collide with one.
        return self.ids([b"filler:" + len(self._ids).to_bytes(DIGEST_BYTES, "big")])[0]
