"""`agentx validate`, `convert`, `inspect` and `compare`: traces in and out."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import msgspec

from agentx.cli.common import fail, print_findings, stderr, stdout
from agentx.cli.shared_flags import block_size_option, format_option, json_flag, overwrite_flag
from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.io import Format, load_trace, save_trace


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@format_option
@block_size_option
@click.option("--max-findings", default=50, show_default=True, help="Print at most this many findings (0: all).")
def validate(trace: Path, input_format: Format | None, block_size: int | None, max_findings: int) -> None:
    """Check TRACE; print each error and warning with its file, line, session and request.

    Exit status 0 when there are no errors (warnings allowed), 2 otherwise.
    """
    findings = Findings()
    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size, findings=findings)
    except TraceError as exc:
        print_findings(findings.items or exc.findings, max_findings)
        errors = len(findings.errors) or len(exc.findings)
        fail(f"{trace}: {errors} error(s), {len(findings.warnings)} warning(s); the trace is not usable")
    print_findings(findings.items, max_findings)
    stdout.print(
        f"{trace}: ok — {len(loaded.sessions):,} sessions, {loaded.request_count:,} requests, "
        f"{len(findings.warnings):,} warning(s)",
        markup=False,
    )


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("destination", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "output_format",
    type=click.Choice(("arrow", "parquet", "weka", "mooncake")),
    help="Output format (default: from DESTINATION's suffix: .arrow, .ipc or .feather Arrow, .parquet Parquet, "
    ".jsonl or .json Weka JSONL; Mooncake only when named here).",
)
@format_option
@block_size_option
@overwrite_flag("DESTINATION if it exists")
def convert(
    source: Path,
    destination: Path,
    output_format: Format | None,
    input_format: Format | None,
    block_size: int | None,
    overwrite: bool,
) -> None:
    """Convert SOURCE to DESTINATION (Arrow, Parquet, Weka JSONL or Mooncake JSONL)."""
    from agentx.records.run_folder import refuse_existing_file
    from agentx.trace.io import suffix_format, unknown_suffix

    # Both before reading a large trace for nothing.
    if output_format is None and suffix_format(destination) is None:
        fail(f"{unknown_suffix(destination)}; pass --to arrow, parquet, weka or mooncake to choose one")
    refuse_existing_file(destination, overwrite, named_by="DESTINATION")
    started = time.perf_counter()
    findings = Findings()
    try:
        trace = load_trace(source, format=input_format, block_size=block_size, findings=findings)
        print_findings(findings.warnings, 10)
        save_trace(trace, destination, format=output_format)
    except OSError as exc:
        fail(f"{destination}: cannot write: {exc.strerror or exc}")
    size_mb = destination.stat().st_size / 1e6 if destination.is_file() else 0.0
    stdout.print(
        f"wrote {destination}: {len(trace.sessions):,} sessions, {trace.request_count:,} requests, "
        f"{size_mb:,.2f} MB in {time.perf_counter() - started:.2f} s",
        markup=False,
    )


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@json_flag("the report")
@click.option(
    "--cache-tokens",
    default="",
    metavar="N[,N...]",
    help="LRU cache capacities in tokens to simulate, e.g. 1e6,1e7,1e8.",
)
@click.option(
    "--non-causal",
    is_flag=True,
    help="Count a block as cached once its producer starts (older reference rule), not once it ends.",
)
@format_option
@block_size_option
def inspect(
    trace: Path, as_json: bool, cache_tokens: str, non_causal: bool, input_format: Format | None, block_size: int | None
) -> None:
    """Summarise TRACE: sessions, subagent shape, distributions, prefix-cache hit rates."""
    from agentx.cli.display.tables import stats_tables
    from agentx.trace.stats import parse_token_counts, trace_stats

    try:
        capacities = parse_token_counts(cache_tokens) if cache_tokens else []
    except ValueError as exc:
        fail(f"--cache-tokens: {exc}")
    findings = Findings()
    loaded = load_trace(trace, format=input_format, block_size=block_size, findings=findings)
    if findings.warnings:
        stderr.print(f"{len(findings.warnings):,} warning(s); `agentx validate {trace}` lists them", markup=False)
    stats = trace_stats(loaded, cache_tokens=capacities, causal=not non_causal)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(stats)).decode() + "\n")
        return
    for table in stats_tables(stats, title=str(trace)):
        stdout.print(table)
