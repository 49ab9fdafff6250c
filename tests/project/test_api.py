"""The public API (docs/api.md): the replay flow at the top level, `agentx.trace`, `agentx.synth` and `agentx.sim` as
namespaces. Each package's one table (`EXPORTS`) makes its `__all__` and its lazy imports, and what type checkers see
is the same; every type in a public signature is public."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import agentx

PACKAGES = ("agentx", "agentx.trace", "agentx.synth", "agentx.sim")
RESULTS = {
    "Summary",
    "RunResult",
    "ReplayResult",
    "SweepResult",
    "DecodeResult",
    "RequestRecord",
    "TraceStats",
    "Fidelity",
    "PreparedTrace",
    "ReplayStream",
}
"""Classes a caller receives and reads but does not build: their constructors are not part of the API (the types of
their fields are reached as attributes)."""
OPAQUE = {"PreparedTrace"}
"""Classes a caller only passes on (`prepare_trace` → `replay`): their methods are the replayer's."""


def _typing_imports(package: str) -> dict[str, str]:
    """Name → module of the package's `if TYPE_CHECKING:` imports (what type checkers see)."""
    init = Path(importlib.import_module(package).__file__ or "")
    tree = ast.parse(init.read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {
        alias.asname or alias.name: node.module or ""
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_one_table_makes_all_and_what_type_checkers_see(package: str) -> None:
    module = importlib.import_module(package)
    homes = {name: home for home, names in module.EXPORTS.items() for name in names}
    namespaces = dict.fromkeys(getattr(module, "NAMESPACES", ()), package)
    assert module.__all__ == sorted({**homes, **namespaces})
    typing_imports = _typing_imports(package)
    assert typing_imports == {**homes, **namespaces}
    for name in module.__all__:
        value = getattr(module, name)
        expected = importlib.import_module(f"{package}.{name}") if name in namespaces else None
        assert value is (expected or getattr(importlib.import_module(homes[name]), name))
        assert name in dir(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(package: str) -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(importlib.import_module(package), "no_such_name")  # noqa: B009 (a name no type checker lets through)


def _public() -> dict[type, str]:
    """Every public class, by the name it is reached at."""
    found: dict[type, str] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                found[value] = f"{package}.{name}"
    return found


def _classes(hint: Any) -> Iterator[type]:
    """The classes a type hint names, through unions, generics, Annotated and Literal."""
    if isinstance(hint, type) and typing.get_origin(hint) is None:
        yield hint
    for argument in typing.get_args(hint):
        if not isinstance(argument, (str, int, float, bool, bytes)) and argument is not None:
            yield from _classes(argument)


def _names() -> dict[str, Any]:
    """Every class and type alias of agentx's modules by name: what an annotation under `TYPE_CHECKING` names."""
    names: dict[str, Any] = {}
    for info in pkgutil.walk_packages(agentx.__path__, "agentx."):
        if info.name.rsplit(".", 1)[-1] == "__main__" or ".cluster." in info.name or info.name.endswith("plots"):
            continue  # the command line's entry; Ray and matplotlib are optional extras
        module = importlib.import_module(info.name)
        names.update({key: value for key, value in vars(module).items() if not key.startswith("_")})
    return names


NAMES = _names()


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    return typing.get_type_hints(function, localns=NAMES, include_extras=True)


def _signatures() -> Iterator[tuple[str, dict[str, Any]]]:
    """The type hints of every public function, method and constructor users call, by where they are."""
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            where = f"{package}.{name}"
            if inspect.isfunction(value):
                yield where, _hints(value)
            elif isinstance(value, type) and not issubclass(value, BaseException):
                if issubclass(value, msgspec.Struct):
                    if name not in RESULTS:
                        yield where, {field.name: field.type for field in msgspec.structs.fields(value)}
                elif name not in RESULTS:
                    yield where, _hints(value.__init__)
                for method_name, method in inspect.getmembers(value, inspect.isfunction) if name not in OPAQUE else ():
                    if not method_name.startswith("_") and method.__module__.startswith("agentx"):
                        yield f"{where}.{method_name}", _hints(method)


def test_every_type_in_a_public_signature_is_public() -> None:
    public = _public()
    hidden = sorted(
        f"{where}: {cls.__module__}.{cls.__qualname__}"
        for where, hints in _signatures()
        for hint in hints.values()
        for cls in _classes(hint)
        if cls.__module__.startswith("agentx") and cls not in public
    )
    assert hidden == []


def test_the_signature_walk_sees_the_types_it_must_judge() -> None:
    seen = {cls for _, hints in _signatures() for hint in hints.values() for cls in _classes(hint)}
    assert {agentx.trace.Trace, agentx.ReplayOptions, agentx.Slos, agentx.Server, agentx.ServerMetrics} <= seen


def test_the_leaves_users_catch_are_public() -> None:
    for name in (
        "ServerUnreachable",
        "ModelNotServed",
        "WarmupFailed",
        "CalibrationError",
        "RunExists",
        "WorkerFailed",
    ):
        error = getattr(agentx, name)
        assert issubclass(error, agentx.AgentxError) and error.__module__ == "agentx.errors"
