"""What a server's `/metrics` says: the metric names each engine exposes, and their values read from the text.

Prefix cache (agentx.results.summary.summarize): vLLM's `vllm:prefix_cache_hits_total` and `..._queries_total` (hits
over queries), or llama.cpp's `llamacpp:prompt_tokens_cached_total` and `llamacpp:prompt_tokens_total`
(computed prompt tokens, cached ones excluded: hits over their sum). The KV cache's shape: vLLM's info gauge
`vllm:cache_config_info`, whose labels carry the engine's `block_size` and `num_gpu_blocks` (`parse_cache_config`).

Speculative decoding (agentx.results.summary.checks.acceptance, which says how each set gives an acceptance length):

- vLLM: `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
  `..._num_accepted_tokens_per_pos{position}` (counters).
- ATOM: `atom:mtp_accepted_tokens`, `atom:mtp_draft_tokens`, `atom:mtp_decode_steps{accepted_tokens}`
  (counters); the gauges `atom:mtp_average_tokens_per_forward` and `atom:mtp_acceptance_rate`.
- SGLang: the gauges `sglang:spec_accept_length` and `sglang:spec_accept_rate`.
- llama.cpp (`llama-server --metrics`): vLLM's four counters under the prefix `llamacpp:`.
- TensorRT-LLM: none read; a run against it gets the stream's acceptance only.

`parse_counters` reads the samples of the wanted names with `prometheus_client`'s text parser, one line at a
time: a line it rejects (a malformed sample) is skipped and the rest are read, so an odd exposition costs the
figures of that line, never the run. A sample whose value is NaN or ±Inf counts as absent.

The series scraped over a run (server_metrics.arrow), each engine's names mapped onto agentx's:
agentx.replayer.telemetry.series.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

_log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# names, as exposed (counters with Prometheus' `_total`)

PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
LLAMACPP_PROMPT_TOKENS: Final = "llamacpp:prompt_tokens_total"
"""llama.cpp's prompt tokens computed, cached ones excluded."""
LLAMACPP_CACHED_TOKENS: Final = "llamacpp:prompt_tokens_cached_total"
CACHE_METRICS: Final = (PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, LLAMACPP_PROMPT_TOKENS, LLAMACPP_CACHED_TOKENS)
"""The prefix-cache counters: vLLM's hits and queries, or llama.cpp's cached and computed prompt tokens."""

VLLM_DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ATOM_DRAFT_TOKENS: Final = "atom:mtp_draft_tokens_total"
ATOM_ACCEPTED: Final = "atom:mtp_accepted_tokens_total"
ATOM_STEPS: Final = "atom:mtp_decode_steps_total"
ATOM_TOKENS_PER_FORWARD: Final = "atom:mtp_average_tokens_per_forward"
ATOM_ACCEPTANCE_RATE: Final = "atom:mtp_acceptance_rate"
SGLANG_ACCEPT_LENGTH: Final = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE: Final = "sglang:spec_accept_rate"
LLAMACPP_DRAFTS: Final = "llamacpp:spec_decode_num_drafts_total"
LLAMACPP_DRAFT_TOKENS: Final = "llamacpp:spec_decode_num_draft_tokens_total"
LLAMACPP_ACCEPTED: Final = "llamacpp:spec_decode_num_accepted_tokens_total"
LLAMACPP_ACCEPTED_PER_POS: Final = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"

SPEC_METRICS: Final = (
    VLLM_DRAFTS,
    VLLM_DRAFT_TOKENS,
    VLLM_ACCEPTED,
    VLLM_ACCEPTED_PER_POS,
    ATOM_DRAFT_TOKENS,
    ATOM_ACCEPTED,
    ATOM_STEPS,
    ATOM_TOKENS_PER_FORWARD,
    ATOM_ACCEPTANCE_RATE,
    SGLANG_ACCEPT_LENGTH,
    SGLANG_ACCEPT_RATE,
    LLAMACPP_DRAFTS,
    LLAMACPP_DRAFT_TOKENS,
    LLAMACPP_ACCEPTED,
    LLAMACPP_ACCEPTED_PER_POS,
)
"""Every speculative-decoding metric read."""
METRIC_LABELS: Final = {
    VLLM_ACCEPTED_PER_POS: "position",
    LLAMACPP_ACCEPTED_PER_POS: "position",
    ATOM_STEPS: "accepted_tokens",
}
"""Metrics kept per value of one label (see `labelled`), summed over their other labels."""
SCRAPED_METRICS: Final = (*CACHE_METRICS, *SPEC_METRICS)
"""Every metric a run reads: the prefix-cache counters and the speculative-decoding metrics."""


CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"
"""vLLM's KV-cache configuration: a gauge of 1 per engine whose labels are the configuration's fields."""


class ServerCache(msgspec.Struct, frozen=True, kw_only=True):
    """The server's KV cache as its `/metrics` describes it (`CACHE_CONFIG_INFO`)."""

    block_size: int
    """Tokens per KV block: the grid its prefix cache hits on."""
    num_gpu_blocks: int | None = None
    """KV blocks on the GPUs, over every engine of a data-parallel server; None when not reported."""

    @property
    def capacity_tokens(self) -> int | None:
        return None if self.num_gpu_blocks is None else self.num_gpu_blocks * self.block_size


def labelled(name: str, label: str, value: str) -> str:
    """The key under which `parse_counters` stores one label value of a per-label metric."""
    return f'{name}{{{label}="{value}"}}'


# ---------------------------------------------------------------------------------------------
# values


def counter_delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    """A counter's increase between two scrapes; None when either lacks it. A counter that went down was
    reset (the server restarted), and counts 0, as AIPerf counts it."""
    if name not in before or name not in after:
        return None
    return max(after[name] - before[name], 0.0)


class ServerMetrics(msgspec.Struct, kw_only=True):
    """Counter values scraped from the server's `/metrics` as profiling starts and after the run (name → value)."""

    before: dict[str, float]
    after: dict[str, float]

    def delta(self, name: str) -> float | None:
        """The counter's increase over the run (`counter_delta`)."""
        return counter_delta(self.before, self.after, name)


_NAME: Final = re.compile(r"\s*([^\s{]+)")
"""A sample line's leading name (up to its labels or its value); comment lines start with `#`."""


def _candidate_lines(text: str, wanted: set[str]) -> Iterable[str]:
    """The lines of `text` that are samples of a `wanted` metric, by their leading name."""
    for line in text.splitlines():
        match = _NAME.match(line)
        if match is not None and match.group(1) in wanted:
            yield line


def parse_counters(
    text: str,
    names: Sequence[str] = CACHE_METRICS,
    labels: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Counter values from a Prometheus `/metrics` text, summed over label sets (one series per engine).

    A name in `labels` (name → label) is kept per value of that label instead, under the key
    `labelled(name, label, value)` (e.g. vLLM's accepted tokens per draft position), summed over its other
    labels; a sample without that label is left out. Malformed lines and non-finite values are skipped.
    """
    from prometheus_client.parser import text_string_to_metric_families  # only when a server has metrics

    wanted = set(names)
    per_label = labels or {}
    values: dict[str, float] = {}
    for line in _candidate_lines(text, wanted):
        try:
            samples = [sample for family in text_string_to_metric_families(line) for sample in family.samples]
        except ValueError as exc:
            _log.debug("/metrics: skipped a line the Prometheus parser rejects (%s): %r", exc, line)
            continue
        for sample in samples:
            value = float(sample.value)
            if sample.name not in wanted or not math.isfinite(value):
                continue
            key = sample.name
            if key in per_label:
                label = per_label[key]
                found = sample.labels.get(label)
                if found is None:
                    continue
                key = labelled(key, label, found)
            values[key] = values.get(key, 0.0) + value
    return values


def parse_cache_config(text: str) -> ServerCache | None:
    """The KV cache's block size and capacity from a Prometheus `/metrics` text (`CACHE_CONFIG_INFO`'s labels; the
    blocks of a data-parallel server's engines are summed); None when the text has no such sample with a positive
    integer `block_size`. A `num_gpu_blocks` that is absent or not a positive integer leaves the capacity unknown."""
    from prometheus_client.parser import text_string_to_metric_families

    block_size: int | None = None
    blocks: list[int | None] = []
    for line in _candidate_lines(text, {CACHE_CONFIG_INFO}):
        try:
            samples = [sample for family in text_string_to_metric_families(line) for sample in family.samples]
        except ValueError:
            continue
        for sample in samples:
            size = _positive_int(sample.labels.get("block_size"))
            if size is None or (block_size is not None and size != block_size):
                continue
            block_size = size
            blocks.append(_positive_int(sample.labels.get("num_gpu_blocks")))
    if block_size is None:
        return None
    known = None if None in blocks else sum(count for count in blocks if count is not None)
    return ServerCache(block_size=block_size, num_gpu_blocks=known)


def _positive_int(text: str | None) -> int | None:
    if text is None or not text.isdecimal():
        return None
    value = int(text)
    return value if value > 0 else None
