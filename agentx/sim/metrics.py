"""`GET /metrics`: the engine's counters under vLLM's metric names, read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from agentx.sim.engine.counters import TTFT_BUCKETS_S, EngineCounters

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The classic text format, which every scraper (and vLLM's own /metrics) speaks."""
FINISH_REASONS = ("stop", "length", "abort")


GENERATION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


class ServerCounters:
    """What the HTTP layer counts itself: generation requests received by endpoint, finished requests by
    reason, injected faults by kind, tokens it sent ahead of the engine."""

    def __init__(self) -> None:
        self.received: dict[str, int] = dict.fromkeys(GENERATION_ENDPOINTS, 0)
        self.finished: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.faults: dict[str, int] = {}
        self.early_tokens = 0
        """Tokens an early-first-token fault sent before the engine ran: generated tokens all the same."""


class _SimCollector:
    def __init__(
        self, counters: Callable[[], EngineCounters], server: ServerCounters, *, model_name: str, spec_k: int
    ) -> None:
        self._counters = counters
        self._server = server
        self._labels = ["model_name", "engine"]
        self._values = [model_name, "0"]
        self._spec_k = spec_k

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=self._labels)
        family.add_metric(self._values, value)
        return family

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=self._labels)
        family.add_metric(self._values, value)
        return family

    def collect(self) -> Iterator[Metric]:
        c = self._counters()
        yield self._counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", c.prefix_cache_queries)
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", c.prefix_cache_hits)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        generated = c.generation_tokens + self._server.early_tokens
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.", generated)
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.", c.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", c.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", c.kv_cache_usage)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemptions.", c.num_preemptions)
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(c.block_size), str(c.num_gpu_blocks)], 1.0)
        yield cache
        ttft = HistogramMetricFamily(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels=self._labels
        )
        buckets = [(f"{bound:g}", count) for bound, count in zip(TTFT_BUCKETS_S, c.ttft_buckets, strict=True)]
        ttft.add_metric(self._values, [*buckets, ("+Inf", c.ttft_count)], c.ttft_sum_s)
        yield ttft
        if self._spec_k > 0:
            yield from self._spec_decode(c)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of finished requests.", labels=[*self._labels, "finished_reason"]
        )
        for reason, count in self._server.finished.items():
            success.add_metric([*self._values, reason], count)
        yield success
        # Finished requests leave out those answered with an error or cut off: a client's count of requests
        # sent is checked against this one (refused, faulted and bad requests included).
        received = CounterMetricFamily(
            "agentx_sim_requests_received", "Generation requests received, by endpoint.", labels=["endpoint"]
        )
        for endpoint, count in self._server.received.items():
            received.add_metric([endpoint], count)
        yield received
        yield self._counter("agentx_sim_steps", "Engine steps run.", c.steps)
        yield self._gauge(
            "agentx_sim_step_lag_seconds", "How far the last step ended behind its simulated deadline.", c.step_lag_s
        )
        yield self._gauge("agentx_sim_step_lag_max_seconds", "The largest step lag so far.", c.step_lag_max_s)
        yield self._counter("agentx_sim_step_lag_sum_seconds", "Sum of all steps' lags.", c.step_lag_total_s)
        faults = CounterMetricFamily("agentx_sim_faults_injected", "Injected faults by kind.", labels=["fault"])
        for fault, count in self._server.faults.items():
            faults.add_metric([fault], count)
        yield faults

    def _spec_decode(self, c: EngineCounters) -> Iterator[Metric]:
        yield self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.spec_num_drafts)
        yield self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", c.spec_num_draft_tokens)
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", c.spec_num_accepted_tokens
        )
        per_position = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=[*self._labels, "position"],
        )
        accepted = c.spec_accepted_per_position
        for position in range(self._spec_k):
            per_position.add_metric(
                [*self._values, str(position)], accepted[position] if position < len(accepted) else 0
            )
        yield per_position


def metrics_registry(
    counters: Callable[[], EngineCounters], server: ServerCounters, *, model_name: str, spec_k: int
) -> CollectorRegistry:
    """A registry of its own (not the process-global one) holding only the simulator's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(counters, server, model_name=model_name, spec_k=spec_k))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
