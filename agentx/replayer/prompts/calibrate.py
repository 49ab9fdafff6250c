"""Calibrating `--api chat` text against the server's tokenizer, once, before a run.

Chat requests carry text, and the server tokenizes it; a prompt of exactly `in` tokens needs text whose
token count is known in advance. The calibration finds:

- **words** that are one token each when written after a space (`" word"`), drawn from the server's own
  vocabulary (its `/detokenize` of single ids, split on a newline token) and verified in bulk through
  `/tokenize` (halving a failing group until the offenders are found), so any run of them costs exactly
  one token per word;
- a **block separator**, `"\\n"`, written at the start of every block, whose cost (0 or 1 tokens) is
  measured: it keeps one block's tokenization independent of the block before it;
- a **head**, a fixed word opening every message, so a template that trims message content (Llama 3's
  `| trim`) trims the same thing everywhere; its cost is part of the per-message overhead;
- the **chat template's overhead**: the tokens a conversation costs beyond its messages' content, as
  `base + Σ per-role`, measured by `/tokenize` with `messages` on a few role sequences;
- a **check** on sample conversations (predicted versus counted), stored with the calibration.

`--tokenizer tokenizer.json` (the optional `tokenizers` package) counts text locally instead; the
template overhead still comes from the server (`/tokenize` with messages, else a one-token chat request's
`usage.prompt_tokens`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from agentx.errors import CalibrationError
from agentx.replayer.http.client import Client, ServerUnreachable

HEAD: Final = "ok"
SEPARATOR: Final = "\n"
CANDIDATE_IDS: Final = 8192
"""Ids 0..8191 hold most short whole words of every common vocabulary."""
DETOKENIZE_CHUNK: Final = 1024
MIN_WORDS: Final = 64
MAX_WORDS: Final = 4096
MAX_WORD_CHARS: Final = 12
VERIFY_BUDGET: Final = 600
"""`/tokenize` calls the word search may make; a group still unverified when it runs out is dropped."""

_FALLBACK_TEXT: Final = (
    "the of and to in is for on that with as it at by from this be or are an was have not but all can more  "
    "one will new has about time when there which out up so use only some these other into than its two  "
    "first any many then them would like what just over also after most such make made well back way long  "
    "even good much through where each work part take place found while same both three since right high  "
    "used under last never need small world life state house still help point large number"
)
FALLBACK_WORDS: Final = tuple(_FALLBACK_TEXT.split())
"""Candidates when the server has no `/detokenize`: common words that most vocabularies hold whole."""


class ChatCalibration(msgspec.Struct, frozen=True, kw_only=True):
    """How to write chat text of a known token count for one server (see the module docstring)."""

    words: tuple[str, ...]
    """One token each after a space."""
    head: str = HEAD
    separator: str = SEPARATOR
    separator_tokens: int = 0
    """What the separator costs beyond the space it replaces: 0 or 1."""
    base_tokens: int = 0
    """Template tokens of a conversation with no message (the generation prompt, BOS, ...)."""
    role_tokens: dict[str, int] = {}
    """Template tokens each message of a role adds (its head included)."""
    source: str = ""
    """What counted the tokens: "server" or the tokenizer file's name."""
    checks: list[tuple[int, int]] = []
    """(predicted, counted) on the sample conversations."""

    def text_of(self, blocks: Sequence[Sequence[int]], filler: Sequence[int]) -> str:
        """A message's text: the head, then each block (separator, then its words), then the filler words.
        Word ids index `words`; it costs `len(blocks) × block_size + len(filler)` tokens beyond the head
        when every block holds `block_size − separator_tokens` words."""
        words = self.words
        parts = [self.head]
        for block in blocks:
            parts.append(self.separator)
            parts.extend(" " + words[i] for i in block)
        parts.extend(" " + words[i] for i in filler)
        return "".join(parts)

    def overhead(self, roles: Sequence[str]) -> int:
        """Template tokens of a conversation whose messages have these roles, in this order."""
        table = self.role_tokens
        return self.base_tokens + sum(table[role] for role in roles)

    def summary(self) -> dict[str, Any]:
        """JSON-ready facts for run metadata (the word list itself is left out)."""
        return {
            "words": len(self.words),
            "separator_tokens": self.separator_tokens,
            "base_tokens": self.base_tokens,
            "role_tokens": dict(self.role_tokens),
            "source": self.source,
            "checks": [list(check) for check in self.checks],
        }


Messages = list[dict[str, str]]


class TokenCounter(Protocol):
    async def count_text(self, text: str) -> int: ...

    async def count_messages(self, messages: Messages) -> int: ...

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        """The text of `ids`, or None when the backend cannot say (or an id is out of range)."""
        ...

    async def encode(self, text: str) -> list[int] | None:
        """The token ids of `text` (no special tokens), or None when the backend cannot say."""
        ...


class _TokenizeResponse(msgspec.Struct):
    count: int | None = None
    tokens: list[int] | None = None

    def n(self) -> int:
        if self.count is not None:
            return self.count
        return len(self.tokens or ())


class _DetokenizeResponse(msgspec.Struct):
    prompt: str | None = None
    content: str | None = None
    """llama.cpp's name for the text."""


class _Usage(msgspec.Struct):
    prompt_tokens: int


class _CompletionResponse(msgspec.Struct):
    usage: _Usage


class ServerCounter:
    """Counts through the server's `/tokenize` and `/detokenize` (vLLM, SGLang, llama.cpp, the simulator);
    chat templates through `/tokenize` with `messages`, else a one-token chat request.

    Two dialects: vLLM's (`prompt`, `add_special_tokens`; `/detokenize` answers `prompt`) and llama.cpp's
    (`content`, `add_special`; answers `content`). llama.cpp answers a vLLM-style body with an empty token
    list, not an error, so an empty answer for non-empty text switches to its dialect; its `/tokenize` takes
    no `messages` either (an empty answer again), so templates are then counted by request.
    """

    def __init__(self, client: Client, model: str) -> None:
        self.client = client
        self.model = model
        self._messages_endpoint = True
        self._messages_seen = False
        self._llamacpp = False

    async def _tokenize(self, text: str) -> tuple[int, bytes, _TokenizeResponse | None]:
        for llamacpp in (self._llamacpp, True):
            if llamacpp:
                payload: dict[str, object] = {"content": text, "add_special": False, "parse_special": False}
            else:
                payload = {"model": self.model, "prompt": text, "add_special_tokens": False}
            status, body = await self.client.request_json("POST", "/tokenize", payload)
            if status != 200:
                return status, body, None
            answer = msgspec.json.decode(body, type=_TokenizeResponse)
            if answer.n() > 0 or not text or llamacpp:
                self._llamacpp = llamacpp
                return status, body, answer
        raise AssertionError("unreachable: the llama.cpp dialect always returns")

    async def count_text(self, text: str) -> int:
        status, body, answer = await self._tokenize(text)
        if answer is None:
            raise CalibrationError(
                f"POST /tokenize answered HTTP {status}: {body[:200]!r}. `--api chat` needs the server's "
                "/tokenize (vLLM, SGLang, llama.cpp have it) or a local `--tokenizer tokenizer.json`."
            )
        return answer.n()

    async def count_messages(self, messages: Messages) -> int:
        if self._messages_endpoint and not self._llamacpp:
            payload = {"model": self.model, "messages": messages, "add_generation_prompt": True}
            status, body = await self.client.request_json("POST", "/tokenize", payload)
            if status == 200 and (counted := msgspec.json.decode(body, type=_TokenizeResponse).n()) > 0:
                self._messages_seen = True
                return counted
            if status not in (200, 400, 404, 405, 422):
                raise CalibrationError(f"POST /tokenize with messages answered HTTP {status}: {body[:200]!r}")
            if status == 400 and self._messages_seen:
                # The endpoint takes messages, so this is the template refusing this role sequence.
                raise CalibrationError(f"the chat template refused a message sequence: {body[:200]!r}")
            self._messages_endpoint = False  # (a 200 with no tokens: the endpoint ignored `messages`, as llama.cpp's)
        return await count_by_request(self.client, self.model, messages)

    async def encode(self, text: str) -> list[int] | None:
        _, _, answer = await self._tokenize(text)
        return None if answer is None else answer.tokens

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        payload = {"model": self.model, "tokens": list(ids)}
        status, body = await self.client.request_json("POST", "/detokenize", payload)
        if status != 200:
            return None
        answer = msgspec.json.decode(body, type=_DetokenizeResponse)
        return answer.prompt if answer.prompt is not None else answer.content


class LocalCounter:
    """Counts text with a `tokenizer.json` (the `tokenizers` package); chat templates through the server."""

    def __init__(self, path: str, client: Client, model: str) -> None:
        try:
            from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise CalibrationError(
                "`--tokenizer` needs the `tokenizers` package: pip install 'agentx-replay[tokenizer]'"
            ) from None
        try:
            self._tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # the library raises plain Exceptions for unreadable files
            raise CalibrationError(f"cannot read the tokenizer file {path}: {exc}") from None
        self._server = ServerCounter(client, model)

    async def count_text(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    async def count_messages(self, messages: Messages) -> int:
        return await self._server.count_messages(messages)

    async def encode(self, text: str) -> list[int] | None:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        vocab_size = self._tokenizer.get_vocab_size()
        text: str = self._tokenizer.decode([i for i in ids if i < vocab_size], skip_special_tokens=False)
        return text


async def count_by_request(client: Client, model: str, messages: Messages) -> int:
    """The prompt tokens of `messages` from a one-token, non-streamed chat request's usage."""
    payload = {"model": model, "messages": messages, "max_tokens": 1, "max_completion_tokens": 1, "stream": False}
    status, body = await client.request_json("POST", "/v1/chat/completions", payload, timeout_s=120.0)
    if status != 200:
        raise CalibrationError(f"a one-token chat request for calibration answered HTTP {status}: {body[:200]!r}")
    try:
        return msgspec.json.decode(body, type=_CompletionResponse).usage.prompt_tokens
    except msgspec.DecodeError:
        raise CalibrationError("a one-token chat request for calibration returned no usage.prompt_tokens") from None


async def candidate_words(counter: TokenCounter) -> list[str]:
    """Short lowercase words from the tokenizer's own vocabulary (single ids decoded one by one)."""
    newline = None
    try:
        # The newline id separates the decoded ids, so each piece is exactly one id's text.
        status_ids = await counter.encode(SEPARATOR)
        newline = status_ids[0] if status_ids is not None and len(status_ids) == 1 else None
    except ServerUnreachable:
        newline = None
    pieces: list[str] = []
    start, size = 0, DETOKENIZE_CHUNK
    # Chunk by chunk, halving a chunk the server rejects: the vocabulary's size is not known up front.
    while start < CANDIDATE_IDS and size >= 1:
        ids: list[int] = []
        for token in range(start, min(start + size, CANDIDATE_IDS)):
            ids.append(token)
            if newline is not None:
                ids.append(newline)
        text = await counter.detokenize(ids)
        if text is None:
            size //= 2
            continue
        pieces += text.split("\n") if newline is not None else text.split()
        start += size
    seen: set[str] = set()
    words: list[str] = []
    for piece in (p.strip() for p in pieces):
        usable = 2 <= len(piece) <= MAX_WORD_CHARS and piece.isascii() and piece.isalpha() and piece.islower()
        if usable and piece not in seen:
            seen.add(piece)
            words.append(piece)
    if len(words) < MIN_WORDS:
        words += [word for word in FALLBACK_WORDS if word not in seen]
    return words[:MAX_WORDS]


async def single_token_words(counter: TokenCounter, candidates: Sequence[str]) -> list[str]:
    """The candidates that cost exactly one token each after a space, in their original order."""
    head_tokens = await counter.count_text(HEAD)
    budget = [VERIFY_BUDGET]

    async def cost(words: Sequence[str]) -> int:
        budget[0] -= 1
        return await counter.count_text(HEAD + "".join(" " + word for word in words)) - head_tokens

    async def verify(words: Sequence[str]) -> list[str]:
        if not words or budget[0] <= 0:
            return []
        if await cost(words) == len(words):
            return list(words)
        if len(words) == 1:
            return []
        middle = len(words) // 2
        left, right = await asyncio.gather(verify(words[:middle]), verify(words[middle:]))
        return left + right

    semaphore = asyncio.Semaphore(8)

    async def verify_chunk(chunk: Sequence[str]) -> list[str]:
        async with semaphore:
            return await verify(chunk)

    chunks = [candidates[i : i + 256] for i in range(0, len(candidates), 256)]
    results = await asyncio.gather(*(verify_chunk(chunk) for chunk in chunks))
    return [word for result in results for word in result]


async def calibrate(counter: TokenCounter, *, block_size: int, source: str) -> ChatCalibration:
    """Measure words, separator and template overhead for `counter`'s tokenizer (module docstring)."""
    words = await single_token_words(counter, await candidate_words(counter))
    if len(words) < MIN_WORDS:
        raise CalibrationError(
            f"only {len(words)} words of the server's vocabulary tokenize as one token each after a space "
            f"(at least {MIN_WORDS} are needed); use `--api completions`, or `--tokenizer` with the model's "
            "tokenizer.json"
        )
    first, second = words[0], words[1]
    plain = await counter.count_text(f"{HEAD} {first} {second}")
    separated = await counter.count_text(f"{HEAD} {first}{SEPARATOR} {second}")
    separator_tokens = separated - plain
    separator = SEPARATOR
    if separator_tokens not in (0, 1) or separator_tokens >= block_size:
        separator, separator_tokens = "", 0  # blocks then simply run on, word after word
    draft = ChatCalibration(words=tuple(words), separator=separator, separator_tokens=separator_tokens)
    n_words = len(words)
    block_words = block_size - separator_tokens

    def block(start: int) -> list[int]:
        return [(start + j) % n_words for j in range(block_words)]

    sample = draft.text_of([block(0)], filler=[])

    async def overhead(roles: Sequence[str]) -> int:
        messages = [{"role": role, "content": sample} for role in roles]
        return await counter.count_messages(messages) - block_size * len(roles)

    one_user = await overhead(["user"])
    alternating = await overhead(["user", "assistant", "user"])
    longer = await overhead(["user", "assistant", "user", "assistant", "user"])
    with_system = await overhead(["system", "user"])
    per_exchange = longer - alternating  # one assistant + one user message
    try:
        user = await overhead(["user", "user"]) - one_user
    except CalibrationError:
        user = per_exchange // 2  # a template that insists on alternating roles: split the pair evenly
    assistant = per_exchange - user
    base = one_user - user
    calibration = msgspec.structs.replace(
        draft,
        base_tokens=base,
        role_tokens={"user": user, "assistant": assistant, "system": with_system - one_user},
        source=source,
    )
    checks = []
    for roles in (["user", "assistant", "user"], ["system", "user", "assistant", "user", "user"]):
        messages = [
            {"role": role, "content": calibration.text_of([block(7 * i)], filler=[(3 + i) % n_words] * i)}
            for i, role in enumerate(roles)
        ]
        predicted = calibration.overhead(roles) + sum(block_size + i for i in range(len(roles)))
        checks.append((predicted, await counter.count_messages(messages)))
    return msgspec.structs.replace(calibration, checks=checks)
