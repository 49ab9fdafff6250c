"""What went wrong with a request, as its record's `error_kind` and `timeout_kind` columns say it; apart from the
records' Arrow layout so that the HTTP client, which sets them, loads no pyarrow."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["http", "rate_limited", "timeout", "connection", "protocol", "context_overflow", "cancelled"]
"""`rate_limited`: an HTTP 429 (its `Retry-After` in the message); `http`: any other error status."""
TimeoutKind = Literal["connect", "idle", "request"]
"""Which timeout ended a request: connecting, no bytes for the idle timeout, or the whole request's limit."""
