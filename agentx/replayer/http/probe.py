"""What the server's streams can report, probed once before a run.

vLLM takes `stream_options.continuous_usage_stats` (running usage in every chunk: exact tokens per chunk
even when speculative decoding sends several); other servers reject the unknown field with a 400 or
ignore it. One tiny streamed request per candidate tells which: the first of "continuous" (usage in a
content chunk), "final" (usage only at the end, or accepted but ignored), "none" (no `stream_options`
accepted) that the server takes.

The probe is bounded: each attempt gets `PROBE_TIMEOUT_S`, or the run's request timeout when that is shorter, and
the whole probe `probe_budget_s`; a server that keeps the probe waiting (a stream that never ends) costs that much,
is said to on the "agentx" logger once it has taken `PROBE_NOTICE_AFTER_S`, and leaves the usage assumed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from agentx.replayer.http.client import Client, ServerUnreachable
from agentx.replayer.http.sse import DONE, SSEParser

_log = logging.getLogger(__name__)

StreamUsage = Literal["continuous", "final", "none"]

STREAM_OPTIONS: Final[Mapping[str, Mapping[str, object] | None]] = {
    "continuous": {"include_usage": True, "continuous_usage_stats": True},
    "final": {"include_usage": True},
    "none": None,
}


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


class UsageProbe(msgspec.Struct, frozen=True):
    """What the probe settled on, and why when it could not tell."""

    usage: StreamUsage
    assumed: str | None = None
    """Set when `usage` was assumed rather than detected (the probes kept failing): what failed. A run then says so
    on stderr and in run.json, since "final" counts tokens per chunk less exactly than "continuous"."""


PROBE_ATTEMPTS: Final = 3
"""Tries per probe request: a 5xx, a 429 or a dropped connection is often a server warming up or briefly full."""
PROBE_RETRY_DELAYS_S: Final = (0.5, 2.0)
PROBE_TIMEOUT_S: Final = 10.0
"""The longest one probe attempt waits for its whole answer (the run's request timeout when shorter). The probe asks
2 tokens of an 8-token prompt, which a serving engine answers in well under a second, queued behind a loaded
batch in a few: 10 s is ample for a healthy server, and bounds a stuck one (a stream that never ends) to ~32 s
over `PROBE_ATTEMPTS`, where 60 s an attempt held a run at "starting" for ~3 minutes."""
PROBE_NOTICE_AFTER_S: Final = 1.0
"""A probe still waiting after this long says what it waits for (a healthy server has answered by then)."""
_TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


def probe_timeout_s(client: Client) -> float:
    """What one probe attempt waits at most: `PROBE_TIMEOUT_S`, or the client's request timeout when shorter."""
    limit = client.total_timeout_s
    return PROBE_TIMEOUT_S if limit is None else min(PROBE_TIMEOUT_S, limit)


def probe_budget_s(client: Client) -> float:
    """What the whole probe waits at most: every attempt of one request timing out, and the pauses between."""
    return PROBE_ATTEMPTS * probe_timeout_s(client) + sum(PROBE_RETRY_DELAYS_S[: PROBE_ATTEMPTS - 1])


async def _answer(client: Client, path: str, payload: Mapping[str, object]) -> tuple[int, bytes] | str:
    """The first answer to `payload` that is not a transient failure, or the last failure, described, when every
    attempt failed."""
    failure = ""
    timeout_s = probe_timeout_s(client)
    for attempt in range(PROBE_ATTEMPTS):
        try:
            status, answer = await client.request_json("POST", path, payload, timeout_s=timeout_s)
        except ServerUnreachable as exc:
            failure = str(exc)
        else:
            if status not in _TRANSIENT_STATUSES:
                return status, answer
            failure = f"HTTP {status}"
        if attempt < len(PROBE_RETRY_DELAYS_S):
            await asyncio.sleep(PROBE_RETRY_DELAYS_S[attempt])
    return failure


async def detect_stream_usage(client: Client, path: str, body: Mapping[str, object]) -> UsageProbe:
    """Probe `path` with `body` (a small generation request without `stream_options`) and return the
    richest usage reporting the server accepts. Transient failures and timeouts are retried (`PROBE_ATTEMPTS`,
    each attempt `probe_timeout_s`); a probe that still fails, or that the server keeps waiting past
    `probe_budget_s`, gets "final" (the most widely supported), marked as assumed, and the run's own records will
    show the server's errors. A probe unanswered after `PROBE_NOTICE_AFTER_S` says what it waits for (a warning of
    the "agentx" logger, which the command line prints on stderr)."""
    budget_s = probe_budget_s(client)
    waiting = (
        f"probing the server's stream-usage reporting (POST {path}): no usable answer yet; waiting up to "
        f"{budget_s:g} s in all, then going on assuming 'final'"
    )
    notice = asyncio.get_running_loop().call_later(PROBE_NOTICE_AFTER_S, _log.warning, waiting)
    try:
        async with asyncio.timeout(budget_s):
            return await _detect(client, path, body)
    except TimeoutError:
        return UsageProbe("final", f"the stream-usage probe got no answer within {budget_s:g} s (POST {path})")
    finally:
        notice.cancel()


async def _detect(client: Client, path: str, body: Mapping[str, object]) -> UsageProbe:
    def assumed(failure: str) -> UsageProbe:
        return UsageProbe("final", f"the stream-usage probe failed {PROBE_ATTEMPTS} times ({failure})")

    for mode in ("continuous", "final"):
        got = await _answer(client, path, {**body, "stream": True, "stream_options": STREAM_OPTIONS[mode]})
        if isinstance(got, str):
            return assumed(got)
        status, answer = got
        if status == 200:
            if mode == "continuous" and not _usage_in_content_chunk(answer):
                return UsageProbe("final")  # accepted but ignored: ask only for what it gives
            return UsageProbe(mode)
    got = await _answer(client, path, {**body, "stream": True})
    if isinstance(got, str):
        return assumed(got)
    status, _ = got
    if status == 200:
        return UsageProbe("none")
    return UsageProbe("final", f"the server refused every stream-usage probe (last: HTTP {status})")
