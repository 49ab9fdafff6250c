"""What agentx is installed as: the distribution `agentx-replay` (the name `agentx` on the package index belongs to
an unrelated project), which provides the package `agentx` and the command `agentx`."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Final

DISTRIBUTION: Final = "agentx-replay"
"""`pip install agentx-replay`. It must not share a venv with SemiAnalysis' `agentx-harness`, whose own command is
also named `agentx`."""


def installed_version() -> str:
    """The installed distribution's version, or "unknown" when the package runs from a source tree not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
