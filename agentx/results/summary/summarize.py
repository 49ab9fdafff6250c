"""The summary of a replay run, computed from its records table with the InferenceX conventions.

Records kept for latency and throughput: `phase = "profiling"` and `status = "ok"` (a missing phase column
counts as profiling, as in InferenceX). Latency statistics drop non-finite and ≤ 0 values; percentiles use
linear interpolation at `k = (n − 1)·p/100` (`percentile`); std is the population standard deviation.
Metric names are vLLM's: TTFT, TPOT (per request, (E2EL − TTFT)/(OSL − 1)), ITL (the gaps between streamed
chunks), E2EL. Interactivity is 1/TPOT *per statistic*, so `p90` interactivity = 1/(p90 TPOT), the slow tail
(one direction for every rate, agentx.results.summary.stats.rate_percentile); its std is the pstdev of per-request
1/TPOT. Duration = max `end_ns` − min `sent_ns` over the kept rows; throughput divides ΣISL, ΣOSL and
Σ(ISL + OSL) by it, with ISL = server prompt tokens else sent and OSL = server completion tokens else streamed
(the OSL `tpot_s` uses).

Slowdown against the trace and the per-play roll-ups: agentx.results.summary.plays. The structs:
agentx.results.summary.model; the statistics: agentx.results.summary.stats.

Everything is read from the table's columns, so a file written by an older or newer minor version works:
optional columns that are absent yield `None` for the quantities that need them. The chunk lists, nearly all of a
long run's records, are read a slice at a time (agentx.results.summary.run_records): ITL and tokens per chunk are
exact without holding them (agentx.results.summary.population), so a summary's memory does not grow with the chunks.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from agentx.errors import RecordsError
from agentx.records.record import run_info
from agentx.replayer.telemetry.metrics import (
    LLAMACPP_CACHED_TOKENS,
    LLAMACPP_PROMPT_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    ServerMetrics,
)
from agentx.results.summary.checks.audit import audit
from agentx.results.summary.columns import equals, floats, has, ints_or, strings
from agentx.results.summary.energy import load_energy_table, summarize_energy, throughput_window_ns
from agentx.results.summary.explain.cache_misses import cache_misses
from agentx.results.summary.explain.critical_path import critical_path
from agentx.results.summary.goodput import goodput
from agentx.results.summary.inferencex import inferencex_metrics
from agentx.results.summary.model import (
    Cache,
    Counts,
    DispatchLag,
    Interactivity,
    Latency,
    LoopLag,
    Summary,
    Throughput,
)
from agentx.results.summary.plays import rollups, slowdown
from agentx.results.summary.run_records import RunRecords
from agentx.results.summary.server_notices import server_notice_counts
from agentx.results.summary.server_telemetry import summarize_telemetry
from agentx.results.summary.stats import SHOWN_PERCENTILES, percentiles_sorted, positive, stats
from agentx.results.summary.tasks import task_costs

__all__ = ["RunRecords", "ServerMetrics", "Summary", "summarize", "summarize_run"]
"""What callers of `summarize` need; the structs are in agentx.results.summary.model."""


def _failures(failed: pa.Table) -> tuple[dict[str, int], dict[str, int], int]:
    """The failed profiling records' counts: errors by kind (in name order), the `http` ones by status (in code
    order), and cancellations (not errors)."""
    kinds = strings(failed, "error_kind", None) if failed.num_rows else []
    statuses = failed.column("http_status").to_pylist() if failed.num_rows and has(failed, "http_status") else []
    by_kind: dict[str, int] = {}
    by_status: dict[int, int] = {}
    for kind, status in itertools.zip_longest(kinds, statuses):
        if kind == "cancelled":
            continue
        by_kind[kind or "unknown"] = by_kind.get(kind or "unknown", 0) + 1
        if kind == "http" and status is not None:
            by_status[status] = by_status.get(status, 0) + 1
    cancelled = sum(kind == "cancelled" for kind in kinds)
    return dict(sorted(by_kind.items())), {str(code): by_status[code] for code in sorted(by_status)}, cancelled


def summarize(
    records: pa.Table | str | os.PathLike[str],
    *,
    num_gpus: int | None = None,
    server_metrics: ServerMetrics | None = None,
    loop_lag_s: Sequence[float] | None = None,
    telemetry: pa.Table | None = None,
    percentiles: Sequence[float] = SHOWN_PERCENTILES,
    trees_cut: bool = True,
    gpu_metrics: pa.Table | None = None,
) -> Summary:
    """The summary of a run from its records: a records file (read a batch at a time) or its table
    (`read_records`); `summarize_run` says the rest."""
    run = RunRecords.of(records) if isinstance(records, pa.Table) else RunRecords.read(records)
    return summarize_run(
        run,
        num_gpus=num_gpus,
        server_metrics=server_metrics,
        loop_lag_s=loop_lag_s,
        telemetry=telemetry,
        percentiles=percentiles,
        trees_cut=trees_cut,
        gpu_metrics=gpu_metrics,
    )


def summarize_run(
    run: RunRecords,
    *,
    num_gpus: int | None = None,
    server_metrics: ServerMetrics | None = None,
    loop_lag_s: Sequence[float] | None = None,
    telemetry: pa.Table | None = None,
    percentiles: Sequence[float] = SHOWN_PERCENTILES,
    trees_cut: bool = True,
    gpu_metrics: pa.Table | None = None,
) -> Summary:
    """The summary of a run from its records as `RunRecords` (a file read a batch at a time, or a table); an empty
    table gives zero counts.

    `trees_cut`: whether the run ended with trees unfinished, which decides the tasks it counts
    (agentx.results.summary.tasks); true when unknown.

    `loop_lag_s`: the run's event-loop lag samples (`RunResult.loop_lag_s`), summarized next to dispatch lag.
    `telemetry`: its server_metrics.arrow (`load_server_metrics`), summarized over the profiling phase.
    `percentiles`: the ones the summary shows (`--percentiles`), computed for every latency.
    `gpu_metrics`: its gpu_metrics.arrow (default: the one beside a records file read), for `energy`.
    """
    if num_gpus is not None and num_gpus < 1:
        raise ValueError(f"num_gpus must be ≥ 1, got {num_gpus}")
    records = run.table
    # A missing phase counts as profiling (InferenceX), a missing status as ok.
    profiling = ~equals(records, "phase", "warmup", missing=False)
    ok = equals(records, "status", "ok", missing=True)
    kept_mask = profiling & ok

    errors_by_kind, errors_by_status, cancelled = _failures(records.filter(pa.array(profiling & ~ok)))
    kept = int(kept_mask.sum())
    counts = Counts(
        rows=records.num_rows,
        kept=kept,
        profiling=int(profiling.sum()),
        errors=sum(errors_by_kind.values()),
        errors_by_kind=errors_by_kind,
        errors_by_status=errors_by_status,
        cancelled=cancelled,
        warmup_excluded=int((~profiling).sum()),
        server_notices=server_notice_counts(records, profiling),
    )
    table = records.filter(pa.array(kept_mask)) if records.num_rows else records

    tpot_values = positive(floats(table, "tpot_s"))
    tpot = stats(tpot_values, percentiles)
    latency = Latency(
        ttft_s=stats(positive(floats(table, "ttft_s")), percentiles),
        tpot_s=tpot,
        itl_s=run.itl_stats(percentiles),
        e2el_s=stats(positive(floats(table, "e2el_s")), percentiles),
        interactivity_tps=Interactivity.of(tpot, tpot_values),
        chunk_tokens=run.chunk_token_stats(percentiles),
    )
    throughput = _throughput(table, num_gpus)
    summary = Summary(
        run_id=_run_id(records),
        counts=counts,
        latency=latency,
        goodput=goodput(records, profiling, throughput.duration_s if throughput is not None else None),
        throughput=throughput,
        cache=_cache(table, server_metrics),
        dispatch_lag=_dispatch_lag(records.filter(pa.array(profiling)) if records.num_rows else records),
        loop_lag=_loop_lag(loop_lag_s),
        rollups=rollups(records, kept_mask),
        slowdown=slowdown(table),
        server_telemetry=summarize_telemetry(telemetry, records),
        percentiles=list(percentiles),
        inferencex=inferencex_metrics(table, percentiles),
        rules=_rules(records),
    )
    total_tps_per_gpu = throughput.total_tps_per_gpu if throughput is not None else None
    summary.tasks = task_costs(records, total_tps_per_gpu, trees_cut=trees_cut)
    if gpu_metrics is None and run.path is not None:
        gpu_metrics = load_energy_table(run.path)
    summary.energy = summarize_energy(
        gpu_metrics,
        records,
        throughput_window_ns(table),
        input_tokens=throughput.input_tokens if throughput is not None else 0,
        output_tokens=throughput.output_tokens if throughput is not None else 0,
        tasks=summary.tasks.completed if summary.tasks is not None else None,
    )
    summary.critical_path = critical_path(records)
    summary.cache_misses = cache_misses(table, records)
    summary.audit = audit(records, summary)
    return summary


def _run_id(table: pa.Table) -> str | None:
    metadata = table.schema.metadata or {}
    if b"agentx.run_id" in metadata:
        return bytes(metadata[b"agentx.run_id"]).decode()
    if has(table, "run_id") and table.num_rows:
        return str(table.column("run_id")[0].as_py())
    return None


def _rules(table: pa.Table) -> str | None:
    """The rule set the records' options name (None: a file that predates rule sets, or a table without them)."""
    try:
        name = run_info(table).options.get("rules")
    except RecordsError:
        return None
    return name if isinstance(name, str) else None


def _throughput(table: pa.Table, num_gpus: int | None) -> Throughput | None:
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return None
    duration_s = (int(pc.max(table.column("end_ns")).as_py()) - int(pc.min(table.column("sent_ns")).as_py())) / 1e9
    if duration_s <= 0:
        return None
    isl = int(ints_or(table, "isl_server_tokens", "isl_sent_tokens").sum())
    osl = int(ints_or(table, "osl_server_tokens", "osl_streamed_tokens").sum())
    result = Throughput(
        duration_s=duration_s,
        input_tokens=isl,
        output_tokens=osl,
        input_tps=isl / duration_s,
        output_tps=osl / duration_s,
        total_tps=(isl + osl) / duration_s,
        requests_per_s=table.num_rows / duration_s,
    )
    if num_gpus is not None:
        result.num_gpus = num_gpus
        result.input_tps_per_gpu = result.input_tps / num_gpus
        result.output_tps_per_gpu = result.output_tps / num_gpus
        result.total_tps_per_gpu = result.total_tps / num_gpus
    return result


def _cache(table: pa.Table, server_metrics: ServerMetrics | None) -> Cache:
    cached = floats(table, "cached_tokens")
    reported = np.isfinite(cached)
    isl = ints_or(table, "isl_server_tokens", "isl_sent_tokens") if table.num_rows else np.zeros(0, np.int64)
    isl_reported = int(isl[reported].sum())
    cached_sum = int(cached[reported].sum())
    usage_rate = cached_sum / isl_reported if isl_reported > 0 else None

    server_rate: float | None = None
    if server_metrics is not None:
        hits, queries = server_metrics.delta(PREFIX_CACHE_HITS), server_metrics.delta(PREFIX_CACHE_QUERIES)
        if hits is None or queries is None:
            hits, computed = server_metrics.delta(LLAMACPP_CACHED_TOKENS), server_metrics.delta(LLAMACPP_PROMPT_TOKENS)
            queries = None if hits is None or computed is None else hits + computed
        if hits is not None and queries is not None and queries > 0:
            server_rate = hits / queries

    hit_blocks = floats(table, "theoretical_hit_blocks")
    total_blocks = floats(table, "theoretical_total_blocks")
    both = np.isfinite(hit_blocks) & np.isfinite(total_blocks)
    total = float(total_blocks[both].sum())
    theoretical = float(hit_blocks[both].sum()) / total if total > 0 else None
    replayed_blocks = floats(table, "replayed_hit_blocks")
    sent = np.isfinite(replayed_blocks) & np.isfinite(total_blocks)
    sent_total = float(total_blocks[sent].sum())
    replayed = float(replayed_blocks[sent].sum()) / sent_total if sent.any() and sent_total > 0 else None
    return Cache(
        usage_hit_rate=usage_rate,
        usage_cached_tokens=cached_sum,
        usage_reported_requests=int(reported.sum()),
        server_hit_rate=server_rate,
        theoretical_hit_rate=theoretical,
        replayed_hit_rate=replayed,
    )


def _dispatch_lag(table: pa.Table) -> DispatchLag | None:
    # Every profiling request counts, failed ones too: the lag is the client's, not the server's.
    lag = floats(table, "dispatch_lag_s")
    lag = np.sort(lag[np.isfinite(lag)])
    if lag.size == 0:
        return None
    p50, p99 = percentiles_sorted(lag, (50.0, 99.0))
    return DispatchLag(p50_s=p50, p99_s=p99, max_s=float(lag[-1]))


def _loop_lag(samples: Sequence[float] | None) -> LoopLag | None:
    if samples is None:
        return None
    lag = np.asarray(samples, dtype=np.float64)
    lag = np.sort(lag[np.isfinite(lag)])
    if lag.size == 0:
        return None
    p50, p99 = percentiles_sorted(lag, (50.0, 99.0))
    return LoopLag(samples=int(lag.size), p50_s=p50, p99_s=p99, max_s=float(lag[-1]))
