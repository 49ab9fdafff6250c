"""The simulator's implausible figures on purpose, over real HTTP: bundled streams, a first token before the
prefill, usage without cached tokens; and the fault draws that decide them, reproducible."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import aiohttp
import msgspec
import pytest
from sim_client import Json, Streamed, post, run, scrape, stream, unique_ids

from agentx.sim.engine.config import EngineConfig
from agentx.sim.faults import FaultConfig, FaultInjector
from agentx.sim.process import SimServer
from agentx.sim.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SEED = 5
DECODE_S_PER_TOKEN = 0.02
PREFILL_S_PER_TOKEN = 1e-4
PROMPT_TOKENS = 3000
"""With PREFILL_S_PER_TOKEN, a prefill of 0.3 s."""
PREFILL_S = PROMPT_TOKENS * PREFILL_S_PER_TOKEN
OUT_TOKENS = 12
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOKENIZER = get_tokenizer(EngineConfig().vocab_size)


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    """A real-time clock whose decode and prefill are slow enough to see from the client; EOS likely."""
    with SimServer(
        time_scale=1.0,
        step_overhead_s=0.002,
        prefill_s_per_token=PREFILL_S_PER_TOKEN,
        decode_s_per_token=DECODE_S_PER_TOKEN,
        eos_probability=0.5,
        max_model_len=8192,
        num_gpu_blocks=2048,
        seed=SEED,
    ) as sim:
        yield sim
        assert "Traceback" not in sim.stderr(), sim.stderr()


@pytest.fixture
def sim(server: SimServer) -> Iterator[SimServer]:
    """The module's server with faults off before and after the test."""
    server.set_faults(FaultConfig(seed=SEED))
    yield server
    server.set_faults(FaultConfig(seed=SEED))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(request.node.name)


def content_arrivals_s(seen: Streamed) -> list[float]:
    """When each event carrying generated text arrived (perf_counter)."""
    assert not seen.malformed and seen.done
    return [
        arrival_s
        for arrival_s, chunk in zip(seen.arrivals_s, seen.chunks, strict=False)
        if any(choice.get("text") or choice.get("delta", {}).get("content") for choice in chunk["choices"])
    ]


def timed_stream(sim: SimServer, body: Json, path: str) -> tuple[float, Streamed]:
    """(perf_counter just before the request went out, what the client saw)."""

    async def go(session: aiohttp.ClientSession) -> tuple[float, Streamed]:
        await post(session, sim.url, "/tokenize", {"prompt": "kawa"})  # the connection is open before timing
        started_s = time.perf_counter()
        return started_s, await stream(session, sim.url, body, path=path)

    return run(go)


def prompt(path: str, token_ids: list[int]) -> Json:
    """A completions or chat prompt holding `token_ids` (the chat template adds a few tokens)."""
    if path == COMPLETIONS:
        return {"prompt": token_ids}
    return {"messages": [{"role": "user", "content": TOKENIZER.decode(token_ids)}]}


# Bundled streams.


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_bundled_stream_arrives_in_one_write_at_the_end(sim: SimServer, path: str) -> None:
    body = {
        **prompt(path, [5000, 5001]),
        "max_tokens": OUT_TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    decode_s = (OUT_TOKENS - 1) * DECODE_S_PER_TOKEN
    _, spread = timed_stream(sim, body, path)
    spread_arrivals = content_arrivals_s(spread)
    assert len(spread_arrivals) == OUT_TOKENS
    assert spread_arrivals[-1] - spread_arrivals[0] >= 0.8 * decode_s

    sim.set_faults(FaultConfig(bundle_rate=1.0))
    started_s, bundled = timed_stream(sim, body, path)
    arrivals = content_arrivals_s(bundled)
    # Each chunk is still its own event with its own tokens, but the first comes as late as the last.
    assert len(arrivals) == OUT_TOKENS and len(bundled.token_ids) == OUT_TOKENS
    assert arrivals[0] - started_s >= 0.8 * decode_s
    assert arrivals[-1] - arrivals[0] < 0.01
    assert bundled.usage["completion_tokens"] == OUT_TOKENS and bundled.finish_reason == "length"
    counted = run(lambda session: scrape(session, sim.url))['agentx_sim_faults_injected_total{fault="bundle"}']
    assert counted >= 1


# Early first token.


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_an_early_first_token_comes_before_the_prefill_could_end(sim: SimServer, path: str, rng: random.Random) -> None:
    def body() -> Json:
        # A prompt of its own each time: a prefix-cache hit would shorten the prefill.
        return {
            **prompt(path, unique_ids(PROMPT_TOKENS, rng)),
            "max_tokens": 8,
            "min_tokens": 8,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }

    started_s, plain = timed_stream(sim, body(), path)
    assert content_arrivals_s(plain)[0] - started_s >= 0.8 * PREFILL_S
    assert plain.usage["prompt_tokens"] >= PROMPT_TOKENS

    sim.set_faults(FaultConfig(early_first_token_rate=1.0))
    before = run(lambda session: scrape(session, sim.url))
    started_s, early = timed_stream(sim, body(), path)
    after = run(lambda session: scrape(session, sim.url))
    first, second, *_ = content_arrivals_s(early)
    assert first - started_s < 0.05
    assert second - started_s >= 0.8 * PREFILL_S
    # The early token is one of the max_tokens: min_tokens = max_tokens still holds the total to 8.
    assert len(early.token_ids) == early.usage["completion_tokens"] == 8 and early.finish_reason == "length"
    assert early.usage["prompt_tokens"] >= PROMPT_TOKENS
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated == 8
    injected = 'agentx_sim_faults_injected_total{fault="early_first_token"}'
    assert after[injected] - before[injected] == 1


def test_early_tokens_keep_usage_consistent_when_eos_ends_the_stream(sim: SimServer) -> None:
    """With EOS likely, lengths vary; the streamed ids and the usage agree whatever they are."""
    sim.set_faults(FaultConfig(early_first_token_rate=1.0))
    body = {"prompt": [7000, 7001, 7002], "max_tokens": 40, "return_token_ids": True, "stream_options": {}}

    async def go(session: aiohttp.ClientSession) -> list[Streamed]:
        return [await stream(session, sim.url, body) for _ in range(12)]

    seen = run(go)
    assert all(result.usage["completion_tokens"] == len(result.token_ids) >= 1 for result in seen)
    assert {result.finish_reason for result in seen} == {"stop"}
    assert len({len(result.token_ids) for result in seen}) > 1


def test_a_single_token_request_is_spared_the_early_token(sim: SimServer, rng: random.Random) -> None:
    sim.set_faults(FaultConfig(early_first_token_rate=1.0))
    body = {
        "prompt": unique_ids(PROMPT_TOKENS, rng),
        "max_tokens": 1,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    started_s, seen = timed_stream(sim, body, COMPLETIONS)
    assert content_arrivals_s(seen)[0] - started_s >= 0.8 * PREFILL_S
    assert seen.usage["completion_tokens"] == 1


# Usage without cached tokens.


def test_dropped_cached_tokens_leave_usage_without_prompt_tokens_details(sim: SimServer) -> None:
    streamed = {"prompt": [6000] * 40, "max_tokens": 2, "ignore_eos": True, "stream_options": {"include_usage": True}}
    whole = {"prompt": [6000] * 40, "max_tokens": 2, "ignore_eos": True}

    async def usages(session: aiohttp.ClientSession) -> tuple[Json, Json]:
        seen = await stream(session, sim.url, streamed)
        _, response = await post(session, sim.url, COMPLETIONS, whole)
        return seen.usage, response["usage"]

    default_stream, default_whole = run(usages)
    assert default_stream["prompt_tokens_details"] == {"cached_tokens": 0}
    assert default_whole["prompt_tokens_details"] == {"cached_tokens": 32}
    sim.set_faults(FaultConfig(drop_cached_tokens=True))
    dropped_stream, dropped_whole = run(usages)
    for usage in (dropped_stream, dropped_whole):
        assert "prompt_tokens_details" not in usage
        assert usage == {"prompt_tokens": 40, "total_tokens": 42, "completion_tokens": 2}


# Settings.


def test_the_control_endpoint_sets_and_validates_them(sim: SimServer) -> None:
    settings = {"bundle_rate": 1.0, "early_first_token_rate": 1.0, "drop_cached_tokens": True}

    async def go(session: aiohttp.ClientSession) -> list[tuple[int, Json]]:
        return [
            await post(session, sim.url, "/sim/faults", {"bundle_rate": 1.5}),
            await post(session, sim.url, "/sim/faults", {"early_first_token_rate": -0.1}),
            await post(session, sim.url, "/sim/faults", {"drop_cached_tokens": 0.5}),
            await post(session, sim.url, "/sim/faults", settings),
        ]

    bad_bundle, bad_early, bad_drop, good = run(go)
    assert bad_bundle[0] == bad_early[0] == bad_drop[0] == 400
    assert "bundle_rate" in bad_bundle[1]["error"]["message"]
    assert "early_first_token_rate" in bad_early[1]["error"]["message"]
    assert good[0] == 200 and {name: good[1][name] for name in settings} == settings
    current = sim.get_faults()
    assert (current.bundle_rate, current.early_first_token_rate, current.drop_cached_tokens) == (1.0, 1.0, True)
    body = {"prompt": [5000], "max_tokens": 6, "ignore_eos": True, "stream_options": {"include_usage": True}}
    started_s, seen = timed_stream(sim, body, COMPLETIONS)
    arrivals = content_arrivals_s(seen)
    # The early token came at once; the rest were bundled, written together at the end.
    assert arrivals[0] - started_s < 0.05 and arrivals[1] - started_s >= 0.8 * 4 * DECODE_S_PER_TOKEN
    assert arrivals[-1] - arrivals[1] < 0.01
    assert "prompt_tokens_details" not in seen.usage and seen.usage["completion_tokens"] == 6


def test_the_flags_start_a_server_with_them() -> None:
    faults = FaultConfig(bundle_rate=0.25, early_first_token_rate=0.5, drop_cached_tokens=True)
    with SimServer(time_scale=0.01, faults=faults) as sim:
        assert {"--fault-bundle-rate", "--fault-early-first-token-rate", "--fault-drop-cached-tokens"} <= set(
            sim.command
        )
        assert sim.get_faults() == faults
        _, response = run(lambda session: post(session, sim.url, COMPLETIONS, {"prompt": "kawa", "max_tokens": 1}))
        assert "prompt_tokens_details" not in response["usage"]
        assert "Traceback" not in sim.stderr(), sim.stderr()


# The draws.


def test_the_five_older_faults_meet_the_luck_they_always_met() -> None:
    """Request k's status, slow first byte, reset, stall and malformed draws are the k-th five uniforms of the
    fault RNG, as before the timing faults existed, whatever the timing settings."""
    older = FaultConfig(
        error_500_rate=0.2, reset_rate=0.3, stall_rate=0.3, malformed_rate=0.3, slow_first_byte_rate=0.3
    )
    reference = random.Random(f"agentx-sim-faults:{SEED}")
    expected = []
    for _ in range(200):
        u_status, u_slow, u_reset, u_stall, u_malformed = (reference.random() for _ in range(5))
        expected.append((u_status < 0.2, u_slow < 0.3, u_reset < 0.3, u_stall < 0.3, u_malformed < 0.3))
    for timing in (FaultConfig(), FaultConfig(bundle_rate=0.5, early_first_token_rate=0.5, drop_cached_tokens=True)):
        injector = FaultInjector(msgspec.structs.replace(older, **_timing_fields(timing)), seed=SEED)
        plans = [injector.plan(stream=True) for _ in range(200)]
        got = [
            (
                plan.status == 500,
                plan.slow_first_byte_s > 0,
                plan.reset_after_chunks is not None,
                plan.stall_after_chunks is not None,
                plan.malformed_after_chunks is not None,
            )
            for plan in plans
        ]
        assert got == expected


def _timing_fields(config: FaultConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in ("bundle_rate", "early_first_token_rate", "drop_cached_tokens")}


def test_timing_draws_repeat_under_the_same_seed_whatever_the_other_settings() -> None:
    def timing(config: FaultConfig, seed: int) -> list[tuple[bool, bool]]:
        injector = FaultInjector(config, seed=seed)
        return [(plan.bundle, plan.early_first_token) for plan in (injector.plan(stream=True) for _ in range(400))]

    settings = FaultConfig(bundle_rate=0.3, early_first_token_rate=0.6)
    first = timing(settings, SEED)
    assert timing(settings, SEED) == first
    assert timing(msgspec.structs.replace(settings, error_503_rate=0.5, stall_rate=0.5), SEED) == first
    assert timing(settings, SEED + 1) != first
    bundled = sum(bundle for bundle, _ in first)
    early = sum(early for _, early in first)
    assert 80 <= bundled <= 160 and 200 <= early <= 280
    # Requests that are not streamed draw the same uniforms, and meet neither.
    injector = FaultInjector(FaultConfig(bundle_rate=1.0, early_first_token_rate=1.0), seed=SEED)
    plan = injector.plan(stream=False)
    assert not plan.bundle and not plan.early_first_token


def test_reseeding_through_the_settings_restarts_the_timing_draws() -> None:
    settings = FaultConfig(bundle_rate=0.5, seed=42)
    injector = FaultInjector(settings, seed=SEED)
    first = [injector.plan(stream=True).bundle for _ in range(50)]
    injector.apply(settings)
    assert [injector.plan(stream=True).bundle for _ in range(50)] == first
