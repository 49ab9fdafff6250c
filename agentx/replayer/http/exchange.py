"""What one request to the server produced: the `Exchange` (timestamps, token counts, usage) and, when it failed,
its error kind and message.

Server and network failures never raise out of a request; they end it with an error kind (`ErrorKind`) and a
message of at most `MESSAGE_MAX_CHARS`. An error answer's message is read from its body in the shapes
OpenAI-compatible servers use (`error_message`); any error whose text names a context overflow is one
(`overflows`), whatever its status or whether it came as a status or an in-stream error event (reference:
`aiperf/common/scenario/context_overflow.py`, applied to every error record; docs/agentx.md §5).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

import msgspec

from agentx.records.kinds import ErrorKind, TimeoutKind
from agentx.replayer.http.tls import describe_tls_error

MESSAGE_MAX_CHARS: Final = 500
CONTEXT_OVERFLOW_SUBSTRINGS: Final = (
    "context length",
    "maximum context",
    "context_length_exceeded",
    "prompt is too long",
)
"""An error answer whose text holds one of these is a context overflow (`Scenario.context_overflow_substrings`)."""


class Exchange(msgspec.Struct, kw_only=True, gc=False):
    """One request and what came back. Times are `perf_counter_ns`; 0 means "did not happen"."""

    status: int = 0
    """HTTP status; 0 when no response arrived."""
    queued_ns: int = 0
    """When the request was handed to the client (`stream` / `complete` called), before the connection pool:
    `sent_ns − queued_ns` is the client's own queueing."""
    sent_ns: int = 0
    """When the request's bytes (head and body, one write) were handed to the socket; 0 when they never were
    (e.g. the connection was refused)."""
    headers_ns: int = 0
    first_token_ns: int = 0
    """Arrival of the first non-empty content chunk (text, reasoning or tool-call delta)."""
    last_token_ns: int = 0
    """Arrival of the last non-empty content chunk (a trailing usage-only chunk does not count)."""
    end_ns: int = 0
    """End of the response body, or the moment the failure was seen."""
    chunk_ns: list[int] = msgspec.field(default_factory=list)
    """Arrival time of every content chunk."""
    chunk_tokens: list[int] = msgspec.field(default_factory=list)
    """Tokens in each content chunk, parallel to `chunk_ns`."""
    tokens_estimated: bool = False
    """Some chunk carried neither running usage nor token ids and was counted as one token."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """From the last non-null `usage` (`prompt_tokens_details.cached_tokens`)."""
    finish_reason: str | None = None
    error_kind: ErrorKind | None = None
    timeout_kind: TimeoutKind | None = None
    """With `error_kind == "timeout"`: which timeout it was."""
    error_message: str | None = None
    """At most ~500 characters."""
    connection_retries: int = 0
    """Times the request was sent again because the server had closed its reused connection unanswered."""
    foreign_content_type: str | None = None
    """A streamed request's answer said it is not an event stream: its Content-Type."""
    without_done: bool = False
    """A stream that ended after its `finish_reason` without `data: [DONE]`: kept whole, and marked."""
    content_encoding: str | None = None
    """The coding the server compressed the answer with (decoded), although the request asked for none."""

    def fail(self, kind: ErrorKind, message: str) -> None:
        """End the request now, failed with `kind` and `message` (already scrubbed of secrets)."""
        self.end_ns = time.perf_counter_ns()
        self.error_kind = kind
        self.error_message = message

    def cancel(self, message: str) -> None:
        """End the request now as cancelled (the run's grace period is over), keeping what had arrived."""
        self.fail("cancelled", message)
        self.timeout_kind = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


class ExchangeError(Exception):
    """Internal: ends a request with an error kind (raised while its response is read, caught where the request
    was made, and recorded in its `Exchange`); never raised to a caller."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


def overflows(text: str, substrings: Sequence[str]) -> bool:
    """Whether an error's text names a context overflow: it holds one of `substrings` (lower case)."""
    lowered = text.lower()
    return any(s in lowered for s in substrings)


def describe(exc: BaseException) -> str:
    """One line for a failed connection or exchange: the TLS reason when it is one (`tls.describe_tls_error`), else
    the exception's type and text."""
    tls = describe_tls_error(exc)
    if tls is not None:
        return tls
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ErrorBody(msgspec.Struct):
    """The `error` object of an OpenAI-style error answer."""

    message: str | None = None


class _ErrorResponse(msgspec.Struct):
    error: ErrorBody | str | None = None
    message: str | None = None
    detail: str | None = None


_error_decoder: Final = msgspec.json.Decoder(_ErrorResponse)


def error_message(raw: bytes) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message"}}`, `{"error": "..."}`, vLLM's old
    `{"object": "error", "message"}`, FastAPI's `{"detail"}`), else the body's start as text."""
    try:
        parsed = _error_decoder.decode(raw)
    except msgspec.DecodeError:
        return raw[:MESSAGE_MAX_CHARS].decode("utf-8", "replace")
    error = parsed.error
    if isinstance(error, ErrorBody) and error.message:
        return error.message
    if isinstance(error, str):
        return error
    return parsed.message or parsed.detail or raw[:MESSAGE_MAX_CHARS].decode("utf-8", "replace")
