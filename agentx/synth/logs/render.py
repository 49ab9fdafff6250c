"""Rendering a request body into the prompt a server would see: system, tools, then messages.

The prompt is a list of text segments, each tokenized on its own (so token counts add up and
repeated segments are tokenized once). Role markers stand in for a chat template; binary content
(images, documents) becomes a marker holding a digest of the data, so equal data shares blocks
without the data itself being tokenized.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from agentx.errors import PromptError

MARK_SYSTEM = "<|system|>\n"
MARK_TOOLS = "<|tools|>\n"
MARK_USER = "<|user|>\n"
MARK_ASSISTANT = "<|assistant|>\n"
MARK_TOOL_RESULT = "<|tool_result|>\n"
MARK_TOOL_CALL = "<|tool_call|>\n"
MARK_THINKING = "<|thinking|>\n"


class Prompt(msgspec.Struct, kw_only=True):
    """A rendered prompt and what its newest input is made of."""

    segments: list[str]
    input_types: tuple[str, ...]
    """Kinds of content in the last message ("tool_result", "text", "image")."""


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _binary(value: Any) -> str:
    # Tokenizing base64 would count far too many tokens; a digest keeps identity, not content.
    digest = hashlib.blake2b(_json(value).encode(), digest_size=12).hexdigest()
    return f"<|media {digest}|>"


def _blocks(content: Any, where: str, out: list[str], kinds: list[str]) -> None:
    """Render Anthropic content (a string or a list of blocks) into `out`, noting block kinds."""
    if content is None:
        return
    if isinstance(content, str):
        out.append(content)
        kinds.append("text")
        return
    if not isinstance(content, list):
        raise PromptError(f"{where}: content must be a string or a list of blocks, not {type(content).__name__}")
    for index, block in enumerate(content):
        if isinstance(block, str):
            out.append(block)
            kinds.append("text")
            continue
        if not isinstance(block, dict):
            raise PromptError(f"{where}: content block {index} must be an object")
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            out.append(str(block.get("text", "")))
            kinds.append("text")
        elif kind in ("tool_use", "server_tool_use"):
            out.extend((MARK_TOOL_CALL, str(block.get("name", "")), _json(block.get("input", {}))))
            kinds.append("tool_use")
        elif kind == "tool_result":
            out.append(MARK_TOOL_RESULT)
            _blocks(block.get("content"), where, out, [])
            kinds.append("tool_result")
        elif kind in ("thinking", "redacted_thinking"):
            out.extend((MARK_THINKING, str(block.get("thinking", block.get("data", "")))))
            kinds.append("thinking")
        elif kind in ("image", "image_url", "input_image", "document", "file", "input_audio"):
            out.append(_binary(block))
            kinds.append("image")
        else:  # an unknown block still occupies the prompt: render it whole
            out.append(_json(block))
            kinds.append("text")


def _system(system: Any, out: list[str]) -> None:
    if system in (None, "", []):
        return
    out.append(MARK_SYSTEM)
    _blocks(system, "system", out, [])


def _tools(tools: Any, out: list[str]) -> None:
    if not tools:
        return
    if not isinstance(tools, list):
        raise PromptError("tools must be a list")
    out.append(MARK_TOOLS)
    out.extend(_json(tool) for tool in tools)


def render_anthropic(body: dict[str, Any]) -> Prompt:
    """Render an Anthropic Messages request body."""
    segments: list[str] = []
    _system(body.get("system"), segments)
    _tools(body.get("tools"), segments)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("the request has no messages list")
    kinds: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PromptError(f"message {index} must be an object")
        role = message.get("role")
        segments.append(MARK_ASSISTANT if role == "assistant" else MARK_USER)
        kinds = []
        _blocks(message.get("content"), f"message {index}", segments, kinds)
    return Prompt(segments=segments, input_types=_input_types(kinds))


def render_openai(body: dict[str, Any]) -> Prompt:
    """Render an OpenAI chat-completions request body (leading system messages first, then tools)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("the request has no messages list")
    segments: list[str] = []
    first = 0
    while first < len(messages) and isinstance(messages[first], dict) and messages[first].get("role") in _SYSTEM_ROLES:
        segments.append(MARK_SYSTEM)
        _blocks(messages[first].get("content"), f"message {first}", segments, [])
        first += 1
    _tools(body.get("tools") or body.get("functions"), segments)
    kinds: list[str] = []
    for index in range(first, len(messages)):
        message = messages[index]
        if not isinstance(message, dict):
            raise PromptError(f"message {index} must be an object")
        role = message.get("role")
        kinds = []
        if role in _SYSTEM_ROLES:
            segments.append(MARK_SYSTEM)
        elif role in ("tool", "function"):
            segments.append(MARK_TOOL_RESULT)
            kinds.append("tool_result")
            _blocks(message.get("content"), f"message {index}", segments, [])
            continue
        else:
            segments.append(MARK_ASSISTANT if role == "assistant" else MARK_USER)
        _blocks(message.get("content"), f"message {index}", segments, kinds)
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            segments.extend((MARK_TOOL_CALL, str(function.get("name", "")), str(function.get("arguments", ""))))
            kinds.append("tool_use")
    return Prompt(segments=segments, input_types=_input_types(kinds))


_SYSTEM_ROLES = ("system", "developer")


def _input_types(kinds: list[str]) -> tuple[str, ...]:
    """The Weka convention: ("tool_result",) when the newest message returns tool output, else ("text",)."""
    if "tool_result" in kinds:
        return ("tool_result",)
    if "image" in kinds:
        return ("text", "image")
    return ("text",)
