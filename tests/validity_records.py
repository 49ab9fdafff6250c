"""Hand-built records, records tables and run.json documents for the validity and rules tests."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
from strategies import record_identity

from agentx.records.record import META_EPOCH, META_FORMAT, META_RUN, META_RUN_ID, META_VERSION, SCHEMA, RequestRecord

MS = 1_000_000
S = 1_000_000_000


def rec(sent_s: float = 1.0, length_s: float = 0.7, **overrides: Any) -> RequestRecord:
    """A successful profiling request of 11 tokens sent at `sent_s`, streaming from +0.1 s to `length_s` − 0.1 s."""
    sent = int(sent_s * S)
    end = sent + int(length_s * S)
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_token_ns": sent + 100 * MS,
        "last_token_ns": end - 100 * MS,
        "end_ns": end,
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 100,
        "osl_recorded_tokens": 11,
        "osl_streamed_tokens": 11,
    }
    values.update(overrides)
    return RequestRecord(**values)


def failed(kind: str, sent_s: float = 1.0, **overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "status": "error",
        "error_kind": kind,
        "first_token_ns": None,
        "last_token_ns": None,
        "osl_streamed_tokens": 0,
    }
    values.update(overrides)
    return rec(sent_s, **values)


def table(records: list[RequestRecord], options: dict[str, Any] | None = None) -> pa.Table:
    metadata = {
        META_FORMAT: b"agentx-records",
        META_VERSION: b"1.2",
        META_RUN_ID: b"run-1",
        META_EPOCH: b"1700000000000000000",
        META_RUN: msgspec.json.encode(options or {}),
    }
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA.with_metadata(metadata))


def run_file(options: dict[str, Any] | None = None, **run: Any) -> dict[str, Any]:
    return {"options": options or {}, "run": {"interrupted": False, **run}, "summary": {}}
