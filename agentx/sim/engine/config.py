"""The simulated engine's shape (`EngineConfig`): its cache, its batching limits and its step-time model.

A step of the engine lasts `step_seconds`: a + b·(prefill tokens) + c·(decode tokens) + d·(KV tokens attended),
the coefficients being `EngineConfig` fields; `agentx.sim.engine.loop` sleeps that long (times `time_scale`).
"""

from __future__ import annotations

import msgspec

from agentx.sim.engine.speculative import validate_acceptance_rates


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


def step_seconds(config: EngineConfig, prefill_tokens: int, decode_tokens: int, attended_tokens: int) -> float:
    """The simulated duration of a step that prefilled, decoded and attended so many tokens."""
    return (
        config.step_overhead_s
        + config.prefill_s_per_token * prefill_tokens
        + config.decode_s_per_token * decode_tokens
        + config.attention_s_per_kv_token * attended_tokens
    )


def validate_config(config: EngineConfig) -> None:
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
