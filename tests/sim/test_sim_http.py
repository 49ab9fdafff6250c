"""The simulated server over real HTTP on loopback: shapes, token accounting, prefix cache, spec decode."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import aiohttp
import msgspec
import pytest
from sim_client import Json, Streamed, post, run, scrape, stream, unique_ids

from agentx.errors import SimServerError
from agentx.sim.process import SimServer
from agentx.sim.tokenizer import FIRST_WORD_ID

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

T = TypeVar("T")

BLOCK = 16
MAX_MODEL_LEN = 4096


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    """A plain server: a fast clock, a large cache, EOS possible (tests that need exact lengths ignore it)."""
    with SimServer(
        time_scale=0.01, eos_probability=0.05, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=4096, seed=1
    ) as server:
        yield server
        assert "Traceback" not in server.stderr(), server.stderr()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(request.node.name)


# Shapes.


def test_health_models_and_version(sim: SimServer) -> None:
    async def go(session: aiohttp.ClientSession) -> None:
        async with session.get(sim.url + "/health") as response:
            assert response.status == 200 and await response.read() == b""
        async with session.get(sim.url + "/v1/models") as response:
            models = await response.json()
        assert models["object"] == "list"
        assert [(card["id"], card["object"], card["max_model_len"]) for card in models["data"]] == [
            (sim.model, "model", MAX_MODEL_LEN)
        ]
        async with session.get(sim.url + "/version") as response:
            assert "agentx-sim" in (await response.json())["version"]

    run(go)


def test_completion_stream_has_vllm_shape(sim: SimServer) -> None:
    body = {"prompt": "bawone bejoka", "max_tokens": 5, "ignore_eos": True, "stream_options": {"include_usage": True}}
    seen = run(lambda session: stream(session, sim.url, body))
    assert seen.status == 200 and seen.done and not seen.malformed
    *deltas, usage = seen.chunks
    assert len(deltas) == 5
    for chunk in deltas:
        assert chunk["id"].startswith("cmpl-") and chunk["id"] == deltas[0]["id"]
        assert chunk["object"] == "text_completion" and chunk["model"] == sim.model
        assert isinstance(chunk["created"], int)
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
        assert choice["index"] == 0 and choice["stop_reason"] is None
    assert [chunk["choices"][0]["finish_reason"] for chunk in deltas] == [None] * 4 + ["length"]
    assert usage["choices"] == [] and usage["id"] == deltas[0]["id"]
    assert usage["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 7,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_chat_stream_starts_with_the_assistant_role(sim: SimServer) -> None:
    body = {"messages": [{"role": "user", "content": "bawone"}], "max_tokens": 3, "ignore_eos": True}
    seen = run(lambda session: stream(session, sim.url, body, path="/v1/chat/completions"))
    assert seen.done
    first, *deltas = seen.chunks
    assert first["id"].startswith("chatcmpl-") and first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert len(deltas) == 3 and all(set(chunk["choices"][0]["delta"]) == {"content"} for chunk in deltas)
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in deltas[-1]


def test_non_streaming_responses(sim: SimServer) -> None:
    async def go(session: aiohttp.ClientSession) -> tuple[Json, Json]:
        _, completion = await post(session, sim.url, "/v1/completions", {"prompt": [5000] * 9, "max_tokens": 4})
        chat_body = {"messages": [{"role": "system", "content": "kawa"}], "max_completion_tokens": 4}
        _, chat = await post(session, sim.url, "/v1/chat/completions", {**chat_body, "ignore_eos": True})
        return completion, chat

    completion, chat = run(go)
    assert completion["object"] == "text_completion" and completion["id"].startswith("cmpl-")
    assert completion["usage"]["prompt_tokens"] == 9 and completion["usage"]["prompt_tokens_details"] is not None
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    message = chat["choices"][0]["message"]
    assert message["role"] == "assistant" and len(message["content"].split()) == 4
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 4 and chat["usage"]["prompt_tokens"] == 3


# Token accounting.


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_ignore_eos_streams_exactly_max_tokens_and_usage_matches(sim: SimServer, path: str) -> None:
    prompt: Json = (
        {"prompt": "bawone bejoka bokase"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "bawone bejoka bokase"}]}
    )
    body = {
        **prompt,
        "max_tokens": 57,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }

    async def go(session: aiohttp.ClientSession) -> tuple[Streamed, Json, Json]:
        seen = await stream(session, sim.url, body, path=path)
        _, text = await post(session, sim.url, "/detokenize", {"tokens": seen.token_ids})
        _, counted = await post(session, sim.url, "/tokenize", prompt)
        return seen, text, counted

    seen, text, counted = run(go)
    assert seen.done and seen.finish_reason == "length"
    assert len(seen.token_ids) == 57 == seen.usage["completion_tokens"]
    assert min(seen.token_ids) >= FIRST_WORD_ID, "generated text holds only ordinary words"
    assert seen.usage["prompt_tokens"] == counted["count"] == (3 if "prompt" in prompt else 5)
    assert seen.text == text["prompt"]
    running = [chunk["usage"]["completion_tokens"] for chunk in seen.chunks if chunk["choices"]]
    streamed = [0]
    for chunk in seen.chunks:
        for choice in chunk["choices"]:
            streamed.append(streamed[-1] + len(choice.get("token_ids") or ()))
    assert running == streamed[1:]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_token_ids_are_returned_where_vllm_puts_them(sim: SimServer, path: str) -> None:
    chat = path != "/v1/completions"
    prompt: Json = {"messages": [{"role": "user", "content": "kawa"}]} if chat else {"prompt": [7000, 7001]}
    body = {**prompt, "max_tokens": 2, "ignore_eos": True, "return_token_ids": True}

    async def go(session: aiohttp.ClientSession) -> tuple[Streamed, Json, Json]:
        seen = await stream(session, sim.url, body, path=path)
        _, whole = await post(session, sim.url, path, body)
        _, tokenized = await post(session, sim.url, "/tokenize", prompt if chat else {"prompt": "kawa"})
        return seen, whole, tokenized

    seen, whole, tokenized = run(go)
    expected = tokenized["tokens"] if chat else [7000, 7001]
    if chat:
        assert seen.chunks[0]["prompt_token_ids"] == expected and whole["prompt_token_ids"] == expected
    else:
        assert seen.chunks[0]["choices"][0]["prompt_token_ids"] == expected
        assert whole["choices"][0]["prompt_token_ids"] == expected
    assert len(whole["choices"][0]["token_ids"]) == 2


def test_eos_stops_early_after_min_tokens(sim: SimServer) -> None:
    body = {"prompt": [9000] * 4, "max_tokens": 3000, "min_tokens": 10, "return_token_ids": True}

    async def go(session: aiohttp.ClientSession) -> tuple[list[Streamed], list[Json]]:
        streams = [await stream(session, sim.url, {**body, "stream_options": {}}) for _ in range(4)]
        whole = [(await post(session, sim.url, "/v1/completions", body))[1] for _ in range(4)]
        return streams, whole

    streams, whole = run(go)
    for seen in streams:
        assert seen.finish_reason == "stop" and 10 <= len(seen.token_ids) < 3000
        assert seen.usage["completion_tokens"] == len(seen.token_ids)
    for response in whole:
        choice = response["choices"][0]
        assert choice["finish_reason"] == "stop" and response["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_max_tokens_past_the_context_is_clamped_to_it(sim: SimServer) -> None:
    """vLLM 0.32 (`get_max_tokens`) and the simulator alike: what the context has left, not a 400."""
    body = {"prompt": [8000] * 4000, "max_tokens": 500, "ignore_eos": True}
    status, response = run(lambda session: post(session, sim.url, "/v1/completions", body))
    assert status == 200, response
    assert response["usage"]["completion_tokens"] == MAX_MODEL_LEN - 4000
    assert response["choices"][0]["finish_reason"] == "length"


def test_default_max_tokens_fills_the_context(sim: SimServer) -> None:
    body = {"prompt": [8000] * 96, "ignore_eos": True}
    status, response = run(lambda session: post(session, sim.url, "/v1/completions", body))
    assert status == 200
    assert response["usage"]["completion_tokens"] == MAX_MODEL_LEN - 96
    assert response["choices"][0]["finish_reason"] == "length"


# Prefix caching, exact.


def cached(response: Json) -> int:
    return int(response["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_prefix_cache_hits_are_exact(sim: SimServer, rng: random.Random) -> None:
    base = unique_ids(64, rng)
    prompts = [
        (base, 0),
        (base + unique_ids(20, rng), 64),  # the 4 blocks of `base`
        (base[:40] + unique_ids(30, rng), 32),  # 2 full shared blocks; the shared part of the 3rd is not counted
        (base, 48),  # the last prompt token is always computed: (64 - 1) // 16 blocks
    ]

    async def go(session: aiohttp.ClientSession) -> tuple[list[int], dict[str, float], dict[str, float]]:
        before = await scrape(session, sim.url)
        hits = []
        for prompt, _ in prompts:
            _, response = await post(session, sim.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
            hits.append(cached(response))
        return hits, before, await scrape(session, sim.url)

    hits, before, after = run(go)
    assert hits == [expected for _, expected in prompts]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert queries == sum(len(prompt) for prompt, _ in prompts)
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == sum(hits)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == queries


def test_cache_salt_separates_caches(sim: SimServer, rng: random.Random) -> None:
    prompt = unique_ids(48, rng)
    salts = [None, "tenant-a", "tenant-a", "tenant-b", None]

    async def go(session: aiohttp.ClientSession) -> list[int]:
        hits = []
        for salt in salts:
            body: Json = {"prompt": prompt, "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
            hits.append(cached((await post(session, sim.url, "/v1/completions", body))[1]))
        return hits

    assert run(go) == [0, 0, 32, 0, 32]


def test_a_chat_turn_hits_the_previous_turn_and_its_reply(sim: SimServer, rng: random.Random) -> None:
    words = " ".join(f"ba{syllable}" for syllable in ("bo", "da", "fe", "gi", "ho"))
    first: list[Json] = [{"role": "system", "content": f"{words} {rng.random()}"}, {"role": "user", "content": words}]

    async def go(session: aiohttp.ClientSession) -> tuple[Json, Json]:
        body = {"messages": first, "max_tokens": 30, "ignore_eos": True}
        _, one = await post(session, sim.url, "/v1/chat/completions", body)
        reply = one["choices"][0]["message"]["content"]
        second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": words * 3}]
        _, two = await post(session, sim.url, "/v1/chat/completions", {"messages": second, "max_tokens": 1})
        return one, two

    one, two = run(go)
    # Turn one computed the KV of its prompt and of all but its last output token; turn two's prompt
    # starts with exactly those tokens, since the reply re-tokenizes to the ids that were generated.
    computed = one["usage"]["prompt_tokens"] + one["usage"]["completion_tokens"] - 1
    assert cached(two) == min(computed, two["usage"]["prompt_tokens"] - 1) // BLOCK * BLOCK
    assert cached(two) > 0


def test_a_tiny_cache_evicts_least_recently_used_blocks(rng: random.Random) -> None:
    with SimServer(time_scale=0.01, block_size=BLOCK, max_model_len=128, num_gpu_blocks=12) as small:
        prompt = unique_ids(64, rng)
        fillers = [unique_ids(112, rng) for _ in range(3)]

        async def go(session: aiohttp.ClientSession) -> list[int]:
            hits = []
            for body in [prompt, prompt, *fillers, prompt]:
                response = await post(session, small.url, "/v1/completions", {"prompt": body, "max_tokens": 1})
                hits.append(cached(response[1]))
            return hits

        # 12 blocks hold the 64-token prompt and one 113-token filler; the next fillers evict it.
        assert run(go) == [0, 48, 0, 0, 0, 0]


# Speculative decoding.


def test_realized_acceptance_length_matches_the_configured_one() -> None:
    length, spec_k = 2.4, 4
    with SimServer(time_scale=0.0, spec_k=spec_k, acceptance_length=length, seed=3) as spec:

        async def go(session: aiohttp.ClientSession) -> tuple[dict[str, float], dict[str, float]]:
            before = await scrape(session, spec.url)
            body = {"prompt": [1234] * 8, "max_tokens": 600, "ignore_eos": True}
            await asyncio.gather(*(post(session, spec.url, "/v1/completions", body) for _ in range(48)))
            return before, await scrape(session, spec.url)

        before, after = run(go)

    def delta(name: str) -> float:
        return after[name] - before[name]

    drafts = delta("vllm:spec_decode_num_drafts_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts >= 10_000
    assert 1 + accepted / drafts == pytest.approx(length, rel=0.02)
    assert delta("vllm:spec_decode_num_draft_tokens_total") == spec_k * drafts
    per_position = [delta(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}') for i in range(4)]
    assert per_position == sorted(per_position, reverse=True)
    assert sum(per_position) == accepted
    # The minimum-variance schedule for 2.4: the first draft always accepted, the second 40% of the time.
    assert per_position[0] == drafts and per_position[2] == per_position[3] == 0


# Metrics, tokenizer, errors.


def test_metrics_parse_with_vllm_names(sim: SimServer) -> None:
    samples = run(lambda session: scrape(session, sim.url))
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        'vllm:request_success_total{finished_reason="length"}',
        "agentx_sim_step_lag_seconds",
    ):
        assert name in samples, name
    assert 0.0 <= samples["vllm:kv_cache_usage_perc"] <= 1.0
    assert not any(name.startswith("vllm:spec_decode") for name in samples)


def test_tokenize_and_detokenize_round_trip(sim: SimServer, rng: random.Random) -> None:
    ids = [rng.randrange(32000) for _ in range(500)]
    text = "  Hello,\n wörld  bawone\t<|user|> "

    async def go(session: aiohttp.ClientSession) -> tuple[Json, Json, Json, Json]:
        _, detokenized = await post(session, sim.url, "/detokenize", {"tokens": ids})
        _, again = await post(session, sim.url, "/tokenize", {"prompt": detokenized["prompt"]})
        _, tokenized = await post(session, sim.url, "/tokenize", {"prompt": text, "return_token_strs": True})
        _, normalized = await post(session, sim.url, "/detokenize", {"tokens": tokenized["tokens"]})
        return again, tokenized, normalized, detokenized

    again, tokenized, normalized, _ = run(go)
    assert again["tokens"] == ids and again["count"] == 500 and again["max_model_len"] == MAX_MODEL_LEN
    # Out-of-vocabulary words are spelled one character per token, non-ASCII as UTF-8 byte tokens.
    assert tokenized["token_strs"] == [
        *"Hello,",
        "w",
        "<0xC3>",
        "<0xB6>",
        *"rld",
        "bawone",
        "<|user|>",
    ]
    assert normalized["prompt"] == " ".join(tokenized["token_strs"])


def test_chat_template_count_formula(sim: SimServer) -> None:
    messages = [
        {"role": "system", "content": "bawone bejoka"},
        {"role": "user", "content": [{"type": "text", "text": "kawa"}, {"type": "text", "text": "bejoka"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "kawa", "arguments": "{}"}}]},
        {"role": "tool", "content": "bawone"},
    ]

    async def go(session: aiohttp.ClientSession) -> tuple[Json, Json]:
        _, with_prompt = await post(session, sim.url, "/tokenize", {"messages": messages})
        _, without = await post(session, sim.url, "/tokenize", {"messages": messages, "add_generation_prompt": False})
        return with_prompt, without

    with_prompt, without = run(go)
    # Σ (1 marker + content tokens) + 1 generation prompt; "{}" is spelled as 2 characters.
    assert with_prompt["count"] == (1 + 2) + (1 + 2) + (1 + 1 + 2) + (1 + 1) + 1 == 13
    assert without["count"] == 12 and with_prompt["tokens"][:-1] == without["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", {"prompt": "kawa", "n": 2}, 400, "n=2"),
        ("/v1/completions", {"prompt": [1000] * (MAX_MODEL_LEN + 1)}, 400, "maximum context length"),
        ("/v1/completions", {"prompt": [1000] * MAX_MODEL_LEN, "max_tokens": 8}, 400, "at least 1, got 0"),
        ("/v1/completions", {"prompt": [1000] * 4000, "max_tokens": 200, "min_tokens": 200}, 400, "max_tokens=96, got"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a " * 5000}]}, 400, "context length"),
        ("/v1/completions", {"prompt": "kawa", "model": "gpt-9"}, 404, "The model `gpt-9` does not exist. Valid"),
        ("/v1/completions", {"prompt": ["kawa", "bawone"]}, 400, "one prompt per request"),
        ("/v1/completions", {"prompt": [[1000, 1001]], "max_tokens": 1}, 200, ""),
        ("/v1/completions", {"prompt": [40000]}, 400, "out of vocabulary"),
        ("/v1/completions", {"prompt": ""}, 400, "must be provided"),
        ("/v1/completions", {"prompt": "kawa", "max_tokens": 0}, 400, "at least 1"),
        ("/v1/completions", {"prompt": "kawa", "max_tokens": "many"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "kawa", "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ("/v1/completions", {"prompt": "kawa", "cache_salt": ""}, 400, "cache_salt"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "unknown role"),
        ("/v1/chat/completions", {"prompt": "kawa"}, 400, "messages"),
        ("/tokenize", {"prompt": "a", "messages": []}, 400, "exactly one"),
        ("/detokenize", {"tokens": [-1]}, 400, "out of vocabulary"),
    ],
)
def test_client_mistakes_get_clear_errors(sim: SimServer, path: str, body: Json, status: int, needle: str) -> None:
    got, response = run(lambda session: post(session, sim.url, path, body))
    assert got == status, response
    if status != 200:
        assert set(response) == {"error"} and set(response["error"]) == {"message", "type", "param", "code"}
        assert response["error"]["code"] == status and needle in response["error"]["message"]


def test_bad_json_is_a_400(sim: SimServer) -> None:
    async def go(session: aiohttp.ClientSession) -> list[tuple[int, Json]]:
        results = []
        for raw in (b"{not json", b"", b"[1, 2]", b'"text"'):
            async with session.post(sim.url + "/v1/completions", data=raw) as response:
                results.append((response.status, await response.json(content_type=None)))
        return results

    for status, response in run(go):
        assert status == 400 and response["error"]["type"] == "BadRequestError"


def test_garbage_http_is_answered_without_a_traceback(sim: SimServer) -> None:
    host, port = sim.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert raw.recv(100).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert "Traceback" not in sim.stderr()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", "Invalid header token"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Control: \x01\r\n\r\n", "Invalid header value char"),
        (b"GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n", "Bad status line"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "Duplicate"),
        (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope", "gzip"),
    ],
)
def test_a_malformed_request_is_a_400_and_one_line(sim: SimServer, raw: bytes, needle: str) -> None:
    """The client's mistake, not the server's: a one-line warning, no aiohttp traceback."""
    before = sim.stderr()
    host, port = sim.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(raw)
        assert connection.recv(100).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    deadline = time.monotonic() + 5
    while needle not in (new := sim.stderr()[len(before) :]):
        assert time.monotonic() < deadline, new
        time.sleep(0.01)
    time.sleep(0.05)  # anything else it would print comes with the same request
    new = sim.stderr()[len(before) :]
    assert "Traceback" not in new and len(new.splitlines()) == 1 and "malformed request" in new, new


# Streams under pressure: a client that leaves, a client that does not read.


def test_a_client_that_leaves_aborts_its_sequence(sim: SimServer) -> None:
    async def go(session: aiohttp.ClientSession) -> tuple[dict[str, float], dict[str, float]]:
        before = await scrape(session, sim.url)
        body = {"prompt": [4321] * 8, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with session.post(sim.url + "/v1/completions", json=body) as response:
            await response.content.readline()
            response.close()  # drop the connection mid-stream
        for _ in range(200):
            after = await scrape(session, sim.url)
            if (
                after['vllm:request_success_total{finished_reason="abort"}']
                > before['vllm:request_success_total{finished_reason="abort"}']
            ):
                break
            await asyncio.sleep(0.01)
        return before, after

    before, after = run(go)
    key = 'vllm:request_success_total{finished_reason="abort"}'
    assert after[key] == before[key] + 1
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 4000


def test_a_slow_reader_gets_the_whole_stream() -> None:
    """A reader that falls behind fills the socket; the server holds output and sends all of it later."""
    tokens = 30_000  # ~6 MB of events: more than the kernel's socket buffers hold
    with SimServer(time_scale=0.0, max_model_len=32_768, num_gpu_blocks=4096) as big:
        host, port = big.url.removeprefix("http://").split(":")
        body = msgspec.json.encode(
            {"prompt": [777] * 4, "max_tokens": tokens, "ignore_eos": True, "stream": True, "return_token_ids": True}
        )
        request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        request += b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with raw:
            raw.settimeout(10)
            raw.connect((host, int(port)))
            raw.sendall(request)
            time.sleep(1.0)  # the whole output is produced meanwhile; most of it cannot be sent
            received = bytearray()
            while not received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                chunk = raw.recv(1 << 20)
                assert chunk, "the server closed the stream early"
                received += chunk
        assert "Traceback" not in big.stderr()
    events = [line for line in bytes(received).split(b"\n") if line.startswith(b"data: {")]
    ids = [token for event in events for token in msgspec.json.decode(event[6:])["choices"][0]["token_ids"]]
    assert len(ids) == tokens


# Start-up.


def test_a_bad_configuration_fails_to_start_with_its_reason() -> None:
    with pytest.raises(SimServerError, match="needs --synthetic-acceptance-length") as failure:
        SimServer(spec_k=2).start()
    assert "Traceback" not in str(failure.value)


def test_a_working_directory_that_shadows_the_standard_library_does_not_break_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `agentx replay` without --url, run where a user keeps an html.py of their own.
    (tmp_path / "html.py").write_text("raise SystemExit('the working directory was imported')\n")
    monkeypatch.chdir(tmp_path)
    with SimServer(time_scale=0.0) as sim:

        async def go(session: aiohttp.ClientSession) -> None:
            async with session.get(sim.url + "/health") as response:
                assert response.status == 200

        run(go)


def test_ctrl_c_stops_the_server_cleanly() -> None:
    server = SimServer(time_scale=0.01).start()
    os.kill(server.pid, signal.SIGINT)
    assert server.stop() == 0
    assert "stopped" in server.stderr() and "Traceback" not in server.stderr()


def test_a_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "agentx.cli", "sim", "--port", str(port)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
