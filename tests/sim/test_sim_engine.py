"""The simulated engine in-process: acceptance schedules, the KV cache and the step loop end to end.

Most engine runs use time_scale=0 (steps as fast as the CPU goes); the timing tests use a known
step model and assert loosely.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.sim.engine.kvcache import KVCache, block_hashes
from agentx.sim.engine.loop import (
    EngineConfig,
    FinishReason,
    GenerationRequest,
    SequenceHandle,
    SimEngine,
)
from agentx.sim.engine.speculative import (
    acceptance_schedule,
    accepted_drafts,
    mean_acceptance_length,
    survival_thresholds,
    validate_acceptance_rates,
)

# --- speculative decoding -------------------------------------------------------------------------


def test_schedule_of_the_issue_example() -> None:
    assert acceptance_schedule(3.78, 7) == (1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("length", "spec_k", "rates"),
    [(1.0, 3, (0.0, 0.0, 0.0)), (4.0, 3, (1.0, 1.0, 1.0)), (3.0, 4, (1.0, 1.0, 0.0, 0.0)), (1.0, 0, ())],
)
def test_schedule_edges(length: float, spec_k: int, rates: tuple[float, ...]) -> None:
    assert acceptance_schedule(length, spec_k) == rates


@pytest.mark.parametrize(("length", "spec_k"), [(0.99, 3), (4.01, 3), (math.nan, 3), (2.0, 0), (1.0, -1)])
def test_schedule_rejects_lengths_outside_one_to_k_plus_one(length: float, spec_k: int) -> None:
    with pytest.raises(ValueError, match=r"acceptance length|spec_k"):
        acceptance_schedule(length, spec_k)


@pytest.mark.parametrize(
    ("rates", "spec_k", "message"),
    [
        ((0.9, 0.8), 3, "one rate per draft position: spec_k=3, got 2"),
        ((0.9, 1.2), 2, r"position 2 must be in \[0, 1\], got 1.2"),
        ((-0.1,), 1, r"position 1 must be in \[0, 1\]"),
        ((math.nan,), 1, r"must be in \[0, 1\], got nan"),
        ((0.5, 0.7, 0.1), 3, r"non-increasing: position 2 \(0.7\) > position 1 \(0.5\)"),
    ],
)
def test_validation_says_what_is_wrong(rates: tuple[float, ...], spec_k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_acceptance_rates(rates, spec_k)


def test_validation_accepts_a_non_increasing_schedule() -> None:
    assert validate_acceptance_rates([1, 0.9, 0.9, 0], 4) == (1.0, 0.9, 0.9, 0.0)


def _sample_acceptance(rates: Sequence[float], draws: int, seed: int) -> tuple[float, list[int], int]:
    """Mean AL, per-position acceptance counts and total accepted drafts over `draws` steps."""
    thresholds = survival_thresholds(rates)
    rng = random.Random(seed)
    per_position = [0] * len(rates)
    accepted_total = 0
    for _ in range(draws):
        accepted = accepted_drafts(thresholds, rng.random())
        accepted_total += accepted
        for position in range(accepted):
            per_position[position] += 1
    return 1 + accepted_total / draws, per_position, accepted_total


@settings(max_examples=examples(30), deadline=None)
@given(spec_k=st.integers(1, 8), fraction=st.floats(0, 1), seed=st.integers(0, 2**32))
def test_schedule_sampling_realizes_the_acceptance_length(spec_k: int, fraction: float, seed: int) -> None:
    length = 1 + fraction * spec_k
    rates = acceptance_schedule(length, spec_k)
    assert validate_acceptance_rates(rates, spec_k) == rates
    assert mean_acceptance_length(rates) == pytest.approx(length, abs=1e-9)
    mean, per_position, accepted_total = _sample_acceptance(rates, 10_000, seed)
    assert mean == pytest.approx(length, rel=0.02)
    assert all(per_position[i] >= per_position[i + 1] for i in range(spec_k - 1))
    assert sum(per_position) == accepted_total


@settings(max_examples=examples(20), deadline=None)
@given(
    rates=st.lists(st.floats(0, 1), min_size=1, max_size=6).map(lambda rates: sorted(rates, reverse=True)),
    seed=st.integers(0, 2**32),
)
def test_sampling_follows_any_valid_rates(rates: list[float], seed: int) -> None:
    draws = 20_000
    mean, per_position, accepted_total = _sample_acceptance(rates, draws, seed)
    # Position i is accepted with probability Π r_1..r_i: check each count within 6 standard errors.
    survival = 1.0
    for position, rate in enumerate(rates):
        survival *= rate
        tolerance = 6 * math.sqrt(draws * survival * (1 - survival)) + 1
        assert abs(per_position[position] - draws * survival) <= tolerance
    assert sum(per_position) == accepted_total
    assert mean == pytest.approx(mean_acceptance_length(rates), abs=6 * len(rates) / math.sqrt(draws))


# --- KV cache -------------------------------------------------------------------------------------


def test_chained_hashes_share_prefixes_and_skip_partial_blocks() -> None:
    base = list(range(40))
    assert len(block_hashes(base, 16)) == 2  # 40 tokens: two full blocks, the 8-token tail is not hashed
    diverging = base[:20] + [999] * 20
    assert block_hashes(diverging, 16)[0] == block_hashes(base, 16)[0]
    assert block_hashes(diverging, 16)[1] != block_hashes(base, 16)[1]
    # The chain: a change in the first block changes every later block's hash.
    changed_first = [7, *base[1:]]
    assert set(block_hashes(changed_first, 16)).isdisjoint(block_hashes(base, 16))
    # Salts (on the first block, hence the whole chain) separate tenants.
    salted = block_hashes(base, 16, cache_salt="tenant-a")
    assert set(salted).isdisjoint(block_hashes(base, 16))
    assert salted == block_hashes(base, 16, cache_salt="tenant-a")
    assert set(salted).isdisjoint(block_hashes(base, 16, cache_salt="tenant-b"))


def _fill(cache: KVCache, tokens: list[int], salt: str | None = None) -> list[int]:
    """Admit a sequence holding `tokens` with whatever prefix hits, and register its full blocks."""
    hashes = block_hashes(tokens, cache.block_size, salt)
    hits = cache.longest_cached_prefix(hashes)
    blocks: list[int] = []
    assert cache.admit(blocks, hits, -(-len(tokens) // cache.block_size) - len(hits))
    for block, hash_value in zip(blocks, hashes, strict=False):
        cache.register(block, hash_value)
    return blocks


def test_refcounted_sharing_and_freed_blocks_stay_cached() -> None:
    cache = KVCache(num_blocks=8, block_size=4)
    first = _fill(cache, list(range(10)))  # blocks: 2 full + 1 partial
    second = _fill(cache, [*range(8), 50, 51, 52, 53, 54])  # shares the 2 full blocks, 1 full + 1 partial of its own
    assert second[:2] == first[:2]
    assert [cache.ref_count(block) for block in second] == [2, 2, 1, 1]
    assert cache.num_used_blocks == 5
    assert cache.usage == 5 / 8
    cache.free(first)
    assert [cache.ref_count(block) for block in first] == [1, 1, 0]
    cache.free(second)
    assert cache.num_used_blocks == 0
    assert cache.num_free_blocks == 8
    # The 3 distinct full blocks stay findable; the partial ones were never registered.
    assert cache.num_cached_blocks == 3
    assert len(cache.longest_cached_prefix(block_hashes([*range(8), 50, 51, 52, 53], 4))) == 3


def test_eviction_is_least_recently_freed_first_and_tails_before_prefixes() -> None:
    cache = KVCache(num_blocks=4, block_size=2)
    a_tokens, b_tokens = [1, 2, 3, 4], [5, 6, 7, 8]
    cache.free(_fill(cache, a_tokens))
    cache.free(_fill(cache, b_tokens))
    assert cache.num_cached_blocks == 4
    blocks: list[int] = []
    assert cache.allocate(blocks, 1)  # no clean block left: evicts A's tail, the oldest freed
    assert len(cache.longest_cached_prefix(block_hashes(a_tokens, 2))) == 1
    assert len(cache.longest_cached_prefix(block_hashes(b_tokens, 2))) == 2
    # Sharing a cached block revives it: it leaves the eviction queue.
    revived: list[int] = []
    assert cache.admit(revived, cache.longest_cached_prefix(block_hashes(b_tokens, 2)), 0)
    assert cache.allocate(blocks, 1)  # evicts A's first block, the only evictable one left
    assert cache.longest_cached_prefix(block_hashes(a_tokens, 2)) == []
    assert not cache.allocate(blocks, 1)
    assert blocks == blocks[:2]  # a failed allocation changes nothing


def test_admission_is_all_or_nothing_and_counts_revived_hits() -> None:
    cache = KVCache(num_blocks=3, block_size=2)
    tokens = [1, 2, 3, 4]
    cache.free(_fill(cache, tokens))  # 2 cached, evictable blocks; 1 clean
    hits = cache.longest_cached_prefix(block_hashes(tokens, 2))
    blocks: list[int] = []
    # Reviving 2 hit blocks takes 2 of the 3 free blocks: 2 new ones do not fit.
    assert not cache.admit(blocks, hits, 2)
    assert blocks == []
    assert cache.num_used_blocks == 0
    assert cache.admit(blocks, hits, 1)
    assert cache.num_used_blocks == 3


def test_the_same_content_computed_twice_is_cached_once() -> None:
    cache = KVCache(num_blocks=4, block_size=2)
    first = _fill(cache, [1, 2])
    duplicate: list[int] = []
    assert cache.allocate(duplicate, 1)
    cache.register(duplicate[0], block_hashes([1, 2], 2)[0])
    assert cache.num_cached_blocks == 1
    assert cache.longest_cached_prefix(block_hashes([1, 2], 2)) == first
    cache.free(duplicate)
    assert cache.num_cached_blocks == 1


# --- the engine -----------------------------------------------------------------------------------

Call = tuple[list[int], "FinishReason | None", int]
"""One on_output call: token ids, finish reason, engine step it came in."""

FAST = EngineConfig(time_scale=0.0, num_gpu_blocks=4096, max_model_len=4096)
"""Steps as fast as the CPU goes."""


class Recorder:
    """Submits requests and records every on_output call per sequence."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.calls: list[list[Call]] = []
        self.handles: list[SequenceHandle] = []
        self.cached_at_first_output: list[int | None] = []
        self.stop_when_done = True
        """Stop the engine once every submitted sequence has finished."""

    def submit(self, request: GenerationRequest) -> SequenceHandle:
        index = len(self.calls)
        self.calls.append([])
        self.cached_at_first_output.append(None)
        handle = self.engine.submit(request, lambda tokens, reason: self._record(index, tokens, reason))
        self.handles.append(handle)
        return handle

    def _record(self, index: int, tokens: list[int], reason: FinishReason | None) -> None:
        if not self.calls[index]:
            self.cached_at_first_output[index] = self.handles[index].num_cached_tokens
        self.calls[index].append((tokens, reason, self.engine.counters.steps))
        if self.stop_when_done and self.all_done():
            self.engine.stop()

    def all_done(self) -> bool:
        return all(self._done(i) for i in range(len(self.calls)))

    def _done(self, index: int) -> bool:
        calls = self.calls[index]
        return self.handles[index].finished or (bool(calls) and calls[-1][1] is not None)

    def tokens(self, index: int) -> list[int]:
        return [token for tokens, _, _ in self.calls[index] for token in tokens]

    def reason(self, index: int) -> FinishReason | None:
        return self.calls[index][-1][1] if self.calls[index] else None


def run_engine(
    config: EngineConfig,
    requests: Sequence[GenerationRequest],
    *,
    during: Callable[[SimEngine, Recorder], None] | None = None,
    timeout_s: float = 10.0,
) -> tuple[SimEngine, Recorder]:
    """Submit `requests`, run the loop until every sequence finished; `during` runs after each step."""
    engine = SimEngine(config)
    recorder = Recorder(engine)
    for request in requests:
        recorder.submit(request)

    async def main() -> None:
        task = asyncio.create_task(engine.run())
        if during is not None:
            give_up = time.perf_counter() + timeout_s
            while not task.done() and time.perf_counter() < give_up:
                during(engine, recorder)
                if recorder.all_done():  # the last sequence may have been aborted: no output will stop the engine
                    engine.stop()
                await asyncio.sleep(0)
        await asyncio.wait_for(task, timeout_s)

    asyncio.run(main())
    return engine, recorder


def request(prompt_len: int, max_tokens: int, *, first_token: int = 0, **fields: object) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=list(range(first_token, first_token + prompt_len)),
        max_tokens=max_tokens,
        **fields,  # type: ignore[arg-type]
    )


def test_every_sequence_streams_max_tokens_one_call_per_step() -> None:
    engine, recorder = run_engine(FAST, [request(100 + i, 50, ignore_eos=True) for i in range(20)])
    for index in range(20):
        calls = recorder.calls[index]
        assert len(recorder.tokens(index)) == 50
        assert [len(tokens) for tokens, _, _ in calls] == [1] * 50
        steps = [step for _, _, step in calls]
        assert steps == list(range(steps[0], steps[0] + 50))  # every step, never twice in one step
        assert [reason for _, reason, _ in calls] == [None] * 49 + ["length"]
        assert all(0 <= token < FAST.vocab_size for token in recorder.tokens(index))
        assert recorder.handles[index].finished
        assert recorder.handles[index].num_output_tokens == 50
    counters = engine.counters
    assert counters.generation_tokens == 20 * 50
    assert counters.prompt_tokens == counters.prefix_cache_queries == sum(100 + i for i in range(20))
    assert (counters.num_running, counters.num_waiting, counters.kv_cache_usage) == (0, 0, 0.0)


def test_stream_interval_batches_tokens_but_sends_the_first_and_last_at_once() -> None:
    config = EngineConfig(time_scale=0.0, stream_interval=4, num_gpu_blocks=1024, max_model_len=1024)
    _, recorder = run_engine(config, [request(30, 23, ignore_eos=True), request(31, 1, ignore_eos=True)])
    calls = recorder.calls[0]
    # First token alone (time to first token), then 4 steps' worth per call, the remainder with the finish.
    assert [len(tokens) for tokens, _, _ in calls] == [1, 4, 4, 4, 4, 4, 2]
    steps = [step for _, _, step in calls]
    assert [later - earlier for earlier, later in itertools.pairwise(steps)] == [4, 4, 4, 4, 4, 2]
    assert calls[-1][1] == "length"
    assert recorder.calls[1] == [(recorder.tokens(1), "length", recorder.calls[1][0][2])]


def test_eos_stops_after_min_tokens_without_emitting_it() -> None:
    config = EngineConfig(time_scale=0.0, eos_probability=0.2, num_gpu_blocks=1024, max_model_len=1024)
    requests = [request(20, 200, first_token=i, min_tokens=10) for i in range(200)]
    _, recorder = run_engine(config, requests)
    lengths = [len(recorder.tokens(i)) for i in range(200)]
    assert min(lengths) >= 10
    assert all(recorder.reason(i) == ("stop" if lengths[i] < 200 else "length") for i in range(200))
    # Tokens past min_tokens are geometric: mean (1 - p) / p = 4.
    assert sum(lengths) / 200 - 10 == pytest.approx(4, abs=1.0)


def test_ignore_eos_and_certain_eos() -> None:
    config = EngineConfig(time_scale=0.0, eos_probability=1.0, num_gpu_blocks=1024, max_model_len=1024)
    _, recorder = run_engine(config, [request(20, 10), request(20, 10, ignore_eos=True), request(20, 10, min_tokens=3)])
    assert recorder.calls[0] == [([], "stop", recorder.calls[0][0][2])]  # EOS first: an empty final output
    assert (len(recorder.tokens(1)), recorder.reason(1)) == (10, "length")
    assert (len(recorder.tokens(2)), recorder.reason(2)) == (3, "stop")


def test_generation_is_clamped_to_max_model_len() -> None:
    config = EngineConfig(time_scale=0.0, num_gpu_blocks=64, max_model_len=50)
    _, recorder = run_engine(config, [request(40, 100, ignore_eos=True)])
    assert (len(recorder.tokens(0)), recorder.reason(0)) == (10, "length")


def test_same_seed_same_outputs_other_seed_other_outputs() -> None:
    def outputs(seed: int) -> list[tuple[list[int], FinishReason | None]]:
        config = EngineConfig(time_scale=0.0, seed=seed, eos_probability=0.05, num_gpu_blocks=1024, max_model_len=1024)
        _, recorder = run_engine(config, [request(30, 40, first_token=i) for i in range(10)])
        return [(recorder.tokens(i), recorder.reason(i)) for i in range(10)]

    assert outputs(1) == outputs(1)
    assert outputs(1) != outputs(2)


def test_preemption_under_a_tiny_cache_still_completes_everything_identically() -> None:
    requests = [request(20, 40, first_token=100 * i, ignore_eos=True) for i in range(8)]
    roomy, reference = run_engine(EngineConfig(time_scale=0.0, num_gpu_blocks=1024, max_model_len=64), requests)
    # 24 blocks of 4 tokens: 96 tokens for 8 sequences that grow to 60 each.
    tiny_config = EngineConfig(time_scale=0.0, block_size=4, num_gpu_blocks=24, max_model_len=64)
    tiny, recorder = run_engine(tiny_config, requests)
    assert roomy.counters.num_preemptions == 0
    assert tiny.counters.num_preemptions > 0
    for index in range(8):
        assert recorder.tokens(index) == reference.tokens(index)  # a sequence's outputs are its own
        assert recorder.reason(index) == "length"
    assert tiny.counters.generation_tokens == 8 * 40
    assert tiny.counters.prompt_tokens == 8 * 20  # a readmission is not a new request
    assert tiny.kv_cache.num_used_blocks == 0


def test_prefix_hits_shared_prefixes_salts_and_the_last_token_rule() -> None:
    shared = list(range(1000, 1040))  # 2 full blocks of 16 + 8 tokens
    requests = [
        GenerationRequest(prompt_ids=shared, max_tokens=2),
        GenerationRequest(prompt_ids=[*shared[:32], 1, 2, 3], max_tokens=2),  # 2 shared full blocks
        GenerationRequest(prompt_ids=shared[:32], max_tokens=2),  # exactly 2 blocks: the last token is computed
        GenerationRequest(prompt_ids=shared, max_tokens=2, cache_salt="other"),  # another tenant
        GenerationRequest(prompt_ids=shared[:15], max_tokens=2),  # no full block at all
    ]
    config = EngineConfig(time_scale=0.0, num_gpu_blocks=256, max_model_len=256, max_num_seqs=1)
    engine, recorder = run_engine(config, requests)
    assert [handle.num_cached_tokens for handle in recorder.handles] == [0, 32, 16, 0, 0]
    assert recorder.cached_at_first_output == [0, 32, 16, 0, 0]
    assert engine.counters.prefix_cache_hits == 48
    assert engine.counters.prefix_cache_queries == 40 + 35 + 32 + 40 + 15


def test_decoded_blocks_become_cacheable_for_the_next_turn() -> None:
    engine = SimEngine(EngineConfig(time_scale=0.0, num_gpu_blocks=256, max_model_len=256))
    recorder = Recorder(engine)
    recorder.stop_when_done = False
    recorder.submit(request(20, 30, ignore_eos=True))

    async def main() -> None:
        task = asyncio.create_task(engine.run())
        while not recorder.handles[0].finished:
            await asyncio.sleep(0)
        # The next turn: the whole conversation so far plus a new user message.
        recorder.stop_when_done = True
        recorder.submit(GenerationRequest(prompt_ids=[*range(20), *recorder.tokens(0), 7, 7], max_tokens=1))
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    # 52 tokens; the first turn computed 49 of them (its last token never went through the model): 3 blocks.
    assert recorder.handles[1].num_cached_tokens == 48


def test_abort_stops_outputs_and_frees_blocks() -> None:
    aborted: list[int] = []

    def abort_after_three_outputs(engine: SimEngine, recorder: Recorder) -> None:
        if not aborted and len(recorder.calls[0]) >= 3:
            engine.abort(recorder.handles[0])
            engine.abort(recorder.handles[0])  # twice is harmless
            aborted.append(len(recorder.calls[0]))

    config = EngineConfig(time_scale=0.0, num_gpu_blocks=256, max_model_len=256)
    engine, recorder = run_engine(
        config, [request(20, 100, ignore_eos=True), request(20, 10, first_token=50)], during=abort_after_three_outputs
    )
    assert len(recorder.calls[0]) == aborted[0]
    assert recorder.handles[0].finished
    assert len(recorder.tokens(1)) == 10
    assert engine.kv_cache.num_used_blocks == 0
    assert engine.counters.num_running == 0


def test_abort_while_waiting_and_a_failing_consumer() -> None:
    engine = SimEngine(EngineConfig(time_scale=0.0, num_gpu_blocks=256, max_model_len=256))
    recorder = Recorder(engine)
    waiting = recorder.submit(request(20, 5))
    engine.abort(waiting)
    assert engine.counters.num_waiting == 0

    def broken(tokens: list[int], reason: FinishReason | None) -> None:
        raise RuntimeError("client gone")

    failing = engine.submit(request(20, 50, ignore_eos=True), broken)
    recorder.submit(request(20, 5, first_token=50, ignore_eos=True))

    async def main() -> None:
        await asyncio.wait_for(engine.run(), 5)

    asyncio.run(main())
    assert failing.finished and failing.num_output_tokens == 1
    assert len(recorder.tokens(1)) == 5
    assert recorder.calls[0] == []


def test_speculative_decoding_counters_and_acceptance_length() -> None:
    rates = acceptance_schedule(2.5, 3)
    config = EngineConfig(
        time_scale=0.0, spec_k=3, acceptance_rates=rates, num_gpu_blocks=4096, max_model_len=4096, max_num_seqs=64
    )
    engine, recorder = run_engine(config, [request(30, 300, first_token=i, ignore_eos=True) for i in range(40)])
    for index in range(40):
        assert len(recorder.tokens(index)) == 300
        assert all(1 <= len(tokens) <= 4 for tokens, _, _ in recorder.calls[index])
    counters = engine.counters
    assert counters.generation_tokens == 40 * 300
    assert counters.spec_num_draft_tokens == 3 * counters.spec_num_drafts
    assert counters.spec_num_accepted_tokens == sum(counters.spec_accepted_per_position)
    per_position = counters.spec_accepted_per_position
    assert per_position[0] == counters.spec_num_drafts  # rate 1: always accepted
    assert per_position[2] == 0
    assert 1 + counters.spec_num_accepted_tokens / counters.spec_num_drafts == pytest.approx(2.5, rel=0.02)
    # One draft per decode step per sequence: the first token comes from the prefill step.
    decode_calls = sum(len(recorder.calls[index]) - 1 for index in range(40))
    assert counters.spec_num_drafts == decode_calls


def test_budget_and_max_num_seqs_shape_the_steps() -> None:
    # 4 sequences at most; 64-token budget: 4 decodes leave 60 for prefill chunks.
    config = EngineConfig(
        time_scale=0.0, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks=256, max_model_len=256
    )
    engine, recorder = run_engine(config, [request(100, 5, first_token=1000 * i, ignore_eos=True) for i in range(8)])
    first_steps = [recorder.calls[index][0][2] for index in range(8)]
    # 100-token prompts take 2 steps of chunked prefill each; FCFS: later sequences start no earlier.
    assert first_steps == sorted(first_steps)
    assert first_steps[0] == 2
    # Never more than 4 sequences produce tokens in the same step.
    per_step: dict[int, int] = {}
    for calls in recorder.calls:
        for _, _, step in calls:
            per_step[step] = per_step.get(step, 0) + 1
    assert max(per_step.values()) <= 4
    assert engine.counters.generation_tokens == 40


def test_elapsed_time_follows_the_step_model() -> None:
    # 1 prefill step then 19 decode steps; each step 5 ms + 1 ms per decode token, at half speed.
    config = EngineConfig(
        step_overhead_s=0.005,
        prefill_s_per_token=0.0,
        decode_s_per_token=0.001,
        attention_s_per_kv_token=0.0,
        time_scale=2.0,
        num_gpu_blocks=64,
        max_model_len=256,
    )
    start = time.perf_counter()
    engine, _ = run_engine(config, [request(10, 20, ignore_eos=True)])
    elapsed = time.perf_counter() - start
    expected = 2.0 * (0.005 + 19 * 0.006)
    assert engine.counters.steps == 20
    assert expected * 0.95 <= elapsed <= expected * 3 + 0.2
    assert engine.counters.step_lag_max_s >= engine.counters.step_lag_s >= 0
    assert engine.counters.step_lag_total_s <= elapsed


def test_idle_loop_sleeps_and_stop_is_prompt() -> None:
    engine = SimEngine(EngineConfig(step_overhead_s=30.0, num_gpu_blocks=64, max_model_len=256))
    recorder = Recorder(engine)

    async def main() -> None:
        task = asyncio.create_task(engine.run())
        cpu_before = time.process_time()
        await asyncio.sleep(0.2)
        assert time.process_time() - cpu_before < 0.1  # waiting on an event, not polling
        assert engine.counters.steps == 0
        recorder.submit(request(10, 5))  # its first step lasts 30 s
        await asyncio.sleep(0.05)
        stop_at = time.perf_counter()
        engine.stop()
        await asyncio.wait_for(task, 1.0)
        assert time.perf_counter() - stop_at < 0.5
        assert recorder.calls[0] == []

    asyncio.run(main())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_gpu_blocks": 10, "max_model_len": 1000}, "cannot hold one sequence"),
        ({"spec_k": 2, "acceptance_rates": (0.5,)}, "one rate per draft position"),
        ({"spec_k": 4, "acceptance_rates": (1.0,) * 4, "max_num_batched_tokens": 4}, "must hold one decoding"),
        ({"eos_probability": 1.5}, "eos_probability"),
        ({"stream_interval": 0}, "stream_interval"),
    ],
)
def test_config_validation(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimEngine(EngineConfig(**fields))  # type: ignore[arg-type]


def test_submit_validation() -> None:
    engine = SimEngine(EngineConfig(num_gpu_blocks=64, max_model_len=100))

    def ignore(tokens: list[int], reason: FinishReason | None) -> None:
        pass

    for bad, message in [
        (GenerationRequest(prompt_ids=[], max_tokens=1), "at least one token"),
        (GenerationRequest(prompt_ids=[1], max_tokens=0), "max_tokens >= 1"),
        (GenerationRequest(prompt_ids=list(range(100)), max_tokens=1), "max_model_len=100"),
    ]:
        with pytest.raises(ValueError, match=message):
            engine.submit(bad, ignore)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[EngineConfig, list[GenerationRequest], dict[int, int]]:
    """Small configs (often a cache barely holding one sequence) and requests sharing prefixes;
    the dict maps sequences to abort to the number of outputs after which they are aborted."""
    spec_k = draw(st.integers(0, 3))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = draw(st.integers(16, 96))
    config = EngineConfig(
        time_scale=0.0,
        block_size=block_size,
        max_model_len=max_model_len,
        num_gpu_blocks=-(-(max_model_len + spec_k) // block_size) + draw(st.integers(0, 24)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1 + spec_k, 160)),
        spec_k=spec_k,
        acceptance_rates=tuple(sorted(draw(st.lists(st.floats(0, 1), min_size=spec_k, max_size=spec_k)), reverse=True)),
        stream_interval=draw(st.integers(1, 3)),
        eos_probability=draw(st.sampled_from([0.0, 0.1])),
        seed=draw(st.integers(0, 3)),
    )
    base = draw(st.lists(st.integers(0, 3), min_size=max_model_len, max_size=max_model_len))
    requests = []
    for _ in range(draw(st.integers(1, 12))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        shared = draw(st.integers(0, prompt_len))
        tail = draw(st.lists(st.integers(0, 3), min_size=prompt_len - shared, max_size=prompt_len - shared))
        requests.append(
            GenerationRequest(
                prompt_ids=base[:shared] + tail,
                max_tokens=draw(st.integers(1, 40)),
                min_tokens=draw(st.integers(0, 5)),
                cache_salt=draw(st.sampled_from([None, None, "tenant"])),
            )
        )
    aborts = draw(st.dictionaries(st.integers(0, len(requests) - 1), st.integers(0, 3), max_size=3))
    return config, requests, aborts


@settings(max_examples=examples(60), deadline=None)
@given(workload=workloads())
def test_random_workloads_keep_every_invariant(
    workload: tuple[EngineConfig, list[GenerationRequest], dict[int, int]],
) -> None:
    config, requests, aborts = workload
    aborted: set[int] = set()

    def abort_some(engine: SimEngine, recorder: Recorder) -> None:
        for index, after_outputs in aborts.items():
            if index not in aborted and len(recorder.calls[index]) >= after_outputs:
                engine.abort(recorder.handles[index])
                aborted.add(index)

    engine, recorder = run_engine(config, requests, during=abort_some)
    _, reference = run_engine(msgspec.structs.replace(config, num_gpu_blocks=4096, max_num_seqs=64), requests)
    for index, handle in enumerate(recorder.handles):
        calls = recorder.calls[index]
        steps = [step for _, _, step in calls]
        assert steps == sorted(set(steps))  # at most one call per step
        assert handle.finished
        if index in aborted:
            assert len(calls) <= aborts[index] + 1  # outputs queued before the abort was seen may not all arrive
            continue
        assert all(reason is None for _, reason, _ in calls[:-1])
        # Output length and finish reason are drawn at submission: preemption and batching cannot change them.
        assert len(recorder.tokens(index)) == handle.num_output_tokens == len(reference.tokens(index))
        assert recorder.reason(index) == reference.reason(index)
        if config.spec_k == 0:
            assert recorder.tokens(index) == reference.tokens(index)
        assert all(len(tokens) <= config.stream_interval * (1 + config.spec_k) for tokens, _, _ in calls)
    counters = engine.counters
    assert counters.generation_tokens == sum(handle.num_output_tokens for handle in recorder.handles)
    assert counters.prefix_cache_queries == counters.prompt_tokens
    assert counters.prefix_cache_hits <= counters.prefix_cache_queries
    assert counters.spec_num_accepted_tokens == sum(counters.spec_accepted_per_position)
    assert counters.spec_accepted_per_position == sorted(counters.spec_accepted_per_position, reverse=True)
    assert (counters.num_running, counters.num_waiting, engine.kv_cache.num_used_blocks) == (0, 0, 0)
    assert engine.kv_cache.num_free_blocks == config.num_gpu_blocks
    assert all(engine.kv_cache.ref_count(block) == 0 for block in range(config.num_gpu_blocks))
