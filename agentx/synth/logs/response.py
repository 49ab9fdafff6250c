"""Reading a recorded response (Anthropic or OpenAI, streamed or not): usage, output, stop reason.

A streamed response may be stored as the list of decoded events or as the raw SSE text.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentx.errors import ResponseError

STOP_REASONS = frozenset(
    {
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "pause_turn",
        "refusal",
        "stop",
        "length",
        "tool_calls",
        "function_call",
        "content_filter",
    }
)
"""Stop reasons kept verbatim; anything else is written as "other" (it could carry text)."""


class Response(msgspec.Struct, kw_only=True):
    """What a response tells: token usage when recorded, the output rendered, the stop reason."""

    in_tokens: int | None = None
    out_tokens: int | None = None
    segments: list[str] = msgspec.field(default_factory=list)
    output_types: tuple[str, ...] = ()
    stop: str = ""
    streamed: bool = False


def _events(response: Any) -> list[Any] | None:
    """The events of a streamed response, or None when it is a single object."""
    if isinstance(response, list):
        return response
    if isinstance(response, str):
        events = []
        for line in response.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data and data != "[DONE]":
                    try:
                        events.append(msgspec.json.decode(data))
                    except msgspec.DecodeError as exc:
                        raise ResponseError(f"a streamed event is not JSON ({exc})") from exc
        return events
    if isinstance(response, dict):
        return None
    raise ResponseError(f"the response must be an object, a list of events or SSE text, not {type(response).__name__}")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _stop(value: Any) -> str:
    if not value:
        return ""
    return value if value in STOP_REASONS else "other"


def _kinds(kinds: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(kinds)))


def _anthropic_usage(usage: Any) -> int | None:
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return None
    # Cached and cache-written tokens are part of the prompt the server holds.
    return sum(_int(usage.get(k)) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))


def _anthropic_content(content: Any, segments: list[str], kinds: list[str]) -> None:
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            segments.append(str(block.get("text", "")))
            kinds.append("text")
        elif kind in ("tool_use", "server_tool_use"):
            segments.extend((str(block.get("name", "")), msgspec.json.encode(block.get("input", {})).decode()))
            kinds.append("tool_use")
        elif kind in ("thinking", "redacted_thinking"):
            segments.append(str(block.get("thinking", block.get("data", ""))))
            kinds.append("thinking")


def read_anthropic(response: Any) -> Response:
    """An Anthropic Messages response, whole or as stream events."""
    events = _events(response)
    segments: list[str] = []
    kinds: list[str] = []
    if events is None:
        usage = response.get("usage")
        _anthropic_content(response.get("content"), segments, kinds)
        return Response(
            in_tokens=_anthropic_usage(usage),
            out_tokens=_int(usage.get("output_tokens"))
            if isinstance(usage, dict) and "output_tokens" in usage
            else None,
            segments=segments,
            output_types=_kinds(kinds),
            stop=_stop(response.get("stop_reason")),
        )
    in_tokens: int | None = None
    out_tokens: int | None = None
    stop = ""
    for event in events:
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            usage = event["message"].get("usage")
            in_tokens = _anthropic_usage(usage)
            if isinstance(usage, dict) and "output_tokens" in usage:
                out_tokens = _int(usage["output_tokens"])
        elif kind == "content_block_start":
            _anthropic_content([event.get("content_block")], segments, kinds)
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            delta = event["delta"]
            piece = delta.get("text", delta.get("partial_json", delta.get("thinking", "")))
            if isinstance(piece, str) and piece:
                segments.append(piece)
        elif kind == "message_delta":
            if isinstance(event.get("delta"), dict):
                stop = _stop(event["delta"].get("stop_reason")) or stop
            usage = event.get("usage")
            if isinstance(usage, dict):
                if "output_tokens" in usage:
                    out_tokens = _int(usage["output_tokens"])
                if "input_tokens" in usage and in_tokens is None:
                    in_tokens = _anthropic_usage(usage)
    return Response(
        in_tokens=in_tokens,
        out_tokens=out_tokens,
        segments=segments,
        output_types=_kinds(kinds),
        stop=stop,
        streamed=True,
    )


def _openai_usage(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    prompt = _int(usage["prompt_tokens"]) if "prompt_tokens" in usage else None
    completion = _int(usage["completion_tokens"]) if "completion_tokens" in usage else None
    return prompt, completion


def _openai_message(message: Any, segments: list[str], kinds: list[str]) -> None:
    if not isinstance(message, dict):
        return
    content = message.get("content")
    if isinstance(content, str) and content:
        segments.append(content)
        kinds.append("text")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        segments.append(reasoning)
        kinds.append("thinking")
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            segments.extend(str(function.get(k) or "") for k in ("name", "arguments"))
            kinds.append("tool_use")


def read_openai(response: Any) -> Response:
    """An OpenAI chat-completions response, whole or as stream chunks."""
    events = _events(response)
    segments: list[str] = []
    kinds: list[str] = []
    if events is None:
        choices = response.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        _openai_message(choice.get("message"), segments, kinds)
        in_tokens, out_tokens = _openai_usage(response.get("usage"))
        return Response(
            in_tokens=in_tokens,
            out_tokens=out_tokens,
            segments=segments,
            output_types=_kinds(kinds),
            stop=_stop(choice.get("finish_reason")),
        )
    in_tokens = out_tokens = None
    stop = ""
    for chunk in events:
        if not isinstance(chunk, dict):
            continue
        if chunk.get("usage"):
            in_tokens, out_tokens = _openai_usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            _openai_message(choice.get("delta"), segments, kinds)
            stop = _stop(choice.get("finish_reason")) or stop
    return Response(
        in_tokens=in_tokens,
        out_tokens=out_tokens,
        segments=segments,
        output_types=_kinds(kinds),
        stop=stop,
        streamed=True,
    )
