"""What the server's streams can report, probed once before a run.

vLLM takes `stream_options.continuous_usage_stats` (running usage in every chunk: exact tokens per chunk
even when speculative decoding sends several); other servers reject the unknown field with a 400 or
ignore it. One tiny streamed request per candidate tells which: the first of "continuous" (usage in a
content chunk), "final" (usage only at the end, or accepted but ignored), "none" (no `stream_options`
accepted) that the server takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from agentx.replay.client import Client, ServerUnreachable
from agentx.replay.sse import DONE, SSEParser

StreamUsage = Literal["continuous", "final", "none"]

STREAM_OPTIONS: Final[Mapping[str, Mapping[str, object] | None]] = {
    "continuous": {"include_usage": True, "continuous_usage_stats": True},
    "final": {"include_usage": True},
    "none": None,
}
_PROBE_TIMEOUT_S: Final = 60.0


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, object] | None = None


def _usage_in_content_chunk(body: bytes) -> bool:
    parser = SSEParser()
    for _, data in parser.feed(body + b"\n\n"):
        if data == DONE:
            break
        try:
            chunk = msgspec.json.decode(data, type=_Chunk)
        except msgspec.DecodeError:
            return False
        content = any(
            choice.text or (choice.delta is not None and (choice.delta.content or choice.delta.reasoning_content))
            for choice in chunk.choices or ()
        )
        if content and chunk.usage is not None:
            return True
    return False


async def detect_stream_usage(client: Client, path: str, body: Mapping[str, object]) -> StreamUsage:
    """Probe `path` with `body` (a small generation request without `stream_options`) and return the
    richest usage reporting the server accepts. A server failing all three probes gets "final" (the most
    widely supported), and the run's own records will show its errors."""
    for mode in ("continuous", "final"):
        payload = {**body, "stream": True, "stream_options": STREAM_OPTIONS[mode]}
        try:
            status, answer = await client.request_json("POST", path, payload, timeout_s=_PROBE_TIMEOUT_S)
        except ServerUnreachable:
            return "final"
        if status == 200:
            if mode == "continuous" and not _usage_in_content_chunk(answer):
                return "final"  # accepted but ignored: ask only for what it gives
            return mode
        if status >= 500:
            return "final"
    try:
        status, _ = await client.request_json("POST", path, {**body, "stream": True}, timeout_s=_PROBE_TIMEOUT_S)
    except ServerUnreachable:
        return "final"
    return "none" if status == 200 else "final"
