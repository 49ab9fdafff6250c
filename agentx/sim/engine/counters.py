"""`EngineCounters`: what the simulated engine counts, read by `GET /metrics` (`agentx.sim.metrics`)."""

from __future__ import annotations

import msgspec


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
