"""Exact statistics of integer populations too large to hold at once, read a part at a time.

- `IntCounts`: a distribution of integers with few distinct values (tokens per chunk), exact in one pass: the count
  of each distinct value.
- `IntPopulation`: the mean, population std and order statistics of any int64 values (the gaps between a run's
  content chunks, ~150M in an hour at concurrency 256), exact with memory bounded whatever their number, in a few
  passes over them:

  1. (`add`) count, sum, min and max, and a histogram over fixed log-spaced bins: one bin per value below 8,192,
     then 4,096 bins per octave (the bin of 12 ms is 2 µs wide), mirrored below 0;
  2. (`resolve`) for each bin holding a wanted rank, the values in it again: counted in sub-bins one value wide
     when the bin spans at most 65,536 values (every gap under ~134 ms), else kept whole when few enough
     (`COLLECT_MAX`), else counted in 65,536 wider sub-bins and read once more, until each wanted rank's value is
     known. The squared deviations from the mean are summed in that same pass.

Ranks, and so min, max and every percentile, are exact; the mean is the exact sum over the count, correctly
rounded; the std is the population std within float rounding (the squared deviations from the exact mean, summed in
float64 a part at a time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Final

import numpy as np

from agentx.results.summary.stats import IntArray, Stats, percentile_ranks, shown_percentiles, stats_at

_MANTISSA_BITS: Final = 12
_PER_OCTAVE: Final = 1 << _MANTISSA_BITS
_EXACT_BELOW: Final = 1 << (_MANTISSA_BITS + 1)
"""Magnitudes below this have a bin each."""
_TOP_BIN: Final = _EXACT_BELOW + (63 - _MANTISSA_BITS - 2) * _PER_OCTAVE + _PER_OCTAVE - 1
"""The magnitude bin of 2⁶³ − 1 (bit length 63)."""
_BINS: Final = 2 * _TOP_BIN + 1
SUB_BINS: Final = 1 << 16
"""Sub-bins a bin holding a wanted rank is counted in (at most; 512 KB of counts)."""
COLLECT_MAX: Final = 1 << 21
"""A wider bin's values are kept (16 MB at most) rather than counted in sub-bins when it holds no more."""
_INT64_MAX: Final = (1 << 63) - 1
_DENSE: Final = 1 << 12
"""`IntCounts` counts values in [0, this) in one array (32 KB), others by value."""
_FLOAT_EXACT: Final = 1 << 53
_FLOAT_OFFSET: Final = (1024 + _MANTISSA_BITS) * _PER_OCTAVE - _EXACT_BELOW
"""Float64 bits >> (52 − mantissa bits) − this = the bin: the biased exponent 1023 + bit length − 1 and the leading
mantissa bits past the implicit one."""


def _magnitude_bins(magnitudes: IntArray, high: int) -> IntArray:
    """The log-spaced bin of each value ≥ 0 (`high`: their max): itself below `_EXACT_BELOW`, then `_PER_OCTAVE` bins
    per octave."""
    # Below 2⁵³ a value is exact in float64, whose exponent and leading mantissa bits are the bin.
    bins = magnitudes.astype(np.float64).view(np.int64)
    bins >>= 52 - _MANTISSA_BITS
    bins -= _FLOAT_OFFSET
    np.copyto(bins, magnitudes, where=magnitudes < _EXACT_BELOW)
    if high >= _FLOAT_EXACT:
        huge = magnitudes >= _FLOAT_EXACT
        bins[huge] = _magnitude_bins_exact(magnitudes[huge])
    return bins


def _magnitude_bins_exact(magnitudes: IntArray) -> IntArray:
    """`_magnitude_bins` by integer shifts, for values float64 rounds."""
    exponent = np.frexp(magnitudes.astype(np.float64))[1].astype(np.int64)
    exponent -= (magnitudes >> np.maximum(exponent - 1, 0)) == 0  # rounded up to the next power of two
    shift = np.maximum(exponent - (_MANTISSA_BITS + 1), 0)
    bins: IntArray = _EXACT_BELOW + (shift - 1) * _PER_OCTAVE + (magnitudes >> shift) - _PER_OCTAVE
    return bins


def _bins(values: IntArray, low: int | None = None, high: int | None = None) -> IntArray:
    """Each value's bin, in [0, `_BINS`): monotone in the value (`low`, `high`: their min and max, when known)."""
    low = int(values.min()) if low is None else low
    high = int(values.max()) if high is None else high
    if low >= 0:  # gaps between chunks: never negative unless a clock stepped back
        bins = _magnitude_bins(values, high)
        bins += _TOP_BIN
        return bins
    values = np.maximum(values, -_INT64_MAX)  # −2⁶³ has no magnitude in int64
    magnitude = _magnitude_bins(np.abs(values), max(high, -low))
    return np.where(values < 0, -magnitude, magnitude) + _TOP_BIN


def _magnitude_range(index: int) -> tuple[int, int]:
    if index < _EXACT_BELOW:
        return index, index
    shift, top = divmod(index - _EXACT_BELOW, _PER_OCTAVE)
    shift, top = shift + 1, top + _PER_OCTAVE
    return top << shift, ((top + 1) << shift) - 1


def _bin_range(index: int) -> tuple[int, int]:
    """The values [lo, hi] of a bin of `_bins`."""
    magnitude = index - _TOP_BIN
    if magnitude >= 0:
        return _magnitude_range(magnitude)
    lo, hi = _magnitude_range(-magnitude)
    return -hi, -lo


class _Interval:
    """Values [lo, hi] (`count` of them, `below` values under lo) holding wanted ranks, read again in a pass: counted
    in sub-bins `width` wide, or kept (`width` 0)."""

    def __init__(self, bin_index: int, lo: int, hi: int, below: int, count: int) -> None:
        self.bin, self.lo, self.hi, self.below, self.count = bin_index, lo, hi, below, count
        span = hi - lo + 1
        self.width = 1 if span <= SUB_BINS else 0 if count <= COLLECT_MAX else -(-span // SUB_BINS)
        self.counts = np.zeros(-(-span // self.width) if self.width else 0, dtype=np.int64)
        self.parts: list[IntArray] = []
        self._kept: IntArray | None = None

    def take(self, values: IntArray) -> None:
        if self.width:
            self.counts += np.bincount((values - self.lo) // self.width, minlength=self.counts.size)
        else:
            self.parts.append(values.copy())

    def narrow(self, rank: int) -> int | _Interval:
        """After a pass: the value at `rank`, or the narrower interval that holds it."""
        if not self.width:
            if self._kept is None:
                self._kept, self.parts = np.sort(np.concatenate(self.parts)), []
            return int(self._kept[rank - self.below])
        cumulative = np.cumsum(self.counts)
        sub = int(np.searchsorted(cumulative, rank - self.below, side="right"))
        lo = self.lo + sub * self.width
        hi = min(lo + self.width - 1, self.hi)
        if lo == hi:
            return lo
        below = self.below + (int(cumulative[sub - 1]) if sub else 0)
        return _Interval(self.bin, lo, hi, below, int(self.counts[sub]))


class IntPopulation:
    """Exact statistics of int64 values met a part at a time (module docstring): `add` every part, then `resolve`
    the ranks wanted, reading the parts again; then `value`, `mean`, `std`, `stats`."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None
        self._histogram = np.zeros(_BINS, dtype=np.int64)
        self._values: dict[int, int] = {}
        self._squares: float | None = None

    def add(self, values: IntArray) -> None:
        """Count one part of the population (the first pass)."""
        if values.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        self.count += int(values.size)
        low, high = int(values.min()), int(values.max())
        if max(high, -low) * values.size < _INT64_MAX:
            self.total += int(values.sum(dtype=np.int64))
        else:  # an int64 sum could overflow: sum the high and low 32 bits apart (exact below 2³¹ values)
            self.total += (int((values >> 32).sum(dtype=np.int64)) << 32) + int(
                (values & 0xFFFFFFFF).sum(dtype=np.int64)
            )
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        bins = _bins(values, low, high)
        first = int(bins.min())  # a part's bins span a few thousand: count those, not all `_BINS`
        counted = np.bincount(bins - first)
        self._histogram[first : first + counted.size] += counted

    def mean(self, scale: int = 1) -> float:
        """The mean over `scale` (e.g. 10⁹: ns as s), correctly rounded; NaN without values."""
        return float(Fraction(self.total, self.count * scale)) if self.count else math.nan

    def std(self, scale: int = 1) -> float:
        """The population std over `scale`; known once `resolve` has run."""
        if self._squares is None:
            raise ValueError("std before resolve")
        return math.sqrt(self._squares / self.count) / scale if self.count else math.nan

    def value(self, rank: int) -> int:
        """The `rank`-th smallest value (0-based) of the ranks `resolve` was given, min and max."""
        if rank == 0 and self.min is not None:
            return self.min
        if rank == self.count - 1 and self.max is not None:
            return self.max
        return self._values[rank]

    def resolve(self, ranks: Iterable[int], passes: Callable[[], Iterable[IntArray]]) -> int:
        """Find the values at `ranks` and the squared deviations from the mean, reading the population again with
        `passes()` (each call: its parts, as `add` had them) as often as that takes; returns the passes made."""
        wanted = sorted({r for r in ranks if 0 < r < self.count - 1} - set(self._values))
        cumulative = np.cumsum(self._histogram)
        open_ranks: dict[int, _Interval] = {}
        by_bin: dict[int, _Interval] = {}
        for rank in wanted:
            index = int(np.searchsorted(cumulative, rank, side="right"))
            lo, hi = _bin_range(index)
            if lo == hi:
                self._values[rank] = lo
                continue
            if index not in by_bin:
                below = int(cumulative[index - 1]) if index else 0
                by_bin[index] = _Interval(index, lo, hi, below, int(self._histogram[index]))
            open_ranks[rank] = by_bin[index]
        made = 0
        while open_ranks or self._squares is None:
            intervals = sorted({id(i): i for i in open_ranks.values()}.values(), key=lambda i: i.lo)
            self._read(passes(), intervals, squares=self._squares is None)
            made += 1
            narrower: dict[tuple[int, int], _Interval] = {}
            for rank, interval in list(open_ranks.items()):
                found = interval.narrow(rank)
                if isinstance(found, int):
                    self._values[rank] = found
                    del open_ranks[rank]
                else:
                    open_ranks[rank] = narrower.setdefault((found.lo, found.hi), found)
        return made

    def _read(self, parts: Iterable[IntArray], intervals: list[_Interval], *, squares: bool) -> None:
        los = np.array([i.lo for i in intervals], dtype=np.int64)
        his = np.array([i.hi for i in intervals], dtype=np.int64)
        # The intervals lie in a few bins: a value outside those is told by its bin, without a search.
        in_bins = np.zeros(_BINS, dtype=bool)
        in_bins[[i.bin for i in intervals]] = True
        mean = float(Fraction(self.total, self.count)) if self.count else 0.0
        total = 0.0
        seen = 0
        for part in parts:
            values = np.asarray(part, dtype=np.int64)
            seen += int(values.size)
            if squares:
                deviations = values.astype(np.float64) - mean
                total += float(np.dot(deviations, deviations))
            if not intervals or values.size == 0:
                continue
            values = values[in_bins[_bins(values)]]
            index = np.searchsorted(los, values, side="right") - 1
            inside = (index >= 0) & (values <= his[np.maximum(index, 0)])
            values, index = values[inside], index[inside]
            for found in np.unique(index).tolist():
                intervals[found].take(values[index == found])
        if seen != self.count:
            raise ValueError(f"the population changed between passes: {self.count:,} values, then {seen:,}")
        if squares:
            self._squares = total

    def stats(self, percentiles: Iterable[float], passes: Callable[[], Iterable[IntArray]], scale: int) -> Stats | None:
        """`Stats` (agentx.results.summary.stats) of the values over `scale` (10⁹: ns as s), with `percentiles`
        beyond its own; reads the parts again (`resolve`). None without values."""
        if self.count == 0:
            return None
        more = list(percentiles)
        self.resolve([r for p in shown_percentiles(more) for r in percentile_ranks(self.count, p)], passes)
        divisor = float(scale)  # as numpy divides an int64 array by a float: the value as float64, then divided
        return stats_at(self.count, lambda r: float(self.value(r)) / divisor, self.mean(scale), self.std(scale), more)


class IntCounts:
    """The distribution of integers with few distinct values, met a part at a time: how many of each."""

    def __init__(self) -> None:
        self._values = np.zeros(0, dtype=np.int64)
        self._counts = np.zeros(0, dtype=np.int64)
        self._dense: IntArray | None = None

    @property
    def values(self) -> IntArray:
        """The distinct values, ascending."""
        self._settle()
        return self._values

    @property
    def counts(self) -> IntArray:
        """How many of each of `values`."""
        self._settle()
        return self._counts

    def add(self, values: IntArray) -> None:
        if values.size == 0:
            return
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high < _DENSE:  # the usual tokens per chunk: counted in place
            counted = np.bincount(values, minlength=_DENSE)
            self._dense = counted if self._dense is None else self._dense + counted
            return
        if high - low < SUB_BINS:
            counted = np.bincount(values - low)
            present = np.flatnonzero(counted)
            distinct, counts = present + low, counted[present]
        else:
            distinct, counts = np.unique(values, return_counts=True)
        self._add_counts(distinct, counts)

    def merge(self, other: IntCounts) -> None:
        """Count `other`'s values too."""
        self._add_counts(other.values, other.counts)

    def _settle(self) -> None:
        if self._dense is not None:
            dense, self._dense = self._dense, None
            present = np.flatnonzero(dense)
            self._add_counts(present.astype(np.int64), dense[present])

    def _add_counts(self, distinct: IntArray, counts: IntArray) -> None:
        merged, where = np.unique(np.concatenate([self._values, distinct]), return_inverse=True)
        totals = np.zeros(merged.size, dtype=np.int64)
        np.add.at(totals, where, np.concatenate([self._counts, counts]))
        self._values, self._counts = merged.astype(np.int64), totals

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    @property
    def total(self) -> int:
        """The sum of the values, exact."""
        return sum(int(v) * int(c) for v, c in zip(self.values.tolist(), self.counts.tolist(), strict=True))

    def as_dict(self) -> dict[int, int]:
        """Value → count, ascending."""
        return {int(v): int(c) for v, c in zip(self.values.tolist(), self.counts.tolist(), strict=True)}

    def value(self, rank: int) -> int:
        """The `rank`-th smallest value (0-based)."""
        return int(self.values[int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))])

    def mean(self) -> float:
        """The exact sum over the count, correctly rounded (as numpy's mean of the values, whose sums of integers
        below 2⁵³ are exact)."""
        return self.total / self.count

    def stats(self, percentiles: Iterable[float] = ()) -> Stats | None:
        """`Stats` of the values (as floats), with `percentiles` beyond its own; None without values."""
        n = self.count
        if n == 0:
            return None
        mean = self.mean()
        deviations = self.values.astype(np.float64) - mean
        std = math.sqrt(float(np.dot(self.counts.astype(np.float64), deviations * deviations)) / n)
        cumulative = np.cumsum(self.counts)

        def value_at(rank: int) -> float:
            return float(self.values[int(np.searchsorted(cumulative, rank, side="right"))])

        return stats_at(n, value_at, mean, std, list(percentiles))
