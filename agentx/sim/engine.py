"""The simulated engine: a vLLM-like step loop over a KV cache with prefix caching.

INTERFACE (fixed; the HTTP server is written against it):

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

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
    """Steps between outputs of one sequence (vLLM's --stream-interval)."""
    eos_probability: float = 0.0
    """Chance that a generated token is EOS (past min_tokens, without ignore_eos)."""
    vocab_size: int = 32_000
    seed: int = 0
    time_scale: float = 1.0
    """Wall seconds per simulated second: 0.01 runs the clock 100x faster."""


class GenerationRequest(msgspec.Struct, kw_only=True):
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    cache_salt: str | None = None


class EngineCounters(msgspec.Struct, kw_only=True):
    """Monotonic counters and gauges, named after the vLLM metrics they feed."""

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


class SequenceHandle:
    """One submitted sequence, as the server sees it."""

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    finished: bool


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        raise NotImplementedError

    @property
    def counters(self) -> EngineCounters:
        raise NotImplementedError

    def submit(self, request: GenerationRequest, on_output: OnOutput) -> SequenceHandle:
        raise NotImplementedError

    def abort(self, handle: SequenceHandle) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
