"""The metrics InferenceX's AgentX aggregation computes beyond TTFT, TPOT and E2EL (its `infx/results/agentic`
`request_metrics.py`), from a run's kept records (profiling, status ok), in seconds:

- **full-response TPOT**: (`end_ns` − `first_token_ns`) / (OSL − 1) for OSL ≥ 2: the agentx-harness's
  `full_response_inter_token_latency` (its `full_decode_duration` runs to the end of the HTTP response, so the
  trailing usage chunk and the stream's close count), and its interactivity, 1 / each statistic;
- **E2E-normalized interactivity**: 1 / each statistic of E2EL / OSL (OSL ≥ 1), queueing and prefill included;
- **QPS**: completions counted in back-to-back 1 s windows from the first completion while a whole window fits
  before the last one (empty windows count 0, the last partial one is left out); mean, p50, p75, p90, p95, std.

OSL is the server's completion tokens, else the streamed count. Values that are not finite or ≤ 0 are dropped,
and every statistic is agentx.results.summary.stats' (linear interpolation, population std), as for TPOT.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from agentx.results.summary.columns import floats, ints_or
from agentx.results.summary.model import InferencexMetrics, Interactivity, QpsWindows
from agentx.results.summary.stats import FloatArray, percentiles_sorted, positive, stats

QPS_WINDOW_S = 1.0


def inferencex_metrics(kept: pa.Table, percentiles: Sequence[float] = ()) -> InferencexMetrics | None:
    """The metrics of the kept records `kept` (module docstring); None without a record."""
    if kept.num_rows == 0:
        return None
    osl = ints_or(kept, "osl_server_tokens", "osl_streamed_tokens").astype(np.float64)
    first, end = floats(kept, "first_token_ns"), floats(kept, "end_ns")
    with np.errstate(divide="ignore", invalid="ignore"):
        full = np.where(osl >= 2, (end - first) / 1e9 / (osl - 1), np.nan)
        per_osl = np.where(osl >= 1, floats(kept, "e2el_s") / osl, np.nan)
    full, per_osl = positive(full), positive(per_osl)
    full_stats, per_osl_stats = stats(full, percentiles), stats(per_osl, percentiles)
    return InferencexMetrics(
        full_response_tpot_s=full_stats,
        full_response_interactivity_tps=Interactivity.of(full_stats, full),
        e2el_per_osl_s=per_osl_stats,
        e2e_norm_interactivity_tps=Interactivity.of(per_osl_stats, per_osl),
        qps=qps_windows(end[np.isfinite(end)] / 1e9),
    )


def qps_windows(ends_s: FloatArray) -> QpsWindows | None:
    """Completions per second in 1 s windows (module docstring); None with fewer than two completions apart."""
    ends = np.sort(ends_s)
    if ends.size < 2 or ends[-1] <= ends[0]:
        return None
    starts = ends[0] + QPS_WINDOW_S * np.arange(int((ends[-1] - ends[0]) // QPS_WINDOW_S))
    if starts.size == 0:
        return QpsWindows(window_s=QPS_WINDOW_S, samples=0, mean=ends.size / float(ends[-1] - ends[0]))
    counts = (np.searchsorted(ends, starts + QPS_WINDOW_S, "left") - np.searchsorted(ends, starts, "left")).astype(
        np.float64
    ) / QPS_WINDOW_S
    p50, p75, p90, p95 = percentiles_sorted(np.sort(counts), (50.0, 75.0, 90.0, 95.0))
    return QpsWindows(
        window_s=QPS_WINDOW_S,
        samples=int(counts.size),
        mean=float(counts.mean()),
        p50=p50,
        p75=p75,
        p90=p90,
        p95=p95,
        std=float(counts.std()),
    )
