"""The simulated engine: a vLLM-like step loop over a KV cache with prefix caching.

- `EngineConfig`: every knob, immutable.
- `GenerationRequest`: what one HTTP request asks the engine for.
- `Engine(config)`; `await engine.run()` runs the step loop until `engine.stop()`;
  `engine.submit(request, on_output) -> SequenceHandle` queues a sequence;
  `engine.abort(handle)` drops it (client went away); `engine.counters` are the metric values.
- `on_output(token_ids, finish_reason)` is called synchronously by the step loop at the end of every
  step in which the sequence produced tokens (at most one call per sequence per step, or per
  `stream_interval` steps), with the new token ids and, on its last call, the finish reason
  ("length" or "stop"). It must not block; the server writes its SSE chunk from it.
- `handle.num_cached_tokens` is set when the sequence is first scheduled (prefix-cache hit, tokens)
  and is final before the first `on_output` call.

HOW IT RUNS. Each step the scheduler (`_schedule`) spends a token budget like vLLM's: running
sequences decode first (1 + spec_k tokens each, in admission order), then partially prefilled ones
and then waiting ones get chunked prefill from what is left. The step's outputs are computed right
away; the loop then sleeps until the step's simulated end (previous end + the step-time model, times
`time_scale`) and delivers them. Deadlines chain from one another, not from the wall clock, so a late
wake-up is caught up by the next steps instead of drifting: how late is in `step_lag_*`. A sequence's
output length and finish reason are drawn when it is submitted (EOS is a geometric draw), and its
tokens and speculative acceptances come from its own RNG, so a sequence's outputs depend only on the
seed and its submission number, whatever else runs beside it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Literal

import msgspec

from agentx.sim.kvcache import KVCache, block_hash, root_hash
from agentx.sim.speculative import survival_thresholds, validate_acceptance_rates

_log = logging.getLogger(__name__)

FinishReason = Literal["length", "stop"]
OnOutput = Callable[[list[int], "FinishReason | None"], None]


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The simulated server's shape. Step-time defaults are illustrative, not measured: shaped like a
    large MoE served on one 8-GPU node (≈8 ms per step at batch 1, ≈25k prefill tokens/s)."""

    model_name: str = "agentx-sim"
    block_size: int = 16
    num_gpu_blocks: int = 262_144
    """KV-cache capacity in blocks (4.2M tokens at block size 16)."""
    max_model_len: int = 262_144
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 16_384
    """Token budget of one step: decode tokens first, the rest for chunked prefill."""
    step_overhead_s: float = 0.008
    """a: fixed cost of a step."""
    prefill_s_per_token: float = 40e-6
    """b: per prefill token in the step."""
    decode_s_per_token: float = 60e-6
    """c: per decoding token in the step (a sequence verifies 1 + spec_k tokens per step)."""
    attention_s_per_kv_token: float = 2e-9
    """d: per KV-cache token attended by the step's sequences."""
    spec_k: int = 0
    """Draft tokens proposed per sequence per step (0: no speculative decoding)."""
    acceptance_rates: tuple[float, ...] = ()
    """Per-position conditional acceptance probabilities, non-increasing, len == spec_k."""
    stream_interval: int = 1
    """Steps between outputs of one sequence (vLLM's --stream-interval); the first token and the final
    call go out at once."""
    eos_probability: float = 0.0
    """Chance that a generated token is EOS (past min_tokens, without ignore_eos)."""
    vocab_size: int = 32_000
    first_output_token_id: int = 0
    """Generated ids are drawn from [first_output_token_id, vocab_size): the server keeps the ids below
    (special tokens, single characters) out of generated text."""
    seed: int = 0
    time_scale: float = 1.0
    """Wall seconds per simulated second: 0.01 runs the clock 100x faster; 0 runs steps back to back."""


class GenerationRequest(msgspec.Struct, kw_only=True):
    prompt_ids: Sequence[int]
    """A list, or (as the server passes it) a compact `array("i")`: not copied, never modified."""
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    cache_salt: str | None = None


class EngineCounters(msgspec.Struct, kw_only=True):
    """Monotonic counters and gauges, named after the vLLM metrics they feed.

    `Engine.counters` refreshes the gauges and the spec-decode fields when it is read.
    """

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = msgspec.field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    """Fraction of KV blocks in use, 0..1."""
    steps: int = 0
    step_lag_s: float = 0.0
    """How far the last step ended behind its simulated deadline (engine overload), seconds."""
    step_lag_max_s: float = 0.0
    """The largest `step_lag_s` so far."""
    step_lag_total_s: float = 0.0
    """Sum of every step's lag: the mean lag is step_lag_total_s / steps."""
    num_preemptions: int = 0
    """Sequences preempted for lack of KV blocks (vllm:num_preemptions)."""


class SequenceHandle:
    """One submitted sequence, as the server sees it.

    `request_id` is "sim-<submission number>". `num_output_tokens` counts the tokens produced so far
    (up to a step ahead of those delivered; final at the last call). `finished` turns true just before
    the final `on_output` call, or on `abort`.
    """

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    finished: bool


_WAITING, _PREFILLING, _DECODING, _DONE, _ABORTED = range(5)
"""Sequence states: _DONE has produced its last token (the final delivery may be pending)."""


class _Sequence(SequenceHandle):
    """A sequence's scheduling state; the engine hands it out as its `SequenceHandle`."""

    __slots__ = (
        "admission",
        "block_hashes",
        "blocks",
        "finish_reason",
        "kv_capacity_tokens",
        "next_cache_at_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_tokens",
        "on_output",
        "output",
        "pending",
        "prompt",
        "random",
        "root_hash",
        "state",
        "steps_since_output",
        "target_output_tokens",
    )

    def __init__(
        self,
        number: int,
        request: GenerationRequest,
        on_output: OnOutput,
        rng: random.Random,
        target_output_tokens: int,
        finish_reason: FinishReason,
    ) -> None:
        self.request_id = f"sim-{number}"
        self.num_prompt_tokens = len(request.prompt_ids)
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.finished = False
        self.on_output = on_output
        self.prompt = request.prompt_ids
        """Not copied: the caller must not modify it afterwards."""
        self.output: list[int] = []
        self.pending: list[int] = []
        """Produced, not yet delivered."""
        self.random = rng.random
        self.target_output_tokens = target_output_tokens
        self.finish_reason = finish_reason
        self.root_hash = root_hash(request.cache_salt)
        self.state = _WAITING
        self.admission = -1
        """Order of the latest admission: the most recent is preempted first."""
        self.num_tokens = self.num_prompt_tokens
        """Prompt + output tokens: what a (re)admission must prefill."""
        self.num_computed_tokens = 0
        """Tokens whose KV is computed, kept while prefilling (a decoding sequence has num_tokens - 1)."""
        self.blocks: list[int] = []
        self.kv_capacity_tokens = 0
        self.block_hashes: list[int] = []
        """Chained hashes of the leading full blocks of prompt + output, computed as needed."""
        self.num_cached_blocks = 0
        """Leading blocks registered in (or taken from) the prefix cache."""
        self.next_cache_at_tokens = 0
        self.steps_since_output = 0

    def hashes_up_to(self, num_blocks: int, block_size: int) -> list[int]:
        """`block_hashes`, extended to at least `num_blocks` entries."""
        hashes = self.block_hashes
        parent = hashes[-1] if hashes else self.root_hash
        split = len(self.prompt)
        for index in range(len(hashes), num_blocks):
            start = index * block_size
            end = start + block_size
            if end <= split:
                tokens = self.prompt[start:end]
            elif start >= split:
                tokens = self.output[start - split : end - split]
            else:
                tokens = [*self.prompt[start:], *self.output[: end - split]]
            parent = block_hash(parent, tokens)
            hashes.append(parent)
        return hashes


_by_admission = attrgetter("admission")


def _ignore_output(token_ids: list[int], finish_reason: FinishReason | None) -> None:
    """Stands in for a finished sequence's consumer: dropping the server's callback breaks the
    stream ↔ sequence reference cycle, so finished requests are freed at once, not by a GC pause
    in the middle of a step."""


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _validate(config: EngineConfig) -> None:
    """ValueError for a configuration the step loop cannot run."""
    for name in ("block_size", "num_gpu_blocks", "max_model_len", "max_num_seqs", "vocab_size", "stream_interval"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    for name in ("step_overhead_s", "prefill_s_per_token", "decode_s_per_token", "attention_s_per_kv_token"):
        if not getattr(config, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)}")
    if not 0 <= config.first_output_token_id < config.vocab_size:
        raise ValueError(f"first_output_token_id must be in [0, vocab_size), got {config.first_output_token_id}")
    if not config.time_scale >= 0:
        raise ValueError(f"time_scale must be >= 0, got {config.time_scale}")
    if not 0 <= config.eos_probability <= 1:
        raise ValueError(f"eos_probability must be in [0, 1], got {config.eos_probability}")
    validate_acceptance_rates(config.acceptance_rates, config.spec_k)
    if config.max_num_batched_tokens < 1 + config.spec_k:
        raise ValueError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must hold one decoding sequence "
            f"(1 + spec_k = {1 + config.spec_k} tokens)"
        )
    # Like vLLM: a sequence at max_model_len (plus its drafts) must fit in the cache alone, or
    # preemption could never make room for it.
    capacity_tokens = config.num_gpu_blocks * config.block_size
    if capacity_tokens < config.max_model_len + config.spec_k:
        raise ValueError(
            f"the KV cache ({config.num_gpu_blocks} blocks x {config.block_size} = {capacity_tokens} tokens) "
            f"cannot hold one sequence of max_model_len + spec_k = {config.max_model_len + config.spec_k} tokens; "
            "raise num_gpu_blocks or lower max_model_len"
        )


class Engine:
    """The step loop over the KV cache (see the module docstring). Call it from the event loop's thread
    only. It runs once: after `stop()`, `run()` returns at once. ValueError for an unusable config."""

    def __init__(self, config: EngineConfig) -> None:
        _validate(config)
        self.config = config
        self.kv_cache = KVCache(config.num_gpu_blocks, config.block_size)
        self._counters = EngineCounters(spec_accepted_per_position=[0] * config.spec_k)
        self._thresholds = survival_thresholds(config.acceptance_rates)
        self._accepted_histogram = [0] * (config.spec_k + 1)
        """Steps that accepted n drafts, for n = 0..K: the spec-decode counters derive from it."""
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: list[_Sequence] = []
        self._decoding: list[_Sequence] = []
        """Both running lists are kept in admission order."""
        self._to_deliver: list[_Sequence] = []
        self._done_this_step: list[_Sequence] = []
        self._num_submitted = 0
        self._num_admissions = 0
        self._wakeup = asyncio.Event()
        self._sleeper: asyncio.Future[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def counters(self) -> EngineCounters:
        counters = self._counters
        counters.num_running = len(self._prefilling) + len(self._decoding)
        counters.num_waiting = len(self._waiting)
        counters.kv_cache_usage = self.kv_cache.usage
        spec_k = self.config.spec_k
        if spec_k:
            histogram = self._accepted_histogram
            counters.spec_num_drafts = sum(histogram)
            counters.spec_num_draft_tokens = spec_k * counters.spec_num_drafts
            counters.spec_num_accepted_tokens = sum(n * steps for n, steps in enumerate(histogram))
            # Position i (0-based) was accepted in every step that accepted more than i drafts.
            per_position = [0] * spec_k
            accepted_beyond = 0
            for position in range(spec_k - 1, -1, -1):
                accepted_beyond += histogram[position + 1]
                per_position[position] = accepted_beyond
            counters.spec_accepted_per_position = per_position
        return counters

    def submit(self, request: GenerationRequest, on_output: OnOutput) -> SequenceHandle:
        """Queue a sequence; ValueError for an empty prompt, max_tokens < 1 or prompt >= max_model_len."""
        config = self.config
        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            raise ValueError("the prompt must hold at least one token")
        if request.max_tokens < 1 or request.min_tokens < 0:
            raise ValueError(f"need max_tokens >= 1, min_tokens >= 0; got {request.max_tokens}, {request.min_tokens}")
        if prompt_len >= config.max_model_len:
            raise ValueError(f"prompt of {prompt_len} tokens does not fit max_model_len={config.max_model_len}")
        number = self._num_submitted
        self._num_submitted += 1
        rng = random.Random(hash((config.seed, number)))
        target = min(request.max_tokens, config.max_model_len - prompt_len)
        reason: FinishReason = "length"
        probability = config.eos_probability
        if probability > 0 and not request.ignore_eos:
            # Each token past min_tokens is EOS with this probability: the number of non-EOS tokens
            # before it is geometric, drawn once (inversion of P(G >= g) = (1 - p)^g).
            uniform = rng.random()
            tokens_before_eos = 0.0 if probability >= 1 else math.log1p(-uniform) / math.log1p(-probability)
            if request.min_tokens + tokens_before_eos < target:  # float compare: the draw may overflow to inf
                target, reason = request.min_tokens + math.floor(tokens_before_eos), "stop"
        sequence = _Sequence(number, request, on_output, rng, target, reason)
        self._waiting.append(sequence)
        self._wakeup.set()
        return sequence

    def abort(self, handle: SequenceHandle) -> None:
        """Forget a sequence: its blocks are freed (full ones stay cached) and it gets no more outputs."""
        if not isinstance(handle, _Sequence) or handle.state == _ABORTED or handle.finished:
            return
        state = handle.state
        if state == _WAITING:
            self._waiting.remove(handle)
        elif state == _PREFILLING:
            self._prefilling.remove(handle)
        elif state == _DECODING:
            self._decoding.remove(handle)
        handle.state = _ABORTED
        handle.finished = True
        handle.on_output = _ignore_output
        self.kv_cache.free(handle.blocks)
        handle.blocks = []
        self._wakeup.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        counters = self._counters
        time_scale = self.config.time_scale
        clock = time.perf_counter
        step_end = clock()
        while not self._stopping.is_set():
            step_s = self._schedule() if self._waiting or self._prefilling or self._decoding else None
            if step_s is None:
                # Idle: nothing to run until a submit (or abort) sets the event; the clock restarts then.
                self._wakeup.clear()
                await self._wakeup.wait()
                step_end = clock()
                continue
            deadline = step_end + step_s * time_scale
            future = loop.create_future()
            self._sleeper = future
            # Always through the event loop, even when late, so that the server gets its turn.
            timer = loop.call_later(max(deadline - clock(), 0.0), _wake, future)
            try:
                await future
            finally:
                timer.cancel()
                self._sleeper = None
            if self._stopping.is_set():
                break
            counters.steps += 1
            if time_scale > 0:
                lag = max(clock() - deadline, 0.0)
                counters.step_lag_s = lag
                counters.step_lag_total_s += lag
                counters.step_lag_max_s = max(counters.step_lag_max_s, lag)
            else:
                deadline = clock()  # no clock to keep: every step is on time
            self._deliver()
            step_end = deadline

    def stop(self) -> None:
        self._stopping.set()
        self._wakeup.set()
        if self._sleeper is not None:
            _wake(self._sleeper)

    def _schedule(self) -> float | None:
        """Plan one step and produce its tokens; the step's simulated duration, or None if idle."""
        config = self.config
        block_size = config.block_size
        kv_cache = self.kv_cache
        spec_k = config.spec_k
        tokens_per_decode = 1 + spec_k
        first_id = config.first_output_token_id
        id_span = config.vocab_size - first_id
        stream_interval = config.stream_interval
        thresholds = self._thresholds
        histogram = self._accepted_histogram
        deliver = self._to_deliver
        done = self._done_this_step
        counters = self._counters
        budget = config.max_num_batched_tokens
        attended_tokens = 0
        produced_tokens = 0

        # Pass 1, decodes. A sequence preempted to make room is always one not yet run this step
        # (the most recently admitted is last in its list), or the one asking.
        decoding = self._decoding
        kept: list[_Sequence] = []
        index = 0
        while index < len(decoding):
            sequence = decoding[index]
            index += 1
            if budget < tokens_per_decode:
                kept += decoding[index - 1 :]
                break
            context_tokens = sequence.num_tokens - 1 + tokens_per_decode
            if context_tokens > sequence.kv_capacity_tokens and not self._grow_decoding(
                sequence, context_tokens, decoding
            ):
                continue
            budget -= tokens_per_decode
            attended_tokens += context_tokens
            sample = sequence.random
            left = sequence.target_output_tokens - sequence.num_output_tokens
            if spec_k:
                accepted = bisect_left(thresholds, -sample())
                histogram[accepted] += 1
                emitted = accepted + 1 if accepted < left else left
                tokens = [first_id + int(sample() * id_span) for _ in range(emitted)]
            else:
                emitted = 1
                tokens = [first_id + int(sample() * id_span)]
            sequence.output += tokens
            if sequence.pending:
                sequence.pending += tokens
            else:
                sequence.pending = tokens
            produced_tokens += emitted
            sequence.num_output_tokens += emitted
            sequence.num_tokens += emitted
            if sequence.num_tokens > sequence.next_cache_at_tokens:
                self._cache_computed_blocks(sequence, sequence.num_tokens - 1)
            if emitted == left:
                sequence.state = _DONE
                done.append(sequence)
                deliver.append(sequence)
                continue
            kept.append(sequence)
            if stream_interval == 1:
                deliver.append(sequence)
            else:
                sequence.steps_since_output += 1
                if sequence.steps_since_output >= stream_interval:
                    deliver.append(sequence)
        decode_tokens = config.max_num_batched_tokens - budget
        self._decoding = kept

        # Pass 2, partial prefills in admission order; one short of blocks preempts later ones.
        prefill_start_budget = budget
        prefilling = self._prefilling
        still_prefilling: list[_Sequence] = []
        index = 0
        while index < len(prefilling) and budget > 0:
            sequence = prefilling[index]
            index += 1
            chunk = min(sequence.num_tokens - sequence.num_computed_tokens, budget)
            end = sequence.num_computed_tokens + chunk
            while end > sequence.kv_capacity_tokens and not self._grow(sequence, end):
                if index == len(prefilling):
                    break
                self._preempt(prefilling.pop())
            if end > sequence.kv_capacity_tokens:
                still_prefilling.append(sequence)
                break
            budget -= chunk
            attended_tokens += end
            if not self._prefill(sequence, chunk):
                still_prefilling.append(sequence)
        still_prefilling += prefilling[index:]
        self._prefilling = still_prefilling

        # Pass 3, admissions, first come first served: stop at the first that does not fit.
        waiting = self._waiting
        max_num_seqs = config.max_num_seqs
        while waiting and budget > 0 and len(self._prefilling) + len(self._decoding) < max_num_seqs:
            sequence = waiting[0]
            hit_blocks = self._cached_prefix(sequence)
            hit_tokens = len(hit_blocks) * block_size
            chunk = min(sequence.num_tokens - hit_tokens, budget)
            end = hit_tokens + chunk
            if not kv_cache.admit(sequence.blocks, hit_blocks, -(-end // block_size) - len(hit_blocks)):
                break
            waiting.popleft()
            if sequence.admission < 0:
                # Counted once per request: a preempted sequence's readmission is not a new query.
                counters.prompt_tokens += sequence.num_prompt_tokens
                counters.prefix_cache_queries += sequence.num_prompt_tokens
                counters.prefix_cache_hits += hit_tokens
                sequence.num_cached_tokens = hit_tokens
            self._num_admissions += 1
            sequence.admission = self._num_admissions
            sequence.kv_capacity_tokens = len(sequence.blocks) * block_size
            sequence.num_computed_tokens = hit_tokens
            sequence.num_cached_blocks = len(hit_blocks)
            sequence.next_cache_at_tokens = hit_tokens + block_size
            budget -= chunk
            attended_tokens += end
            sequence.state = _PREFILLING
            if not self._prefill(sequence, chunk):
                self._prefilling.append(sequence)

        for sequence in done:
            kv_cache.free(sequence.blocks)
            sequence.blocks = []
        done.clear()
        prefill_tokens = prefill_start_budget - budget
        if prefill_tokens == 0 and decode_tokens == 0:
            return None
        counters.generation_tokens += produced_tokens
        return (
            config.step_overhead_s
            + config.prefill_s_per_token * prefill_tokens
            + config.decode_s_per_token * decode_tokens
            + config.attention_s_per_kv_token * attended_tokens
        )

    def _grow(self, sequence: _Sequence, num_tokens: int) -> bool:
        """Give `sequence` the blocks to hold `num_tokens`, if free (or evictable) blocks allow."""
        block_size = self.config.block_size
        if not self.kv_cache.allocate(sequence.blocks, -(-num_tokens // block_size) - len(sequence.blocks)):
            return False
        sequence.kv_capacity_tokens = len(sequence.blocks) * block_size
        return True

    def _grow_decoding(self, sequence: _Sequence, num_tokens: int, decoding: list[_Sequence]) -> bool:
        """`_grow`, preempting the most recently admitted running sequences until it fits.

        False when `sequence` itself was the one preempted. `decoding` is the list pass 1 walks.
        """
        prefilling = self._prefilling
        while not self._grow(sequence, num_tokens):
            if prefilling and prefilling[-1].admission > decoding[-1].admission:
                victim = prefilling.pop()
            else:
                victim = decoding.pop()
            self._preempt(victim)
            if victim is sequence:
                return False
        return True

    def _preempt(self, sequence: _Sequence) -> None:
        """vLLM's recompute preemption: drop the KV (full blocks stay cached), requeue first in line."""
        self.kv_cache.free(sequence.blocks)
        sequence.blocks = []
        sequence.kv_capacity_tokens = 0
        sequence.num_computed_tokens = 0
        sequence.num_cached_blocks = 0
        sequence.state = _WAITING
        self._waiting.appendleft(sequence)
        self._counters.num_preemptions += 1

    def _cached_prefix(self, sequence: _Sequence) -> list[int]:
        """The cached blocks among the sequence's leading full blocks (its prefix-cache hit).

        The last token is always computed (it yields the next token's logits), so at most
        (num_tokens - 1) // block_size blocks can hit. Hashing them all costs nothing extra: the
        prefill registers every full block it computes anyway.
        """
        block_size = self.config.block_size
        max_hit_blocks = (sequence.num_tokens - 1) // block_size
        hashes = sequence.hashes_up_to(max_hit_blocks, block_size)
        return self.kv_cache.longest_cached_prefix(hashes[:max_hit_blocks])

    def _cache_computed_blocks(self, sequence: _Sequence, num_computed_tokens: int) -> None:
        """Register the blocks that `num_computed_tokens` filled since the last call."""
        block_size = self.config.block_size
        num_full = num_computed_tokens // block_size
        hashes = sequence.hashes_up_to(num_full, block_size)
        blocks = sequence.blocks
        register = self.kv_cache.register
        for index in range(sequence.num_cached_blocks, num_full):
            register(blocks[index], hashes[index])
        sequence.num_cached_blocks = num_full
        sequence.next_cache_at_tokens = (num_full + 1) * block_size

    def _prefill(self, sequence: _Sequence, chunk_tokens: int) -> bool:
        """Compute a prefill chunk whose blocks are allocated; on the last chunk, sample the next token
        and move the sequence to the decoding list. True when the prefill is complete."""
        computed = sequence.num_computed_tokens + chunk_tokens
        sequence.num_computed_tokens = computed
        if computed >= sequence.next_cache_at_tokens:
            self._cache_computed_blocks(sequence, computed)
        if computed < sequence.num_tokens:
            return False
        # No drafts yet: the draft model proposes from the token this step samples.
        first = sequence.num_output_tokens == 0
        if sequence.num_output_tokens < sequence.target_output_tokens:
            first_id = self.config.first_output_token_id
            token = first_id + int(sequence.random() * (self.config.vocab_size - first_id))
            sequence.output.append(token)
            sequence.pending.append(token)
            sequence.num_output_tokens += 1
            sequence.num_tokens += 1
            self._counters.generation_tokens += 1
        if sequence.num_output_tokens >= sequence.target_output_tokens:
            # Also an EOS drawn as the very first token: an empty final output.
            sequence.state = _DONE
            self._done_this_step.append(sequence)
            self._to_deliver.append(sequence)
            return True
        sequence.state = _DECODING
        insort(self._decoding, sequence, key=_by_admission)
        sequence.steps_since_output += 1
        # The first token goes out at once whatever the stream interval (time to first token).
        if first or sequence.steps_since_output >= self.config.stream_interval:
            self._to_deliver.append(sequence)
        return True

    def _deliver(self) -> None:
        """Hand every due sequence its pending tokens, at the end of the step that produced them."""
        batch = self._to_deliver
        self._to_deliver = []
        for sequence in batch:
            state = sequence.state
            if state == _ABORTED:
                continue
            tokens = sequence.pending
            sequence.pending = []
            sequence.steps_since_output = 0
            finish_reason: FinishReason | None = None
            if state == _DONE:
                sequence.finished = True
                finish_reason = sequence.finish_reason
            try:
                sequence.on_output(tokens, finish_reason)
                if finish_reason is not None:
                    sequence.on_output = _ignore_output
            except Exception:
                # A broken consumer must not stop the loop serving everyone else.
                _log.exception("on_output of %s failed; aborting the sequence", sequence.request_id)
                self.abort(sequence)
