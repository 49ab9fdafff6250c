"""Statistics over a population, with the InferenceX conventions.

Percentiles use linear interpolation at `k = (n − 1)·p/100` (`percentile`); std is the population standard
deviation. Latency statistics drop non-finite and ≤ 0 values first (`positive`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

PERCENTILES: Final = (50.0, 75.0, 90.0, 95.0, 99.0)
"""InferenceX reports p50…p95; p99 is ours. Others asked for (`--percentiles`) go in `Stats.more`."""
SHOWN_PERCENTILES: Final = (50.0, 90.0, 95.0, 99.0)
"""The percentiles the summary shows unless `--percentiles` says others."""


def percentile_key(p: float) -> str:
    """A percentile's name: `p50`, `p99.9`."""
    return f"p{p:g}"


class Stats(msgspec.Struct, kw_only=True):
    """One quantity over a population; `None` replaces a `Stats` whose population is empty."""

    count: int
    mean: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    std: float
    """Population standard deviation (`statistics.pstdev`)."""
    min: float
    max: float
    more: dict[str, float] = {}
    """Percentiles asked for beyond the fields (`--percentiles`), by `percentile_key`."""

    def at(self, p: float) -> float:
        """The `p`-th percentile: a field's, else one in `more`; KeyError when it was not computed."""
        key = percentile_key(p)
        return float(getattr(self, key)) if p in PERCENTILES else self.more[key]


def percentile_ranks(n: int, p: float) -> tuple[int, int]:
    """The two 0-based ranks (in ascending order of n values) the `p`-th percentile interpolates between."""
    f = math.floor((n - 1) * p / 100.0)
    return f, min(f + 1, n - 1)


def percentiles_at(n: int, value_at: Callable[[int], float], ps: Sequence[float]) -> list[float]:
    """The `ps` percentiles of n values (n ≥ 1) given by rank: `value_at(r)` is the r-th smallest (see `percentile`)."""
    # InferenceX: k = (n−1)p/100, f = floor(k), v[f] + (k−f)(v[f+1] − v[f]); at the top f+1 is past the end.
    result: list[float] = []
    for p in ps:
        k = (n - 1) * p / 100.0
        f, c = percentile_ranks(n, p)
        low = value_at(f)
        result.append(float(low + (k - f) * (value_at(c) - low)))
    return result


def percentiles_sorted(data: FloatArray, ps: Sequence[float]) -> list[float]:
    """The `ps` percentiles of `data`, sorted ascending and not empty (see `percentile`)."""
    return percentiles_at(data.size, data.__getitem__, ps)


def percentile(values: Sequence[float] | FloatArray, p: float) -> float:
    """The `p`-th percentile (0 ≤ p ≤ 100) by linear interpolation, exactly as InferenceX computes it.

    Sort, `k = (n − 1)·p/100`, `f = ⌊k⌋`, value `v[f] + (k − f)(v[f+1] − v[f])`. Raises `ValueError` on an
    empty input or `p` outside [0, 100].
    """
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} outside [0, 100]")
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        raise ValueError("percentile of no values")
    return percentiles_sorted(data, [p])[0]


def rate_percentile(rates: Sequence[float] | FloatArray, p: float) -> float:
    """The `p`-th percentile of a rate (tokens/s per user) in agentx's one direction, the slow tail: the rate
    `p`% of the population reached at least, 1 / (the `p`-th percentile of 1/rate), as InferenceX's
    interactivity is 1 / (p90 TPOT). Rates must be > 0."""
    times = 1.0 / np.asarray(rates, dtype=np.float64)
    return 1.0 / percentile(times, p)


def stats(values: FloatArray, more: Sequence[float] = ()) -> Stats | None:
    """`Stats` of `values` (taken as they are: filter first), with the percentiles `more` too; None when there
    are none."""
    if values.size == 0:
        return None
    data = np.sort(values)
    return stats_at(data.size, data.__getitem__, float(data.mean()), float(data.std()), more)  # ddof=0: pstdev


def shown_percentiles(more: Sequence[float] = ()) -> list[float]:
    """Every percentile `stats(values, more)` computes: `PERCENTILES`, then those of `more` beyond them."""
    return [*PERCENTILES, *(p for p in more if p not in PERCENTILES)]


def stats_at(
    n: int, value_at: Callable[[int], float], mean: float, std: float, more: Sequence[float] = ()
) -> Stats | None:
    """`Stats` of n values given by rank (`value_at(r)`: the r-th smallest), their mean and population std, with
    the percentiles `more` too: for a population read in passes, never held whole (`stats` holds it)."""
    if n == 0:
        return None
    p50, p75, p90, p95, p99 = percentiles_at(n, value_at, PERCENTILES)
    extra = [p for p in more if p not in PERCENTILES]
    return Stats(
        count=int(n),
        mean=mean,
        p50=p50,
        p75=p75,
        p90=p90,
        p95=p95,
        p99=p99,
        std=std,
        min=float(value_at(0)),
        max=float(value_at(n - 1)),
        more=dict(zip(map(percentile_key, extra), percentiles_at(n, value_at, extra), strict=True)),
    )


def positive(values: FloatArray) -> FloatArray:
    """The finite values > 0: InferenceX drops the others before every latency statistic."""
    return values[np.isfinite(values) & (values > 0)]
