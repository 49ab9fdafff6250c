"""The series of a run's server telemetry (`server_metrics.arrow`, agentx.replayer.telemetry.scrape) and each engine's
own names for them.

`TELEMETRY` maps the names of vLLM, SGLang, llama.cpp (`--metrics`), TensorRT-LLM (`trtllm-serve`, whose Prometheus
text is at `/prometheus/metrics`) and ATOM onto one set of agentx series (`requests_running`,
`kv_cache_usage_ratio`, ...); names of other engines, and every other name, are left out. `read_samples` picks the
samples of those names out of a scrape cheaply: it runs every second on the replay's event loop, so it compares line
starts and parses only the lines it keeps (0.4 ms for a 160 kB vLLM exposition of 1,400 lines), never the whole
text. `detect_engine` says whose names a server uses; `telemetry_values` reads one scrape as agentx series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from agentx.engines import ENGINES, Engine
from agentx.replayer.telemetry.metrics import (
    ATOM_ACCEPTED,
    ATOM_DRAFT_TOKENS,
    ATOM_TOKENS_PER_FORWARD,
    LLAMACPP_ACCEPTED,
    LLAMACPP_CACHED_TOKENS,
    LLAMACPP_DRAFT_TOKENS,
    LLAMACPP_DRAFTS,
    LLAMACPP_PROMPT_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    SGLANG_ACCEPT_LENGTH,
    VLLM_ACCEPTED,
    VLLM_DRAFT_TOKENS,
    VLLM_DRAFTS,
)

Sources = tuple[tuple[str, ...], ...]
"""An engine's ways to read one series, tried in order: the first whose names are all exposed is read, as the sum
of those names' values (llama.cpp's prompt tokens are its cached ones plus those it computed)."""


class TelemetrySeries(msgspec.Struct, frozen=True, kw_only=True):
    """One agentx series of `server_metrics.arrow` and the names each engine exposes it under."""

    name: str
    """The column of server_metrics.arrow."""
    kind: Literal["gauge", "counter"]
    """A gauge is a level at the scrape; a counter only grows (what it counted since the server started)."""
    unit: str
    meaning: str
    sources: dict[Engine, Sources]
    average: bool = False
    """Several label sets (data-parallel engines, several models) are averaged, not summed: a ratio."""


def _one(*names: str) -> Sources:
    """Alternative names of one metric (a renamed one last), each read on its own."""
    return tuple((name,) for name in names)


TELEMETRY: Final = (
    TelemetrySeries(
        name="requests_running",
        kind="gauge",
        unit="requests",
        meaning="requests in the engine's running batch",
        sources={
            "vllm": _one("vllm:num_requests_running"),
            "sglang": _one("sglang:num_running_reqs"),
            "llamacpp": _one("llamacpp:requests_processing"),
            "trtllm": _one("trtllm_num_requests_running"),
        },
    ),
    TelemetrySeries(
        name="requests_waiting",
        kind="gauge",
        unit="requests",
        meaning="requests queued, not yet scheduled",
        sources={
            "vllm": _one("vllm:num_requests_waiting"),
            "sglang": _one("sglang:num_queue_reqs"),
            "llamacpp": _one("llamacpp:requests_deferred"),
            "trtllm": _one("trtllm_num_requests_waiting"),
        },
    ),
    TelemetrySeries(
        name="kv_cache_usage_ratio",
        kind="gauge",
        unit="ratio",
        meaning="share of the KV cache in use, 0 to 1",
        sources={
            "vllm": _one("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "sglang": _one("sglang:token_usage"),
            "llamacpp": _one("llamacpp:kv_cache_usage_ratio"),
            "trtllm": _one("trtllm_kv_cache_utilization"),
        },
        average=True,
    ),
    TelemetrySeries(
        name="prefix_cache_hits_total",
        kind="counter",
        unit="tokens",
        meaning="prompt tokens served from the prefix cache (TensorRT-LLM: KV blocks reused)",
        sources={
            "vllm": _one(PREFIX_CACHE_HITS, "vllm:gpu_prefix_cache_hits_total"),
            "sglang": _one("sglang:cached_tokens_total"),
            "llamacpp": _one(LLAMACPP_CACHED_TOKENS),
            "trtllm": _one("trtllm_kv_cache_reused_blocks_total"),
        },
    ),
    TelemetrySeries(
        name="prefix_cache_queries_total",
        kind="counter",
        unit="tokens",
        meaning="prompt tokens looked up in the prefix cache (TensorRT-LLM: KV blocks reused or missed)",
        sources={
            "vllm": _one(PREFIX_CACHE_QUERIES, "vllm:gpu_prefix_cache_queries_total"),
            "sglang": _one("sglang:prompt_tokens_total"),
            "llamacpp": ((LLAMACPP_CACHED_TOKENS, LLAMACPP_PROMPT_TOKENS),),
            "trtllm": (("trtllm_kv_cache_reused_blocks_total", "trtllm_kv_cache_missed_blocks_total"),),
        },
    ),
    TelemetrySeries(
        name="prefix_cache_hit_ratio",
        kind="gauge",
        unit="ratio",
        meaning="the engine's own prefix-cache hit rate, 0 to 1 (engines without hit and query counters)",
        sources={"sglang": _one("sglang:cache_hit_rate"), "trtllm": _one("trtllm_kv_cache_hit_rate")},
        average=True,
    ),
    TelemetrySeries(
        name="prompt_tokens_total",
        kind="counter",
        unit="tokens",
        meaning="prompt tokens of the requests the engine took in, cached ones included",
        sources={
            "vllm": _one("vllm:prompt_tokens_total"),
            "sglang": _one("sglang:prompt_tokens_total"),
            "llamacpp": ((LLAMACPP_CACHED_TOKENS, LLAMACPP_PROMPT_TOKENS),),
            "trtllm": _one("trtllm_prompt_tokens_total"),
        },
    ),
    TelemetrySeries(
        name="generation_tokens_total",
        kind="counter",
        unit="tokens",
        meaning="output tokens generated",
        sources={
            "vllm": _one("vllm:generation_tokens_total"),
            "sglang": _one("sglang:generation_tokens_total"),
            "llamacpp": _one("llamacpp:tokens_predicted_total"),
            "trtllm": _one("trtllm_generation_tokens_total"),
        },
    ),
    TelemetrySeries(
        name="preemptions_total",
        kind="counter",
        unit="requests",
        meaning="running requests preempted (SGLang: retracted) for want of KV cache",
        sources={
            "vllm": _one("vllm:num_preemptions_total"),
            "sglang": _one("sglang:num_retracted_requests_total"),
        },
    ),
    TelemetrySeries(
        name="ttft_seconds_total",
        kind="counter",
        unit="seconds",
        meaning="the server's own time to first token, summed over its requests (its histogram's sum)",
        sources={
            "vllm": _one("vllm:time_to_first_token_seconds_sum"),
            "sglang": _one("sglang:time_to_first_token_seconds_sum"),
        },
    ),
    TelemetrySeries(
        name="ttft_requests_total",
        kind="counter",
        unit="requests",
        meaning="requests in the server's time-to-first-token histogram (its count)",
        sources={
            "vllm": _one("vllm:time_to_first_token_seconds_count"),
            "sglang": _one("sglang:time_to_first_token_seconds_count"),
        },
    ),
    TelemetrySeries(
        name="spec_drafts_total",
        kind="counter",
        unit="steps",
        meaning="speculative verification steps (one draft per request per step)",
        sources={"vllm": _one(VLLM_DRAFTS), "llamacpp": _one(LLAMACPP_DRAFTS)},
    ),
    TelemetrySeries(
        name="spec_draft_tokens_total",
        kind="counter",
        unit="tokens",
        meaning="draft tokens proposed",
        sources={
            "vllm": _one(VLLM_DRAFT_TOKENS),
            "llamacpp": _one(LLAMACPP_DRAFT_TOKENS),
            "atom": _one(ATOM_DRAFT_TOKENS),
            "trtllm": _one("trtllm_spec_decode_num_draft_tokens_total"),
        },
    ),
    TelemetrySeries(
        name="spec_accepted_tokens_total",
        kind="counter",
        unit="tokens",
        meaning="draft tokens accepted",
        sources={
            "vllm": _one(VLLM_ACCEPTED),
            "llamacpp": _one(LLAMACPP_ACCEPTED),
            "atom": _one(ATOM_ACCEPTED),
            "trtllm": _one("trtllm_spec_decode_num_accepted_tokens_total"),
        },
    ),
    TelemetrySeries(
        name="spec_acceptance_length",
        kind="gauge",
        unit="tokens per step",
        meaning="the engine's own acceptance length over its last logging interval (engines without counters)",
        sources={
            "sglang": _one(SGLANG_ACCEPT_LENGTH),
            "atom": _one(ATOM_TOKENS_PER_FORWARD),
            "trtllm": _one("trtllm_spec_decode_acceptance_length"),
        },
        average=True,
    ),
)
"""Every series of server_metrics.arrow, in its column order."""
TELEMETRY_NAMES: Final = tuple(series.name for series in TELEMETRY)


def engine_names(engine: Engine | None = None) -> tuple[str, ...]:
    """Every metric name `TELEMETRY` reads from `engine` (None: from any engine)."""
    found = {
        name
        for series in TELEMETRY
        for owner, sources in series.sources.items()
        if engine is None or owner == engine
        for alternative in sources
        for name in alternative
    }
    return tuple(sorted(found))


def read_samples(text: str, names: tuple[str, ...]) -> dict[str, list[float]]:
    """The finite values of the samples named `names` in a Prometheus text exposition, one per label set.

    Only lines that start with one of `names` are parsed (a sample line is `name[{labels}] value [timestamp]`);
    a line whose value is not a number is skipped, as is a NaN or infinite value.
    """
    wanted = set(names)
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        end = len(line)
        for stop in ("{", " ", "\t"):
            found = line.find(stop)
            if 0 <= found < end:
                end = found
        name = line[:end]
        if name not in wanted:
            continue  # a longer name that starts like a wanted one
        rest = line[line.rfind("}") + 1 :] if line[end : end + 1] == "{" else line[end:]
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            values.setdefault(name, []).append(value)
    return values


def _read(series: TelemetrySeries, sources: Sources, samples: Mapping[str, list[float]]) -> float | None:
    for alternative in sources:
        if all(name in samples for name in alternative):
            per_name = [samples[name] for name in alternative]
            if series.average:
                return sum(sum(values) / len(values) for values in per_name)
            return sum(sum(values) for values in per_name)
    return None


def detect_engine(samples: Mapping[str, list[float]]) -> Engine | None:
    """The engine whose names give the most series in `samples` (the first in `ENGINES` at a tie); None if none."""
    best: Engine | None = None
    best_count = 0
    for engine in ENGINES:
        count = sum(
            1
            for series in TELEMETRY
            if engine in series.sources and _read(series, series.sources[engine], samples) is not None
        )
        if count > best_count:
            best, best_count = engine, count
    return best


def telemetry_values(samples: Mapping[str, list[float]], engine: Engine) -> dict[str, float]:
    """One scrape as agentx series (series name → value) under `engine`'s names; a series it lacks is absent.

    Several label sets of a name (data-parallel engines, several models) are summed, a ratio's averaged."""
    values: dict[str, float] = {}
    for series in TELEMETRY:
        sources = series.sources.get(engine)
        if sources is not None and (value := _read(series, sources, samples)) is not None:
            values[series.name] = value
    return values


def telemetry_sources(samples: Mapping[str, list[float]], engine: Engine) -> dict[str, list[str]]:
    """For each series read from `samples`, the engine's names it was read from (the AIPerf export keys on them)."""
    found: dict[str, list[str]] = {}
    for series in TELEMETRY:
        for alternative in series.sources.get(engine, ()):
            if all(name in samples for name in alternative):
                found[series.name] = list(alternative)
                break
    return found
