"""Proxy captures: JSONL, one request/response exchange per line (Anthropic Messages or OpenAI chat).

A line is an object with the request body, the response (whole, a list of stream events, or raw
SSE text), start and end timestamps, and optionally a session key and explicit agent links:

    {"session": "s1", "start": 1732950000.0, "end": 1732950003.5, "request": {...}, "response": {...}}

Accepted field names: session | session_id | session_key; start | start_time | started_at |
request_time; end | end_time | ended_at | response_time; first_token | first_token_time (optional);
request | request_body; response | response_body; agent | agent_id and parent | parent_agent_id
(optional). See docs/synth.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from agentx.errors import PromptError, ResponseError, TraceError
from agentx.synth.logs.exchange import Exchange, parse_time
from agentx.synth.logs.render import render_anthropic, render_openai
from agentx.synth.logs.response import read_anthropic, read_openai
from agentx.trace.formats.textfile import jsonl_lines

ProxyFormat = Literal["anthropic-proxy", "openai-proxy"]

_SESSION = ("session", "session_id", "session_key")
_START = ("start", "start_time", "started_at", "request_time")
_END = ("end", "end_time", "ended_at", "response_time")
_FIRST_TOKEN = ("first_token", "first_token_time")
_REQUEST = ("request", "request_body")
_RESPONSE = ("response", "response_body")
_AGENT = ("agent", "agent_id")
_PARENT = ("parent", "parent_agent_id")


def _field(obj: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def _key(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{what} must be a string or an integer")


def read_proxy(path: Path, fmt: ProxyFormat) -> Iterator[Exchange]:
    """Every exchange in one capture file; a bad line raises TraceError naming file and line."""
    render = render_anthropic if fmt == "anthropic-proxy" else render_openai
    read = read_anthropic if fmt == "anthropic-proxy" else read_openai
    for number, text in jsonl_lines(path):
        try:
            obj = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise TraceError.at(f"not a JSON object ({exc})", file=str(path), line=number) from None
        try:
            yield _exchange(obj, str(path), number, render, read)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise TraceError.at(f"{fmt} exchange: {exc}", file=str(path), line=number) from None


def _exchange(obj: Any, file: str, line: int, render: Any, read: Any) -> Exchange:
    if not isinstance(obj, dict):
        raise ValueError("each line must be a JSON object")
    body = _field(obj, _REQUEST)
    if not isinstance(body, dict):
        raise ValueError(f"no request body (one of {', '.join(_REQUEST)}) holding an object")
    raw_response = _field(obj, _RESPONSE)
    if raw_response is None:
        raise ValueError(f"no response (one of {', '.join(_RESPONSE)})")
    start, end = _field(obj, _START), _field(obj, _END)
    if start is None or end is None:
        raise ValueError(f"start and end timestamps are required (fields {_START[0]!r} and {_END[0]!r})")
    start_s, end_s = parse_time(start), parse_time(end)
    if end_s < start_s:
        raise ValueError(f"end ({end}) is before start ({start})")
    first = _field(obj, _FIRST_TOKEN)
    try:
        prompt = render(body)
    except PromptError as exc:
        raise ValueError(f"request body: {exc}") from None
    try:
        response = read(raw_response)
    except ResponseError as exc:
        raise ValueError(f"response: {exc}") from None
    model = body.get("model")
    return Exchange(
        file=file,
        line=line,
        session_key=_key(_field(obj, _SESSION), "the session key") or "",
        start_s=start_s,
        end_s=end_s,
        first_token_s=parse_time(first) if first is not None else None,
        model=model if isinstance(model, str) else "",
        prompt=prompt,
        response=response,
        agent_key=_key(_field(obj, _AGENT), "agent"),
        parent_key=_key(_field(obj, _PARENT), "parent"),
    )
