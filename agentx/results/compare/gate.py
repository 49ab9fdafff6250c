"""`agentx compare --fail-on`: bounds on relative changes that fail a CI pipeline when a figure is resolved worse.

The grammar (docs/compare.md, "Gating a pull request"): a comma-separated list of `FIGURE:BOUND`, BOUND a signed
relative change in percent (`-3%`, `+10%`, `+0%`). FIGURE is a figure compare shows, named from it: a run's rows
(`metric_name` of agentx.results.compare.metrics: `ttft_p90`, `output_throughput`, `gpu_time_per_task`, ...),
`usd_per_task` (priced from `gpu_time_per_task`), or a sweep's throughput per GPU at an interactivity target,
`tput_per_gpu@50`. The sign says which way is worse: a higher-is-better figure takes a negative bound (fail when the
change is resolved below it), a lower-is-better one a positive bound (fail when resolved above it).

A bound fails when the whole interval of the relative difference (compare's own, simultaneous over the comparison's
rows) lies beyond it and compare calls the row worse (with repeats, the Welch check agrees); when its verdict is
withheld; and when either side lacks the figure (no completed requests, no tokens, a target off the front): a run
without output tokens never passes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final
from xml.etree import ElementTree

import msgspec

from agentx.errors import ConfigError
from agentx.results.compare.build import Comparison, Row, Versus
from agentx.results.compare.metrics import Better, metrics
from agentx.results.compare.sides import Loaded, Side, load_side
from agentx.results.compare.sweeps import SweepVersus, TargetRow

SWEEP_FIGURE: Final = "tput_per_gpu"
"""A sweep's figure: throughput per GPU (compare's `--basis`) at the target after `@`."""
USD_PER_TASK: Final = "usd_per_task"
"""$ per task at the first price tier both sides have: GPU time per task times a constant price."""
OUTPUT_THROUGHPUT: Final = "output_throughput"
"""The row whose absence or zero on a side marks a run that produced no tokens."""

_BOUND: Final = re.compile(r"^\s*([A-Za-z0-9_]+(?:@[0-9]+(?:\.[0-9]+)?)?)\s*:\s*([+-])\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")


class Bound(msgspec.Struct, frozen=True, kw_only=True):
    """One `FIGURE:BOUND` of the gate."""

    figure: str
    """The canonical name: `ttft_p90`, `tput_per_gpu@50`."""
    limit: float
    """The relative change (−0.03 for `-3%`) beyond which a resolved difference fails."""
    better: Better
    text: str
    """As written, normalized: `ttft_p90:+10%`."""


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    bounds: list[Bound]


class Check(msgspec.Struct, kw_only=True):
    """One bound on one compared side."""

    bound: str
    figure: str
    limit: float
    baseline_label: str
    other_label: str
    baseline: float | None = None
    value: float | None = None
    relative: float | None = None
    low: float | None = None
    high: float | None = None
    passed: bool = False
    reason: str = ""


class GateResult(msgspec.Struct, kw_only=True):
    spec: str
    passed: bool
    checks: list[Check]

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]


def metric_name(metric: str) -> str:
    """A row's name in the grammar: lower case, runs of other characters as `_` ("TTFT p90" → "ttft_p90")."""
    return re.sub(r"[^a-z0-9]+", "_", metric.lower()).strip("_")


def target_name(target_tps: float) -> str:
    return f"{SWEEP_FIGURE}@{target_tps:g}"


def run_figures() -> dict[str, Better]:
    """Every run figure compare shows, by grammar name, with its direction (from the metrics themselves)."""
    figures: dict[str, Better] = {metric_name(spec.name): spec.better for spec, _ in metrics(True)}
    figures[USD_PER_TASK] = "lower"
    return figures


def sweep_figures(targets_tps: Sequence[float]) -> dict[str, Better]:
    return {target_name(target): "higher" for target in targets_tps}


def known_figures(targets_tps: Sequence[float]) -> dict[str, Better]:
    return run_figures() | sweep_figures(targets_tps)


def _names_hint(targets_tps: Sequence[float]) -> str:
    return "figures: " + ", ".join(known_figures(targets_tps))


def parse_gate(spec: str, targets_tps: Sequence[float]) -> Gate:
    """The bounds of `spec`; ConfigError, naming every figure, for a malformed bound, an unknown figure, a sweep target
    not among `targets_tps`, or a sign that is not the worse direction of its figure."""
    known = known_figures(targets_tps)
    bounds: list[Bound] = []
    for part in spec.split(","):
        match = _BOUND.match(part)
        if match is None:
            raise ConfigError(
                f"--fail-on {part.strip()!r} is not FIGURE:BOUND with BOUND a signed percent (ttft_p90:+10%); "
                + _names_hint(targets_tps)
            )
        name, sign, magnitude = match.group(1).lower(), match.group(2), float(match.group(3))
        if "@" in name:
            figure, target = name.split("@")
            name = target_name(float(target)) if figure == SWEEP_FIGURE else name
        better = known.get(name)
        if better is None:
            raise ConfigError(f"--fail-on names {name!r}, which compare does not show; " + _names_hint(targets_tps))
        worse_sign = "-" if better == "higher" else "+"
        if sign != worse_sign:
            raise ConfigError(
                f"--fail-on {name}:{sign}{magnitude:g}%: {name} is {better}-is-better, so its bound is "
                f"{worse_sign}N% (fail when resolved {'below' if better == 'higher' else 'above'} it); "
                + _names_hint(targets_tps)
            )
        limit = magnitude / 100.0 * (-1.0 if sign == "-" else 1.0)
        bounds.append(Bound(figure=name, limit=limit, better=better, text=f"{name}:{sign}{magnitude:g}%"))
    return Gate(bounds=bounds)


def check_kinds(gate: Gate, kind: str, targets_tps: Sequence[float]) -> None:
    """ConfigError when a bound names a sweep figure in a comparison of runs, or the other way round."""
    allowed = sweep_figures(targets_tps) if kind == "sweep" else run_figures()
    wrong = [bound.figure for bound in gate.bounds if bound.figure not in allowed]
    if wrong:
        raise ConfigError(
            f"--fail-on names {', '.join(wrong)}, not a figure of a comparison of {kind}s; figures: "
            + ", ".join(allowed)
        )


class _Figure(msgspec.Struct, kw_only=True):
    """A row of either kind, as the gate reads it."""

    baseline: float | None
    value: float | None
    relative: float | None
    low: float | None
    high: float | None
    verdict: str


def _from_row(row: Row | TargetRow) -> _Figure:
    return _Figure(baseline=row.baseline, value=row.value, relative=row.relative, low=row.low, high=row.high,
                   verdict=row.verdict)  # fmt: skip


def _usd_figure(row: Row | None, base: Side, other: Side) -> _Figure | str:
    """$ per task from the GPU-time row: a constant price per side rescales the ratio and its interval exactly."""
    if row is None:
        return "neither side has a GPU time per task"
    tier = next((t for t in base.usd_per_task if t in other.usd_per_task), None)
    if tier is None or not base.gpu_s_per_task or not other.gpu_s_per_task:
        return "no price common to both sides (pass --gpu-sku or --price)"
    base_price = base.usd_per_task[tier] / base.gpu_s_per_task
    other_price = other.usd_per_task[tier] / other.gpu_s_per_task
    factor = other_price / base_price

    def scaled(x: float | None) -> float | None:
        return None if x is None else (1.0 + x) * factor - 1.0

    low, high = scaled(row.low), scaled(row.high)
    verdict = row.verdict
    if not verdict.startswith("withheld") and low is not None and high is not None:
        # Prices that differ move the ratio off the GPU-time row's: its own interval says whether it is resolved.
        verdict = "worse" if low > 0 else "better" if high < 0 else "no resolved difference"
    return _Figure(
        baseline=None if row.baseline is None else row.baseline * base_price,
        value=None if row.value is None else row.value * other_price,
        relative=scaled(row.relative), low=low, high=high, verdict=verdict,
    )  # fmt: skip


def _judge(bound: Bound, figure: _Figure | str, check: Check, base_label: str, other_label: str) -> None:
    """Fill `check` from `figure` (or the reason it is missing): pass only on a figure both sides have, a verdict
    not withheld, and an interval not wholly beyond the bound."""
    if isinstance(figure, str):
        check.reason = figure
        return
    check.baseline, check.value, check.relative = figure.baseline, figure.value, figure.relative
    check.low, check.high = figure.low, figure.high
    if figure.baseline is None or figure.value is None:
        missing = [label for label, v in ((base_label, figure.baseline), (other_label, figure.value)) if v is None]
        check.reason = (
            f"{' and '.join(missing)} has no {bound.figure} (no completed requests, no tokens, or off the front)"
        )
    elif figure.verdict.startswith("withheld"):
        check.reason = f"verdict {figure.verdict}"
    elif figure.relative is None:
        check.reason = f"{base_label}'s {bound.figure} is 0: no relative change"
    elif figure.low is None or figure.high is None:
        check.reason = f"no interval ({figure.verdict})"
    else:
        beyond = figure.high < bound.limit if bound.better == "higher" else figure.low > bound.limit
        interval = f"{figure.relative:+.1%} in [{figure.low:+.1%}, {figure.high:+.1%}]"
        if beyond and figure.verdict == "worse":
            check.reason = f"resolved worse than {bound.limit:+.1%}: {interval}"
        else:
            check.passed = True
            check.reason = f"not resolved beyond {bound.limit:+.1%}: {interval}"


def _run_checks(gate: Gate, versus: Versus, base: Side, other: Side) -> list[Check]:
    rows = {metric_name(row.metric): row for row in versus.rows}
    output = rows.get(OUTPUT_THROUGHPUT)
    tokenless = [
        label
        for label, v in ((versus.baseline, output and output.baseline), (versus.other, output and output.value))
        if not v or not math.isfinite(v)
    ]
    checks = []
    for bound in gate.bounds:
        check = Check(bound=bound.text, figure=bound.figure, limit=bound.limit, baseline_label=versus.baseline,
                      other_label=versus.other)  # fmt: skip
        figure: _Figure | str
        if bound.figure == USD_PER_TASK:
            figure = _usd_figure(rows.get("gpu_time_per_task"), base, other)
        elif (row := rows.get(bound.figure)) is None:
            figure = f"neither side has {bound.figure} (goodput needs --slo; per-task figures need completed tasks)"
        else:
            figure = _from_row(row)
        _judge(bound, figure, check, versus.baseline, versus.other)
        if tokenless and check.passed:
            check.passed = False
            check.reason = f"{' and '.join(tokenless)} produced no output tokens: a run without tokens never passes"
        checks.append(check)
    return checks


def _sweep_checks(gate: Gate, versus: SweepVersus) -> list[Check]:
    rows = {target_name(row.target_tps): row for row in versus.targets}
    checks = []
    for bound in gate.bounds:
        check = Check(bound=bound.text, figure=bound.figure, limit=bound.limit, baseline_label=versus.baseline,
                      other_label=versus.other)  # fmt: skip
        row = rows.get(bound.figure)
        _judge(bound, f"compare has no row {bound.figure}" if row is None else _from_row(row), check,
               versus.baseline, versus.other)  # fmt: skip
        checks.append(check)
    return checks


def evaluate(gate: Gate, comparison: Comparison, spec: str = "") -> GateResult:
    """Every bound on every compared side (each against the baseline)."""
    checks: list[Check] = []
    for index, versus in enumerate(comparison.versus, start=1):
        checks += _run_checks(gate, versus, comparison.sides[0], comparison.sides[index])
    for sweep in comparison.sweeps:
        checks += _sweep_checks(gate, sweep)
    return GateResult(spec=spec, passed=all(check.passed for check in checks), checks=checks)


def empty_sides(paths: Sequence[Path]) -> list[Loaded]:
    """The sides among `paths` with no kept request in any run or level (compare refuses them): where a gate must fail
    rather than the comparison stop. ReportError for a folder that holds no run."""
    loaded = [load_side(path) for path in paths]
    return [
        item
        for item in loaded
        if not any(
            level.summary is not None and level.summary.throughput is not None
            for series in item.repeats
            for level in series.levels
        )
    ]


def failed_on_empty(gate: Gate, paths: Sequence[Path], empty: Sequence[Loaded], spec: str = "") -> GateResult:
    """Every bound failed on every compared side, when a side has no completed request to compare."""
    labels = [path.resolve().name for path in paths]
    empty_labels = {item.label for item in empty}
    checks = []
    for other in labels[1:]:
        lacking = [label for label in (labels[0], other) if label in empty_labels] or sorted(empty_labels)
        reason = f"{' and '.join(lacking)} has no completed request: nothing to compare, so no bound can pass"
        for bound in gate.bounds:
            checks.append(Check(bound=bound.text, figure=bound.figure, limit=bound.limit, baseline_label=labels[0],
                                other_label=other, reason=reason))  # fmt: skip
    return GateResult(spec=spec, passed=False, checks=checks)


def _figures(check: Check) -> str:
    def n(value: float | None) -> str:
        return "—" if value is None else f"{value:,.4g}"

    interval = "—" if check.low is None or check.high is None else f"[{check.low:+.2%}, {check.high:+.2%}]"
    relative = "—" if check.relative is None else f"{check.relative:+.2%}"
    return (
        f"{check.figure}: {check.baseline_label} {n(check.baseline)}, {check.other_label} {n(check.value)}, "
        f"change {relative}, interval {interval}, bound {check.limit:+.1%}"
    )


def junit_xml(result: GateResult) -> str:
    """One JUnit testcase per bound per compared side, a failure carrying the figures and the interval."""
    suite = ElementTree.Element(
        "testsuite", name="agentx compare --fail-on", tests=str(len(result.checks)),
        failures=str(len(result.failed)), errors="0", skipped="0",
    )  # fmt: skip
    for check in result.checks:
        case = ElementTree.SubElement(
            suite, "testcase", classname=f"agentx.compare.{check.other_label}", name=check.bound
        )
        if not check.passed:
            failure = ElementTree.SubElement(case, "failure", message=check.reason, type="GateFailure")
            failure.text = _figures(check)
        else:
            ElementTree.SubElement(case, "system-out").text = _figures(check)
    suites = ElementTree.Element("testsuites", name="agentx compare", tests=suite.get("tests", "0"),
                                 failures=suite.get("failures", "0"))  # fmt: skip
    suites.append(suite)
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
