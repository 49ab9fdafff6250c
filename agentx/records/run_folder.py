"""A run folder's file names, which every layer shares, and the rule that a run is never replaced silently."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from agentx.errors import RunExists

RECORDS_FILE: Final = "records.arrow"
"""The run's records (agentx.records.record), written as the run goes."""
RUN_FILE: Final = "run.json"
"""Written into the run folder at the end of every run (interrupted ones too): options, run, summary."""


def refuse_existing_run(out_dir: Path, overwrite: bool) -> None:
    """Raise RunExists when `out_dir` holds a records file and `overwrite` is off: a run is never replaced silently."""
    if not overwrite and (out_dir / RECORDS_FILE).exists():
        raise RunExists(f"{out_dir} already holds a run ({RECORDS_FILE}); pass overwrite=True to replace it")
