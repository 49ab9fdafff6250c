"""`profile_export_aiperf.json`: AIPerf's aggregate export of a run (AIPerf 0.13.0 `JsonExportData`, schema 1.4).

**Which requests.** The profiling phase's metrics sit at the top level, the warmup's under `warmup_metrics`
(omitted without warmup requests). Per-request metrics (`agentx.results.export.aiperf_metrics`) are aggregated over
the phase's successful requests, `error_isl` over its failed ones. In an agentx-mode run (the scenario
`inferencex-agentx-mvp`, AIPerf's AGENTIC_REPLAY timing) a context overflow is left out of everything — every
metric and count, `error_summary` — and counted in `context_overflow_count` and `skipped_context_overflow_count`,
as the reference does; in the other modes it is an ordinary failure.

**Statistics** of a per-request metric: `avg`, `p1`, `p5`, `p10`, `p25`, `p50`, `p75`, `p90`, `p95`, `p99`
(linear interpolation, `k = (n − 1)·p/100`), `min`, `max`, `std` (population), `count`, `sum`; undefined
values are left out, zeros kept (AIPerf drops NaN only). `inter_chunk_latency` pools every gap of the phase.

**Aggregates** (`{"unit", "avg"}`): `request_count` (successes), `error_request_count` (failures),
`completed_request_count`, `request_error_rate` (%), `context_overflow_count`, `total_isl`, `total_osl`,
`total_output_tokens`, `total_error_isl`, `total_usage_*_tokens`, `overall_usage_prompt_cache_read_pct`
(cache-read / prompt tokens · 100), `usage_discrepancy_count` (a usage diff above 10 %), `osl_mismatch_count`
(|OSL − requested| > min(5 % of requested, 50 tokens)), `benchmark_duration` (s: last successful request's last
content chunk − first successful request's send) and the throughputs, which AIPerf divides by the **phase
window**, not the benchmark duration: `request_throughput`, `input_token_throughput`,
`output_token_throughput`, `total_token_throughput`.

**The phase window** AIPerf reports as `start_time`/`end_time` (local time, ISO 8601) runs from the phase's
start to the return of its last request. agentx records neither, so: profiling starts when the last warmup
request ends (the engine starts it then) or, without a warmup, at the first profiling request's due time; it
ends at the last profiling request's end, or at start + `duration_s` if that is later and the run was not
interrupted. The warmup window runs from its first due time to its last end.

**Time-weighted metrics** (`effective_*`, `active_*`, `tokens_in_flight`; `agentx.results.export.time_weighted`) over
the phase window; `credit_to_start_latency` (sent − due) and `effective_latency` (end − due) over every
request of the phase; `adj_request_latency`, `adj_time_to_first_token`, `adj_inter_token_latency`,
`adj_decode_duration` when requests failed: the successes' values with one +∞ per failure, percentiles by
nearest rank, non-finite statistics left out; `theoretical_prefix_cache_hit`: 100·Σhit/Σtotal blocks (hits
clamped to the total) over successful requests, `sum` = hit blocks, `count` = blocks.

**Server telemetry**: `server_metrics`, when the run scraped its server's `/metrics` (server_metrics.arrow): the
document AIPerf writes to `server_metrics_export.json`, for the metrics agentx maps, over the profiling phase
(agentx.results.export.aiperf_server_metrics says where it differs).

**Run fields**: `schema_version`, `benchmark_id` (the `benchmark_id` option, else the run id), `run_info`
(`benchmark_id`, `random_seed` = `--seed`, `trial` 0), `was_cancelled` / `is_complete` / `incomplete_reason`
(an interrupted run, or one without run.json), `error_summary` (`{error_details, count}` per distinct error
of the profiling phase, in order of first appearance), `metadata`: `scenario` (the rule set's scenario in agentx
mode: `agentx` under agentx-harness 1.0.12, `inferencex-agentx-mvp` under AIPerf 0.13.0; else null),
`submission_valid`, `submission_invalid_reasons` (agentx.results.summary.checks.validity) and `agentx` (run id,
the rule set's name and reference, validity details, and `inferencex`: the metrics InferenceX's aggregation adds —
full-response and E2E-normalized interactivity, 1 s QPS windows — over the profiling phase's successful requests,
agentx.results.summary.inferencex).

**The rule set's schema** (agentx.replayer.options.rules, `export_harness_metrics`): a run of the agentx-harness 1.0.12
rules is written as the harness writes it: with `full_decode_duration`, `full_response_inter_token_latency` and
`full_response_output_token_throughput_per_user` (and their `adj_` variants when requests failed) beside AIPerf
0.13.0's metrics, `metadata.metric_duration_coverage` (`[{phase_name, expected_duration_seconds, required_ratio,
ttft_ratio, inter_token_latency_ratio}]`) when its coverage rule was applied, and without what its fork of AIPerf
lacks: `is_complete` and `incomplete_reason`, and `completed_request_count` and `request_error_rate` when no
request or every request failed (it derives them from both counts).

**Not exported** (the reference writes them; agentx cannot produce them):

- `aiperf_version`: the file is not written by AIPerf.
- `input_config`: AIPerf's configuration model; agentx's options differ, stay in run.json and are never copied
  here (no header or key can leak).
- `telemetry_data`: agentx collects no GPU telemetry.
- `branch_stats`: the counters of AIPerf's branch orchestrator (children spawned, truncated, joins
  suppressed, ...); agentx's engine keeps no such counters.
- `run_info.cli_command`: not stored (it could carry credentials).
- `error_summary[].error_details.cause_chain`: see profile_export.jsonl.
- `http_req_blocked`, `http_req_dns_lookup`, `http_req_connecting`, `http_req_sending`, `http_req_data_sent`,
  `http_req_data_received`, `http_req_chunks_sent`, `http_req_chunks_received`, `http_req_connection_reused`
  (also under `warmup_metrics`): not measured, see profile_export.jsonl.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa

from agentx.results.export.aiperf_jsonl import error_details
from agentx.results.export.aiperf_metrics import (
    DEFINITIONS,
    LIST_TAGS,
    NS_PER_MS,
    NS_PER_S,
    RecordMetrics,
    RunContext,
    column,
    record_metrics,
    run_context,
)
from agentx.results.export.aiperf_server_metrics import server_metrics_export
from agentx.results.export.time_weighted import sweep_metrics
from agentx.results.summary.checks.validity import Validity, validity
from agentx.results.summary.columns import equals, strings
from agentx.results.summary.inferencex import inferencex_metrics
from agentx.results.summary.stats import BoolArray, FloatArray

SCHEMA_VERSION: Final = "1.4"
PERCENTILES: Final = (1, 5, 10, 25, 50, 75, 90, 95, 99)
ADJUSTED: Final = ("request_latency", "time_to_first_token", "inter_token_latency", "decode_duration")
"""AIPerf's metrics flagged PERCENTILE_INCLUDES_FAILED_REQUESTS: they get an `adj_` variant."""
HARNESS_ADJUSTED: Final = ("full_decode_duration", "full_response_inter_token_latency")
"""The harness's metrics with the same flag."""
USAGE_DIFF_THRESHOLD_PCT: Final = 10.0
OSL_MISMATCH_THRESHOLD_PCT: Final = 5.0
OSL_MISMATCH_MAX_TOKENS: Final = 50
_HTTP_NOT_MEASURED: Final = (
    "http_req_blocked",
    "http_req_dns_lookup",
    "http_req_connecting",
    "http_req_sending",
    "http_req_data_sent",
    "http_req_data_received",
    "http_req_chunks_sent",
    "http_req_chunks_received",
    "http_req_connection_reused",
)

NOT_EXPORTED: Final[dict[str, str]] = {
    "summary.top.aiperf_version": "the file is not written by AIPerf",
    "summary.top.input_config": "AIPerf's configuration model; agentx's options stay in run.json",
    "summary.top.telemetry_data": "agentx collects no GPU telemetry",
    "summary.top.branch_stats": "agentx's engine keeps no branch-orchestrator counters",
    "summary.run_info.cli_command": "not stored (it could carry credentials)",
    "summary.error_details.cause_chain": "agentx keeps an error kind and a message, not the exception chain",
    **{
        f"summary.{part}.{tag}": "not measured (see profile_export.jsonl)"
        for part in ("metrics", "warmup_metrics")
        for tag in _HTTP_NOT_MEASURED
    },
}
"""`file.part.key` → why agentx leaves it out (see the module docstring)."""


def stats_block(values: FloatArray, unit: str) -> dict[str, Any] | None:
    """AIPerf's statistics of the defined values (None when there are none)."""
    data = np.sort(values[~np.isnan(values)])
    n = data.size
    if n == 0:
        return None
    position = np.array(PERCENTILES, dtype=np.float64) / 100.0 * (n - 1)
    low = position.astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    points = data[low] + (position - low) * (data[high] - data[low])
    total = float(data.sum())
    block: dict[str, Any] = {"unit": unit, "avg": total / n}
    block |= {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}
    block |= {"min": float(data[0]), "max": float(data[-1]), "std": float(data.std()), "count": int(n), "sum": total}
    return block


def _adjusted_block(values: FloatArray, failures: int, unit: str) -> dict[str, Any] | None:
    """The successes' values plus one +∞ per failure; nearest-rank percentiles; non-finite entries left out."""
    data = np.sort(values[~np.isnan(values)])
    inflated = np.concatenate([data, np.full(failures, np.inf)])
    if inflated.size == 0:
        return None
    points = np.percentile(inflated, PERCENTILES, method="nearest")
    candidates: dict[str, float] = {
        "avg": float(np.mean(inflated)),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)},
        "min": float(np.min(inflated)),
        "max": float(np.max(inflated)),
        "sum": float(np.sum(inflated)),
    }
    block: dict[str, Any] = {"unit": unit}
    block |= {key: value for key, value in candidates.items() if np.isfinite(value)}
    block["count"] = int(inflated.size)
    return block


def _scalar(value: float | int, unit: str) -> dict[str, Any]:
    return {"unit": unit, "avg": value}


def phase_windows(table: pa.Table, ctx: RunContext) -> dict[str, tuple[float, float] | None]:
    """The warmup's and the profiling phase's [start, end] in ns after the run start (see the module docstring)."""
    warmup = equals(table, "phase", "warmup")
    profiling = ~warmup
    scheduled, end = column(table, "scheduled_ns"), column(table, "end_ns")
    windows: dict[str, tuple[float, float] | None] = {"warmup": None, "profiling": None}
    if warmup.any():
        windows["warmup"] = (float(np.nanmin(scheduled[warmup])), float(np.nanmax(end[warmup])))
    if profiling.any():
        lo = float(np.nanmax(end[warmup])) if warmup.any() else float(np.nanmin(scheduled[profiling]))
        hi = float(np.nanmax(end[profiling]))
        duration = ctx.options.get("duration_s")
        if isinstance(duration, int | float) and not isinstance(duration, bool) and not ctx.interrupted:
            hi = max(hi, lo + float(duration) * NS_PER_S)
        windows["profiling"] = (lo, max(lo, hi))
    return windows


def _window_s(window: tuple[float, float] | None) -> float | None:
    if window is None or window[1] <= window[0]:
        return None
    return (window[1] - window[0]) / NS_PER_S


def phase_metrics(
    table: pa.Table,
    metrics: RecordMetrics,
    phase: BoolArray,
    window: tuple[float, float] | None,
    skipped_overflows: int,
    harness: bool = False,
) -> dict[str, dict[str, Any]]:
    """Every metric block of one phase (`phase`: its rows, overflow records already left out); `harness`: in the
    agentx-harness's schema (the module docstring)."""
    valid, failed = phase & metrics.ok, phase & ~metrics.ok
    result: dict[str, dict[str, Any]] = {}
    for tag, (unit, _) in DEFINITIONS.items():
        if tag in LIST_TAGS:
            block = stats_block(metrics.icl_ms[valid[metrics.icl_rows]], unit)
        else:
            block = stats_block(metrics.values[tag][failed if tag == "error_isl" else valid], unit)
        if block is not None:
            result[tag] = block

    successes, failures = int(valid.sum()), int(failed.sum())
    overflow = failed & equals(table, "error_kind", "context_overflow")
    result["request_count"] = _scalar(successes, "requests")
    result["error_request_count"] = _scalar(failures, "requests")
    # The harness derives these two from both counts and drops them when either is zero.
    if not harness or (successes and failures):
        result["completed_request_count"] = _scalar(successes + failures, "requests")
        if successes + failures:
            result["request_error_rate"] = _scalar(100.0 * failures / (successes + failures), "%")
    result["context_overflow_count"] = _scalar(int(overflow.sum()) + skipped_overflows, "requests")
    if skipped_overflows:
        result["skipped_context_overflow_count"] = _scalar(skipped_overflows, "requests")

    def total(tag: str, rows: BoolArray) -> float | None:
        values = metrics.values[tag][rows]
        values = values[~np.isnan(values)]
        return float(values.sum()) if values.size else None

    totals = {
        "total_isl": total("input_sequence_length", valid),
        "total_osl": total("output_sequence_length", valid),
        "total_output_tokens": total("output_token_count", valid),
        "total_error_isl": total("error_isl", failed),
        "total_usage_prompt_tokens": total("usage_prompt_tokens", valid),
        "total_usage_completion_tokens": total("usage_completion_tokens", valid),
        "total_usage_total_tokens": total("usage_total_tokens", valid),
        "total_usage_prompt_cache_read_tokens": total("usage_prompt_cache_read_tokens", valid),
    }
    result |= {tag: _scalar(value, "tokens") for tag, value in totals.items() if value is not None}
    prompt, cache_read = totals["total_usage_prompt_tokens"], totals["total_usage_prompt_cache_read_tokens"]
    if prompt and cache_read is not None:
        result["overall_usage_prompt_cache_read_pct"] = _scalar(100.0 * cache_read / prompt, "%")

    prompt_diff = metrics.values["usage_prompt_tokens_diff_pct"][valid]
    completion_diff = metrics.values["usage_completion_tokens_diff_pct"][valid]
    both = ~np.isnan(prompt_diff) & ~np.isnan(completion_diff)
    if both.any():
        over = (prompt_diff[both] > USAGE_DIFF_THRESHOLD_PCT) | (completion_diff[both] > USAGE_DIFF_THRESHOLD_PCT)
        result["usage_discrepancy_count"] = _scalar(int(over.sum()), "requests")
    mismatch = metrics.values["osl_mismatch_diff_pct"][valid]
    known = ~np.isnan(mismatch)
    if known.any():
        requested, actual = metrics.requested_osl[valid][known], metrics.osl[valid][known]
        limit = np.minimum(requested * OSL_MISMATCH_THRESHOLD_PCT / 100.0, OSL_MISMATCH_MAX_TOKENS)
        result["osl_mismatch_count"] = _scalar(int((np.abs(actual - requested) > limit).sum()), "requests")

    sent, end = column(table, "sent_ns"), column(table, "end_ns")
    if successes:
        last_chunk = sent + metrics.values["request_latency"] * NS_PER_MS
        first_sent = float(np.nanmin(sent[valid]))
        ends = last_chunk[valid & ~np.isnan(last_chunk)]
        if ends.size and float(ends.max()) > first_sent:
            result["benchmark_duration"] = _scalar((float(ends.max()) - first_sent) / NS_PER_S, "sec")
    observed = _window_s(window)
    if observed is None and "benchmark_duration" in result:
        observed = float(result["benchmark_duration"]["avg"])
    if observed:
        if successes:
            result["request_throughput"] = _scalar(successes / observed, "requests/sec")
        isl, osl = totals["total_isl"], totals["total_osl"]
        if isl is not None:
            result["input_token_throughput"] = _scalar(isl / observed, "tokens/sec")
        if osl is not None:
            result["output_token_throughput"] = _scalar(osl / observed, "tokens/sec")
        if isl is not None and osl is not None:
            result["total_token_throughput"] = _scalar((isl + osl) / observed, "tokens/sec")

    if failures:
        for tag in ADJUSTED + (HARNESS_ADJUSTED if harness else ()):
            block = _adjusted_block(metrics.values[tag][valid], failures, "ms")
            if block is not None:
                result[f"adj_{tag}"] = block

    nan = np.full(table.num_rows, np.nan)
    start_in, end_in = np.where(phase, sent, nan), np.where(phase, end, nan)
    gen = np.where(valid, column(table, "first_token_ns"), nan)
    gaps = metrics.icl_ms * NS_PER_MS
    chunks = (gaps, metrics.icl_rows) if gaps.size else None
    isl_in, osl_in = np.where(valid, metrics.values["input_sequence_length"], nan), np.where(valid, metrics.osl, nan)
    result |= sweep_metrics(start_in, end_in, gen, isl_in, osl_in, chunks, window)

    scheduled = column(table, "scheduled_ns")
    for tag, until in (("credit_to_start_latency", sent), ("effective_latency", end)):
        delta = (until - scheduled)[phase]
        block = stats_block(np.maximum(delta[~np.isnan(delta)], 0.0) / NS_PER_MS, "ms")
        if block is not None:
            result[tag] = block

    hits, blocks = column(table, "theoretical_hit_blocks")[valid], column(table, "theoretical_total_blocks")[valid]
    usable = ~np.isnan(hits) & ~np.isnan(blocks) & (blocks > 0)
    hit_sum = int(np.clip(hits[usable], 0, blocks[usable]).sum())
    block_sum = int(blocks[usable].sum())
    if block_sum > 0:
        result["theoretical_prefix_cache_hit"] = {
            "unit": "%",
            "avg": 100.0 * hit_sum / block_sum,
            "sum": hit_sum,
            "count": block_sum,
        }
    return result


def _error_summary(table: pa.Table, rows: BoolArray) -> list[dict[str, Any]]:
    kinds, messages = strings(table, "error_kind"), strings(table, "error_message")
    statuses = column(table, "http_status")
    counts: dict[bytes, list[Any]] = {}
    for i in np.flatnonzero(rows):
        status = None if np.isnan(statuses[i]) else int(statuses[i])
        details = error_details(kinds[i] or None, status, messages[i] or None)
        key = msgspec.json.encode(details)
        counts.setdefault(key, [details, 0])[1] += 1
    return [{"error_details": details, "count": count} for details, count in counts.values()]


def _iso(epoch_ns: int, offset_ns: float) -> str:
    return datetime.datetime.fromtimestamp((epoch_ns + offset_ns) / NS_PER_S).isoformat()


def aiperf_summary(table: pa.Table, run_file: Mapping[str, Any] | msgspec.Struct | None) -> dict[str, Any]:
    """The `profile_export_aiperf.json` document of a records table and its run file (None: no run.json)."""
    ctx = run_context(table, run_file)
    metrics = record_metrics(table, ctx)
    warmup = equals(table, "phase", "warmup")
    profiling = ~warmup
    skipped = (
        equals(table, "error_kind", "context_overflow") & ~metrics.ok
        if ctx.agentic
        else np.zeros(table.num_rows, dtype=bool)
    )
    windows = phase_windows(table, ctx)
    benchmark_id = ctx.options.get("benchmark_id") or ctx.run_id
    document: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "benchmark_id": benchmark_id}
    harness = ctx.rules.export_harness_metrics
    document |= phase_metrics(
        table, metrics, profiling & ~skipped, windows["profiling"], int((profiling & skipped).sum()), harness
    )
    seed = ctx.options.get("seed")
    document["run_info"] = {
        "benchmark_id": benchmark_id,
        "random_seed": seed if isinstance(seed, int) else None,
        "trial": 0,
    }
    document["was_cancelled"] = ctx.interrupted
    if not harness:  # the harness's fork predates these two
        document["is_complete"] = not ctx.interrupted
    if ctx.interrupted and not harness:
        document["incomplete_reason"] = (
            "Run cancelled before all records were processed."
            if ctx.has_run_file
            else "The run wrote no run.json (it did not finish)."
        )
    document["error_summary"] = _error_summary(table, profiling & ~skipped & ~metrics.ok)
    if windows["profiling"] is not None:
        document["start_time"] = _iso(ctx.epoch_ns, windows["profiling"][0])
        document["end_time"] = _iso(ctx.epoch_ns, windows["profiling"][1])
    if warmup.any():
        document["warmup_metrics"] = phase_metrics(
            table, metrics, warmup & ~skipped, windows["warmup"], int((warmup & skipped).sum()), harness
        )
    server_metrics = server_metrics_export(_summary_part(run_file, "server_telemetry"), _url(ctx), ctx.epoch_ns)
    if server_metrics is not None:
        document["server_metrics"] = server_metrics
    verdict: Validity = validity(table, run_file)
    document["metadata"] = {
        "scenario": ctx.scenario,
        "submission_valid": verdict.valid,
        "submission_invalid_reasons": verdict.reasons,
        "agentx": {
            "run_id": ctx.run_id,
            "rules": {"name": ctx.rules.name, "reference": ctx.rules.reference},
            "validity": verdict.details,
            "inferencex": msgspec.to_builtins(inferencex_metrics(table.filter(pa.array(profiling & metrics.ok)))),
        },
    }
    coverage = verdict.details.get("metric_duration_coverage")
    if harness and ctx.agentic and isinstance(coverage, Mapping) and coverage.get("applies") and not ctx.interrupted:
        document["metadata"]["metric_duration_coverage"] = [
            {key: value for key, value in coverage.items() if key != "applies"}
        ]
    return document


def _summary_part(run_file: Mapping[str, Any] | msgspec.Struct | None, name: str) -> Any:
    """A part of the run file's summary (None without a run file, a summary or that part)."""
    document = msgspec.to_builtins(run_file) if isinstance(run_file, msgspec.Struct) else run_file
    summary = document.get("summary") if isinstance(document, Mapping) else None
    return summary.get(name) if isinstance(summary, Mapping) else None


def _url(ctx: RunContext) -> str | None:
    url = ctx.options.get("url")
    return url if isinstance(url, str) else None
