"""How `agentx compare` makes its intervals: its options, each row's level in a family of rows, the floor of an
interval (docs/compare.md)."""

from __future__ import annotations

from typing import Final

import msgspec

from agentx.results.report.frontier import FrontierOptions

DEFAULT_REPLICATES: Final = 2000
"""Enough for a row's interval at 99.7 % (a family of 17 rows at 95 %) to have a few replicates in each tail."""


class CompareOptions(msgspec.Struct, frozen=True, kw_only=True):
    level: float = 0.95
    """The family-wise confidence level: each row's interval is at `row_level(level, rows)`."""
    min_effect: float = 0.01
    """The floor of every interval's half-width (relative): below it, the client's timing and the machine's noise are
    of the same order, however tight the bootstrap's interval."""
    replicates: int = DEFAULT_REPLICATES
    seed: int = 0
    """Seeds the bootstrap: the same inputs and seed give the same intervals."""
    allow: frozenset[str] = frozenset()
    """Difference keys (agentx.results.compare.fairness.KEYS) accepted for a verdict."""
    gpu_sku: str | None = None
    """Prices the GPU time per task (overrides what a sweep recorded)."""
    usd_per_gpu_hour: float | None = None
    frontier: FrontierOptions = FrontierOptions()


def row_level(level: float, rows: int) -> float:
    """Each row's level for a family-wise `level` over `rows` rows (Bonferroni): with 17 rows at 95 %, 99.7 %."""
    return 1.0 - (1.0 - level) / max(rows, 1)


def floored(bounds: tuple[float, float] | None, relative: float, min_effect: float) -> tuple[float, float] | None:
    """`bounds` widened to at least `min_effect` on each side of `relative`: no interval claims a precision finer than
    the measurement's (near-deterministic figures give bootstrap intervals far tighter than the client's timing)."""
    if bounds is None:
        return None
    return min(bounds[0], relative - min_effect), max(bounds[1], relative + min_effect)
