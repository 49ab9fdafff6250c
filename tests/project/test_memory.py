"""Memory that must not grow over a long run (bench/soak.py measures it for real).

- A failed request leaves no reference cycle behind: under the replay's collector (agentx.replayer.schedule.collector) a
  cycle through a pooled connection was never freed, so every reset or malformed stream kept its connection,
  socket, response and frames until the run ended.
- The replay's collector also collects the oldest generation, so cyclic garbage that a library or an error path
  leaves there is freed during the run, not at its end.
- The simulator holds each prompt in flight in 4 bytes a token, not as a list of int objects (~40 bytes a token:
  ~360 MB for 256 requests of 35k tokens, most of its memory under load).
- The simulator's KV-cache bookkeeping is sized once: filling the prefix cache grows only its hash → block map.
"""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
import weakref
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from agentx.replayer.http.client import Client, Exchange
from agentx.replayer.schedule import collector
from agentx.replayer.schedule.collector import collect_on_clock, quiet_gc
from agentx.sim import protocol
from agentx.sim.engine.kvcache import KVCache
from agentx.sim.engine.loop import EngineConfig, FinishReason, GenerationRequest, SimEngine
from agentx.sim.engine.sequence import EngineSequence
from agentx.sim.tokenizer import get_tokenizer

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


FIRST_EVENT = _chunk(b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n')


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")), 0)
    await reader.readexactly(length)


def _reset_after_first_event(writer: asyncio.StreamWriter) -> bool:
    writer.write(HEAD + FIRST_EVENT)
    writer.transport.abort()
    return False


def _malformed_event(writer: asyncio.StreamWriter) -> bool:
    writer.write(HEAD + FIRST_EVENT + _chunk(b"data: {not json\n\n"))
    return True


Answer = Callable[[asyncio.StreamWriter], bool]
"""Writes one response; False when the connection is done for."""


@pytest.fixture
def saved_garbage() -> Iterator[list[Any]]:
    """`gc.garbage` holding everything the next `gc.collect()` finds unreachable (automatic collection off)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def _failed_exchanges(answer: Answer, count: int, garbage: list[Any]) -> tuple[list[Exchange], list[str]]:
    """`count` requests answered by `answer`, one after the other; their exchanges, and the type names of what a
    collection then finds unreachable among the client's own objects."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await _read_request(reader)
                if not answer(writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    async def main() -> tuple[list[Exchange], list[str]]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, Client(f"http://127.0.0.1:{port}", limit=4, spare_connections=0) as client:
            gc.collect()
            garbage.clear()
            exchanges = [await client.stream("/v1/completions", b"{}") for _ in range(count)]
            await asyncio.sleep(0)  # the last connection's close callbacks
            gc.collect()
        ours = {f"agentx.replayer.{name}" for name in ("http1", "pool", "client", "streaming", "exchange", "calls")}
        return exchanges, sorted({type(item).__qualname__ for item in garbage if type(item).__module__ in ours})

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "kind"), [(_reset_after_first_event, "connection"), (_malformed_event, "protocol")], ids=["reset", "sse"]
)
def test_a_failed_request_leaves_no_reference_cycle(answer: Answer, kind: str, saved_garbage: list[Any]) -> None:
    exchanges, cyclic = _failed_exchanges(answer, 5, saved_garbage)
    assert [exchange.error_kind for exchange in exchanges] == [kind] * 5
    # It was the connection, the error and the response, in a cycle through the error's traceback.
    assert cyclic == []


class _Node:
    def __init__(self) -> None:
        self.me = self


def _run_collector_until(freed: Callable[[], bool]) -> bool:
    async def main() -> bool:
        task = asyncio.create_task(collect_on_clock())
        try:
            # Ends as soon as the cycle is freed; the cap only keeps a broken collector from hanging the test.
            for _ in range(500):
                await asyncio.sleep(0.01)
                if freed():
                    return True
            return False
        finally:
            task.cancel()

    return asyncio.run(main())


def test_the_replays_collector_frees_cycles_in_the_oldest_generation(
    monkeypatch: pytest.MonkeyPatch, saved_garbage: list[Any]
) -> None:
    gc.set_debug(0)  # free for real: the weak reference tells
    for name in ("MIDDLE_EVERY_S", "OLDEST_EVERY_S"):
        monkeypatch.setattr(collector, name, (0.0, 0.0), raising=False)
    with quiet_gc(True):
        node = _Node()
        alive = weakref.ref(node)
        gc.collect(1)  # it survives a middle collection, as any object that lived through a request does
        del node
        gc.collect(1)
        assert alive() is not None  # the middle generation's collections cannot free it
        assert _run_collector_until(lambda: alive() is None)


def test_the_simulator_holds_a_prompt_in_four_bytes_a_token() -> None:
    ids = list(range(1000, 21_000))
    body = msgspec.json.encode({"prompt": ids, "max_tokens": 1, "stream": True})
    tokenizer = get_tokenizer(32_000)
    tracemalloc.start()
    try:
        plan = protocol.plan_generation(body, chat=False, config=EngineConfig(), tokenizer=tokenizer)
        held_bytes, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(plan.prompt_ids) == ids
    assert held_bytes < 6 * len(ids)  # was ~40 bytes a token: a pointer and an int object each


def _ignore(token_ids: list[int], finish_reason: FinishReason | None) -> None:
    pass


def test_a_compact_prompt_hashes_its_blocks_as_a_list_does() -> None:
    engine = SimEngine(EngineConfig(block_size=16))
    prompt = list(range(1000, 1040))  # two full blocks, and a third that its output completes
    sequences = [
        engine.submit(GenerationRequest(prompt_ids=ids, max_tokens=8), _ignore) for ids in (prompt, array("i", prompt))
    ]
    hashes = []
    for sequence in sequences:
        assert isinstance(sequence, EngineSequence)
        sequence.output = list(range(5000, 5008))
        hashes.append(sequence.hashes_up_to(3, 16))
    assert hashes[0] == hashes[1] and len(hashes[0]) == 3


def _full_cache_bytes_a_block(cache: KVCache) -> float:
    """What registering every block of an empty cache and freeing them all (every one cached and evictable)
    allocates, per block."""
    tracemalloc.start()
    try:
        blocks: list[int] = []
        assert cache.allocate(blocks, cache.num_blocks)
        for block in blocks:
            cache.register(block, hash((block, "content")))
        cache.free(blocks)
        del blocks
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return grown / cache.num_blocks


def test_a_full_prefix_cache_costs_only_its_hash_map() -> None:
    cache = KVCache(num_blocks=16_384, block_size=16)
    # The hash → block map and its hash values: ~72 bytes a block. It was ~192, with a block → hash dict and an
    # OrderedDict of evictable blocks growing beside it (~35 MB more at 262,144 blocks).
    assert _full_cache_bytes_a_block(cache) < 100
    assert cache.num_free_blocks == cache.num_blocks and cache.num_cached_blocks == cache.num_blocks


def test_evictable_blocks_go_least_recently_freed_first_whatever_the_order() -> None:
    rng = random.Random(8)
    cache = KVCache(num_blocks=64, block_size=1)
    blocks: list[int] = []
    assert cache.allocate(blocks, 64)
    hash_of = {block: hash((block, "content")) for block in blocks}
    for block in blocks:
        cache.register(block, hash_of[block])
    freed = rng.sample(blocks, len(blocks))
    for block in freed:
        cache.free([block])
    revived = freed[10:20:3]  # taken back from the middle of the list: off it until freed again, last
    taken: list[int] = []
    assert cache.admit(taken, revived, 0)
    cache.free(list(reversed(revived)))  # freed tail first: in list order
    expected = [block for block in freed if block not in revived] + revived
    evicted = []
    for _ in range(len(expected)):
        before = {block for block in blocks if cache.longest_cached_prefix([hash_of[block]])}
        assert cache.allocate([], 1)
        after = {block for block in blocks if cache.longest_cached_prefix([hash_of[block]])}
        evicted += list(before - after)
    assert evicted == expected
    assert cache.num_free_blocks == 0 and cache.num_cached_blocks == 0
