"""The server's telemetry in AIPerf's shape: the `server_metrics` object of `profile_export_aiperf.json`.

AIPerf 0.13.0 writes the `/metrics` it scraped to a file of its own, `server_metrics_export.json`
(`server_metrics/json_exporter.py`, `ServerMetricsExportData` schema 1.1): `summary` (endpoints, `start_time`,
`end_time`), `metrics_phase` and `metrics`, keyed by the server's own metric name, each with `type`, `description`,
`unit` and `series`, whose `stats` are a gauge's `avg`, `min`, `max`, `std`, `p1`…`p99` or a counter's `total` and
`rate` over the profiling phase (agentx.results.summary.server_telemetry computes them the same way). agentx writes that
document, for the metrics it scrapes, under `server_metrics` in the summary export, where its figures sit beside the
run's.

Where it differs: only the names agentx maps (agentx.replayer.telemetry.series) are there, and a series agentx
reads as the sum of two names (llama.cpp's and TensorRT-LLM's prefix-cache queries) is left out, since AIPerf has
no such metric; a counter is keyed by its family name, as AIPerf's parser gives it (`vllm:prefix_cache_hits`, not
`..._total`); agentx sums a name's label sets into one series (without `labels`), where AIPerf keeps one series per
label set; `description` is agentx's meaning of the series, not the server's HELP text; no histogram, no
`warmup_metrics`, no timeslices (`rate_avg`, `rate_min`, ...: AIPerf computes them only with a slice duration).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec

from agentx.replayer.telemetry.series import TELEMETRY
from agentx.results.summary.server_telemetry import ServerTelemetry

SCHEMA_VERSION: Final = "1.1"
"""AIPerf's `ServerMetricsExportData.SCHEMA_VERSION`."""
_MEANINGS: Final = {series.name: series.meaning for series in TELEMETRY}


def server_metrics_export(
    telemetry: ServerTelemetry | Mapping[str, Any] | None, url: str | None, epoch_ns: int
) -> dict[str, Any] | None:
    """The `server_metrics` object of a run whose summary holds `telemetry` (None without it): scraped from `url`
    (the server's base URL, credentials left out), its window turned into local time from `epoch_ns`."""
    if telemetry is None:
        return None
    if not isinstance(telemetry, ServerTelemetry):
        try:
            telemetry = msgspec.convert(telemetry, ServerTelemetry)
        except msgspec.ValidationError:
            return None  # a run.json of another layout: nothing to export rather than a wrong figure
    endpoint = _without_credentials(url) + telemetry.endpoint if url else telemetry.endpoint
    metrics: dict[str, Any] = {}
    for name, series in telemetry.series.items():
        if len(series.sources) != 1:
            continue
        key = series.sources[0]
        if series.kind == "counter" and key.endswith("_total"):
            key = key.removesuffix("_total")
        stats = series.gauge if series.gauge is not None else series.counter
        if stats is None:
            continue
        metrics[key] = {
            "type": series.kind,
            "description": _MEANINGS.get(name, name),
            "unit": series.unit,
            "series": [{"endpoint_url": endpoint, "stats": msgspec.to_builtins(stats)}],
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "summary": {
            "endpoints_configured": [endpoint],
            "endpoints_successful": [endpoint],
            "start_time": _iso(epoch_ns, telemetry.window_start_s),
            "end_time": _iso(epoch_ns, telemetry.window_end_s),
        },
        "metrics_phase": "profiling",
        "metrics": dict(sorted(metrics.items())),
    }


def _iso(epoch_ns: int, offset_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_ns / 1e9 + offset_s).isoformat()


def _without_credentials(url: str) -> str:
    """`url` without a `user:password@` part and without a trailing slash."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
