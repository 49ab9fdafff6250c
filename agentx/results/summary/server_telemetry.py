"""The server's telemetry over a run (server_metrics.arrow, agentx.replayer.telemetry.scrape) summarized over its
profiling phase: `Summary.server_telemetry`.

**Window.** The profiling phase as the records show it: from the end of the last warmup request (else the first
profiling request's due time) to the last profiling request's end, on the records' clock. Scrapes inside it count;
a file of another run (its `agentx.run_id`) is left out.

**Statistics**, per series, as AIPerf 0.13.0 computes a server metric's (`server_metrics/export_stats.py`), so the
AIPerf export can carry them: a gauge's `avg`, `min`, `max`, sample `std` (n − 1; 0 for one scrape) and `p1`…`p99`
(linear interpolation) over the scrapes in the window; a counter's `total` (its value at the last scrape in the
window − its value at the last scrape before the window, else at the first one in it; 0 if it fell: a restart) and
`rate` (`total` over the time between those two scrapes).

**The figures printed** (`ServerTelemetry`): running and waiting requests (mean, peak), KV-cache usage (mean, peak),
and the prefix-cache hit rate over the window: Δhits / Δqueries of the counters, else the mean of the engine's own
hit-rate gauge (SGLang's `cache_hit_rate`, TensorRT-LLM's `kv_cache_hit_rate`).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.errors import ServerMetricsError
from agentx.records.record import run_info
from agentx.replayer.telemetry.arrow_file import aligned_times_ns, server_metrics_info
from agentx.replayer.telemetry.series import TELEMETRY
from agentx.results.summary.columns import equals, floats
from agentx.results.summary.stats import FloatArray

AIPERF_PERCENTILES: Final = (1, 5, 10, 25, 50, 75, 90, 95, 99)


class GaugeStats(msgspec.Struct, kw_only=True):
    """AIPerf's gauge statistics over the scrapes in the window."""

    avg: float
    min: float
    max: float
    std: float
    """Sample standard deviation (n − 1), as AIPerf's; 0 for a single scrape."""
    p1: float
    p5: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float


class CounterStats(msgspec.Struct, kw_only=True):
    """AIPerf's counter statistics over the window."""

    total: float
    rate: float
    """`total` per second."""


class SeriesStats(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One series of server_metrics.arrow over the window (`gauge` or `counter` by its kind)."""

    kind: Literal["gauge", "counter"]
    unit: str
    sources: list[str]
    """The engine's names it was read from (summed when several)."""
    scrapes: int
    gauge: GaugeStats | None = None
    counter: CounterStats | None = None


class MeanPeak(msgspec.Struct, kw_only=True):
    """A gauge over the window: its mean and its peak."""

    mean: float
    peak: float


class ServerTelemetry(msgspec.Struct, kw_only=True):
    """What the server's `/metrics` said over the profiling phase (see the module docstring)."""

    engine: str
    endpoint: str
    interval_s: float
    scrapes: int
    """Rows of server_metrics.arrow, warmup included."""
    window_scrapes: int
    """Scrapes inside the profiling window."""
    window_start_s: float
    window_end_s: float
    """The window on the run's clock, s after the run start."""
    requests_running: MeanPeak | None = None
    requests_waiting: MeanPeak | None = None
    kv_cache_usage_ratio: MeanPeak | None = None
    prefix_cache_hit_rate: float | None = None
    prefix_cache_hit_source: Literal["counters", "gauge"] | None = None
    series: dict[str, SeriesStats] = msgspec.field(default_factory=dict)


def profiling_window_ns(records: pa.Table) -> tuple[float, float] | None:
    """The profiling phase on the records' clock (see the module docstring); None without profiling requests."""
    warmup = equals(records, "phase", "warmup", missing=False)
    profiling = ~warmup
    if not profiling.any():
        return None
    ends = floats(records, "end_ns")
    start = (
        float(np.nanmax(ends[warmup])) if warmup.any() else float(np.nanmin(floats(records, "scheduled_ns")[profiling]))
    )
    end = float(np.nanmax(ends[profiling]))
    return start, max(start, end)


def summarize_telemetry(telemetry: pa.Table | None, records: pa.Table) -> ServerTelemetry | None:
    """The summary of a run's server telemetry over its profiling phase; None without telemetry rows of this run."""
    if telemetry is None or telemetry.num_rows == 0:
        return None
    try:
        info = server_metrics_info(telemetry.schema)
        run = run_info(records)
    except (ServerMetricsError, ValueError):  # RecordsError is a ValueError
        return None
    if info.run_id != run.run_id:
        return None
    times = np.asarray(aligned_times_ns(telemetry, run.wall_epoch_ns), dtype=np.float64)
    window = profiling_window_ns(records) or (float(times.min()), float(times.max()))
    inside = (times >= window[0]) & (times <= window[1])
    before = np.flatnonzero(times < window[0])
    reference = int(before[-1]) if before.size else None
    result = ServerTelemetry(
        engine=info.engine,
        endpoint=info.endpoint,
        interval_s=info.interval_s,
        scrapes=telemetry.num_rows,
        window_scrapes=int(inside.sum()),
        window_start_s=window[0] / 1e9,
        window_end_s=window[1] / 1e9,
    )
    for series in TELEMETRY:
        values = floats(telemetry, series.name)
        if not np.isfinite(values).any():
            continue
        stats = SeriesStats(
            kind=series.kind,
            unit=series.unit,
            sources=info.sources.get(series.name, []),
            scrapes=int((inside & np.isfinite(values)).sum()),
        )
        if series.kind == "gauge":
            stats.gauge = gauge_stats(values[inside])
        else:
            stats.counter = counter_stats(times, values, inside, reference)
        if stats.gauge is not None or stats.counter is not None:
            result.series[series.name] = stats
    return with_headlines(result)


def with_headlines(result: ServerTelemetry) -> ServerTelemetry:
    """`result` with its headline figures filled from its series: running and waiting requests, KV-cache usage and
    the prefix-cache hit rate (the counters' ratio, else the engine's own gauge)."""
    result.requests_running = _level(result, "requests_running")
    result.requests_waiting = _level(result, "requests_waiting")
    result.kv_cache_usage_ratio = _level(result, "kv_cache_usage_ratio")
    hits, queries = result.series.get("prefix_cache_hits_total"), result.series.get("prefix_cache_queries_total")
    if hits is not None and queries is not None and hits.counter and queries.counter and queries.counter.total > 0:
        result.prefix_cache_hit_rate = hits.counter.total / queries.counter.total
        result.prefix_cache_hit_source = "counters"
    elif (ratio := result.series.get("prefix_cache_hit_ratio")) is not None and ratio.gauge is not None:
        result.prefix_cache_hit_rate = ratio.gauge.avg
        result.prefix_cache_hit_source = "gauge"
    return result


def gauge_stats(values: FloatArray) -> GaugeStats | None:
    """AIPerf's gauge statistics of the finite values; None when there are none."""
    data = values[np.isfinite(values)]
    if data.size == 0:
        return None
    points = np.percentile(data, AIPERF_PERCENTILES)
    return GaugeStats(
        avg=float(np.mean(data)),
        min=float(np.min(data)),
        max=float(np.max(data)),
        std=float(np.std(data, ddof=1)) if data.size > 1 else 0.0,
        **{f"p{p}": float(v) for p, v in zip(AIPERF_PERCENTILES, points, strict=True)},
    )


def counter_stats(
    times_ns: FloatArray, values: FloatArray, inside: npt.NDArray[np.bool_], reference: int | None
) -> CounterStats | None:
    """AIPerf's counter statistics over the window (`inside`), from the scrape `reference` before it when there is
    one; None when the window holds no value of it."""
    rows = np.flatnonzero(inside & np.isfinite(values))
    if rows.size == 0:
        return None
    start = reference if reference is not None and np.isfinite(values[reference]) else int(rows[0])
    last = int(rows[-1])
    total = max(float(values[last] - values[start]), 0.0)
    duration_s = float(times_ns[last] - times_ns[start]) / 1e9
    return CounterStats(total=total, rate=total / duration_s if duration_s > 0 else 0.0)


def _level(result: ServerTelemetry, name: str) -> MeanPeak | None:
    series = result.series.get(name)
    if series is None or series.gauge is None:
        return None
    return MeanPeak(mean=series.gauge.avg, peak=series.gauge.max)
