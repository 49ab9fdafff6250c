"""The simulated engine: a vLLM-like step loop over a KV cache with prefix caching.

- `EngineConfig` (`agentx.sim.engine.config`): every knob, immutable, and the step-time model.
- `GenerationRequest` (`agentx.sim.engine.sequence`): what one HTTP request asks the engine for.
- `SimEngine(config)`; `await engine.run()` runs the step loop until `engine.stop()`;
  `engine.submit(request, on_output) -> SequenceHandle` queues a sequence;
  `engine.abort(handle)` drops it (client went away); `engine.counters` are the metric values
  (`agentx.sim.engine.counters`).
- `on_output(token_ids, finish_reason)` is called synchronously by the step loop at the end of every
  step in which the sequence produced tokens (at most one call per sequence per step, or per
  `stream_interval` steps), with the new token ids and, on its last call, the finish reason
  ("length" or "stop"). It must not block; the server writes its SSE chunk from it.
- `handle.num_cached_tokens` is set when the sequence is first scheduled (prefix-cache hit, tokens)
  and is final before the first `on_output` call.

HOW IT RUNS. Each step the scheduler (`agentx.sim.engine.scheduler`) spends a token budget like vLLM's: running
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

from agentx.sim.engine.config import EngineConfig, validate_config
from agentx.sim.engine.counters import EngineCounters
from agentx.sim.engine.scheduler import Scheduler
from agentx.sim.engine.sequence import (
    ABORTED,
    DONE,
    EngineSequence,
    FinishReason,
    GenerationRequest,
    OnOutput,
    SequenceHandle,
    ignore_output,
)

__all__ = [
    "EngineConfig",
    "EngineCounters",
    "FinishReason",
    "GenerationRequest",
    "OnOutput",
    "SequenceHandle",
    "SimEngine",
]

_log = logging.getLogger(__name__)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SimEngine:
    """The step loop over the KV cache (see the module docstring). Call it from the event loop's thread
    only. It runs once: after `stop()`, `run()` returns at once. ValueError for an unusable config."""

    def __init__(self, config: EngineConfig) -> None:
        validate_config(config)
        self.config = config
        self._counters = EngineCounters(
            spec_accepted_per_position=[0] * config.spec_k,
            block_size=config.block_size,
            num_gpu_blocks=config.num_gpu_blocks,
        )
        self._scheduler = Scheduler(config, self._counters)
        self.kv_cache = self._scheduler.kv_cache
        self._num_submitted = 0
        self._wakeup = asyncio.Event()
        self._sleeper: asyncio.Future[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def counters(self) -> EngineCounters:
        counters = self._counters
        scheduler = self._scheduler
        counters.num_running = len(scheduler.prefilling) + len(scheduler.decoding)
        counters.num_waiting = len(scheduler.waiting)
        counters.kv_cache_usage = self.kv_cache.usage
        spec_k = self.config.spec_k
        if spec_k:
            histogram = scheduler.accepted_histogram
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
        sequence = EngineSequence(number, request, on_output, rng, target, reason)
        self._scheduler.waiting.append(sequence)
        self._wakeup.set()
        return sequence

    def abort(self, handle: SequenceHandle) -> None:
        """Forget a sequence: its blocks are freed (full ones stay cached) and it gets no more outputs."""
        if not isinstance(handle, EngineSequence) or handle.state == ABORTED or handle.finished:
            return
        self._scheduler.drop(handle)
        handle.state = ABORTED
        handle.finished = True
        handle.on_output = ignore_output
        self._wakeup.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        counters = self._counters
        scheduler = self._scheduler
        time_scale = self.config.time_scale
        clock = time.perf_counter
        step_end = clock()
        while not self._stopping.is_set():
            busy = scheduler.waiting or scheduler.prefilling or scheduler.decoding
            step_s = scheduler.step() if busy else None
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

    def _deliver(self) -> None:
        """Hand every due sequence its pending tokens, at the end of the step that produced them."""
        scheduler = self._scheduler
        batch = scheduler.to_deliver
        scheduler.to_deliver = []
        for sequence in batch:
            state = sequence.state
            if state == ABORTED:
                continue
            tokens = sequence.pending
            if tokens and len(sequence.output) == len(tokens):
                self._counters.observe_ttft(time.perf_counter() - sequence.submitted_s)
            sequence.pending = []
            sequence.steps_since_output = 0
            finish_reason: FinishReason | None = None
            if state == DONE:
                sequence.finished = True
                finish_reason = sequence.finish_reason
            try:
                sequence.on_output(tokens, finish_reason)
                if finish_reason is not None:
                    sequence.on_output = ignore_output
            except Exception:
                # A broken consumer must not stop the loop serving everyone else.
                _log.exception("on_output of %s failed; aborting the sequence", sequence.request_id)
                self.abort(sequence)
