"""The vocabulary of the option structs' fields: the `Meta` that makes a field a flag (`field_help`), the units
of time and fractions, and the `--help` sections a field may name (agentx.replayer.options.replay' docstring says what
`Meta.extra` holds; agentx.cli.flags reads it)."""

from __future__ import annotations

from typing import Annotated, Any, Final

from msgspec import Meta

# The `--help` sections of fields listed apart from their part's (agentx.cli.flags.HELP_GROUPS orders them all).
LOAD: Final = "Load"
AGENTX: Final = "AgentX scenario"
TRACE: Final = "Trace"
PROMPTS: Final = "Prompts"
OUTPUT: Final = "Output"

Seconds = Annotated[float, Meta(ge=0)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]


def field_help(text: str, **extra: Any) -> Meta:
    """A field's `Meta`: its one-line `--help` text and the other flag settings (`extra`)."""
    return Meta(extra={"help": text, **extra})
