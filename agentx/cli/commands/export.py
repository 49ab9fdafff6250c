"""`agentx export`: a run's records in AIPerf's file formats or as a table."""

from __future__ import annotations

import time
from pathlib import Path

import click
import msgspec

from agentx.cli.common import fail, stderr, stdout
from agentx.cli.shared_flags import overwrite_flag


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "export_format",
    type=click.Choice(("aiperf-jsonl", "aiperf-summary", "arrow", "parquet", "csv")),
    required=True,
    help="aiperf-jsonl: profile_export.jsonl (one object per request); "
    "aiperf-summary: profile_export_aiperf.json (statistics and submission validity); "
    "arrow: records.arrow as an Arrow IPC file (without --out: a killed run's stream made a file in place); "
    "parquet: records.parquet; csv: records.csv (one header row, list columns as JSON arrays).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), metavar="PATH", help="File to write, or a directory (default: RUN_DIR)."
)
@overwrite_flag("the file if it exists")
def export(run_dir: Path, export_format: str, out: Path | None, overwrite: bool) -> None:
    """Export the run in RUN_DIR: AIPerf's file formats (for InferenceX tooling) or its records as a table."""
    from agentx.errors import ExportError, OutputExists, RecordsDamaged, RunInProgress, cli_words
    from agentx.results.export.export_run import export_run, export_target, finalize_in_place, is_own_records

    started = time.perf_counter()
    try:
        if export_format == "arrow" and is_own_records(run_dir, export_target(run_dir, export_format, out)):
            done = finalize_in_place(run_dir)
            seconds = time.perf_counter() - started
            if done.rewritten:
                note = f"rewrote {done.path} as an Arrow IPC file ({done.rows} rows) in {seconds:.2f} s"
            else:
                note = f"{done.path} is already an Arrow IPC file ({done.rows} rows); nothing written"
            stdout.print(note, markup=False)
            return
        written = export_run(run_dir, export_format, out, overwrite=overwrite)
    except (OutputExists, RunInProgress) as exc:
        fail(cli_words(exc))
    except RecordsDamaged as exc:
        fail(f"{exc}; nothing written")
    except ExportError as exc:
        fail(f"{exc}. Pass the directory a replay wrote (its --out), which holds records.arrow and run.json.")
    except OSError as exc:
        fail(f"{exc.filename or out}: cannot write the export ({exc.strerror or exc})")
    stdout.print(f"wrote {written} in {time.perf_counter() - started:.2f} s", markup=False)
    if export_format == "aiperf-summary":
        metadata = msgspec.json.decode(written.read_bytes())["metadata"]
        reasons = ", ".join(metadata["submission_invalid_reasons"]) or "none"
        valid = "true" if metadata["submission_valid"] else "false"
        stdout.print(f"submission_valid: {valid} (reasons: {reasons})", markup=False)
        if metadata["agentx"]["validity"]["run_file_missing"]:
            note = f"{run_dir} has no run.json (a crashed or unfinished run): counted as run_cancelled"
            stderr.print(note, markup=False)
