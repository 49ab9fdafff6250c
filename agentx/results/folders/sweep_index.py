"""sweep.json: the index of a sweep folder (`SweepIndex`), one run folder per level, `c{N}/`, and what a folder
already holds that a new sweep would mix with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from agentx.records.run_folder import RECORDS_FILE, SWEEP_FILE, write_json_atomically

LevelStatus = Literal["ok", "failed", "kept", "interrupted"]
"""`kept`: a level `--resume` kept from an earlier run (written `skipped` before)."""


class LevelEntry(msgspec.Struct, kw_only=True):
    """One level in sweep.json."""

    concurrency: int
    dir: str
    """Relative to the sweep directory."""
    status: LevelStatus
    error: str | None = None
    elapsed_s: float = 0.0
    spec_al: float | None = None
    spec_k: int | None = None


class SweepIndex(msgspec.Struct, kw_only=True):
    """The layout of sweep.json."""

    version: int = 1
    trace: str = ""
    gpu_sku: str | None = None
    num_gpus: int | None = None
    seed: int = 0
    concurrency: list[int] = []
    levels: list[LevelEntry] = []


def level_dir_name(concurrency: int) -> str:
    return f"c{concurrency}"


def write_index(out_dir: Path, index: SweepIndex) -> None:
    """Write `out_dir`'s sweep.json atomically."""
    write_json_atomically(out_dir / SWEEP_FILE, index)


def existing_sweep(out_dir: Path) -> str | None:
    """What of a sweep `out_dir` already holds (its index, some levels' records), said briefly; None if nothing."""
    held = sorted(str(path.relative_to(out_dir)) for path in out_dir.glob(f"c*/{RECORDS_FILE}"))
    if held:
        return ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
    return SWEEP_FILE if (out_dir / SWEEP_FILE).exists() else None


def read_index(out_dir: Path) -> SweepIndex | None:
    """The sweep.json of `out_dir`, or None when there is none."""
    path = out_dir / SWEEP_FILE
    if not path.is_file():
        return None
    document = msgspec.json.decode(path.read_bytes())
    for level in document.get("levels", []) if isinstance(document, dict) else []:
        if isinstance(level, dict) and level.get("status") == "skipped":
            level["status"] = "kept"
    return msgspec.convert(document, type=SweepIndex)
