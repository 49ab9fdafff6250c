"""`run_sync`: the `*_sync` functions' one way to run a coroutine for code without an event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentx.errors import ConfigError

T = TypeVar("T")


def run_sync(work: Coroutine[Any, Any, T], name: str) -> T:
    """`asyncio.run(work)`; `ConfigError` naming `name` (the async function that `work` calls) and what to do instead
    when this thread already runs an event loop, `work` closed unstarted (no "never awaited" warning)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    work.close()
    raise ConfigError(
        f"{name}_sync runs an event loop of its own and cannot be called where one runs already (this thread runs "
        f"one): `await {name}(...)` there instead"
    )
