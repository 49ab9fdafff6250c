"""`EngineCounters`: what the simulated engine counts, read by `GET /metrics` (`agentx.sim.metrics`)."""

from __future__ import annotations

from typing import Final

import msgspec

TTFT_BUCKETS_S: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""The upper bounds of vLLM's time-to-first-token histogram (its first sixteen)."""


class EngineCounters(msgspec.Struct, kw_only=True):
    """Monotonic counters and gauges, named after the vLLM metrics they feed.

    `SimEngine.counters` refreshes the gauges and the spec-decode fields when it is read.
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
    block_size: int = 0
    num_gpu_blocks: int = 0
    """The KV cache's shape, fixed (vllm:cache_config_info's labels)."""
    ttft_buckets: list[int] = msgspec.field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    """Sequences whose first output came within each of `TTFT_BUCKETS_S` of their submission (cumulative)."""
    ttft_count: int = 0
    ttft_sum_s: float = 0.0
    """vllm:time_to_first_token_seconds: submission to the engine's first output, summed over `ttft_count`."""

    def observe_ttft(self, ttft_s: float) -> None:
        for index, bound in enumerate(TTFT_BUCKETS_S):
            if ttft_s <= bound:
                self.ttft_buckets[index] += 1
        self.ttft_count += 1
        self.ttft_sum_s += ttft_s
