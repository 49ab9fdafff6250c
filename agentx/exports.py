"""A package's public names from one table (module → names): its `__all__`, and a module `__getattr__` (PEP 562) that
imports each name's module when the name is first used, so `import agentx` (and the command line, which starts with
it) loads no engine, pyarrow or numpy before a command needs them. Type checkers read the package's
`if TYPE_CHECKING:` imports instead, which tests/project/test_api.py holds equal to the table."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, table: Mapping[str, tuple[str, ...]], namespaces: tuple[str, ...] = ()
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """`__all__`, `__getattr__` and `__dir__` for `package`, whose public names are `table`'s (module → names) and
    its sub-packages `namespaces`."""
    homes = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module hook's name)
        if name in namespaces:
            return importlib.import_module(f"{package}.{name}")  # the import sets the attribute
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)  # once: later uses are plain attribute lookups
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*vars(sys.modules[package]), *homes, *namespaces})

    return sorted([*homes, *namespaces]), __getattr__, __dir__
