"""AIPerf's server metrics, `server_metrics_export.json`, as the summary's `server_telemetry` and prefix-cache
counters.

AIPerf writes, per metric it scraped (keyed by the server's name, a counter by its family name without `_total`), one
series per endpoint and label set with its statistics over the profiling phase: a gauge's `avg`, `min`, `max`,
`std`, `p1`…`p99`, a counter's `total` and `rate`, computed as agentx computes them
(agentx.results.summary.server_telemetry). The engine is the one whose names give the most series
(agentx.replayer.telemetry.series, `detect_engine`); each agentx series is read from that engine's names:

- a counter is the sum of its series (label sets, endpoints, and the names agentx adds up), totals and rates alike;
- a gauge is taken when it has one series; several (data-parallel engines, several endpoints) are left out, since
  the statistics of their sum cannot be had from each one's;
- the window is AIPerf's profiling phase (`summary.phase_time_ranges`), else the records' own;
  `interval_s` is the mean time between fetches and `scrapes` their count (`summary.endpoint_info`);
  `window_scrapes` (and each series' `scrapes`) is estimated as the window over that interval, AIPerf does not
  count them.

The prefix-cache counters' totals (`vllm:prefix_cache_hits`, `..._queries`, llama.cpp's prompt tokens) also give
the summary's `cache.server_hit_rate` (a `ServerMetrics` whose `before` is 0 and `after` the total).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from agentx.errors import ArtifactError
from agentx.replayer.telemetry.metrics import CACHE_METRICS, ServerMetrics
from agentx.replayer.telemetry.series import TELEMETRY, detect_engine
from agentx.results.summary.server_telemetry import (
    AIPERF_PERCENTILES,
    CounterStats,
    GaugeStats,
    SeriesStats,
    ServerTelemetry,
    with_headlines,
)

GAUGE_KEYS: Final = ("avg", "min", "max", "std", *(f"p{p}" for p in AIPERF_PERCENTILES))


class ImportedTelemetry(msgspec.Struct, kw_only=True):
    """What a server metrics export gives the summary, and what it had to leave out."""

    telemetry: ServerTelemetry | None
    counters: ServerMetrics | None
    """The prefix-cache counters' increase over the profiling phase (`before` all 0)."""
    left_out: list[str] = []


def read_server_metrics(path: Path) -> dict[str, Any] | None:
    """`server_metrics_export.json` as a dict, None when there is no such file; ArtifactError when unreadable."""
    if not path.is_file():
        return None
    try:
        document = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ArtifactError(f"{path}: not a readable AIPerf server metrics export ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("metrics"), dict):
        raise ArtifactError(f"{path}: not an AIPerf server metrics export (no `metrics` object)")
    return document


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def exposition_names(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The server's exposition name of each exported metric (a counter's family name takes its `_total` back)."""
    names = {}
    for name, metric in metrics.items():
        counter = _dict(metric).get("type") == "counter" and not name.endswith("_total")
        names[f"{name}_total" if counter else name] = name
    return names


def _series_stats(metric: Any) -> list[dict[str, Any]]:
    return [_dict(series.get("stats")) for series in _dict(metric).get("series", []) if isinstance(series, dict)]


def _finite(stats: Mapping[str, Any], keys: tuple[str, ...]) -> bool:
    return all(isinstance(stats.get(key), int | float) and not isinstance(stats.get(key), bool) for key in keys)


def counter_total(metrics: Mapping[str, Any], name: str) -> tuple[float, float] | None:
    """(total, rate) of exported counter `name` over its series; None when a series lacks them."""
    stats = _series_stats(metrics.get(name))
    if not stats or not all(_finite(s, ("total", "rate")) for s in stats):
        return None
    return sum(float(s["total"]) for s in stats), sum(float(s["rate"]) for s in stats)


def window_ns(document: Mapping[str, Any], epoch_ns: int) -> tuple[int, int] | None:
    """AIPerf's profiling phase in ns after `epoch_ns`, None when the export does not say."""
    phase = _dict(_dict(_dict(document.get("summary")).get("phase_time_ranges")).get("profiling"))
    start, end = phase.get("start_ns"), phase.get("end_ns")
    if not isinstance(start, int) or not isinstance(end, int) or end < start:
        return None
    return start - epoch_ns, end - epoch_ns


def _fetches(document: Mapping[str, Any]) -> tuple[int, float]:
    """(fetches, mean seconds between them) over every endpoint."""
    infos = [_dict(info) for info in _dict(_dict(document.get("summary")).get("endpoint_info")).values()]
    fetches = sum(int(info.get("total_fetches") or 0) for info in infos)
    spans = [
        float(info["duration_seconds"]) / (int(info["total_fetches"]) - 1)
        for info in infos
        if isinstance(info.get("duration_seconds"), int | float) and int(info.get("total_fetches") or 0) > 1
    ]
    return fetches, (sum(spans) / len(spans) if spans else 0.0)


def _endpoint(document: Mapping[str, Any]) -> str:
    configured = _dict(document.get("summary")).get("endpoints_successful") or []
    first = configured[0] if configured and isinstance(configured[0], str) else ""
    return urlsplit(first).path or first


def import_telemetry(
    document: Mapping[str, Any], epoch_ns: int, records_window_ns: tuple[float, float] | None
) -> ImportedTelemetry:
    """The summary's server telemetry and prefix-cache counters from a server metrics export (see the module
    docstring); `records_window_ns`, the records' profiling phase, when the export has no window of its own."""
    metrics = _dict(document.get("metrics"))
    exposed = exposition_names(metrics)
    counters: dict[str, float] = {}
    for name in CACHE_METRICS:
        total = counter_total(metrics, exposed[name]) if name in exposed else None
        if total is not None:
            counters[name] = total[0]
    engine = detect_engine({name: [0.0] for name in exposed})
    window = window_ns(document, epoch_ns) or records_window_ns
    if engine is None or window is None:
        return ImportedTelemetry(telemetry=None, counters=_counters(counters))
    fetches, interval_s = _fetches(document)
    window_s = (window[1] - window[0]) / 1e9
    in_window = int(window_s / interval_s) + 1 if interval_s > 0 else fetches
    result = ServerTelemetry(
        engine=engine,
        endpoint=_endpoint(document),
        interval_s=round(interval_s, 3),
        scrapes=fetches,
        window_scrapes=in_window,
        window_start_s=window[0] / 1e9,
        window_end_s=window[1] / 1e9,
    )
    left_out = []
    for series in TELEMETRY:
        alternative = next(
            (names for names in series.sources.get(engine, ()) if all(name in exposed for name in names)), None
        )
        if alternative is None:
            continue
        stats = SeriesStats(kind=series.kind, unit=series.unit, sources=list(alternative), scrapes=in_window)
        if series.kind == "counter":
            totals = [counter_total(metrics, exposed[name]) for name in alternative]
            if all(total is not None for total in totals):
                stats.counter = CounterStats(
                    total=sum(total[0] for total in totals if total is not None),
                    rate=sum(total[1] for total in totals if total is not None),
                )
        elif len(alternative) == 1:
            gauges = _series_stats(metrics[exposed[alternative[0]]])
            if len(gauges) == 1 and _finite(gauges[0], GAUGE_KEYS):
                stats.gauge = GaugeStats(**{key: float(gauges[0][key]) for key in GAUGE_KEYS})
            elif len(gauges) > 1:
                left_out.append(f"{alternative[0]} ({len(gauges)} series)")
        if stats.gauge is not None or stats.counter is not None:
            result.series[series.name] = stats
    return ImportedTelemetry(telemetry=with_headlines(result), counters=_counters(counters), left_out=left_out)


def _counters(totals: Mapping[str, float]) -> ServerMetrics | None:
    if not totals:
        return None
    return ServerMetrics(before=dict.fromkeys(totals, 0.0), after=dict(totals))
