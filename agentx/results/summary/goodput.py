"""Goodput: the requests that met every `--slo` target (agentx.replayer.options.slo), per second, and their share.

From the records' `slo_met` column, judged as each record was made:

- `met`: profiling records with `slo_met` true (a failed request never meets them);
- `judged`: profiling records with a verdict, cancelled ones left out (a request the run's end cut short says
  nothing of the server; the summary keeps cancellations out of its errors for the same reason);
- `requests_per_s`, `output_tps`: the met requests and their output tokens (the server's count, else those
  streamed) over the summary's throughput duration (first send → last end of the successful profiling requests), so
  goodput and throughput share one clock and goodput ≤ throughput.

vLLM bench's `--goodput` divides by its benchmark's whole duration instead, and reports no fraction or token rate.
The targets come from the records' metadata (the run's options), so the summary of a records file alone has them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.errors import RecordsError
from agentx.records.record import run_info
from agentx.results.summary.columns import equals, has, ints_or

COLUMN = "slo_met"


class Goodput(msgspec.Struct, kw_only=True):
    """Requests meeting every SLO over the profiling phase (module docstring)."""

    targets_s: dict[str, float]
    """The targets, in seconds, by metric ("ttft", "tpot", "e2el"); empty when the records' metadata lacks them."""
    judged: int
    """Profiling requests with a verdict, cancelled ones left out."""
    met: int
    met_fraction: float | None
    """`met / judged`; None when nothing was judged."""
    requests_per_s: float | None
    """Met requests per second of the throughput duration; None without one."""
    output_tps: float | None
    """Output tokens of the met requests per second of the throughput duration; None without one."""


def _targets_s(records: pa.Table) -> dict[str, float]:
    try:
        options: Any = run_info(records).options
    except RecordsError:  # a table built in memory, without the file's metadata
        return {}
    given = options.get("slo")
    if not isinstance(given, dict):
        return {}
    return {
        name.removesuffix("_s"): float(value)
        for name, value in given.items()
        if isinstance(value, int | float) and value
    }


def goodput(records: pa.Table, profiling: npt.NDArray[np.bool_], duration_s: float | None) -> Goodput | None:
    """The goodput of a records table (`profiling`: its profiling rows) over `duration_s`; None when the run had no
    SLO (or its file predates `slo_met`)."""
    import pyarrow.compute as pc

    if not has(records, COLUMN):
        return None
    targets = _targets_s(records)
    verdict = np.asarray(pc.is_valid(records.column(COLUMN)).to_numpy(zero_copy_only=False), dtype=bool)
    if not targets and not verdict.any():
        return None
    cancelled = equals(records, "error_kind", "cancelled", missing=False)
    judged = profiling & verdict & ~cancelled
    met = judged & equals(records, COLUMN, True, missing=False)
    count = int(met.sum())
    osl = ints_or(records, "osl_server_tokens", "osl_streamed_tokens") if records.num_rows else np.zeros(0, np.int64)
    seconds = duration_s if duration_s is not None and duration_s > 0 else None
    return Goodput(
        targets_s=targets,
        judged=int(judged.sum()),
        met=count,
        met_fraction=count / int(judged.sum()) if judged.any() else None,
        requests_per_s=None if seconds is None else count / seconds,
        output_tps=None if seconds is None else int(osl[met].sum()) / seconds,
    )


def slo_text(targets_s: dict[str, float]) -> str:
    """The targets as people write them: "TTFT ≤ 2 s, TPOT ≤ 50 ms"."""

    def time(seconds: float) -> str:
        return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1e3:g} ms"

    return ", ".join(f"{metric.upper()} ≤ {time(seconds)}" for metric, seconds in targets_s.items())
