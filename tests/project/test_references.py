"""Every reference in the code and the docs resolves inside the repository: a dotted `agentx.…` name names a module
(and a name it defines), a path names a file that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from paths import REPO

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

DOTTED = re.compile(r"(?<![\w./-])agentx(?:\.[A-Za-z_]\w*)+")
LOGGER = re.compile(r"getLogger\([^)]*\)")
PATH = re.compile(
    r"(?<![\w./-])((?:agentx|tests|bench|docs|scripts|engine_tests|reference_tests|examples|schemas|traces)/[\w./-]*\w"
    r"|(?:replayer|results|trace|sim|synth|cli|run|spec|records)/[\w/]*\w\.py)"
)


def _tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "Makefile", "*.toml"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in names if (REPO / name).is_file()]


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(dotted: str) -> bool:
    parts = dotted.rstrip(".").split(".")
    if _module_file(parts[:2]) is None and not (REPO / parts[0] / parts[1]).is_dir():
        return True  # not a module's name: a metadata key (agentx.run_id), a logger's, a dunder
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        # A name the module defines or imports: a word of its text is enough to catch a moved or renamed module.
        return re.search(rf"\b{re.escape(rest[0])}\b", module.read_text(encoding="utf-8")) is not None
    return False


def _path_exists(path: str) -> bool:
    if path.startswith("bench/out") or "/build" in path:
        return True  # made by a run, not kept
    candidates = [REPO / path, REPO / "agentx" / path]
    return any(candidate.exists() or Path(str(candidate).rstrip(".")).exists() for candidate in candidates)


def _unresolved() -> list[str]:
    found = []
    for file in _tracked():
        text = file.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            line = LOGGER.sub("", line)  # a logger's dotted name is not a module's
            where = f"{file.relative_to(REPO)}:{number}"
            found += [f"{where}: {name}" for name in DOTTED.findall(line) if not _resolves(name)]
            found += [f"{where}: {path}" for path in PATH.findall(line) if "*" not in path and not _path_exists(path)]
    return found


def test_every_reference_resolves() -> None:
    assert _unresolved() == []
