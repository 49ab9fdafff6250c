"""`agentx report`: the tables and plots of runs and sweeps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from agentx.results.report.build import Report, Series

from agentx.cli.common import fail, interactivity_targets, stderr, stdout, write_page
from agentx.cli.shared_flags import frontier_flags, gpu_sku_flag, gpus_flag, json_flag, overwrite_flag


@click.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_flag("the report")
@click.option("--markdown", is_flag=True, help="Print the report as Markdown tables.")
@click.option("--plots", "plots_dir", type=click.Path(path_type=Path), metavar="DIR", help="Write PNG and SVG plots.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    metavar="OUT.html",
    help="Write the whole report as one self-contained page (tables, validity, plots as inline SVG).",
)
@overwrite_flag("an existing --html file")
@click.option(
    "--target",
    "target_tps",
    default=50.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Interactivity (tok/s/user) of the per-tier cost table.",
)
@frontier_flags
@click.option("--tier", default="hyperscaler", show_default=True, help="Price tier of the targets table's $/M.")
@gpu_sku_flag("for prices, overriding what the sweep recorded")
@gpus_flag(overriding=True)
@click.option(
    "--price",
    "usd_per_gpu_hour",
    type=click.FloatRange(min=0),
    metavar="USD_PER_GPU_HOUR",
    help="Price every series at this $/GPU/hr (the tier 'given').",
)
@click.option("--prices", "prices_path", type=click.Path(path_type=Path), metavar="FILE", help="Price table JSON.")
@click.option(
    "--power-kw-per-gpu",
    type=click.FloatRange(min=0, min_open=True),
    metavar="KW",
    help="Power per GPU (its share of the facility), for J/token and tokens per MW.",
)
@click.option("--label", "labels", multiple=True, help="Name of each directory's series, in order (repeatable).")
@click.option(
    "--mixed-rules",
    is_flag=True,
    help="Report runs of different AgentX rule sets together (refused otherwise: their figures are not comparable).",
)
@click.option(
    "--engine",
    "engines",
    multiple=True,
    help="The engine of each directory's series, in order, replacing what its runs recorded (repeatable).",
)
def report_command(
    dirs: tuple[Path, ...],
    as_json: bool,
    markdown: bool,
    plots_dir: Path | None,
    html_path: Path | None,
    overwrite: bool,
    target_tps: float,
    targets: str,
    tier: str,
    statistic: str,
    basis: str,
    gpu_sku: str | None,
    gpus: int | None,
    usd_per_gpu_hour: float | None,
    prices_path: Path | None,
    power_kw_per_gpu: float | None,
    labels: tuple[str, ...],
    mixed_rules: bool,
    engines: tuple[str, ...],
) -> None:
    """Tables of one or more runs or sweeps (their directories), side by side: throughput per GPU at every
    interactivity target with $/M and the operating point, what serving costs per price tier, best TTFT and TPOT,
    peak throughput, every level. Reads run.json and records.arrow only, so any run directory works.
    """
    from agentx.cli.display.report_tables import report_markdown, report_tables
    from agentx.errors import RecordsDamaged
    from agentx.results.report.build import ReportOptions, build_report, load_series, report_json
    from agentx.results.report.build import mixed_rules as rules_conflict
    from agentx.results.report.cost import TIERS, load_price_table
    from agentx.results.report.frontier import FrontierOptions

    if as_json and markdown:
        fail("pass --json or --markdown, not both: each prints the whole report")
    if html_path is not None and html_path.exists() and not overwrite:
        fail(f"{html_path} exists: pass --overwrite to replace it")
    for flag, given in (("--label", labels), ("--engine", engines)):
        if len(given) > len(dirs):
            fail(f"{len(given)} {flag} for {len(dirs)} director{'y' if len(dirs) == 1 else 'ies'}: one per directory")
    try:
        prices = load_price_table(prices_path)
        known_tiers = sorted({*TIERS, *prices.tiers})
        if usd_per_gpu_hour is None and tier not in known_tiers:
            raise click.BadParameter(f"--tier {tier!r} is not one of {', '.join(known_tiers)}")
        if gpu_sku is not None and gpu_sku.lower() not in prices.gpus and usd_per_gpu_hour is None:
            raise click.BadParameter(
                f"--gpu-sku {gpu_sku!r} is not in the price table ({', '.join(prices.gpus)}); "
                "pass --price USD_PER_GPU_HOUR or a --prices file that has it"
            )
        options = ReportOptions(
            frontier=FrontierOptions(statistic=statistic, basis=basis, targets_tps=interactivity_targets(targets)),  # type: ignore[arg-type]
            target_tps=target_tps,
            tier=tier,
            gpu_sku=gpu_sku,
            num_gpus=gpus,
            usd_per_gpu_hour=usd_per_gpu_hour,
            kw_per_gpu=power_kw_per_gpu,
        )
        series = [
            load_series(d, labels[i] if i < len(labels) else None, engines[i] if i < len(engines) else None)
            for i, d in enumerate(dirs)
        ]
        conflict = rules_conflict(series)
        if conflict is not None and not mixed_rules:
            raise click.BadParameter(conflict)
        report = build_report(series, options, prices)
    except click.BadParameter as exc:
        fail(str(exc))
    except RecordsDamaged as exc:
        fail(f"{exc}; no report made")
    if as_json:
        sys.stdout.write(report_json(report) + "\n")
    elif markdown:
        sys.stdout.write(report_markdown(report))
    else:
        for item in report_tables(report):
            if isinstance(item, str):  # a note: wrapped to the width, its brackets text
                stdout.print(item, markup=False, soft_wrap=False)
            else:
                stdout.print(item)
        unknown = [s.label for s in report.series if not s.gpus_known]
        if unknown:
            stderr.print(
                f"{', '.join(unknown)}: no GPU count recorded; throughput is per server (pass --gpus N)", markup=False
            )
    if html_path is not None:
        _write_html(html_path, report, series)
    if plots_dir is not None:
        from agentx.errors import PlotsUnavailableError
        from agentx.results.report.plots import write_plots

        try:
            written = write_plots(report, plots_dir)
        except PlotsUnavailableError as exc:
            stderr.print(f"no plots: {exc}", markup=False)
            return
        except OSError as exc:
            fail(f"{exc.filename or plots_dir}: cannot write the plots ({exc.strerror or exc})")
        stderr.print(f"wrote {len(written)} plot files into {plots_dir}", markup=False)


def _write_html(path: Path, report: Report, series: list[Series]) -> None:
    """The report as one HTML page at `path` (`write_page`)."""
    from agentx.cli.display.report_tables import report_notes, report_sections
    from agentx.results.report.html import html_report

    write_page(path, html_report(report, series, report_sections(report), report_notes(report)))
