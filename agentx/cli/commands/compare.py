"""`agentx compare`: runs or sweeps side by side, with intervals, and what keeps them from being comparable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from agentx.results.compare.build import Comparison
    from agentx.results.compare.gate import Gate, GateResult

from agentx.cli.common import fail, interactivity_targets, stderr, stdout, write_page
from agentx.cli.shared_flags import frontier_flags, gpu_sku_flag, json_flag, overwrite_flag


@click.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_flag("the comparison")
@click.option("--markdown", is_flag=True, help="Print the comparison as Markdown tables.")
@click.option(
    "--html", "html_path", type=click.Path(path_type=Path), metavar="OUT.html", help="Write it as one HTML page."
)
@overwrite_flag("an existing --html or --junit file")
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    metavar="KEY",
    help="Accept a difference for a verdict: trace, rules, mode, model, gpus, gpu-sku, acceptance, concurrency, "
    "duration, validity, version (repeatable).",
)
@click.option(
    "--level",
    type=click.FloatRange(min=0.5, max=0.999),
    default=0.95,
    show_default=True,
    help="Family-wise confidence level: each row's interval is at 1 − (1 − level) / rows.",
)
@click.option(
    "--bootstrap",
    "replicates",
    type=click.IntRange(min=100),
    default=2000,
    show_default=True,
    help="Bootstrap replicates.",
)
@click.option(
    "--min-effect",
    type=click.FloatRange(min=0),
    default=0.01,
    show_default=True,
    help="Floor of every interval's half-width, relative (0.01: ±1%): the client's timing resolution.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@gpu_sku_flag("for the $ per task, overriding what a sweep recorded")
@click.option(
    "--price",
    "usd_per_gpu_hour",
    type=click.FloatRange(min=0),
    metavar="USD_PER_GPU_HOUR",
    help="Price the GPU time at this $/GPU/hr (the tier 'given').",
)
@frontier_flags
@click.option(
    "--fail-on",
    "fail_on",
    metavar="FIGURE:BOUND,...",
    help="Gate: exit 1 when a figure is resolved worse than its bound, a signed percent change (tput_per_gpu@50:-3%,"
    "ttft_p90:+10%), or when a side lacks it; a withheld verdict fails it too (docs/compare.md).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    metavar="OUT.xml",
    help="Write the --fail-on gate as JUnit XML: a testcase per bound per compared side.",
)
def compare_command(
    dirs: tuple[Path, ...],
    as_json: bool,
    markdown: bool,
    html_path: Path | None,
    overwrite: bool,
    allowed: tuple[str, ...],
    level: float,
    replicates: int,
    min_effect: float,
    seed: int,
    gpu_sku: str | None,
    usd_per_gpu_hour: float | None,
    statistic: str,
    basis: str,
    targets: str,
    fail_on: str | None,
    junit_path: Path | None,
) -> None:
    """Compare runs or sweeps (their directories; a folder of --repeat runs pools them), each against the first:
    every figure with its bootstrap interval over sessions, paired where they played the same sessions, whether the
    difference is resolved, and every way the runs differ that makes a verdict unfair (withheld unless --allow).
    Exit 3 when verdicts are withheld; with --fail-on, 1 when the gate fails (0 passes, 2 a usage error)."""
    from agentx.results.compare.build import compare
    from agentx.results.compare.fairness import KEYS
    from agentx.results.compare.options import CompareOptions
    from agentx.results.report.frontier import FrontierOptions

    if as_json and markdown:
        fail("pass --json or --markdown, not both: each prints the whole comparison")
    if len(dirs) < 2:
        fail("compare needs two or more run or sweep directories, the first being the baseline")
    unknown = [key for key in allowed if key not in KEYS]
    if unknown:
        fail(f"--allow {unknown[0]!r} is not one of {', '.join(KEYS)}")
    for path in (html_path, junit_path):
        if path is not None and path.exists() and not overwrite:
            fail(f"{path} exists: pass --overwrite to replace it")
    if junit_path is not None and fail_on is None:
        fail("--junit writes the --fail-on gate: pass --fail-on too")
    targets_tps = interactivity_targets(targets)
    gate = _parse_gate(fail_on, targets_tps)
    options = CompareOptions(
        level=level,
        replicates=replicates,
        seed=seed,
        min_effect=min_effect,
        allow=frozenset(allowed),
        gpu_sku=gpu_sku,
        usd_per_gpu_hour=usd_per_gpu_hour,
        frontier=FrontierOptions(statistic=statistic, basis=basis, targets_tps=targets_tps),  # type: ignore[arg-type]
    )
    if gate is not None:
        from agentx.results.compare.gate import empty_sides, failed_on_empty

        empty = empty_sides(list(dirs))
        if empty:
            # compare refuses a side without a completed request; a gate reports it as failed instead.
            failed = failed_on_empty(gate, list(dirs), empty, fail_on or "")
            _print(None, failed, as_json, markdown)
            if html_path is not None:
                _write_html(html_path, None, failed)
            _finish_gate(failed, junit_path)
    comparison = compare(list(dirs), options)
    result = None if gate is None else _evaluate(gate, comparison, fail_on or "", targets_tps)
    _print(comparison, result, as_json, markdown)
    if html_path is not None:
        _write_html(html_path, comparison, result)
    if result is not None and junit_path is not None:
        _write_junit(junit_path, result)
    if comparison.withheld:
        keys = ", ".join(d.key for d in comparison.withheld)
        stderr.print(f"verdicts withheld: the runs differ in {keys} (--allow KEY to compare anyway)", markup=False)
        raise SystemExit(3)
    if result is not None:
        _finish_gate(result, None)


def _parse_gate(fail_on: str | None, targets_tps: tuple[float, ...]) -> Gate | None:
    from agentx.errors import ConfigError
    from agentx.results.compare.gate import parse_gate

    if fail_on is None:
        return None
    try:
        return parse_gate(fail_on, targets_tps)
    except ConfigError as exc:
        fail(str(exc))


def _evaluate(gate: Gate, comparison: Comparison, spec: str, targets_tps: tuple[float, ...]) -> GateResult:
    from agentx.errors import ConfigError
    from agentx.results.compare.gate import check_kinds, evaluate

    try:
        check_kinds(gate, comparison.sides[0].kind, targets_tps)
    except ConfigError as exc:
        fail(str(exc))
    return evaluate(gate, comparison, spec)


def _print(comparison: Comparison | None, result: GateResult | None, as_json: bool, markdown: bool) -> None:
    """The comparison (None: there is none, only the gate's failure) and the gate's outcome, in the chosen form."""
    import msgspec

    from agentx.cli.display.compare_tables import compare_markdown, compare_sections, gate_markdown, gate_section
    from agentx.results.compare.build import comparison_json

    if as_json and result is None and comparison is not None:
        sys.stdout.write(comparison_json(comparison) + "\n")
        return
    if as_json:
        # The Comparison's fields as ever, the gate's outcome beside them under "gate".
        document = {} if comparison is None else msgspec.to_builtins(comparison)
        if result is not None:
            document["gate"] = msgspec.to_builtins(result)
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(document)).decode() + "\n")
        return
    if markdown:
        text = "" if comparison is None else compare_markdown(comparison) + "\n"
        sys.stdout.write(text + ("" if result is None else gate_markdown(result)))
        return
    sections = [] if comparison is None else compare_sections(comparison)
    sections += [] if result is None else [gate_section(result)]
    for section in sections:
        stdout.print(section.table())


def _finish_gate(result: GateResult, junit_path: Path | None) -> None:
    """Write the JUnit file if asked, then exit 1 when the gate failed."""
    if junit_path is not None:
        _write_junit(junit_path, result)
    if not result.passed:
        failed = result.failed
        stderr.print(f"gate failed: {len(failed)} of {len(result.checks)} bounds ({failed[0].other_label}: "
                     f"{failed[0].bound}: {failed[0].reason})", markup=False)  # fmt: skip
        raise SystemExit(1)


def _write_junit(path: Path, result: GateResult) -> None:
    from agentx.results.compare.gate import junit_xml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(result))


def _write_html(path: Path, comparison: Comparison | None, result: GateResult | None) -> None:
    from agentx.cli.display.compare_tables import html_sections
    from agentx.results.report.html import tables_page

    write_page(path, tables_page("agentx compare", html_sections(comparison, result)))
