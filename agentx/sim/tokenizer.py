"""The simulator's deterministic tokenizer and chat template (docs/sim.md has the exact rules).

Every token is one whitespace-free string ("word"); text is split on whitespace, each piece is one
token when it is in the vocabulary and is spelled character by character otherwise; ids decode to
their words joined by single spaces. So `encode(decode(ids)) == ids` for any ids, and token counts
are predictable from the text alone.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import msgspec

SPECIAL_TOKENS = ("<|endoftext|>", "<|system|>", "<|developer|>", "<|user|>", "<|assistant|>", "<|tool|>")
ROLE_IDS = {"system": 1, "developer": 2, "user": 3, "assistant": 4, "tool": 5, "function": 5}
"""Role marker token of each chat role ("function" is the legacy name of "tool")."""
GENERATION_PROMPT_ID = ROLE_IDS["assistant"]
"""The generation prompt is the assistant marker, so a turn's prompt is a token prefix of the next turn's."""

_CHARS = tuple(chr(code) for code in range(33, 127))
"""Printable ASCII except space: one token each, to spell words that are not in the vocabulary."""
_FIRST_CHAR_ID = len(SPECIAL_TOKENS)
_FIRST_BYTE_ID = _FIRST_CHAR_ID + len(_CHARS)
"""Any other character is spelled as its UTF-8 bytes, one `<0xHH>` token each."""
FIRST_WORD_ID = _FIRST_BYTE_ID + 256
MIN_VOCAB_SIZE = FIRST_WORD_ID + 100

_CONSONANTS = "bdfghjklmnprstvwz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)


def _generated_word(index: int) -> str:
    """The index-th word made of two or more consonant-vowel syllables (never a single character)."""
    base = len(_SYLLABLES)
    length = 2
    while index >= base**length:
        index -= base**length
        length += 1
    syllables = []
    for _ in range(length):
        index, digit = divmod(index, base)
        syllables.append(_SYLLABLES[digit])
    return "".join(reversed(syllables))


class Tokenizer:
    """The vocabulary of `vocab_size` tokens; build one with `get_tokenizer` (cached)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
        self.vocab_size = vocab_size
        bytes_tokens = [f"<0x{value:02X}>" for value in range(256)]
        generated = [_generated_word(index) for index in range(vocab_size - FIRST_WORD_ID)]
        self.words: list[str] = [*SPECIAL_TOKENS, *_CHARS, *bytes_tokens, *generated]
        self._ids = {word: index for index, word in enumerate(self.words)}
        # JSON string bodies (escaped, without quotes) for building streamed text without encoding it.
        self.json_bare: list[bytes] = [msgspec.json.encode(word)[1:-1] for word in self.words]
        self.json_spaced: list[bytes] = [b" " + body for body in self.json_bare]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        vocabulary = self._ids
        for piece in text.split():
            token = vocabulary.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._spell(piece))
        return ids

    def _spell(self, piece: str) -> Iterable[int]:
        for char in piece:
            code = ord(char)
            if 33 <= code < 127:
                yield _FIRST_CHAR_ID + code - 33
            else:
                yield from (_FIRST_BYTE_ID + value for value in char.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        words = self.words
        return " ".join([words[token] for token in ids])

    def is_valid(self, ids: Sequence[int]) -> bool:
        size = self.vocab_size
        return all(0 <= token < size for token in ids)

    def json_text(self, ids: Sequence[int], *, continued: bool) -> bytes:
        """The JSON string body (no quotes) of `ids`' text, with a leading space when `continued`."""
        spaced = self.json_spaced
        if not ids:
            return b""
        first = spaced[ids[0]] if continued else self.json_bare[ids[0]]
        if len(ids) == 1:
            return first
        return first + b"".join([spaced[token] for token in ids[1:]])

    def chat_ids(self, messages: Iterable[tuple[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        """The chat template: per (role, text) message its role marker then the text's tokens; then the
        generation prompt. Roles must be keys of ROLE_IDS."""
        ids: list[int] = []
        for role, text in messages:
            ids.append(ROLE_IDS[role])
            ids.extend(self.encode(text))
        if add_generation_prompt:
            ids.append(GENERATION_PROMPT_ID)
        return ids


@functools.lru_cache(maxsize=4)
def get_tokenizer(vocab_size: int) -> Tokenizer:
    return Tokenizer(vocab_size)
