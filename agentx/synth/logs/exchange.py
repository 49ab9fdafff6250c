"""One recorded LLM call, as every log reader hands it to from-logs (before any tokenizing)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import msgspec

from agentx.synth.logs.render import Prompt
from agentx.synth.logs.response import Response

MS_EPOCH_THRESHOLD = 1e11
"""Epoch numbers above this are milliseconds (1e11 s is the year 5138)."""


class Exchange(msgspec.Struct, kw_only=True):
    """A request and its response with their times (epoch seconds) and any explicit agent links.

    `file` and `line` locate it for error messages only; they are never written to a trace.
    """

    file: str
    line: int
    session_key: str
    start_s: float
    end_s: float
    model: str
    prompt: Prompt
    response: Response
    first_token_s: float | None = None
    agent_key: str | None = None
    """An explicit agent identity (Claude Code agentId, or the proxy line's `agent` field)."""
    parent_key: str | None = None
    """The explicit parent agent, when the log says."""
    subagent_type: str = ""


def parse_time(value: Any) -> float:
    """Epoch seconds from a number (seconds, or milliseconds when huge) or an ISO 8601 string."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a timestamp")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"{value!r} is not a timestamp (use epoch seconds or ISO 8601)")
        return seconds / 1000.0 if seconds > MS_EPOCH_THRESHOLD else seconds
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 timestamp") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return moment.timestamp()
    raise ValueError(f"{type(value).__name__} is not a timestamp (use epoch seconds or ISO 8601)")
