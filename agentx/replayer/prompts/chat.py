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

import itertools
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from agentx.replayer.http.http1 import Pieces
from agentx.replayer.prompts.block_text import BlockText
from agentx.replayer.prompts.calibrate import ChatCalibration
from agentx.replayer.prompts.conversation import Segment
from agentx.replayer.prompts.tokens import BlockTokens, TokenSpace, filler

CHAT_PATH: Final = "/v1/chat/completions"
MARKER_WORDS: Final = 4
"""A marker of 4 words from a vocabulary of thousands: ~10^14 distinct markers, as unlikely to collide as 12 hex."""
_ENCODER: Final = msgspec.json.Encoder()


class _Message(msgspec.Struct):
    role: str
    content: str


class MessagesText:
    """One agent's last messages as pieces of JSON text, a list of them per message (`encoded`; the second message and
    later open with a comma), with what each message was made of (its segment, its token budget, whether it carries
    the marker), so that the next turn writes only the messages that changed (`ChatRenderer.render_json`)."""

    __slots__ = ("budgets", "encoded", "lengths", "marked", "marker", "segments", "tokens")

    def __init__(
        self,
        segments: Sequence[Segment],
        budgets: list[int],
        encoded: list[tuple[bytes, ...]],
        lengths: list[int],
        marked: int,
        marker: str,
        tokens: int,
    ) -> None:
        self.segments = segments
        self.budgets = budgets
        self.encoded = encoded
        self.lengths = lengths
        """Each message's length in bytes."""
        self.marked = marked
        """The index of the message that carries the marker (-1: none)."""
        self.marker = marker
        self.tokens = tokens
        """The prompt tokens the server counts for them."""

    def json(self) -> Pieces:
        """The array's JSON text in pieces, in order."""
        return Pieces((b"[", *itertools.chain.from_iterable(self.encoded), b"]"), 2 + sum(self.lengths))


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
        # Blocks are resent every turn (the whole history), so their text is cached, not rebuilt: as many as the token
        # cache holds (~4M tokens of text), direct-mapped as `BlockTokens` is, so that a body built on the worker
        # thread and one built on the loop share it safely.
        self._slot_count = self.blocks.cache_blocks
        self._texts: list[tuple[int, str, str] | None] = [None] * self._slot_count
        self._spaced = [" " + word for word in calibration.words]
        # The same text as it stands inside a JSON string: JSON escapes a string a character at a time, so the escaped
        # words, joined, are the escaped block (`render_json` writes messages without encoding their text again).
        self._block_jsons = BlockText(
            self.blocks, [_escaped(word) for word in self._spaced], self._slot_count, _escaped(calibration.separator)
        )
        self._head_json = _escaped(calibration.head)
        self._opens = {
            (role, first): (b"" if first else b",") + b'{"role":' + _ENCODER.encode(role) + b',"content":"'
            for role in ("system", "user", "assistant")
            for first in (True, False)
        }

    def block_text(self, scope_key: str, hash_id: int) -> str:
        return self.block_texts(scope_key, (hash_id,))[0]

    def block_texts(self, scope_key: str, hash_ids: Sequence[int]) -> list[str]:
        """The text of each block of `hash_ids`: the separator, then its words; those not cached made together."""
        count, slots = self._slot_count, self._texts
        salt = hash(scope_key)
        texts: list[str | None] = []
        missing: dict[int, str] = {}
        for hash_id in hash_ids:
            text = None
            if count:
                held = slots[(hash_id ^ salt) % count]
                if held is not None and held[0] == hash_id and held[1] == scope_key:
                    text = held[2]
            if text is None:
                missing[hash_id] = ""
            texts.append(text)
        if missing:
            spaced, separator = self._spaced, self.calibration.separator
            for hash_id, words in zip(missing, self.blocks.blocks(scope_key, list(missing)), strict=True):
                made = missing[hash_id] = separator + "".join([spaced[i] for i in words])
                if count:
                    slots[(hash_id ^ salt) % count] = (hash_id, scope_key, made)
        return [missing[hash_id] if text is None else text for hash_id, text in zip(hash_ids, texts, strict=True)]

    def block_jsons(self, scope_key: str, hash_ids: Sequence[int]) -> list[bytes]:
        """`block_texts`'s texts as they stand inside a JSON string, cached apart; those not cached made together."""
        return self._block_jsons.block_texts(scope_key, hash_ids)

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
        budgets, predicted = self._budgets(segments, target_tokens)
        marked = _marked(segments, marker)
        messages = [
            _Message(
                segment.role, self._content(segment, budget, scope_key, session_id, marker[0] if i == marked else "")
            )
            for i, (segment, budget) in enumerate(zip(segments, budgets, strict=True))
        ]
        return messages, predicted + (marker[1] if marked >= 0 else 0)

    def render_json(
        self,
        segments: Sequence[Segment],
        *,
        target_tokens: int,
        scope_key: str,
        session_id: str,
        marker: tuple[str, int] = ("", 0),
        previous: MessagesText | None = None,
    ) -> tuple[MessagesText, int]:
        """`render`'s messages as the JSON text `msgspec` writes for them (`MessagesText.json`), and the tokens the
        server will count; each message the agent's `previous` messages hold unchanged (the same segment, budget and
        marker) is taken from there, so a turn writes only the messages it changed or added."""
        budgets, predicted = self._budgets(segments, target_tokens)
        marked = _marked(segments, marker)
        words = marker[0]
        reusable = previous is not None and previous.marker == words
        encoded: list[tuple[bytes, ...]] = []
        lengths: list[int] = []
        for i, (segment, budget) in enumerate(zip(segments, budgets, strict=True)):
            if (
                reusable
                and previous is not None
                and i < len(previous.segments)
                and previous.segments[i] is segment
                and previous.budgets[i] == budget
                and (previous.marked == i) == (marked == i)
            ):
                encoded.append(previous.encoded[i])
                lengths.append(previous.lengths[i])
                continue
            marker_words = words if i == marked else ""
            message = self._message_json(segment, budget, scope_key, session_id, marker_words, first=i == 0)
            encoded.append(message)
            lengths.append(sum(map(len, message)))
        predicted += marker[1] if marked >= 0 else 0
        return MessagesText(segments, budgets, encoded, lengths, marked, words, predicted), predicted

    def _budgets(self, segments: Sequence[Segment], target_tokens: int) -> tuple[list[int], int]:
        """Each message's content tokens, and the prompt tokens they make with the template's (module docstring)."""
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
        return budgets, target_tokens + max(0, excess)

    def _content(self, segment: Segment, budget: int, scope_key: str, session_id: str, marker_words: str) -> str:
        """A message's text, with `marker_words` right after its head."""
        text = self._message_text(segment, budget, scope_key, session_id)
        if marker_words:
            head = self.calibration.head
            return head + marker_words + text[len(head) :]
        return text

    def _message_json(
        self, segment: Segment, budget: int, scope_key: str, session_id: str, marker_words: str, *, first: bool
    ) -> tuple[bytes, ...]:
        """`_content`'s message as pieces of the JSON `msgspec` writes for it (after a comma unless `first`): a tuple
        of bytes, which the garbage collector stops tracking at its first look (a message's list of a few thousand
        pieces was walked at every collection of its generation while the agent lived)."""
        bs = self.block_size
        whole = min(len(segment.hash_ids), budget // bs)
        parts = [self._opens[segment.role, first], self._head_json]
        if marker_words:
            parts.append(_escaped(marker_words))
        parts += self.block_jsons(scope_key, segment.hash_ids[:whole])
        rest = budget - whole * bs
        if whole < len(segment.hash_ids):
            if rest > 0:
                parts.append(_escaped(self._cut_block(scope_key, segment.hash_ids[whole], rest)))
        elif rest > 0:
            parts.append(_escaped(self.filler_text(session_id, segment.filler_key, rest)))
        parts.append(b'"}')
        return tuple(parts)

    def _message_text(self, segment: Segment, budget: int, scope_key: str, session_id: str) -> str:
        """The head, then `budget` tokens of the segment: whole blocks, a cut block, filler (extended if the
        budget asks for more than the segment holds)."""
        bs = self.block_size
        whole = min(len(segment.hash_ids), budget // bs)
        parts = [self.calibration.head]
        parts.extend(self.block_texts(scope_key, segment.hash_ids[:whole]))
        rest = budget - whole * bs
        if whole < len(segment.hash_ids):
            if rest > 0:
                parts.append(self._cut_block(scope_key, segment.hash_ids[whole], rest))
        elif rest > 0:
            # Filler is a prefix-stable stream, so a shortened filler is the start of the full one.
            parts.append(self.filler_text(session_id, segment.filler_key, rest))
        return "".join(parts)

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
    messages: Sequence[_Message] | msgspec.Raw,
    max_tokens: int,
    *,
    stream_options: Mapping[str, object] | None,
    extra_body: Mapping[str, object] | None = None,
    cache_salt: str | None = None,
    min_tokens: int | None = None,
) -> bytes:
    """The JSON body of a streamed chat request forcing exactly `max_tokens` output tokens (`messages` as a list, or as
    their JSON text: `msgspec.Raw`).

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


def _marked(segments: Sequence[Segment], marker: tuple[str, int]) -> int:
    """The index of the message that carries `marker`: the first user message (-1: no marker, or no user message)."""
    if not marker[0]:
        return -1
    return next((i for i, segment in enumerate(segments) if segment.role == "user"), -1)


def _escaped(text: str) -> bytes:
    """`text` as it stands inside a JSON string that `msgspec` writes."""
    return _ENCODER.encode(text)[1:-1]
