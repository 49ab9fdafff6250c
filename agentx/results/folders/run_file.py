"""run.json: the layout of a run's document (`RunFile`: options, run, summary), its atomic write and its reading, an
older file's latency keys renamed; `finished_run` and `check_records` for readers that stand on its figures.

A run folder holds `records.arrow` and `run.json` (agentx.records.run_folder names them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import msgspec

from agentx.records.run_folder import RECORDS_FILE, RUN_FILE, Recorded, count_run_records, write_json_atomically
from agentx.replayer.run_result import RunResult
from agentx.results.summary.summarize import Summary


class RunFile(msgspec.Struct, kw_only=True):
    """The layout of `run.json`: the run's options (credentials redacted), its `RunResult` and its `Summary`."""

    options: dict[str, Any]
    run: RunResult
    summary: Summary


def write_run_file(path: Path, document: RunFile) -> None:
    """Write run.json atomically (a reader never sees half of one); an OSError naming the file when the OS refuses,
    and no half file left."""
    write_json_atomically(path, document, enc_hook=str)


def _paths(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(f"cannot decode {kind}")


LATENCY_RENAMES: Final = (("itl_s", "tpot_s"), ("chunk_itl_s", "itl_s"), ("e2e_s", "e2el_s"))
"""The summary's latency keys before vLLM's names were used, and their names since, in the order to rename them
(the old `itl_s` was the per-request TPOT; `chunk_itl_s` the gaps between chunks, vLLM's ITL)."""


def read_run_file(path: Path) -> RunFile:
    """A run.json (an older one's latency keys renamed, `LATENCY_RENAMES`); OSError or msgspec.DecodeError when it
    cannot be read as one."""
    raw = path.read_bytes()
    document = msgspec.json.decode(raw)
    latency = document.get("summary", {}).get("latency") if isinstance(document, dict) else None
    if isinstance(latency, dict) and "tpot_s" not in latency:
        for old, new in LATENCY_RENAMES:
            if old in latency:
                latency[new] = latency.pop(old)
        raw = msgspec.json.encode(document)
    # Decoded from JSON, not converted from the document: JSON's object keys are strings, and only the JSON
    # decoder reads them back into a struct's integer keys (the acceptance's tokens per chunk).
    return msgspec.json.decode(raw, type=RunFile, dec_hook=_paths)


def finished_run(run_dir: Path) -> RunFile | None:
    """The run.json of a level that ran to its end (not interrupted), else None."""
    try:
        run_file = read_run_file(run_dir / RUN_FILE)
    except (OSError, msgspec.DecodeError):
        return None
    return None if run_file.run.interrupted else run_file


def check_records(run_dir: Path, run_file: RunFile) -> None:
    """`RecordsDamaged` when the run's records file reads fewer rows than its run.json counts: a report of run.json's
    figures would stand on records that are no longer there. Cheap (a finished file's footer, not its rows); a run
    without a records file is left to its run.json."""
    records = run_dir / RECORDS_FILE
    if records.is_file():
        count_run_records(records, Recorded(run_file.summary.counts.rows, run_file.summary.run_id))
