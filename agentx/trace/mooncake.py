"""Mooncake JSONL (placeholder until implemented)."""

from __future__ import annotations

import os

from agentx.trace.errors import Findings
from agentx.trace.model import Trace


def read_mooncake(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    raise NotImplementedError


def write_mooncake(trace: Trace, path: str | os.PathLike[str]) -> None:
    raise NotImplementedError
