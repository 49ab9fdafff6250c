"""The targets table's rows, and why the report shows "—": a level with no point on the frontier, interactivity
targets off a series' front, or no price at the chosen tier, each said in one line with what to pass instead
(`agentx report`, docs/results.md); and the words and marks of the plausibility audit's findings, which the tables,
the Markdown and the HTML page share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from agentx.results.report.cost import Price, PriceTable
from agentx.results.summary.checks.audit import Figure, Severity
from agentx.results.summary.model import Summary

REJECTED_MARK: Final = "✗"
"""Beside a figure an error finding of the audit rejects, and before the finding's code."""
WARNING_MARK: Final = "!"
"""Before the code of a warning finding."""
FIGURE_NAMES: Final[Mapping[Figure, str]] = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2el": "E2EL",
    "interactivity": "interactivity",
    "throughput": "throughput",
    "isl": "ISL",
    "cache": "cache hits",
}


def severity_mark(severity: Severity) -> str:
    """What precedes a finding's code: "✗" for an error, "!" for a warning."""
    return REJECTED_MARK if severity == "error" else WARNING_MARK


def rejected_text(codes: Sequence[str]) -> str:
    """Why a figure is marked, in words."""
    return f"rejected by the audit: {', '.join(codes)}"


def rejected_point(rejected: Mapping[Figure, Sequence[str]]) -> str:
    """Why a level's frontier point is marked: the figures it is made of that its audit rejects, and by which
    findings."""
    figures = " and ".join(FIGURE_NAMES[figure] for figure in rejected)
    codes = ", ".join(dict.fromkeys(code for found in rejected.values() for code in found))
    return (
        f"its point on the frontier rests on {figures} that its plausibility audit rejects ({codes}): it and the "
        f"targets next to it are marked {REJECTED_MARK}"
    )


def finding_heading(code: str, severity: Severity, affects: Iterable[Figure]) -> str:
    """A finding's first words: its mark, code, severity and the figures it rejects (an error) or concerns."""
    verb = "rejects" if severity == "error" else "concerns"
    return f"{severity_mark(severity)} {code} ({severity}: {verb} {', '.join(FIGURE_NAMES[f] for f in affects)})"


def levels_text(levels: Iterable[tuple[str, str]]) -> str:
    """(series, level) pairs as words, a series named once: "sweep c1, c2; other c4"."""
    by_series: dict[str, list[str]] = {}
    for series, level in levels:
        by_series.setdefault(series, []).append(level)
    return "; ".join(f"{series} {', '.join(labels)}" for series, labels in by_series.items())


def with_target(targets_tps: Sequence[float], target_tps: float) -> tuple[float, ...]:
    """The targets table's rows: `targets_tps` in the order given, with the cost table's `target_tps` too (in its
    place when the targets ascend, else last)."""
    if target_tps in targets_tps:
        return tuple(targets_tps)
    if list(targets_tps) == sorted(targets_tps):
        return tuple(sorted([*targets_tps, target_tps]))
    return (*targets_tps, target_tps)


def suggest_targets(low_tps: float, high_tps: float, count: int = 4) -> list[float]:
    """Up to `count` round interactivity targets (two significant digits) inside [low_tps, high_tps]."""
    if not 0 < low_tps <= high_tps:
        return []
    found: list[float] = []
    for i in range(count):
        x = low_tps + (high_tps - low_tps) * (i + 0.5) / count
        digits = 1 - math.floor(math.log10(x))
        rounded = round(x, digits)
        if low_tps <= rounded <= high_tps and rounded not in found:
            found.append(rounded)
    return found


def target_note(label: str, front_tps: Sequence[float], targets_tps: Sequence[float], statistic: str) -> str | None:
    """Why targets show no throughput: they lie off the front (no extrapolation), with targets that would not;
    None when every target is on it."""
    if not front_tps:
        return f"{label}: no level has an interactivity, so no target has a throughput"
    low, high = min(front_tps), max(front_tps)
    outside = [t for t in targets_tps if not low <= t <= high]
    if not outside:
        return None
    span = f"{low:,.0f} tok/s/user" if low == high else f"{low:,.0f}–{high:,.0f} tok/s/user"
    suggested = ",".join(f"{t:g}" for t in suggest_targets(low, high))
    which = "every target lies" if len(outside) == len(targets_tps) else f"{len(outside)} of the targets lie"
    hint = f"; try --targets {suggested}" if suggested else ""
    return f"{label}: {which} outside its front ({span} at {statistic}; no extrapolation){hint}"


def price_problem(
    label: str, sku: str | None, tier: str, tiers: Sequence[tuple[str, Price]], prices: PriceTable
) -> str | None:
    """Why the series has no $/M at `tier`, naming what to pass instead; None when it has one."""
    chosen = next((price for name, price in tiers if name == tier), None)
    if chosen is not None and chosen.usd_per_gpu_hour is not None:
        return None
    if sku is None:
        return f"{label}: no GPU SKU recorded or given, so no $/M: pass --gpu-sku SKU or --price USD_PER_GPU_HOUR"
    priced = [name for name, price in tiers if price.usd_per_gpu_hour is not None]
    if sku.lower() not in prices.gpus:
        return f"{label}: {sku.upper()} is not in the price table: pass --price USD_PER_GPU_HOUR or --prices FILE"
    why = f" ({chosen.what})" if chosen is not None and chosen.what else ""
    instead = f"pass --tier {priced[0]} (priced: {', '.join(priced)}) or --price" if priced else "pass --price"
    return f"{label}: no {tier} price for {sku.upper()}{why}: {instead}"


def no_point(summary: Summary) -> str:
    """Why a level's summary gives no point on the frontier (`frontier.point` returned None): no request kept, no
    throughput, or no TPOT — the last with what the run saw, since a TPOT of 0 (every token read at one instant) is a
    stream the server sent at once or a client that read it late, and the run's event-loop lag tells which."""
    if summary.counts.kept == 0:
        return "no request was kept, so no interactivity and no throughput"
    if summary.throughput is None:
        return "no throughput (no request completed in the measured window)"
    latency = summary.latency
    if latency.tpot_s is not None:
        return "its interactivity is not a finite positive figure"
    if latency.e2el_s is None:
        return "no request completed, so no TPOT and no interactivity"
    chunk = latency.chunk_tokens
    bundled = f" (up to {chunk.max:,.0f} tokens in one chunk)" if chunk is not None else ""
    lag = summary.loop_lag
    if lag is not None and lag.max_s >= LATE_READ_S:
        who = (
            f"the client read late: its event loop stalled for up to {lag.max_s * 1e3:,.0f} ms (a client starved of "
            "CPU); rerun with the client on a core of its own"
        )
    else:
        who = "the server sent each stream at once (a stream interval, a buffering proxy) or no response had two tokens"
    return f"no request has a TPOT above 0: every response's tokens were read at one instant{bundled}; {who}"


LATE_READ_S: Final = 0.1
"""Event-loop lag above which a stream read at one instant is put down to the client (its 100 ms timer woke this
late: a response of a few hundred tokens can arrive whole meanwhile)."""
