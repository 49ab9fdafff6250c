"""`agentx import`: another tool's run made an agentx run folder."""

from __future__ import annotations

from pathlib import Path

import click
import msgspec

from agentx.cli.common import fail, refuse_existing_run, stderr, stdout
from agentx.cli.shared_flags import gpus_flag, json_flag, overwrite_flag


@click.group("import")
def import_group() -> None:
    """Make another tool's run an agentx run folder (for report, export and the summary)."""


@import_group.command("aiperf")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Run directory to write: records.arrow and run.json.",
)
@overwrite_flag("the run already in --out")
@gpus_flag()
@json_flag("the summary")
def import_aiperf_command(artifact_dir: Path, out_dir: Path, overwrite: bool, gpus: int | None, as_json: bool) -> None:
    """Import ARTIFACT_DIR, a run of AIPerf or agentx-harness, as the agentx run folder --out.

    ARTIFACT_DIR is the folder the tool wrote its exports to. Reads profile_export.jsonl (one record per request),
    and profile_export_aiperf.json (the run's options) and server_metrics_export.json (the server's telemetry)
    when present; writes records.arrow and run.json as `agentx replay` does, and prints the summary. What AIPerf
    does not record is left empty and listed in run.json (run.notices) and below the summary (docs/results.md).
    """
    from agentx.records.run_folder import RUN_FILE
    from agentx.results.imports.aiperf_folder import import_aiperf

    if not overwrite:
        refuse_existing_run(out_dir)
    try:
        imported = import_aiperf(artifact_dir, out_dir, overwrite=overwrite, num_gpus=gpus)
    except OSError as exc:
        fail(f"{exc.filename or out_dir}: cannot write the run ({exc.strerror or exc})")
    if as_json:
        click.echo(msgspec.json.format(msgspec.json.encode(imported.summary)).decode())
    else:
        from agentx.cli.display.summary_tables import summary_table  # rich: only once there is a summary to show

        version = f" {imported.tool_version}" if imported.tool_version else ""
        for table in summary_table(imported.summary, title=f"{imported.tool}{version} run in {artifact_dir}"):
            stdout.print(table)
        stdout.print(f"records: {imported.run.records_path}", markup=False)
        stdout.print(f"run: {imported.run_dir / RUN_FILE}", markup=False)
    run = imported.run
    stderr.print(
        f"imported {run.requests:,} requests ({run.warmup_requests:,} warmup, {run.errors:,} failed) from "
        f"{', '.join(imported.files)}" + (" (AIPerf says the run was cancelled)" if run.interrupted else ""),
        markup=False,
    )
    for notice in run.notices:
        stderr.print(f"note: {notice}", markup=False)
