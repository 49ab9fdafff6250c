"""Time-weighted concurrency, throughput and tokens-in-flight of a phase: AIPerf's `effective_*`, `active_*`
and `tokens_in_flight` (reference: `aiperf/analysis/sweepline.py`, `sweepline_stats.py`, `sweepline_kv_cache.py`,
`aiperf/metrics/accumulator_sweeps.py`).

Every request of the phase is an interval on one clock: start = sent, generation start = first content chunk
(successful requests only), end = response fully read. Step functions over those events:

- concurrency: +1 at start, −1 at end (failed requests included); decode concurrency over [generation start,
  end), prefill concurrency over [start, generation start);
- decode throughput: with per-chunk times (any request of the run has two chunks or more), each gap between
  consecutive chunks of a request carries (OSL − 1) / (its number of non-zero gaps) tokens at a uniform rate;
  without them, (OSL − 1) / (end − generation start) over [generation start, end);
- prefill throughput: ISL / (generation start − start) over [start, generation start); total throughput: the
  prefill and the request-level decode rates together;
- per-user throughputs: decode throughput ÷ decode concurrency, prefill ÷ prefill concurrency (0 where nobody
  is in that stage);
- tokens in flight: ISL from start (when generation starts after it), then with per-chunk times 1 token at the
  first chunk and (OSL − 1) / (gaps) at the end of each gap, else the OSL at generation start; all freed at end.

At equal times ends sort before starts. `effective_*` are time-weighted over the phase window (avg and std
divided by the window's length, percentiles of the duration-weighted distribution); `active_*` only over the
time the matching stage has someone in it. Rates are per ns internally and reported per second.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from agentx.results.summary.stats import FloatArray, IntArray

Curve = tuple[FloatArray, FloatArray]

NS_PER_S: Final = 1e9
_EMPTY: Final[Curve] = (np.zeros(0), np.zeros(0))
_STAT_KEYS: Final = ("avg", "min", "max", "p50", "p90", "p95", "p99", "std")


def _cumulate(timestamps: FloatArray, deltas: FloatArray) -> Curve:
    """Events sorted by time (ends, the negative deltas, first at ties), values the running sum."""
    order = np.lexsort(((deltas > 0).astype(np.int8), timestamps))
    values = np.cumsum(deltas[order])
    if values.size:
        peak = float(np.max(np.abs(values)))
        if peak > 0:
            values = np.where(np.abs(values) < 1e-9 * peak, 0.0, values)  # cancellation residue
    return timestamps[order], values


def _lookup(ts: FloatArray, values: FloatArray, at: FloatArray) -> FloatArray:
    """The step function's value at each of `at` (0 before its first event)."""
    index = np.searchsorted(ts, at, side="right").astype(np.intp) - 1
    return np.where(index >= 0, values[np.clip(index, 0, len(values) - 1)], 0.0)


def _divide(numerator: Curve, denominator: Curve) -> Curve:
    (num_ts, num), (den_ts, den) = numerator, denominator
    if len(num_ts) == 0 or len(den_ts) == 0:
        return _EMPTY
    grid = np.unique(np.concatenate([num_ts, den_ts]))
    top, bottom = _lookup(num_ts, num, grid), _lookup(den_ts, den, grid)
    result = np.zeros_like(top)
    np.divide(top, bottom, out=result, where=bottom > 0)
    return grid, result


def _intervals(start: FloatArray, end: FloatArray, weight: FloatArray) -> Curve:
    """+weight over [start, end) for every row where all three are defined."""
    valid = ~np.isnan(start) & ~np.isnan(end) & ~np.isnan(weight)
    if not valid.any():
        return _EMPTY
    w = weight[valid]
    return _cumulate(np.concatenate([start[valid], end[valid]]), np.concatenate([w, -w]))


def _decode_rate(gen: FloatArray, end: FloatArray, osl: FloatArray) -> FloatArray:
    span = end - gen
    valid = ~np.isnan(gen) & ~np.isnan(osl) & (span > 0) & (osl >= 1)
    return np.where(valid, (osl - 1.0) / np.where(valid, span, 1.0), np.nan)


def _prefill_rate(start: FloatArray, gen: FloatArray, isl: FloatArray) -> FloatArray:
    span = gen - start
    valid = ~np.isnan(start) & ~np.isnan(gen) & ~np.isnan(isl) & (span > 0)
    return np.where(valid, isl / np.where(valid, span, 1.0), np.nan)


def _chunk_ends(gen: FloatArray, gaps: FloatArray, rows: IntArray) -> FloatArray:
    """The arrival time of the chunk closing each gap: generation start + the row's gaps so far."""
    total = np.cumsum(gaps)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    before = np.where(first, total - gaps, np.nan)
    before = np.maximum.accumulate(np.where(np.isnan(before), -np.inf, before))  # forward-fill per row
    return gen[rows] + (total - before)


def _decode_throughput_chunks(gen: FloatArray, osl: FloatArray, gaps: FloatArray, rows: IntArray) -> Curve:
    ends = _chunk_ends(gen, gaps, rows)
    starts = ends - gaps
    nonzero = gaps > 0
    per_row = np.bincount(rows[nonzero], minlength=len(osl)).astype(np.float64)[rows]
    tokens = np.where(per_row > 0, (osl[rows] - 1.0) / np.where(per_row > 0, per_row, 1.0), 0.0)
    rates = np.where(nonzero, tokens / np.where(nonzero, gaps, 1.0), 0.0)
    valid = ~np.isnan(gen[rows]) & nonzero & ~np.isnan(osl[rows]) & (osl[rows] >= 1)
    if not valid.any():
        return _EMPTY
    return _cumulate(np.concatenate([starts[valid], ends[valid]]), np.concatenate([rates[valid], -rates[valid]]))


def _tokens_in_flight(
    start: FloatArray, gen: FloatArray, end: FloatArray, isl: FloatArray, osl: FloatArray, chunks: Any
) -> Curve:
    parts_ts: list[FloatArray] = []
    parts: list[FloatArray] = []
    prefill = ~np.isnan(start) & ~np.isnan(isl) & ~np.isnan(gen) & (gen > start)
    has_end = ~np.isnan(end)
    if chunks is None:
        generating = ~np.isnan(gen) & ~np.isnan(osl) & ((end - gen) > 0)
        parts_ts += [start[prefill], gen[generating]]
        parts += [isl[prefill], osl[generating]]
    else:
        gaps, rows = chunks
        ends = _chunk_ends(gen, gaps, rows)
        tokens_per_row = np.bincount(rows, minlength=len(osl)).astype(np.float64)[rows]
        per_chunk = np.where(tokens_per_row > 0, (osl[rows] - 1.0) / np.where(tokens_per_row > 0, tokens_per_row, 1), 0)
        valid = ~np.isnan(gen[rows]) & (gaps >= 0) & ~np.isnan(osl[rows]) & (osl[rows] >= 1)
        generating = np.bincount(rows[valid], minlength=len(osl)) > 0
        row_end = end[rows]
        ends = np.where(~np.isnan(row_end) & (ends >= row_end), np.nextafter(row_end, -np.inf), ends)
        first_token = ~np.isnan(gen) & generating & ~np.isnan(osl) & (osl >= 1)
        parts_ts += [gen[first_token], ends[valid], start[prefill]]
        parts += [np.ones(int(first_token.sum())), per_chunk[valid], isl[prefill]]
    both, only_in, only_out = prefill & generating & has_end, prefill & ~generating & has_end, ~prefill & generating
    only_out &= has_end
    parts_ts += [end[both], end[only_in], end[only_out]]
    parts += [-(isl[both] + osl[both]), -isl[only_in], -osl[only_out]]
    timestamps = np.concatenate(parts_ts)
    if timestamps.size == 0:
        return _EMPTY
    return _cumulate(timestamps, np.concatenate(parts))


def _percentiles(values: FloatArray, durations: FloatArray) -> list[float]:
    order = np.argsort(values)
    cumulative = np.cumsum(durations[order])
    index = np.searchsorted(cumulative / cumulative[-1], [0.50, 0.90, 0.95, 0.99])
    np.minimum(index, len(values) - 1, out=index)
    result: list[float] = values[order][index].tolist()
    return result


def _stats(values: FloatArray, durations: FloatArray, total: float) -> tuple[float, ...]:
    avg = float(np.sum(values * durations) / total)
    std = float(np.sqrt(np.sum(durations * (values - avg) ** 2) / total))
    p50, p90, p95, p99 = _percentiles(values, durations)
    return avg, float(np.min(values)), float(np.max(values)), p50, p90, p95, p99, std


def time_weighted(curve: Curve, window: tuple[float, float]) -> tuple[float, ...]:
    """(avg, min, max, p50, p90, p95, p99, std) of the step function over the window; zeros when empty."""
    (ts, values), (lo, hi) = curve, window
    zeros = (0.0,) * len(_STAT_KEYS)
    if len(ts) == 0 or hi - lo <= 0:
        return zeros
    first = max(0, int(np.searchsorted(ts, lo, side="right")) - 1)
    last = min(len(ts), int(np.searchsorted(ts, hi, side="left")) + 1)
    starts = np.concatenate(([lo], ts[first:last]))
    held = np.concatenate(([float(values[first - 1]) if first > 0 else 0.0], values[first:last]))
    ends = np.concatenate((starts[1:], [hi]))
    durations = np.maximum(np.minimum(ends, hi) - np.maximum(starts, lo), 0.0)
    keep = durations > 0
    if not keep.any():
        return zeros
    return _stats(held[keep], durations[keep], hi - lo)


def active_weighted(rate: Curve, active: Curve, window: tuple[float, float]) -> tuple[float, ...]:
    """The same over only the time `active` is positive (its total is the divisor)."""
    (rate_ts, rates), (mask_ts, mask), (lo, hi) = rate, active, window
    zeros = (0.0,) * len(_STAT_KEYS)
    if hi - lo <= 0 or len(rate_ts) == 0 or len(mask_ts) == 0:
        return zeros
    inside = [
        rate_ts[int(np.searchsorted(rate_ts, lo, side="right")) : int(np.searchsorted(rate_ts, hi, side="left"))],
        mask_ts[int(np.searchsorted(mask_ts, lo, side="right")) : int(np.searchsorted(mask_ts, hi, side="left"))],
    ]
    grid = np.unique(np.concatenate([np.array([lo, hi]), *inside]))
    if len(grid) < 2:
        return zeros
    starts, durations = grid[:-1], np.diff(grid)
    values, on = _lookup(rate_ts, rates, starts), _lookup(mask_ts, mask, starts)
    keep = (on > 0) & (durations > 0)
    if not keep.any() or float(durations[keep].sum()) <= 0:
        return zeros
    return _stats(values[keep], durations[keep], float(durations[keep].sum()))


def _block(stats: tuple[float, ...], unit: str, scale: float) -> dict[str, Any]:
    block: dict[str, Any] = {"unit": unit}
    for key, value in zip(_STAT_KEYS, stats, strict=True):
        scaled = value * scale
        if np.isfinite(scaled):
            block[key] = scaled
    return block


def sweep_metrics(
    start: FloatArray,
    end: FloatArray,
    gen: FloatArray,
    isl: FloatArray,
    osl: FloatArray,
    chunks: tuple[FloatArray, IntArray] | None,
    window: tuple[float, float] | None,
) -> dict[str, dict[str, Any]]:
    """The `effective_*`, `tokens_in_flight` and `active_*` blocks of one phase.

    Rows are the phase's requests (NaN where undefined: `gen`, `isl`, `osl` of failed requests); `chunks` is
    (gaps in ns, their rows) when per-chunk times drive the decode curves; `window` the phase's span (default:
    first to last event of the concurrency curve). Empty when no request has both a start and an end.
    """
    ones = np.ones(len(start))
    concurrency = _intervals(start, end, ones)
    if len(concurrency[0]) == 0:
        return {}
    lo, hi = window if window is not None else (float(concurrency[0][0]), float(concurrency[0][-1]))
    decode_concurrency = _intervals(gen, end, ones)
    prefill_concurrency = _intervals(start, gen, ones)
    decode_rate, prefill_rate = _decode_rate(gen, end, osl), _prefill_rate(start, gen, isl)
    if chunks is not None and len(chunks[0]):
        decode = _decode_throughput_chunks(gen, osl, chunks[0], chunks[1])
        in_flight = _tokens_in_flight(start, gen, end, isl, osl, chunks)
    else:
        decode = _intervals(gen, end, decode_rate)
        in_flight = _tokens_in_flight(start, gen, end, isl, osl, None)
    prefill = _intervals(start, gen, prefill_rate)
    total = _total(start, gen, end, prefill_rate, decode_rate)
    decode_per_user = _divide(decode, decode_concurrency)
    prefill_per_user = _divide(prefill, prefill_concurrency)
    effective = (
        ("effective_concurrency", concurrency, "requests", 1.0),
        ("effective_decode_throughput", decode, "tokens/sec", NS_PER_S),
        ("effective_prefill_throughput", prefill, "tokens/sec", NS_PER_S),
        ("effective_decode_concurrency", decode_concurrency, "requests", 1.0),
        ("effective_prefill_concurrency", prefill_concurrency, "requests", 1.0),
        ("effective_total_throughput", total, "tokens/sec", NS_PER_S),
        ("effective_decode_throughput_per_user", decode_per_user, "tokens/sec/user", NS_PER_S),
        ("effective_prefill_throughput_per_user", prefill_per_user, "tokens/sec/user", NS_PER_S),
        ("tokens_in_flight", in_flight, "tokens", 1.0),
    )
    result = {tag: _block(time_weighted(curve, (lo, hi)), unit, scale) for tag, curve, unit, scale in effective}
    active = (
        ("active_decode_throughput", decode, decode_concurrency, "tokens/sec"),
        ("active_prefill_throughput", prefill, prefill_concurrency, "tokens/sec"),
        ("active_decode_throughput_per_user", decode_per_user, decode_concurrency, "tokens/sec/user"),
        ("active_prefill_throughput_per_user", prefill_per_user, prefill_concurrency, "tokens/sec/user"),
        ("active_total_throughput", total, concurrency, "tokens/sec"),
    )
    for tag, curve, mask, unit in active:
        result[tag] = _block(active_weighted(curve, mask, (lo, hi)), unit, NS_PER_S)
    return result


def _total(start: FloatArray, gen: FloatArray, end: FloatArray, prefill: FloatArray, decode: FloatArray) -> Curve:
    """Prefill and request-level decode rates in one curve."""
    p, d = ~np.isnan(prefill), ~np.isnan(decode)
    if not p.any() and not d.any():
        return _EMPTY
    return _cumulate(
        np.concatenate([start[p], gen[p], gen[d], end[d]]),
        np.concatenate([prefill[p], -prefill[p], decode[d], -decode[d]]),
    )
