"""The suite's tiers (docs/development.md): `make test-fast` runs the modules not marked `slow`, for the inner loop;
`make test` runs them all. A module that starts a process (the simulator, a CLI child, Ray, a worker) is slow by
definition, so it must say so: a new one cannot slip into the fast tier and stretch it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import TESTS

PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "ray", "concurrent.futures.process"})
PROCESS_NAMES = frozenset({"SimServer", "Popen", "ProcessPoolExecutor", "replay_workers", "CliRunner"})
"""What starts a process, or runs the CLI whose commands do (a replay, a sweep)."""


def _starts_processes(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.split(".")[0] in PROCESS_MODULES:
                found.append(node.module)
            found += [alias.name for alias in node.names if alias.name in PROCESS_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr in PROCESS_NAMES:
            found.append(node.attr)  # agentx.sim.SimServer
    return found


def _marked_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            return "slow" in ast.unparse(node.value)
    return False


MODULES = sorted(TESTS.rglob("test_*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[path.stem for path in MODULES])
def test_a_module_that_starts_processes_is_marked_slow(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    starts = _starts_processes(tree)
    assert not starts or _marked_slow(tree), (
        f"{path.name} uses {', '.join(sorted(set(starts)))}: mark it `pytestmark = pytest.mark.slow` (make test-fast "
        "leaves it out)"
    )


def test_the_fast_tier_is_a_real_part_of_the_suite() -> None:
    """Both tiers hold modules: a rule that marked everything slow (or nothing) would pass the test above."""
    slow = [path for path in MODULES if _marked_slow(ast.parse(path.read_text()))]
    assert 0 < len(slow) < len(MODULES)
