"""Injected faults over real HTTP: each at its configured rate, each seen by a client as the real thing."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest
from sim_client import Json, Streamed, post, run, scrape, stream

from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

STREAM_BODY: Json = {"prompt": "bawone bejoka", "max_tokens": 12, "ignore_eos": True}
SEED = 11


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, max_model_len=4096, num_gpu_blocks=2048, seed=SEED) as sim:
        yield sim
        assert "Traceback" not in sim.stderr(), sim.stderr()


@pytest.fixture
def sim(server: SimServer) -> Iterator[SimServer]:
    """The module's server with faults off before and after the test."""
    server.set_faults(FaultConfig(seed=SEED))
    yield server
    server.set_faults(FaultConfig(seed=SEED))


def assert_rate(count: int, trials: int, rate: float) -> None:
    """`count` successes of `trials` draws at `rate`, within 4.5 standard deviations."""
    spread = 4.5 * math.sqrt(trials * rate * (1 - rate))
    assert abs(count - trials * rate) <= spread, f"{count}/{trials} at rate {rate}"


def test_error_statuses_at_their_rates_with_vllm_error_bodies(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(error_500_rate=0.1, error_429_rate=0.1, retry_after_s=3, error_503_rate=0.1))
    trials = 400

    async def one(session: aiohttp.ClientSession, semaphore: asyncio.Semaphore) -> tuple[int, Json, str | None]:
        async with semaphore, session.post(sim.url + "/v1/completions", json={"prompt": "kawa", "max_tokens": 1}) as r:
            return r.status, await r.json(), r.headers.get("Retry-After")

    async def go(session: aiohttp.ClientSession) -> tuple[list[tuple[int, Json, str | None]], dict[str, float]]:
        semaphore = asyncio.Semaphore(32)
        results = await asyncio.gather(*(one(session, semaphore) for _ in range(trials)))
        return results, await scrape(session, sim.url)

    results, samples = run(go)
    statuses = Counter(status for status, _, _ in results)
    assert set(statuses) <= {200, 500, 429, 503}
    for status in (500, 429, 503):
        assert_rate(statuses[status], trials, 0.1)
        assert samples[f'agentx_sim_faults_injected_total{{fault="error_{status}"}}'] == statuses[status]
    for status, body, retry_after in results:
        if status == 200:
            assert body["usage"]["completion_tokens"] == 1
            continue
        assert body["error"]["code"] == status and body["error"]["message"]
        assert retry_after == ("3" if status == 429 else None)


def test_fault_draws_repeat_under_the_same_seed(sim: SimServer) -> None:
    settings = FaultConfig(error_500_rate=0.2, error_429_rate=0.2, error_503_rate=0.2, seed=99)

    async def statuses(session: aiohttp.ClientSession) -> list[int]:
        got = []
        for _ in range(40):
            async with session.post(sim.url + "/v1/completions", json={"prompt": "kawa", "max_tokens": 1}) as r:
                got.append(r.status)
        return got

    sim.set_faults(settings)
    first = run(statuses)
    sim.set_faults(settings)
    assert run(statuses) == first
    assert len(set(first)) == 4


async def streams(
    session: aiohttp.ClientSession, url: str, count: int, *, limit: int = 40
) -> list[Streamed | Exception]:
    """`count` streams, at most `limit` at a time; a connection error is returned in place of the stream."""
    semaphore = asyncio.Semaphore(limit)

    async def one() -> Streamed | Exception:
        async with semaphore:
            try:
                return await stream(session, url, {**STREAM_BODY, "return_token_ids": True})
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                return exc

    return list(await asyncio.gather(*(one() for _ in range(count))))


def test_resets_cut_streams_with_a_connection_error(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(reset_rate=0.3, reset_after_chunks=3))
    trials = 200
    results = run(lambda session: streams(session, sim.url, trials))
    failed = [result for result in results if isinstance(result, Exception)]
    whole = [result for result in results if isinstance(result, Streamed)]
    assert_rate(len(failed), trials, 0.3)
    assert all(result.done and len(result.token_ids) == 12 for result in whole)
    samples = run(lambda session: scrape(session, sim.url))
    assert samples['agentx_sim_faults_injected_total{fault="reset"}'] == len(failed)


def test_a_reset_arrives_after_the_configured_chunks(sim: SimServer) -> None:
    """The client reads exactly N chunks, then the read fails: a TCP RST, not a clean end."""
    sim.set_faults(FaultConfig(reset_rate=1.0, reset_after_chunks=4))

    async def go(session: aiohttp.ClientSession) -> tuple[int, BaseException | None]:
        seen = 0
        try:
            async with session.post(sim.url + "/v1/completions", json={**STREAM_BODY, "stream": True}) as response:
                async for line in response.content:
                    seen += line.startswith(b"data: ")
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            return seen, exc
        return seen, None

    seen, error = run(go)
    assert seen == 4 and error is not None


def test_stalls_are_silent_gaps_then_the_rest(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(stall_rate=0.5, stall_s=0.5, stall_after_chunks=2))
    trials = 60
    results = run(lambda session: streams(session, sim.url, trials, limit=trials))
    gaps = []
    for result in results:
        assert isinstance(result, Streamed) and result.done and len(result.token_ids) == 12
        gaps.append(
            max(later - earlier for earlier, later in zip(result.arrivals_s, result.arrivals_s[1:], strict=False))
        )
    # A stalled stream's gap is the stall, give or take the client's own scheduling delays.
    stalled = [gap for gap in gaps if gap >= 0.4]
    assert_rate(len(stalled), trials, 0.5)


def test_malformed_events_are_not_json(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(malformed_rate=0.25, malformed_after_chunks=5))
    trials = 200
    results = run(lambda session: streams(session, sim.url, trials))
    affected = 0
    for result in results:
        assert isinstance(result, Streamed) and result.done and len(result.token_ids) == 12
        if result.malformed:
            affected += 1
            assert len(result.malformed) == 1 and result.malformed[0].startswith(b'{"id":')
    assert_rate(affected, trials, 0.25)


def test_slow_first_byte_delays_the_headers(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(slow_first_byte_rate=0.5, slow_first_byte_s=0.5))
    trials = 60

    async def one(session: aiohttp.ClientSession) -> float:
        started = time.perf_counter()
        result = await stream(session, sim.url, STREAM_BODY)
        assert result.done
        return result.headers_s - started

    async def go(session: aiohttp.ClientSession) -> list[float]:
        return list(await asyncio.gather(*(one(session) for _ in range(trials))))

    waits = run(go)
    slow = [wait for wait in waits if wait >= 0.5]
    assert_rate(len(slow), trials, 0.5)


def test_refused_connections_fail_until_the_window_ends(sim: SimServer) -> None:
    sim.set_faults(FaultConfig(refuse_connections_s=0.6))
    assert 0 < sim.get_faults().refuse_connections_s <= 0.6

    async def attempt() -> int | Exception:
        # A fresh connection each time, as a client would open after a failure.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            try:
                async with session.get(sim.url + "/health") as response:
                    return response.status
            except aiohttp.ClientConnectionError as exc:
                return exc

    refused = asyncio.run(attempt())
    assert isinstance(refused, aiohttp.ClientConnectionError), refused
    time.sleep(0.7)
    assert asyncio.run(attempt()) == 200
    assert run(lambda session: scrape(session, sim.url))['agentx_sim_faults_injected_total{fault="refused"}'] >= 1


def test_the_access_log_says_how_each_request_ended() -> None:
    """A reset stream's headers said 200 and a refused request got no response at all: neither is a 200."""
    with SimServer(time_scale=0.01, seed=SEED, extra_args=("--access-log",)) as sim:

        async def go(session: aiohttp.ClientSession) -> list[Streamed | Exception]:
            sim.set_faults(FaultConfig(reset_rate=1.0, reset_after_chunks=3))
            results = await streams(session, sim.url, 2)
            sim.set_faults(FaultConfig(refuse_connections_s=30))
            # A fresh connection, which aiohttp does not retry, so that the request is refused exactly once.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                try:
                    async with fresh.post(sim.url + "/v1/completions", json=STREAM_BODY) as response:
                        results.append(Exception(f"answered {response.status}"))
                except aiohttp.ClientConnectionError as exc:
                    results.append(exc)
            sim.set_faults(FaultConfig())
            results += await streams(session, sim.url, 1)
            body = {**STREAM_BODY, "max_tokens": 4000, "stream": True}
            async with session.post(sim.url + "/v1/completions", json=body) as response:
                await response.content.readline()
                response.close()  # the client leaves mid-stream
            return results

        reset, also_reset, refused, whole = run(go)
        assert isinstance(reset, Exception) and isinstance(also_reset, Exception) and isinstance(whole, Streamed)
        assert isinstance(refused, aiohttp.ClientConnectionError), refused
        deadline = time.monotonic() + 10
        while len(ended := re.findall(r'"POST /v1/completions HTTP/1.1" (\S+) ', sim.stderr())) < 5:
            assert time.monotonic() < deadline, sim.stderr()
            time.sleep(0.02)
        assert ended == ["reset", "reset", "refused", "200", "disconnected"], sim.stderr()
        assert "Traceback" not in sim.stderr()


def test_the_control_endpoint_validates_settings(sim: SimServer) -> None:
    async def go(session: aiohttp.ClientSession) -> list[tuple[int, Json]]:
        return [
            await post(session, sim.url, "/sim/faults", {"error_500_rate": 2}),
            await post(session, sim.url, "/sim/faults", {"error_500_rate": 0.6, "error_503_rate": 0.6}),
            await post(session, sim.url, "/sim/faults", {"no_such_fault": 1}),
            await post(session, sim.url, "/sim/faults", {"stall_rate": 0.5, "stall_s": 2}),
        ]

    (bad_rate, bad_sum, unknown, good) = run(go)
    assert bad_rate[0] == bad_sum[0] == unknown[0] == 400
    assert "between 0 and 1" in bad_rate[1]["error"]["message"] and "no_such_fault" in unknown[1]["error"]["message"]
    assert good[0] == 200 and good[1]["stall_rate"] == 0.5 and good[1]["stall_s"] == 2
    assert sim.get_faults().stall_rate == 0.5


def test_every_generation_request_received_is_counted(sim: SimServer) -> None:
    """Answered, faulted, refused and bad requests all count, by endpoint; other paths do not: a client's
    requests sent are checked against this count."""
    sim.set_faults(FaultConfig(error_500_rate=0.5))
    chat = {"messages": [{"role": "user", "content": "kawa"}], "max_tokens": 2}

    async def go(session: aiohttp.ClientSession) -> tuple[dict[str, float], dict[str, float]]:
        before = await scrape(session, sim.url)
        for _ in range(6):
            await post(session, sim.url, "/v1/completions", {"prompt": "kawa", "max_tokens": 2})
        await post(session, sim.url, "/v1/completions", {"prompt": "kawa", "max_tokens": -1})
        await post(session, sim.url, "/v1/chat/completions", chat)
        await post(session, sim.url, "/tokenize", {"prompt": "kawa"})
        return before, await scrape(session, sim.url)

    before, after = run(go)
    completions = 'agentx_sim_requests_received_total{endpoint="/v1/completions"}'
    chats = 'agentx_sim_requests_received_total{endpoint="/v1/chat/completions"}'
    assert after[completions] - before[completions] == 7
    assert after[chats] - before[chats] == 1
    sim.set_faults(FaultConfig(refuse_connections_s=5.0))

    async def refused() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await stream(session, sim.url, STREAM_BODY)

    asyncio.run(refused())
    sim.set_faults(FaultConfig())
    assert run(lambda session: scrape(session, sim.url))[completions] - after[completions] == 1
