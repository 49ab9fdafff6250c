"""A distribution as a quantile table: fitted from data, or built from a median and a spread.

Sampling draws u ~ U(0, 1) and interpolates the table (in log space for sizes and durations), so a
fitted distribution reproduces the data's shape without copying its values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import msgspec
import numpy as np

QUANTILES = 33
"""Points in a fitted table (every 1/32 of probability)."""


class Dist(msgspec.Struct, frozen=True, kw_only=True):
    """Quantiles at evenly spaced probabilities 0..1 (at least one value)."""

    quantiles: tuple[float, ...]
    log: bool = True
    """Interpolate between quantiles in log space (positive quantities spanning decades)."""
    discrete: bool = False
    """Draw table entries as they are (counts such as fan-out), never values between them."""

    @classmethod
    def fit(
        cls, values: Sequence[float] | np.ndarray, *, log: bool = True, discrete: bool = False, points: int = QUANTILES
    ) -> Dist:
        data = np.asarray(values, dtype=np.float64)
        data = data[np.isfinite(data)]
        if data.size == 0:
            raise ValueError("cannot fit a distribution to no values")
        if discrete:  # the table's entries at evenly spaced probabilities, each drawn equally often
            table = np.quantile(data, (np.arange(points) + 0.5) / points, method="inverted_cdf")
            return cls(quantiles=tuple(float(q) for q in table), log=False, discrete=True)
        if log:
            data = np.maximum(data, 1e-3)
        return cls(quantiles=tuple(float(q) for q in np.quantile(data, np.linspace(0, 1, points))), log=log)

    @classmethod
    def lognormal(cls, median: float, sigma: float, *, low: float = 0.0, high: float = math.inf) -> Dist:
        """A log-normal with this median and log-space spread, clipped to [low, high] (tails at 0.5 %)."""
        normal = NormalDist()
        probabilities = np.linspace(0.005, 0.995, QUANTILES)
        values = [min(high, max(low, median * math.exp(sigma * normal.inv_cdf(float(p))))) for p in probabilities]
        return cls(quantiles=tuple(values), log=True)

    @classmethod
    def constant(cls, value: float) -> Dist:
        return cls(quantiles=(value,), log=False)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        table = np.asarray(self.quantiles, dtype=np.float64)
        if table.size == 1:
            return np.full(size, table[0])
        if self.discrete:
            return table[rng.integers(0, table.size, size)]
        positions = rng.random(size) * (table.size - 1)
        if self.log:
            return np.exp(np.interp(positions, np.arange(table.size), np.log(np.maximum(table, 1e-3))))
        return np.interp(positions, np.arange(table.size), table)

    @property
    def median(self) -> float:
        return float(np.interp(0.5, np.linspace(0, 1, len(self.quantiles)), self.quantiles))


class BatchedDraws:
    """Draws from one distribution in large batches: per-value cost stays near a list index."""

    def __init__(self, dist: Dist, rng: np.random.Generator, batch: int = 4096) -> None:
        self.dist, self.rng, self.batch = dist, rng, batch
        self._values: list[float] = []
        self._next = 0

    def take(self, count: int) -> list[float]:
        """The next `count` draws."""
        if self._next + count > len(self._values):
            rest = self._values[self._next :]
            self._values = rest + self.dist.sample(self.rng, max(self.batch, count)).tolist()
            self._next = 0
        start = self._next
        self._next += count
        return self._values[start : self._next]

    def __call__(self) -> float:
        if self._next >= len(self._values):
            self._values = self.dist.sample(self.rng, self.batch).tolist()
            self._next = 0
        value = self._values[self._next]
        self._next += 1
        return value
