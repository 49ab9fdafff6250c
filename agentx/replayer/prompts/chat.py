"""Chat message arrays for `--api chat`: segments (agentx.replayer.prompts.conversation) written as calibrated text.

A block of hash id `h` is `block_size` tokens of text: the calibration's separator, then
`block_size − separator_tokens` words, chosen deterministically per (seed, scope key, h) exactly like the
token ids of `--api completions` (the same `BlockTokens`, over word indices instead of token ids), so equal
ids give equal text and different ids never share a leading word pair. Filler words come from the words
the blocks never use. Each message opens with the calibration's head.

**The prompt the server counts is the trace's `in`**: the chat template's own tokens are taken out of the
content. Each message gives up its own (role markers, the head) from its tail, first from its filler,
then from the end of its last block, so a message's text depends only on itself and stays byte-identical
while later turns resend it (the prefix cache sees the recorded reuse); the last message also gives up
the conversation's base tokens (the generation prompt) and whatever a too-short message could not. When
the last message is too short for that (a recorded context can shrink below its history plus the last output),
the messages before it give up the rest from their tails, the latest first, so the prompt keeps its cached
prefix up to there; only a prompt shorter than the template's own tokens comes out longer than `in`, and the
record's `isl_sent_tokens` says by how much. (The reference instead sends `in` tokens of content and lets the
template add its own, docs/agentx.md §2a–§2d.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from agentx.replayer.prompts.calibrate import ChatCalibration
from agentx.replayer.prompts.conversation import Segment
from agentx.replayer.prompts.tokens import BlockTokens, TokenSpace, filler

CHAT_PATH: Final = "/v1/chat/completions"
MARKER_WORDS: Final = 4
"""A marker of 4 words from a vocabulary of thousands: ~10^14 distinct markers, as unlikely to collide as 12 hex."""
MESSAGE_CACHE: Final = 8192
"""Message texts kept: a session resends its whole history every turn, one message at a time."""


class _Message(msgspec.Struct):
    role: str
    content: str


class ChatRenderer:
    """Writes segments as messages whose token count the calibration predicts (module docstring)."""

    def __init__(self, calibration: ChatCalibration, seed: int, block_size: int) -> None:
        words_per_block = block_size - calibration.separator_tokens
        if words_per_block < 1:
            raise ValueError(f"block_size {block_size} leaves no room for words after the separator")
        self.calibration = calibration
        self.seed = seed
        self.block_size = block_size
        self.space = TokenSpace(0, len(calibration.words))
        self.blocks = BlockTokens(seed, words_per_block, self.space)
        # Blocks are resent every turn (the whole history), so their text is cached, not rebuilt.
        self._texts: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._spaced = [" " + word for word in calibration.words]
        self._messages: OrderedDict[tuple[Segment, int, str, str], str] = OrderedDict()

    def block_text(self, scope_key: str, hash_id: int) -> str:
        key = (scope_key, hash_id)
        texts = self._texts
        text = texts.get(key)
        if text is not None:
            texts.move_to_end(key)
            return text
        spaced = self._spaced
        text = self.calibration.separator + "".join([spaced[i] for i in self.blocks.block(scope_key, hash_id)])
        texts[key] = text
        if len(texts) > self.blocks.cache_blocks:  # as many as the token cache: ~4M tokens of text
            texts.popitem(last=False)
        return text

    def filler_text(self, session_id: str, key: str, n_tokens: int) -> str:
        spaced = self._spaced
        return "".join([spaced[i] for i in filler(self.seed, session_id, key, n_tokens, self.space)])

    def marker_text(self, marker: str) -> tuple[str, int]:
        """A cache-bust marker as calibrated words (text, tokens): `MARKER_WORDS` words drawn from its hex."""
        spaced = self._spaced
        value = int(marker, 16)
        words = []
        for _ in range(MARKER_WORDS):
            value, index = divmod(value, len(spaced))
            words.append(spaced[index])
        return "".join(words), MARKER_WORDS

    def render(
        self,
        segments: Sequence[Segment],
        *,
        target_tokens: int,
        scope_key: str,
        session_id: str,
        marker: tuple[str, int] = ("", 0),
    ) -> tuple[list[_Message], int]:
        """The messages of `segments` and the prompt tokens the server will count (aimed at `target_tokens`),
        with `marker` (text, tokens: `marker_text`) right after the head of the first user message."""
        if not segments:
            raise ValueError("a chat request needs at least one segment")
        calibration = self.calibration
        bs = self.block_size
        # Each message gives up its own template tokens from its tail, so its text depends on nothing but
        # itself and stays byte-identical while later turns resend it; the last message takes the rest.
        budgets = [
            max(0, len(segment.hash_ids) * bs + segment.filler_tokens - calibration.role_tokens[segment.role])
            for segment in segments
        ]
        predicted = calibration.overhead([segment.role for segment in segments]) + sum(budgets)
        # The last message takes the difference; what it cannot give up comes off the tails of the messages before
        # it, last first (a recorded context can shrink below history plus output: a compaction, a dropped file).
        excess = predicted - target_tokens
        if excess < 0:
            budgets[-1] -= excess
        else:
            for index in reversed(range(len(budgets))):
                taken = min(excess, budgets[index])
                budgets[index] -= taken
                excess -= taken
        predicted = target_tokens + max(0, excess)
        messages = [
            _Message(segment.role, self._message_text(segment, budget, scope_key, session_id))
            for segment, budget in zip(segments, budgets, strict=True)
        ]
        marker_words, marker_tokens = marker
        if marker_words:
            for message in messages:
                if message.role == "user":
                    head = self.calibration.head
                    message.content = head + marker_words + message.content[len(head) :]
                    predicted += marker_tokens
                    break
        return messages, predicted

    def _message_text(self, segment: Segment, budget: int, scope_key: str, session_id: str) -> str:
        """The head, then `budget` tokens of the segment: whole blocks, a cut block, filler (extended if the
        budget asks for more than the segment holds)."""
        key = (segment, budget, scope_key, session_id)
        texts = self._messages
        text = texts.get(key)
        if text is not None:
            texts.move_to_end(key)
            return text
        bs = self.block_size
        whole = min(len(segment.hash_ids), budget // bs)
        parts = [self.calibration.head]
        parts.extend(self.block_text(scope_key, hash_id) for hash_id in segment.hash_ids[:whole])
        rest = budget - whole * bs
        if whole < len(segment.hash_ids):
            if rest > 0:
                parts.append(self._cut_block(scope_key, segment.hash_ids[whole], rest))
        elif rest > 0:
            # Filler is a prefix-stable stream, so a shortened filler is the start of the full one.
            parts.append(self.filler_text(session_id, segment.filler_key, rest))
        text = "".join(parts)
        texts[key] = text
        if len(texts) > MESSAGE_CACHE:
            texts.popitem(last=False)
        return text

    def _cut_block(self, scope_key: str, hash_id: int, n_tokens: int) -> str:
        """The first `n_tokens` tokens of a block: its separator, then its first words."""
        separator_tokens = self.calibration.separator_tokens
        spaced = self._spaced
        if n_tokens <= separator_tokens:
            # A lone separator at a message's end is whitespace a chat template may trim: words instead.
            return "".join([spaced[i] for i in self.blocks.block(scope_key, hash_id)[:n_tokens]])
        words = self.blocks.block(scope_key, hash_id)[: n_tokens - separator_tokens]
        return self.calibration.separator + "".join([spaced[i] for i in words])


def chat_body(
    model: str,
    messages: Sequence[_Message],
    max_tokens: int,
    *,
    stream_options: Mapping[str, object] | None,
    extra_body: Mapping[str, object] | None = None,
    cache_salt: str | None = None,
    min_tokens: int | None = None,
) -> bytes:
    """The JSON body of a streamed chat request forcing exactly `max_tokens` output tokens.

    Both `max_tokens` and `max_completion_tokens` are sent (servers differ in which one they honour),
    with `min_tokens` (`max_tokens` unless given) and `ignore_eos`; `extra_body` is merged at the top level last.
    """
    body: dict[str, object] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "min_tokens": max_tokens if min_tokens is None else min_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    if stream_options is not None:
        body["stream_options"] = dict(stream_options)
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if extra_body:
        body.update(extra_body)
    return msgspec.json.encode(body)
