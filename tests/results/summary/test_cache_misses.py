"""Why the cache missed (agentx.results.summary.explain.cache_misses): each request's uncached prompt tokens split
into first seen, cache-bust scope, block-boundary remainder and seen before but not hit; the counts behind them (the
records' `seen_any_scope_blocks` and `lru_hit_blocks`, agentx.replayer.plan.sent_blocks) and the server's KV-cache shape
(`vllm:cache_config_info`, agentx.replayer.telemetry.metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from builders import growing_chain, make_session, make_trace
from flat import replay_options
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import RequestRecord, read_records, run_info, to_records
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, Scenario, Server
from agentx.replayer.plan.sent_blocks import LruBlocks
from agentx.replayer.run_replay import run_replay
from agentx.replayer.telemetry.metrics import ServerCache, parse_cache_config
from agentx.results.summary.explain.cache_misses import cache_misses, split_uncached
from agentx.results.summary.summarize import summarize
from agentx.sim.process import SimServer
from agentx.trace.model import Request

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16


def _column(size: int, high: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.int64, size, elements=st.integers(-high // 10, high))


@st.composite
def requests(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    size = draw(st.integers(0, 20))
    return tuple(draw(_column(size, high)) for high in (5000, 6000, 16, 200, 200, 200))


@given(requests(), st.integers(1, 128), st.integers(1, 256))
def test_the_four_parts_add_up_to_the_uncached_tokens_exactly(
    columns: tuple[np.ndarray, ...], trace_block: int, server_block: int
) -> None:
    isl, cached, marker, whole, replayed, seen_any = columns
    split = split_uncached(isl, cached, marker, whole, replayed, seen_any, trace_block, server_block)
    prompt = np.maximum(isl, 0)
    uncached = prompt - np.clip(cached, 0, prompt)
    parts = np.stack(split)
    assert (parts >= 0).all()
    assert (parts.sum(axis=0) == uncached).all()


def test_each_cause_on_a_prompt_of_its_own() -> None:
    """Ten 16-token blocks behind an 8-token marker and a 5-token tail (173 tokens), on a server grid of 32 tokens."""

    def split(cached: int, replayed: int, seen_any: int) -> tuple[int, ...]:
        def one(value: int) -> np.ndarray:
            return np.array([value], dtype=np.int64)

        parts = split_uncached(one(173), one(cached), one(8), one(10), one(replayed), one(seen_any), 16, 32)
        return tuple(int(part[0]) for part in parts)

    # Never sent: every block is new; the tail past the last whole block is the remainder.
    assert split(0, 0, 0) == (0, 5, 0, 168)
    # Sent under another marker (a recycled play's first turn): its blocks differ on purpose.
    assert split(0, 0, 10) == (0, 5, 168, 0)
    # Sent in this scope, all hit up to the server's grid: 8 + 6×16 = 104 tokens → 96 on a 32-token grid.
    assert split(96, 6, 10) == (0, 8 + 5, 64, 0)
    # The same, but the server hit nothing: what it could have hit was seen before but not hit.
    assert split(0, 6, 10) == (96, 8 + 5, 64, 0)


def test_an_lru_keeps_what_a_list_model_of_it_keeps() -> None:
    """Prompts in order against a capacity of 5 blocks, the model a list ordered from least to most recent."""
    prompts = [(1, 2, 3), (1, 2, 3, 4), (5, 6), (1, 2), (7, 8, 9), (1, 2, 3), (9, 8)]
    lru, model = LruBlocks(5), list[int]()
    for ids in prompts:
        expected = next((i for i, block in enumerate(ids) if block not in model), len(ids))
        assert lru.hit_then_use("k", ids) == expected
        for block in reversed(ids):
            if block in model:
                model.remove(block)
            model.append(block)
        del model[: max(0, len(model) - 5)]
        assert len(lru) == len(model)
    assert lru.hit_then_use("other", (1, 2)) == 0  # another content key holds other blocks


def test_the_servers_cache_shape_is_read_from_its_metrics() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="900"} 1.0\n'
    )
    cache = parse_cache_config(text)
    assert cache == ServerCache(block_size=16, num_gpu_blocks=1900) and cache.capacity_tokens == 1900 * 16
    unknown = parse_cache_config('vllm:cache_config_info{block_size="32",num_gpu_blocks="None"} 1.0\n')
    assert unknown == ServerCache(block_size=32) and unknown.capacity_tokens is None
    assert parse_cache_config("vllm:num_requests_running 1\n") is None


def _chain(n: int, first_in_tokens: int, step: int, base: int) -> list[Request]:
    """`n` growing-context turns 1 s apart (0.5 s each), each prompt's ids extending the one before."""
    return growing_chain(n, first_in_tokens=first_in_tokens, in_tokens_step=step, base=base, block_size=BLOCK)


def _assert_the_parts_add_up(records: list[RequestRecord], summary_parts: tuple[int, ...], uncached: int) -> None:
    expected = sum(
        (r.isl_server_tokens or r.isl_sent_tokens) - (r.cached_tokens or 0)
        for r in records
        if r.phase == "profiling" and r.status == "ok" and r.cached_tokens is not None
    )
    assert uncached == expected and sum(summary_parts) == expected


def test_a_recycled_play_misses_under_its_new_cache_bust_marker(tmp_path: Path) -> None:
    """AgentX mode plays the one session again with a new marker: its first turn's blocks were all sent, under the
    previous play's marker, so its misses are the cache-bust scope's, not first seen."""
    trace = make_trace(make_session("s", _chain(4, 64, 32, 0)), block_size=BLOCK)
    with SimServer(time_scale=0.01, block_size=BLOCK) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=AgentxLoad(concurrency=1, tstar_window=(0.5, 0.5)),
            scenario=Scenario(sessions=2, delay_scale=0.01),
        )
        table = read_records(asyncio.run(run_replay(trace, options)).records_path)
    records = to_records(table)
    again = next(r for r in records if r.play == 1 and r.turn == 0)
    assert again.cache_bust_tokens > 0 and again.replayed_hit_blocks == 0
    assert again.seen_any_scope_blocks == again.theoretical_total_blocks
    misses = summarize(table).cache_misses
    assert misses is not None
    parts = (
        misses.first_seen_tokens,
        misses.cache_bust_scope_tokens,
        misses.block_boundary_tokens,
        misses.seen_not_hit_tokens,
    )
    _assert_the_parts_add_up(records, parts, misses.uncached_tokens)
    # The second play sends nothing the run had not sent under the first one's marker: no first-seen blocks.
    plays = pc.field("play")
    second = cache_misses(table.filter(plays == 1), table)
    assert second is not None and second.first_seen_tokens == 0 and second.cache_bust_scope_tokens > 0
    turn = cache_misses(table.filter((plays == 1) & (pc.field("turn") == 0)), table)
    assert turn is not None  # the marker and every whole block, which the server could not hit
    assert turn.cache_bust_scope_tokens == again.cache_bust_tokens + again.isl_recorded_tokens // BLOCK * BLOCK
    first = cache_misses(table.filter(plays == 0), table)
    assert first is not None and first.cache_bust_scope_tokens == 0 and first.first_seen_tokens > 0


@pytest.fixture(scope="module")
def tiny_sim() -> Iterator[SimServer]:
    """A KV cache of 80 blocks of 16 tokens (1,280 tokens): one session's prompt at a time."""
    with SimServer(time_scale=0.01, block_size=BLOCK, num_gpu_blocks=80, max_model_len=1200) as server:
        yield server


def test_a_tiny_kv_cache_forgets_what_the_run_sent_and_an_lru_of_its_size_says_so(
    tiny_sim: SimServer, tmp_path: Path
) -> None:
    """Three sessions of ~1,000-token prompts played twice each, in turn: by the time one comes back the other two
    have filled the server's cache, so content sent in the same scope is not hit."""
    sessions = [make_session(name, _chain(2, 960, 40, 0)) for name in "abc"]
    trace = make_trace(*sessions, block_size=BLOCK, hash_id_scope="session")
    options = replay_options(
        mode="closed", url=tiny_sim.url, model=tiny_sim.model, out_dir=tmp_path, sessions=6, delay_scale=0.01
    )
    table = read_records(asyncio.run(run_replay(trace, options)).records_path)
    assert run_info(table).options["detected"]["server_cache"] == {"block_size": BLOCK, "num_gpu_blocks": 80}
    records = to_records(table)
    assert all(r.lru_hit_blocks is not None for r in records)
    again = [r for r in records if r.play >= 3 and r.turn == 0]
    assert all(r.replayed_hit_blocks == r.theoretical_total_blocks for r in again)  # sent before, same scope
    assert all((r.lru_hit_blocks or 0) < (r.replayed_hit_blocks or 0) for r in again)  # evicted since
    summary = summarize(table)
    misses = summary.cache_misses
    assert misses is not None and misses.lru_capacity_tokens == 80 * BLOCK
    (shown,) = [t for t in summary_table(summary) if t.title == "why the cache missed"]
    assert [row[1] for row in shown.rows if row[0].startswith("seen before")] == [f"{misses.seen_not_hit_tokens:,}"]
    assert misses.seen_not_hit_tokens > 0
    assert misses.lru_hit_rate is not None and misses.replayed_hit_rate is not None
    assert misses.lru_hit_rate < misses.replayed_hit_rate
    parts = (
        misses.first_seen_tokens,
        misses.cache_bust_scope_tokens,
        misses.block_boundary_tokens,
        misses.seen_not_hit_tokens,
    )
    _assert_the_parts_add_up(records, parts, misses.uncached_tokens)


def test_records_without_the_new_counts_give_none(tiny_sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(make_session("s", _chain(2, 64, 32, 0)), block_size=BLOCK)
    options = replay_options(mode="closed", url=tiny_sim.url, model=tiny_sim.model, out_dir=tmp_path)
    table = read_records(asyncio.run(run_replay(trace, options)).records_path)
    assert cache_misses(table) is not None
    older = table.drop_columns(["seen_any_scope_blocks", "lru_hit_blocks"])
    assert cache_misses(older) is None and summarize(older).cache_misses is None
