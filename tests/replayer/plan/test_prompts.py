"""Token-id prompts for `--api completions`: exact lengths, determinism, prefix sharing, and the
simulator's view of them over real HTTP (prompt_tokens and prefix-cache hits)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.replayer.prompts.tokens import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_STREAM_OPTIONS,
    BlockTokens,
    TokenSpace,
    completions_body,
    filler,
    prompt_token_ids,
)
from agentx.sim.process import SimServer
from agentx.sim.tokenizer import FIRST_WORD_ID
from agentx.trace.model import Request

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SMALL_SPACE = TokenSpace(FIRST_WORD_ID, FIRST_WORD_ID + 100)
"""The smallest vocabulary the simulator accepts, ordinary words only."""

hash_id_lists = st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=60)
block_sizes = st.integers(min_value=1, max_value=80)
spaces = st.sampled_from([TokenSpace(), SMALL_SPACE, TokenSpace(5, 7)])


def request(in_tokens: int) -> Request:
    return Request(t=0.0, model="m", in_tokens=in_tokens, out_tokens=1)


def build(
    in_tokens: int,
    hash_ids: list[int],
    blocks: BlockTokens,
    session_id: str = "s",
    turn_key: int | str = 0,
    scope_key: str = "s",
) -> list[int]:
    return prompt_token_ids(request(in_tokens), hash_ids, blocks.block_size, blocks, session_id, turn_key, scope_key)


@settings(max_examples=examples(300), deadline=None)
@given(
    in_tokens=st.integers(min_value=0, max_value=5000),
    hash_ids=hash_id_lists,
    block_size=block_sizes,
    space=spaces,
    cache_blocks=st.sampled_from([0, 3, 1000]),
    prefix=st.lists(st.integers(min_value=0, max_value=10), max_size=3),
)
def test_exact_length_and_ids_in_space(
    in_tokens: int, hash_ids: list[int], block_size: int, space: TokenSpace, cache_blocks: int, prefix: list[int]
) -> None:
    blocks = BlockTokens(7, block_size, space, cache_blocks=cache_blocks)
    ids = prompt_token_ids(request(in_tokens), hash_ids, block_size, blocks, "s", 3, "s", prefix_ids=prefix)
    assert len(ids) == len(prefix) + in_tokens
    assert ids[: len(prefix)] == prefix
    assert all(space.low <= token < space.high for token in ids[len(prefix) :])
    covered = min(len(hash_ids), in_tokens // block_size)
    # Covered blocks come from the block range, everything after from the filler range (docs/agentx.md §1d).
    assert all(token < space.filler_low for token in ids[len(prefix) : len(prefix) + covered * block_size])
    assert all(token >= space.filler_low for token in ids[len(prefix) + covered * block_size :])
    assert len(blocks) <= cache_blocks


def test_in_zero_is_empty() -> None:
    assert build(0, [1, 2, 3], BlockTokens(0, 16)) == []


def test_surplus_and_partial_ids_are_ignored() -> None:
    blocks = BlockTokens(0, 16)
    # in=40 covers 2 full blocks; the id of the partial third block (and a fourth) never appear.
    ids = build(40, [10, 11, 12, 13], blocks)
    assert ids[:32] == [*blocks.block("s", 10), *blocks.block("s", 11)]
    assert ids[32:] == filler(0, "s", 0, 8, blocks.space)
    # Fewer ids than blocks: the missing blocks become filler too.
    assert build(40, [10], blocks)[16:] == filler(0, "s", 0, 24, blocks.space)


@settings(max_examples=examples(100), deadline=None)
@given(in_tokens=st.integers(min_value=16, max_value=3000), hash_ids=hash_id_lists, block_size=block_sizes)
def test_deterministic_and_seeded(in_tokens: int, hash_ids: list[int], block_size: int) -> None:
    first = build(in_tokens, hash_ids, BlockTokens(1, block_size))
    assert first == build(in_tokens, hash_ids, BlockTokens(1, block_size, cache_blocks=0))
    # At least 16 random tokens: another seed colliding on all of them is practically impossible.
    assert first != build(in_tokens, hash_ids, BlockTokens(2, block_size))


@settings(max_examples=examples(150), deadline=None)
@given(
    shared=st.lists(st.integers(min_value=0, max_value=10**6), max_size=20),
    tail_a=st.lists(st.integers(min_value=0, max_value=10**6), max_size=10),
    tail_b=st.lists(st.integers(min_value=0, max_value=10**6), max_size=10),
    block_size=st.integers(min_value=2, max_value=64),
    extra_a=st.integers(min_value=0, max_value=200),
    extra_b=st.integers(min_value=0, max_value=200),
)
def test_shared_leading_ids_share_leading_blocks(
    shared: list[int], tail_a: list[int], tail_b: list[int], block_size: int, extra_a: int, extra_b: int
) -> None:
    blocks = BlockTokens(3, block_size)
    ids_a, ids_b = shared + tail_a, shared + tail_b
    a = build(len(ids_a) * block_size + extra_a, ids_a, blocks, turn_key=0)
    b = build(len(ids_b) * block_size + extra_b, ids_b, blocks, turn_key=1)
    prefix = len(shared) * block_size
    assert a[:prefix] == b[:prefix]
    if tail_a and tail_b and tail_a[0] != tail_b[0]:
        # Distinct ids of one scope never share their first two tokens.
        assert a[prefix : prefix + 2] != b[prefix : prefix + 2]


@settings(max_examples=examples(200), deadline=None)
@given(
    id_a=st.integers(min_value=0, max_value=26_000**2),
    id_b=st.integers(min_value=0, max_value=26_000**2),
    scope=st.text(max_size=5),
)
def test_distinct_ids_never_share_a_leading_pair(id_a: int, id_b: int, scope: str) -> None:
    blocks = BlockTokens(0, 64)
    if id_a != id_b:
        assert blocks.block(scope, id_a)[:2] != blocks.block(scope, id_b)[:2]
    else:
        assert blocks.block(scope, id_a) == blocks.block(scope, id_b)


def test_neighbouring_ids_never_share_a_first_token() -> None:
    blocks = BlockTokens(0, 16)
    firsts = {blocks.block("s", hash_id)[0] for hash_id in range(blocks.space.block_width)}
    assert len(firsts) == blocks.space.block_width


@settings(max_examples=examples(100), deadline=None)
@given(hash_ids=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=10), block_size=block_sizes)
def test_scopes(hash_ids: list[int], block_size: int) -> None:
    blocks = BlockTokens(0, block_size)
    in_tokens = len(hash_ids) * block_size
    # Session scope: the same ids in two sessions are unrelated blocks.
    assert build(in_tokens, hash_ids, blocks, "a", scope_key="a") != build(
        in_tokens, hash_ids, blocks, "b", scope_key="b"
    )
    # Global scope: the same ids are the same blocks everywhere, whatever the session.
    assert build(in_tokens, hash_ids, blocks, "a", scope_key="") == build(
        in_tokens, hash_ids, blocks, "b", scope_key=""
    )


@settings(max_examples=examples(100), deadline=None)
@given(
    n=st.integers(min_value=1, max_value=500),
    hash_id=st.integers(min_value=-(2**40), max_value=2**40),
    block_size=block_sizes,
    space=spaces,
    turn=st.integers(min_value=0, max_value=100),
)
def test_filler_never_matches_block_content(
    n: int, hash_id: int, block_size: int, space: TokenSpace, turn: int
) -> None:
    block = BlockTokens(0, block_size, space).block("s", hash_id)
    fill = filler(0, "s", turn, n, space)
    assert len(fill) == n
    assert fill[0] != block[0]  # so filler at a block boundary never extends a cached prefix
    assert not set(fill) & set(block)


def test_filler_is_per_session_and_turn() -> None:
    base = filler(0, "s", 0, 64)
    assert base == filler(0, "s", 0, 64)
    assert base != filler(0, "s", 1, 64)
    assert base != filler(0, "t", 0, 64)
    assert filler(0, "s", 0, 0) == []


def test_a_block_evicts_the_one_in_its_slot_and_regenerates_identically() -> None:
    blocks = BlockTokens(0, 8, cache_blocks=16)
    first = blocks.block("", 3)
    mapped = [3 ^ k * 16 for k in range(1, 3)]  # ids whose slot is 3's ((id ^ hash("")) % 16, hash("") == 0)
    blocks.block("", 4)  # the next slot: evicts nothing
    assert len(blocks) == 2
    misses = blocks.misses
    assert blocks.block("", 3) == first and blocks.block("", 4) and blocks.misses == misses  # both cached
    blocks.block("", mapped[0])  # takes 3's slot
    assert len(blocks) == 2
    assert blocks.block("", 4) and blocks.misses == misses + 1  # 4 kept
    assert blocks.block("", 3) == first and blocks.misses == misses + 2  # 3 made again, identical
    blocks.block("other", 3)  # same id, another scope: a miss, never the first scope's block
    assert blocks.misses == misses + 3 and blocks.block("other", 3) != first


def test_consecutive_ids_of_a_scope_do_not_evict_each_other() -> None:
    blocks = BlockTokens(0, 4, cache_blocks=64)
    out: list[int] = []
    blocks.extend(out, "session-7", range(1000, 1064))
    assert len(blocks) == 64
    misses = blocks.misses
    blocks.extend(out, "session-7", range(1000, 1064))
    assert blocks.misses == misses and blocks.hits == 64


def test_the_default_cache_holds_as_many_tokens_whatever_the_block_size() -> None:
    # Counted in blocks, it held eight times the memory with Mooncake's 512-token blocks (~270 MB).
    assert BlockTokens(0, 64).cache_blocks == DEFAULT_CACHE_TOKENS // 64
    assert BlockTokens(0, 512).cache_blocks == DEFAULT_CACHE_TOKENS // 512
    assert BlockTokens(0, 512, cache_blocks=0).cache_blocks == 0


@pytest.mark.parametrize("cache_blocks", [0, 1, 2, 10, 33, 1000])
def test_the_cache_never_holds_more_than_its_bound(cache_blocks: int) -> None:
    blocks = BlockTokens(0, 4, cache_blocks=cache_blocks)
    out: list[int] = []
    for start in range(0, 3000, 50):
        blocks.extend(out, "s", range(start, start + 50))
        assert len(blocks) <= cache_blocks
    assert len(blocks) >= min(cache_blocks, 3000) // 2  # and it is used


def test_validation() -> None:
    with pytest.raises(ValueError):
        TokenSpace(10, 11)
    with pytest.raises(ValueError):
        TokenSpace(-1, 100)
    with pytest.raises(ValueError):
        BlockTokens(0, 0)
    with pytest.raises(ValueError):
        prompt_token_ids(request(10), [], 16, BlockTokens(0, 8), "s", 0, "s")


def test_completions_body() -> None:
    body = msgspec.json.decode(completions_body("m", [5, 6], 10))
    assert body == {
        "model": "m",
        "prompt": [5, 6],
        "max_tokens": 10,
        "min_tokens": 10,
        "ignore_eos": True,
        "stream": True,
        "stream_options": dict(DEFAULT_STREAM_OPTIONS),
    }
    body = msgspec.json.decode(
        completions_body(
            "m",
            [5],
            10,
            min_tokens=1,
            ignore_eos=False,
            stream_options=None,
            return_token_ids=True,
            cache_salt="x",
            extra_body={"max_tokens": 3, "temperature": 0.0},
        )
    )
    assert body == {
        "model": "m",
        "prompt": [5],
        "max_tokens": 3,
        "min_tokens": 1,
        "ignore_eos": False,
        "stream": True,
        "return_token_ids": True,
        "cache_salt": "x",
        "temperature": 0.0,
    }


# End to end: the simulator counts the prompt and its prefix-cache hits.

SIM_BLOCK = 16


async def send(session: aiohttp.ClientSession, url: str, body: bytes) -> dict[str, Any]:
    """POST a streamed completion and return the usage of its last usage event."""
    usage: dict[str, Any] = {}
    async with session.post(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            payload = line.strip()
            if not payload.startswith(b"data: ") or payload == b"data: [DONE]":
                continue
            event = msgspec.json.decode(payload[len(b"data: ") :])
            if event.get("usage"):
                usage = event["usage"]
    return usage


def test_sim_counts_prompt_and_cache_hits() -> None:
    blocks = BlockTokens(11, SIM_BLOCK)  # default space: inside the sim's vocabulary of 32000
    first = list(range(1, 11))
    # (in_tokens, hash ids, session/scope, expected cached tokens), sent in order.
    cases: list[tuple[int, list[int], str, int]] = [
        (10 * SIM_BLOCK + 5, first, "a", 0),  # cold: 10 blocks + 5 filler
        (10 * SIM_BLOCK, [*first[:6], 50, 51, 52, 53], "a", 6 * SIM_BLOCK),  # shares 6 leading blocks
        (10 * SIM_BLOCK, first, "a", 9 * SIM_BLOCK),  # all 10 shared, capped at (160 - 1) // 16 = 9 blocks
        (10 * SIM_BLOCK + 5, [*first, 11, 12], "a", 10 * SIM_BLOCK),  # surplus ids ignored, filler not cached
        (10 * SIM_BLOCK, first, "b", 0),  # another session scope: unrelated blocks
        (3 * SIM_BLOCK + 7, [], "a", 0),  # no ids: all filler of a new turn
    ]

    async def main(url: str, model: str) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            usages = []
            for turn, (in_tokens, hash_ids, scope, _) in enumerate(cases):
                ids = build(in_tokens, hash_ids, blocks, session_id=scope, turn_key=turn, scope_key=scope)
                usages.append(await send(session, url, completions_body(model, ids, 4)))
            return usages

    with SimServer(time_scale=0.01, num_gpu_blocks=2048, block_size=SIM_BLOCK, max_model_len=4096) as sim:
        usages = asyncio.run(main(sim.url, sim.model))
    for (in_tokens, _, _, cached), usage in zip(cases, usages, strict=True):
        assert usage["prompt_tokens"] == in_tokens
        assert usage["completion_tokens"] == 4
        assert usage["prompt_tokens_details"]["cached_tokens"] == cached
