"""The cluster bootstrap: resampling a run's sessions, not its requests, and the statistics of a resample.

The requests of one session are not independent (they share a context, a lane, a server state), so the bootstrap
draws whole *clusters* (sessions) with replacement: a replicate is a vector of integer weights, how many times each
cluster was drawn (a multinomial of n draws over the n clusters). A statistic of a replicate is the statistic of the
sample in which every value appears as many times as its cluster was drawn; `weighted_percentiles` computes it without
building that sample, exactly: the values are sorted once and each replicate's weights are accumulated along them.

The interval is the percentile bootstrap's: the (1 − level)/2 and (1 + level)/2 quantiles of the replicates'
statistic (`interval`).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CHUNK_CELLS: Final = 4_000_000
"""Replicates × values computed at once: bounds the memory of a resample of a long run (~32 MB a chunk)."""


def draw_weights(rng: np.random.Generator, clusters: int, replicates: int) -> IntArray:
    """`replicates` resamples of `clusters` clusters: replicates × clusters counts, each row summing to `clusters`."""
    if clusters == 0:
        return np.zeros((replicates, 0), dtype=np.int64)
    weights: IntArray = rng.multinomial(clusters, np.full(clusters, 1.0 / clusters), size=replicates).astype(np.int64)
    return weights


def weighted_percentiles(values: FloatArray, cluster: IntArray, weights: IntArray, p: float) -> FloatArray:
    """The `p`-th percentile (linear interpolation at k = (N − 1)·p/100, as `agentx.results.summary.stats`) of each
    replicate's sample: `values[i]` counted `weights[r, cluster[i]]` times in replicate r. NaN for a replicate whose
    sample is empty. Non-finite values are left out."""
    finite = np.isfinite(values)
    values, cluster = values[finite], cluster[finite]
    replicates = weights.shape[0]
    result = np.full(replicates, np.nan)
    if values.size == 0:
        return result
    order = np.argsort(values, kind="stable")
    sorted_values, sorted_cluster = values[order], cluster[order]
    rows = max(1, CHUNK_CELLS // max(1, values.size))
    for start in range(0, replicates, rows):
        chunk = weights[start : start + rows][:, sorted_cluster]
        cumulative = np.cumsum(chunk, axis=1)
        totals = cumulative[:, -1]
        present = totals > 0
        if not present.any():
            continue
        position = (totals - 1) * (p / 100.0)
        lower = np.floor(position)
        fraction = position - lower
        upper = np.minimum(lower + 1, totals - 1)
        # The sample's i-th value is at the first index whose cumulative weight exceeds i; one searchsorted for all
        # rows at once, each row's cumulative weights lifted above the previous row's.
        span = float(totals.max()) + 1.0
        lift = np.arange(cumulative.shape[0], dtype=np.float64)[:, None] * span
        flat = (cumulative + lift).ravel()
        base = np.arange(cumulative.shape[0]) * cumulative.shape[1]
        at_lower = np.searchsorted(flat, lower + lift[:, 0], side="right") - base
        at_upper = np.searchsorted(flat, upper + lift[:, 0], side="right") - base
        n = sorted_values.size - 1
        low_values = sorted_values[np.clip(at_lower, 0, n)]
        high_values = sorted_values[np.clip(at_upper, 0, n)]
        estimate = low_values + fraction * (high_values - low_values)
        result[start : start + rows] = np.where(present, estimate, np.nan)
    return result


def weighted_means(values: FloatArray, cluster: IntArray, weights: IntArray) -> FloatArray:
    """The mean of each replicate's sample (non-finite values left out); NaN for an empty one."""
    finite = np.isfinite(values)
    values, cluster = values[finite], cluster[finite]
    clusters = weights.shape[1]
    sums = np.bincount(cluster, weights=values, minlength=clusters).astype(np.float64)
    counts = np.bincount(cluster, minlength=clusters).astype(np.float64)
    totals = weights @ counts
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = np.where(totals > 0, (weights @ sums) / np.where(totals > 0, totals, 1.0), np.nan)
    return means


def weighted_sums(values: FloatArray, cluster: IntArray, weights: IntArray) -> FloatArray:
    """The sum of each replicate's sample (non-finite values count 0)."""
    clusters = weights.shape[1]
    sums = np.bincount(cluster, weights=np.where(np.isfinite(values), values, 0.0), minlength=clusters)
    totals: FloatArray = (weights @ sums.astype(np.float64)).astype(np.float64)
    return totals


def interval(replicates: FloatArray, level: float) -> tuple[float, float] | None:
    """The percentile bootstrap interval at `level` (0.95: the 2.5th and 97.5th percentiles) of the finite
    replicates; None when fewer than half of them are finite."""
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0 or finite.size < replicates.size / 2:
        return None
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return float(low), float(high)
