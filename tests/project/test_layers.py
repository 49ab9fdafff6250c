"""The package's floors (docs/architecture.md): every import points down, and no module imports itself in a cycle.

errors, secrets → trace, sim, records → replayer, synth, spec → results → run → cli and the public `agentx/__init__.py`;
inside replayer/ and results/, their sub-packages have floors of their own (`ROOMS`).
Imports inside functions count too: a lazy import is still a dependency. Imports for type checking only count for
the floors, not for cycles: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import PACKAGE, TESTS

FLOORS = {
    "errors": -1,
    "secrets": -1,
    "distribution": -1,
    "engines": -1,
    "exports": -1,
    "format_version": -1,
    "trace": 0,
    "sim": 0,
    "records": 0,
    "replayer": 1,
    "synth": 1,
    "spec": 1,
    "results": 2,
    "run": 3,
    "cli": 4,
    "": 5,
}
"""Floor of each subpackage; "errors" is `agentx/errors.py`, the error tree's roots that every floor raises, and
"" is `agentx/__init__.py`, the public API."""
ROOMS = {
    "replayer": {
        "http": 0,
        "options": 1,
        "prompts": 2,
        "plan": 3,
        "schedule": 4,
        "telemetry": 5,
        "": 6,
        "cluster": 7,
    },
    "results": {"summary": 0, "folders": 1, "export": 2, "imports": 2, "report": 3, "compare": 4, "": 5},
}
"""Floors inside a subpackage: of each of its sub-packages, "" for its own modules (`replayer/run_replay.py`)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:`."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for statement in node.body
        for inner in ast.walk(statement)
    }


def _imports(path: Path, typing: bool = True) -> set[str]:
    """The agentx modules `path` imports, at any depth of its code (with `typing`, those for type checkers too)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("agentx"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("agentx"):
            found.add(node.module)
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _room(module: str) -> str:
    """The sub-package of a subpackage `module` lives in ("" for the subpackage's own modules)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and (PACKAGE / parts[1] / parts[2]).is_dir()) else ""


def _graph(typing: bool = True) -> dict[str, set[str]]:
    return {_module_name(path): _imports(path, typing) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_subpackage_has_a_floor() -> None:
    assert {_package(module) for module in _graph()} <= set(FLOORS)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports in `graph` that point to a higher floor or across one."""
    upward = []
    for module, imported in graph.items():
        for target in imported:
            here, there = _package(module), _package(target)
            if here != there and FLOORS[there] >= FLOORS[here]:
                upward.append(f"{module} imports {target} (floor {FLOORS[here]} → {FLOORS[there]})")
    return upward


def test_imports_only_point_down() -> None:
    assert _upward(_graph()) == []


def _upward_inside(graph: dict[str, set[str]]) -> list[str]:
    """The imports in `graph` between two sub-packages of one subpackage that point up or across (`ROOMS`)."""
    upward = []
    for module, imported in graph.items():
        rooms = ROOMS.get(_package(module))
        if rooms is None:
            continue
        for target in imported:
            if _package(target) != _package(module):
                continue
            here, there = _room(module), _room(target)
            if here != there and rooms[there] >= rooms[here]:
                upward.append(
                    f"{module} imports {target} ({here or '.'} {rooms[here]} → {there or '.'} {rooms[there]})"
                )
    return upward


def test_every_sub_package_has_a_floor() -> None:
    for package, rooms in ROOMS.items():
        assert {_room(module) for module in _graph() if _package(module) == package} == set(rooms)


def test_imports_inside_a_subpackage_only_point_down() -> None:
    assert _upward_inside(_graph()) == []


def test_an_upward_import_inside_a_subpackage_is_found() -> None:
    graph = {
        "agentx.replayer.http.client": {"agentx.replayer.options.replay", "agentx.replayer.http.pool"},
        "agentx.replayer.schedule.runner": {"agentx.replayer.plan.play", "agentx.replayer.run_replay"},
    }
    assert _upward_inside(graph) == [
        "agentx.replayer.http.client imports agentx.replayer.options.replay (http 0 → options 1)",
        "agentx.replayer.schedule.runner imports agentx.replayer.run_replay (schedule 4 → . 6)",
    ]


def test_an_upward_or_sideways_import_is_found() -> None:
    graph = {
        "agentx.results.report.build": {"agentx.run.replay", "agentx.records.record"},
        "agentx.trace.io": {"agentx.sim.engine.loop"},
    }
    assert _upward(graph) == [
        "agentx.results.report.build imports agentx.run.replay (floor 2 → 3)",
        "agentx.trace.io imports agentx.sim.engine.loop (floor 0 → 0)",
    ]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among agentx's modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_no_import_cycle() -> None:
    assert _cycle(_graph(typing=False)) is None


@pytest.mark.parametrize(
    ("graph", "cyclic"),
    [({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True), ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, False)],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert (_cycle(graph) is not None) is cyclic


def _imports_package(path: Path, package: str) -> bool:
    """Whether `path` imports `package` (or a module of it), at any depth of its code."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == package for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            return True
    return False


def test_only_the_cli_draws_for_the_terminal() -> None:
    """rich is the terminal's: results/ and the floors below compute, cli/ presents (docs/architecture.md)."""
    drawing = [_module_name(path) for path in sorted(PACKAGE.rglob("*.py")) if _imports_package(path, "rich")]
    assert [module for module in drawing if _package(module) != "cli"] == []


def _private_imports(path: Path) -> list[str]:
    """The private names (a leading underscore) a test module imports from agentx, and the test modules it imports
    from: a test reaches agentx through names the package stands behind, and shares helpers through the suite's
    helper modules (strategies.py, flat.py, loopback.py, ...), never through another test module."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("agentx"):
                found += [f"{node.module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
            elif node.module.startswith("test_"):
                found.append(f"{node.module} (a test module)")
        elif isinstance(node, ast.Import):
            found += [f"{alias.name} (a test module)" for alias in node.names if alias.name.startswith("test_")]
    return found


def test_tests_import_no_private_helper() -> None:
    imported = {str(path.relative_to(TESTS)): _private_imports(path) for path in sorted(TESTS.rglob("*.py"))}
    assert {name: found for name, found in imported.items() if found} == {}
