"""repeats.json: the index of a folder of repeats, N runs (or sweeps) of one configuration with derived seeds, and what
a folder already holds that a new set would mix with.

`agentx replay --repeat N` and `agentx sweep --repeat N` write `r1/` … `rN/` (each a run or sweep folder) and
`repeats.json` (`RepeatIndex`); `agentx compare` pools a folder's repeats into one side and reports their spread.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Final

import msgspec

from agentx.errors import ReportError
from agentx.records.run_folder import RECORDS_FILE, REPEATS_FILE, RUN_FILE, SWEEP_FILE, write_json_atomically

_REPEAT_DIR: Final = re.compile(r"r[1-9][0-9]*")
_HELD_FILES: Final = (REPEATS_FILE, RECORDS_FILE, RUN_FILE, SWEEP_FILE)
"""What makes a folder, or a repeat folder in it, hold results a new set would mix with."""


class RepeatIndex(msgspec.Struct, kw_only=True):
    """The layout of repeats.json."""

    version: int = 1
    base_seed: int = 0
    seeds: list[int] = []
    """Each repeat's seed, in order (`repeat_seed`)."""
    dirs: list[str] = []
    """Each repeat's folder, relative to the repeats folder."""


def repeat_dir_name(number: int) -> str:
    """The folder of the `number`-th repeat (from 1)."""
    return f"r{number}"


def repeat_seed(base_seed: int, number: int) -> int:
    """The seed of the `number`-th repeat (from 1): the first keeps `base_seed`, so a repeat set's first run is the
    single run of the same options; the others are derived from it by hashing, so no two repeats share a seed."""
    if number == 1:
        return base_seed
    digest = hashlib.sha256(f"agentx-repeat:{base_seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def existing_repeats(out_dir: Path) -> str | None:
    """What `out_dir` already holds that a set of repeats would mix with (an index, a run or a sweep, in it or in a
    repeat folder), said briefly; None when nothing."""
    if not out_dir.is_dir():
        return None
    held = [name for name in _HELD_FILES if (out_dir / name).exists()]
    repeat_dirs = sorted(
        (path for path in out_dir.iterdir() if _REPEAT_DIR.fullmatch(path.name) and path.is_dir()),
        key=lambda path: int(path.name[1:]),
    )
    held += [f"{path.name}/{name}" for path in repeat_dirs for name in _HELD_FILES if (path / name).exists()]
    if not held:
        return None
    return ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")


def write_repeats(folder: Path, index: RepeatIndex) -> None:
    """Write `folder`'s repeats.json atomically."""
    write_json_atomically(folder / REPEATS_FILE, index)


def read_repeats(folder: Path) -> list[Path] | None:
    """The repeat folders of `folder` that exist, or None when it is not a folder of repeats."""
    path = folder / REPEATS_FILE
    if not path.is_file():
        return None
    try:
        index = msgspec.json.decode(path.read_bytes(), type=RepeatIndex)
    except (OSError, msgspec.DecodeError) as exc:
        raise ReportError(f"{path}: not a repeats index ({exc})") from None
    found = [folder / name for name in index.dirs if (folder / name).is_dir()]
    if not found:
        raise ReportError(f"{path}: none of its repeats ({', '.join(index.dirs) or 'none listed'}) is there")
    return found
