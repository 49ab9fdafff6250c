"""Synthetic speculative decoding: how many of K draft tokens a verification step accepts.

Position i (1-based) is accepted with the conditional probability r_i given that position i-1 was,
and the step emits the accepted drafts plus one bonus token: the acceptance length (AL) of a step is
1 + n, n = number of accepted drafts. vLLM reports it through its spec-decode counters (drafts, draft
tokens, accepted tokens, accepted per position), which the engine feeds the same way.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence


def validate_acceptance_rates(rates: Sequence[float], spec_k: int) -> tuple[float, ...]:
    """`rates` as a tuple if they fit K = `spec_k` draft positions, else ValueError saying why."""
    if spec_k < 0:
        raise ValueError(f"spec_k must be >= 0, got {spec_k}")
    if len(rates) != spec_k:
        raise ValueError(f"acceptance_rates needs one rate per draft position: spec_k={spec_k}, got {len(rates)}")
    for position, rate in enumerate(rates, start=1):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"acceptance rate at position {position} must be in [0, 1], got {rate}")
    for position in range(1, len(rates)):
        if rates[position] > rates[position - 1]:
            raise ValueError(
                f"acceptance rates must be non-increasing: position {position + 1} ({rates[position]}) "
                f"> position {position} ({rates[position - 1]})"
            )
    return tuple(float(rate) for rate in rates)


def acceptance_schedule(acceptance_length: float, spec_k: int) -> tuple[float, ...]:
    """vLLM's minimum-variance schedule realizing a mean acceptance length L (bonus token included).

    Every step accepts floor(L-1) drafts surely and one more with probability frac(L-1):
    L=3.78, K=7 → (1, 1, 0.78, 0, 0, 0, 0).
    """
    if spec_k < 0:
        raise ValueError(f"spec_k must be >= 0, got {spec_k}")
    if not 1.0 <= acceptance_length <= spec_k + 1:
        raise ValueError(f"acceptance length must be in [1, spec_k + 1] = [1, {spec_k + 1}], got {acceptance_length}")
    accepted = acceptance_length - 1.0
    sure = min(math.floor(accepted), spec_k)
    # Rounded so that 3.78 gives 0.78 rather than 0.7799999999999998; the error is far below sampling noise.
    partial = [round(accepted - sure, 12)] if sure < spec_k else []
    rates = [1.0] * sure + partial
    return tuple(rates + [0.0] * (spec_k - len(rates)))


def survival_thresholds(rates: Sequence[float]) -> list[float]:
    """Negated P(n >= i) for i = 1..K (ascending), the table `accepted_drafts` samples from."""
    thresholds: list[float] = []
    survival = 1.0
    for rate in rates:
        survival *= rate
        thresholds.append(-survival)
    return thresholds


def accepted_drafts(thresholds: list[float], uniform: float) -> int:
    """n, the number of accepted drafts, from one uniform draw in [0, 1) (inversion sampling).

    n >= i exactly when uniform < P(n >= i), so one draw and a bisection replace K Bernoulli draws.
    The engine inlines this expression in its step loop.
    """
    return bisect_left(thresholds, -uniform)


def mean_acceptance_length(rates: Sequence[float]) -> float:
    """The expected AL of a schedule: 1 + Σ_i P(n >= i)."""
    return 1.0 - sum(survival_thresholds(rates))
