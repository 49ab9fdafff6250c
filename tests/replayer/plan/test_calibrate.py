"""Chat calibration and rendering: predicted prompt tokens equal what a tokenizer with a chat template counts.

Two tokenizers stand in for servers: the simulator's (whitespace-free words, role markers) and a toy BPE-like
one with the traits that break naive text prompts: pre-tokens split at spaces, words outside its vocabulary
spelled letter by letter, a newline that costs a token, glued sub-word pieces in its vocabulary, and a chat
template that trims message content (as Llama 3's does).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import SAMPLE_TRACE
from strategies import examples

from agentx.errors import CalibrationError
from agentx.records.record import read_records, to_records
from agentx.replayer.http.client import Client
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.prompts.calibrate import (
    FALLBACK_WORDS,
    ChatCalibration,
    LocalCounter,
    Messages,
    calibrate,
    single_token_words,
)
from agentx.replayer.prompts.chat import ChatRenderer
from agentx.replayer.prompts.conversation import Segment
from agentx.replayer.run_replay import run_replay
from agentx.sim.process import SimServer
from agentx.sim.tokenizer import get_tokenizer
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


class SimCounter:
    def __init__(self) -> None:
        self.tokenizer = get_tokenizer(32000)
        self.calls = 0

    async def count_text(self, text: str) -> int:
        self.calls += 1
        return len(self.tokenizer.encode(text))

    async def count_messages(self, messages: Messages) -> int:
        return len(self.tokenizer.chat_ids([(m["role"], m["content"]) for m in messages]))

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer.is_valid(ids) else None

    async def encode(self, text: str) -> list[int] | None:
        return self.tokenizer.encode(text)


_PRETOKEN = re.compile(r" ?[A-Za-z]+|\n| ?[^A-Za-z\s]+| +")
SINGLES = [chr(97 + i) + chr(97 + j) + "x" for i in range(26) for j in range(26)]
"""676 whole words ("aax", "abx", ...) that are one token after a space."""
GLUED = ["ing", "ed", "tion"]
"""Sub-word pieces in the vocabulary without a leading space: " ing" is spelled out."""


class ToyBpeCounter:
    """Vocabulary: "\\n", then " word" for SINGLES, then GLUED pieces, then letters. Template per message:
    4 tokens + the trimmed content; 3 tokens of generation prompt."""

    def __init__(self) -> None:
        self.vocab = ["\n", *(" " + w for w in SINGLES), *GLUED, *"abcdefghijklmnopqrstuvwxyz", " "]
        self.singles = set(SINGLES)

    def _count(self, text: str) -> int:
        total = 0
        for piece in _PRETOKEN.findall(text):
            word = piece.lstrip(" ")
            if piece.startswith(" ") and word in self.singles:
                total += 1
            else:
                total += len(piece)  # spelled: each character (and the space) a token
        return total

    async def count_text(self, text: str) -> int:
        return self._count(text)

    async def count_messages(self, messages: Messages) -> int:
        return 3 + sum(4 + self._count(m["content"].strip()) for m in messages)

    async def detokenize(self, ids: Sequence[int]) -> str | None:
        if any(i >= len(self.vocab) for i in ids):
            return None
        return "".join(self.vocab[i] for i in ids)

    async def encode(self, text: str) -> list[int] | None:
        return [0] if text == "\n" else None  # enough for the calibration's newline lookup


def test_the_simulator_calibrates_to_its_own_words_with_a_free_separator() -> None:
    calibration = asyncio.run(calibrate(SimCounter(), block_size=64, source="test"))
    assert len(calibration.words) >= 1000 and all(len(w) >= 2 for w in calibration.words)
    assert calibration.separator_tokens == 0
    # The sim's template: a role marker per message, then the head "ok" spelled as two letters.
    assert calibration.role_tokens == {"user": 3, "assistant": 3, "system": 3}
    assert calibration.base_tokens == 1
    assert calibration.checks and all(predicted == counted for predicted, counted in calibration.checks)


def test_a_bpe_like_tokenizer_loses_glued_pieces_and_pays_for_the_separator() -> None:
    counter = ToyBpeCounter()
    calibration = asyncio.run(calibrate(counter, block_size=16, source="test"))
    assert set(calibration.words) <= set(SINGLES)
    assert len(calibration.words) == len(SINGLES)
    assert calibration.separator_tokens == 1
    assert all(predicted == counted for predicted, counted in calibration.checks)


def test_verification_finds_the_offenders_by_halving() -> None:
    counter = SimCounter()
    words = list(counter.tokenizer.words[400:900])
    spoiled = ["zzzqq", "qqqzz"]  # not in the sim's vocabulary: spelled out, several tokens
    candidates = words[:100] + spoiled[:1] + words[100:] + spoiled[1:]
    kept = asyncio.run(single_token_words(counter, candidates))
    assert kept == words
    assert counter.calls < 60  # halving, not one call per word


def test_too_few_words_is_a_clear_error() -> None:
    class Hopeless(ToyBpeCounter):
        async def count_text(self, text: str) -> int:
            return 10 * len(text)

    with pytest.raises(CalibrationError, match="one token each"):
        asyncio.run(calibrate(Hopeless(), block_size=16, source="test"))


def test_the_fallback_words_are_plain_lowercase() -> None:
    assert len(FALLBACK_WORDS) >= 64 and all(w.isalpha() and w.islower() for w in FALLBACK_WORDS)


def _calibrated(counter: SimCounter | ToyBpeCounter, block_size: int) -> ChatCalibration:
    return asyncio.run(calibrate(counter, block_size=block_size, source="test"))


_SIM_CAL = _calibrated(SimCounter(), 16)
_TOY_CAL = _calibrated(ToyBpeCounter(), 16)

roles = st.sampled_from(["user", "assistant"])
segments = st.lists(
    st.tuples(roles, st.lists(st.integers(0, 40), max_size=5), st.integers(0, 20)), min_size=1, max_size=6
)


@settings(max_examples=examples(80), deadline=None)
@given(segments, st.integers(-150, 200), st.booleans())
def test_rendered_messages_count_as_predicted(raw: list[tuple[str, list[int], int]], slack: int, toy: bool) -> None:
    counter = ToyBpeCounter() if toy else SimCounter()
    calibration = _TOY_CAL if toy else _SIM_CAL
    renderer = ChatRenderer(calibration, seed=3, block_size=16)
    segs = [
        Segment(role, tuple(ids), filler if i == len(raw) - 1 else 0, f"k{i}")  # type: ignore[arg-type]
        for i, (role, ids, filler) in enumerate(raw)
    ]
    content = sum(len(s.hash_ids) * 16 + s.filler_tokens for s in segs)
    target = max(0, content - 10 + slack)
    messages, predicted = renderer.render(segs, target_tokens=target, scope_key="s", session_id="s")
    as_dicts = [{"role": m.role, "content": m.content} for m in messages]
    assert asyncio.run(counter.count_messages(as_dicts)) == predicted
    # The target is met unless no message had anything left to give up.
    assert predicted == target or (predicted > target and all(m.content == calibration.head for m in messages))
    # A message's text depends on itself only: the history renders the same whatever comes last, unless the last
    # message could not give up enough; then the latest messages before it gave up the rest, and only they changed.
    other_last = Segment("user", (99,), 5, "other")
    again, _ = renderer.render([*segs[:-1], other_last], target_tokens=10_000, scope_key="s", session_id="s")
    history, full = [m.content for m in messages[:-1]], [m.content for m in again[:-1]]
    if messages[-1].content != calibration.head:
        assert history == full
    else:
        changed = [i for i, (mine, whole) in enumerate(zip(history, full, strict=True)) if mine != whole]
        if changed:
            assert all(text == calibration.head for text in history[changed[0] + 1 :])


def test_a_context_shorter_than_its_history_takes_the_tokens_off_the_latest_messages() -> None:
    """A recorded context that shrank below its history plus the last output: the server still counts `in`, and
    only the tail of the latest message before the last changes."""
    renderer = ChatRenderer(_SIM_CAL, seed=3, block_size=16)
    segs = [Segment("user", (1, 2, 3), 0, "k0"), Segment("assistant", (4, 5), 0, "k1"), Segment("user", (6,), 0, "k2")]
    full, full_count = renderer.render(segs, target_tokens=6 * 16, scope_key="s", session_id="s")
    short, short_count = renderer.render(segs, target_tokens=4 * 16, scope_key="s", session_id="s")
    assert short_count == 4 * 16
    assert asyncio.run(SimCounter().count_messages([{"role": m.role, "content": m.content} for m in short])) == 4 * 16
    assert short[0].content == full[0].content
    assert full[1].content.startswith(short[1].content) and short[1].content != full[1].content
    assert short[2].content == _SIM_CAL.head
    assert full_count == 6 * 16


def test_a_local_tokenizer_file_calibrates_like_the_server(tmp_path: Path) -> None:
    """`--tokenizer tokenizer.json`: words counted locally (here a WordLevel copy of the simulator's
    vocabulary), the template from the server; a chat replay then lands exactly on `in`."""
    tokenizers = pytest.importorskip("tokenizers")
    sim_tokenizer = get_tokenizer(32000)
    vocab = {word: index for index, word in enumerate(sim_tokenizer.words)}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<|endoftext|>")
    local = tokenizers.Tokenizer(model)
    local.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    local.decoder = None
    path = tmp_path / "tokenizer.json"
    local.save(str(path))

    async def go(url: str, model_name: str) -> ChatCalibration:
        async with Client(url) as client:
            return await calibrate(LocalCounter(str(path), client, model_name), block_size=16, source=path.name)

    with SimServer(time_scale=0.01, block_size=16) as sim:
        calibration = asyncio.run(go(sim.url, sim.model))
        assert calibration.source == "tokenizer.json" and len(calibration.words) >= 1000
        assert all(predicted == counted for predicted, counted in calibration.checks)
        trace = load_trace(SAMPLE_TRACE)
        trace.sessions = trace.sessions[:2]
        trace.block_size = 16
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model, api="chat", tokenizer=str(path)),
            out_dir=tmp_path / "run",
            load=ClosedLoad(),
            scenario=Scenario(delay_scale=0),
        )
        result = asyncio.run(run_replay(trace, options))
    assert result.calibration is not None and result.calibration.source == "tokenizer.json"
    records = to_records(read_records(result.records_path))
    assert records and all(r.isl_server_tokens == r.isl_sent_tokens == r.isl_recorded_tokens for r in records)


def test_a_missing_tokenizer_file_is_a_calibration_error(tmp_path: Path) -> None:
    async def go() -> None:
        async with Client("http://127.0.0.1:9") as client:
            LocalCounter(str(tmp_path / "absent.json"), client, "m")

    with pytest.raises(CalibrationError, match=r"absent\.json"):
        asyncio.run(go())


def test_llamacpp_tokenize_dialect() -> None:
    """llama.cpp's /tokenize takes `content` and answers an empty list for anything else (no error), its
    /detokenize answers `content`, and it ignores `messages`: the counter switches dialect on the empty
    answer and counts chat templates by a one-token request."""
    from aiohttp import web

    from agentx.replayer.http.client import Client
    from agentx.replayer.prompts.calibrate import ServerCounter

    seen: list[str] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append("content" if "content" in body else "other")
        words = body["content"].split() if "content" in body else []
        return web.json_response({"tokens": [len(w) for w in words]})

    async def detokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"content": " ".join("x" * t for t in body["tokens"])})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        words = sum(len(m["content"].split()) for m in body["messages"])
        return web.json_response({"usage": {"prompt_tokens": words + 3 * len(body["messages"])}})

    async def main() -> tuple[int, int, str | None, int]:
        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/detokenize", detokenize)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            async with Client(f"http://127.0.0.1:{runner.addresses[0][1]}") as client:
                counter = ServerCounter(client, "m")
                first = await counter.count_text("three little words")
                again = await counter.count_text("two words")
                text = await counter.detokenize([2, 3])
                templated = await counter.count_messages([{"role": "user", "content": "hello there"}])
                return first, again, text, templated
        finally:
            await runner.cleanup()

    first, again, text, templated = asyncio.run(main())
    assert (first, again, text, templated) == (3, 2, "xx xxx", 2 + 3)
    assert seen == ["other", "content", "content"]  # switched once, then stays in llama.cpp's dialect
