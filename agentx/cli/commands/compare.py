"""`agentx compare`: runs or sweeps side by side, with intervals, and what keeps them from being comparable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from agentx.results.compare.build import Comparison

from agentx.cli.common import fail, interactivity_targets, stderr, stdout, write_page
from agentx.cli.shared_flags import frontier_flags, gpu_sku_flag, json_flag, overwrite_flag


@click.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_flag("the comparison")
@click.option("--markdown", is_flag=True, help="Print the comparison as Markdown tables.")
@click.option(
    "--html", "html_path", type=click.Path(path_type=Path), metavar="OUT.html", help="Write it as one HTML page."
)
@overwrite_flag("an existing --html file")
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
) -> None:
    """Compare runs or sweeps (their directories; a folder of --repeat runs pools them), each against the first:
    every figure with its bootstrap interval over sessions, paired where they played the same sessions, whether the
    difference is resolved, and every way the runs differ that makes a verdict unfair (withheld unless --allow).
    Exit 3 when verdicts are withheld."""
    from agentx.cli.display.compare_tables import compare_markdown, compare_sections
    from agentx.results.compare.build import compare, comparison_json
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
    if html_path is not None and html_path.exists() and not overwrite:
        fail(f"{html_path} exists: pass --overwrite to replace it")
    options = CompareOptions(
        level=level,
        replicates=replicates,
        seed=seed,
        min_effect=min_effect,
        allow=frozenset(allowed),
        gpu_sku=gpu_sku,
        usd_per_gpu_hour=usd_per_gpu_hour,
        frontier=FrontierOptions(statistic=statistic, basis=basis, targets_tps=interactivity_targets(targets)),  # type: ignore[arg-type]
    )
    comparison = compare(list(dirs), options)
    if as_json:
        sys.stdout.write(comparison_json(comparison) + "\n")
    elif markdown:
        sys.stdout.write(compare_markdown(comparison))
    else:
        for section in compare_sections(comparison):
            stdout.print(section.table())
    if html_path is not None:
        _write_html(html_path, comparison)
    if comparison.withheld:
        keys = ", ".join(d.key for d in comparison.withheld)
        stderr.print(f"verdicts withheld: the runs differ in {keys} (--allow KEY to compare anyway)", markup=False)
        raise SystemExit(3)


def _write_html(path: Path, comparison: Comparison) -> None:
    from agentx.cli.display.compare_tables import html_sections
    from agentx.results.report.html import tables_page

    write_page(path, tables_page("agentx compare", html_sections(comparison)))
