"""The simulated engine's scheduler: which sequences one step runs, the tokens they produce, what it costs.

Each step spends a token budget like vLLM's: running sequences decode first (1 + spec_k tokens each, in
admission order; a speculative step accepts a drawn number of drafts and emits them plus a bonus token), then
partially prefilled ones and then waiting ones get chunked prefill from what is left. A sequence short of KV
blocks preempts the most recently admitted (vLLM's recompute preemption). Full blocks are registered in the
prefix cache as they are computed, and an admission starts from its longest cached prefix. The step's duration
comes from `engine_config.step_seconds`; `agentx.sim.engine.loop` sleeps it and delivers the outputs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from operator import attrgetter

from agentx.sim.engine.config import EngineConfig, step_seconds
from agentx.sim.engine.counters import EngineCounters
from agentx.sim.engine.kvcache import KVCache
from agentx.sim.engine.sequence import DECODING, DONE, PREFILLING, WAITING, EngineSequence
from agentx.sim.engine.speculative import survival_thresholds

_by_admission = attrgetter("admission")


class Scheduler:
    """The waiting, prefilling and decoding sequences over the KV cache; `step` plans and computes one step."""

    def __init__(self, config: EngineConfig, counters: EngineCounters) -> None:
        self.config = config
        self.kv_cache = KVCache(config.num_gpu_blocks, config.block_size)
        self.counters = counters
        """Where the scheduler counts prompt, generated and prefix-cache tokens and preemptions."""
        self._thresholds = survival_thresholds(config.acceptance_rates)
        self.accepted_histogram = [0] * (config.spec_k + 1)
        """Steps that accepted n drafts, for n = 0..K: the spec-decode counters derive from it."""
        self.waiting: deque[EngineSequence] = deque()
        self.prefilling: list[EngineSequence] = []
        self.decoding: list[EngineSequence] = []
        """Both running lists are kept in admission order."""
        self.to_deliver: list[EngineSequence] = []
        """Sequences with output (or their end) due at the end of the step that produced it."""
        self._done_this_step: list[EngineSequence] = []
        self._num_admissions = 0

    def drop(self, sequence: EngineSequence) -> None:
        """Take `sequence` out of its queue and free its blocks (full ones stay cached)."""
        state = sequence.state
        if state == WAITING:
            self.waiting.remove(sequence)
        elif state == PREFILLING:
            self.prefilling.remove(sequence)
        elif state == DECODING:
            self.decoding.remove(sequence)
        self.kv_cache.free(sequence.blocks)
        sequence.blocks = []

    def step(self) -> float | None:
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
        histogram = self.accepted_histogram
        deliver = self.to_deliver
        done = self._done_this_step
        counters = self.counters
        budget = config.max_num_batched_tokens
        attended_tokens = 0
        produced_tokens = 0

        # Pass 1, decodes. A sequence preempted to make room is always one not yet run this step
        # (the most recently admitted is last in its list), or the one asking.
        decoding = self.decoding
        kept: list[EngineSequence] = []
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
                sequence.state = DONE
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
        self.decoding = kept

        # Pass 2, partial prefills in admission order; one short of blocks preempts later ones.
        prefill_start_budget = budget
        prefilling = self.prefilling
        still_prefilling: list[EngineSequence] = []
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
        self.prefilling = still_prefilling

        # Pass 3, admissions, first come first served: stop at the first that does not fit.
        waiting = self.waiting
        max_num_seqs = config.max_num_seqs
        while waiting and budget > 0 and len(self.prefilling) + len(self.decoding) < max_num_seqs:
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
            sequence.state = PREFILLING
            if not self._prefill(sequence, chunk):
                self.prefilling.append(sequence)

        for sequence in done:
            kv_cache.free(sequence.blocks)
            sequence.blocks = []
        done.clear()
        prefill_tokens = prefill_start_budget - budget
        if prefill_tokens == 0 and decode_tokens == 0:
            return None
        counters.generation_tokens += produced_tokens
        return step_seconds(config, prefill_tokens, decode_tokens, attended_tokens)

    def _grow(self, sequence: EngineSequence, num_tokens: int) -> bool:
        """Give `sequence` the blocks to hold `num_tokens`, if free (or evictable) blocks allow."""
        block_size = self.config.block_size
        if not self.kv_cache.allocate(sequence.blocks, -(-num_tokens // block_size) - len(sequence.blocks)):
            return False
        sequence.kv_capacity_tokens = len(sequence.blocks) * block_size
        return True

    def _grow_decoding(self, sequence: EngineSequence, num_tokens: int, decoding: list[EngineSequence]) -> bool:
        """`_grow`, preempting the most recently admitted running sequences until it fits.

        False when `sequence` itself was the one preempted. `decoding` is the list pass 1 walks.
        """
        prefilling = self.prefilling
        while not self._grow(sequence, num_tokens):
            if prefilling and prefilling[-1].admission > decoding[-1].admission:
                victim = prefilling.pop()
            else:
                victim = decoding.pop()
            self._preempt(victim)
            if victim is sequence:
                return False
        return True

    def _preempt(self, sequence: EngineSequence) -> None:
        """vLLM's recompute preemption: drop the KV (full blocks stay cached), requeue first in line."""
        self.kv_cache.free(sequence.blocks)
        sequence.blocks = []
        sequence.kv_capacity_tokens = 0
        sequence.num_computed_tokens = 0
        sequence.num_cached_blocks = 0
        sequence.state = WAITING
        self.waiting.appendleft(sequence)
        self.counters.num_preemptions += 1

    def _cached_prefix(self, sequence: EngineSequence) -> list[int]:
        """The cached blocks among the sequence's leading full blocks (its prefix-cache hit).

        The last token is always computed (it yields the next token's logits), so at most
        (num_tokens - 1) // block_size blocks can hit. Hashing them all costs nothing extra: the
        prefill registers every full block it computes anyway.
        """
        block_size = self.config.block_size
        max_hit_blocks = (sequence.num_tokens - 1) // block_size
        hashes = sequence.hashes_up_to(max_hit_blocks, block_size)
        return self.kv_cache.longest_cached_prefix(hashes[:max_hit_blocks])

    def _cache_computed_blocks(self, sequence: EngineSequence, num_computed_tokens: int) -> None:
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

    def _prefill(self, sequence: EngineSequence, chunk_tokens: int) -> bool:
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
            self.counters.generation_tokens += 1
        if sequence.num_output_tokens >= sequence.target_output_tokens:
            # Also an EOS drawn as the very first token: an empty final output.
            sequence.state = DONE
            self._done_this_step.append(sequence)
            self.to_deliver.append(sequence)
            return True
        sequence.state = DECODING
        insort(self.decoding, sequence, key=_by_admission)
        sequence.steps_since_output += 1
        # The first token goes out at once whatever the stream interval (time to first token).
        if first or sequence.steps_since_output >= self.config.stream_interval:
            self.to_deliver.append(sequence)
        return True
