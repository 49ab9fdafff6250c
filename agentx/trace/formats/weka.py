"""Weka / AgentX trace JSON, the wire format: one session per object (docs/agentx.md §1).

The file layout (one trace per file, a directory of files, or JSONL, one per line) and the mapping to the
trace model are `agentx.trace.formats.weka_reader` (`read_weka`) and `agentx.trace.formats.weka_writer` (`write_weka`).
`json_schema` is the source of `schemas/weka-trace.schema.json`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType


def _no_ids() -> msgspec.Raw:
    return msgspec.Raw(b"[]")


class WekaCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, tag_field="type"):
    """One LLM request of the session's root or of a subagent."""

    # omit_defaults: `ttft` must stay absent on "n" requests, which the reference rejects.
    # `input_types`, `output_types` and `stop` default to UNSET rather than their reference defaults
    # ([], [], ""), so that a key the file wrote at its default is told from one it left out, and
    # written back as read (`Request.explicit_defaults`).
    # `hash_ids` stays JSON text until delta encoding: a growing context repeats its predecessor's
    # ids (~97% of a corpus's ids), so comparing text and decoding only the appended ids avoids
    # building ~150M Python ints for an AgentX-size corpus.

    t: float
    model: str
    in_tokens: int | None = msgspec.field(default=None, name="in")
    out_tokens: int | None = msgspec.field(default=None, name="out")
    input_length: int | None = None
    output_length: int | None = None
    hash_ids: msgspec.Raw = msgspec.field(default_factory=_no_ids)
    input_types: list[str] | UnsetType = UNSET
    output_types: list[str] | UnsetType = UNSET
    stop: str | UnsetType | None = UNSET
    api_time: float | None = None
    ttft: float | None = None
    think_time: float | None = None


class WekaRequest(WekaCall, tag="n"):
    """A request recorded without streaming (`type: "n"`); it carries no `ttft`."""


class WekaStreamedRequest(WekaCall, tag="s"):
    """A streamed request (`type: "s"`), with its recorded `ttft`."""


class WekaSubagent(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, tag="subagent", tag_field="type"
):
    """A subagent: its spawn time, recorded telemetry and its own requests (nested subagents allowed)."""

    t: float
    agent_id: str
    subagent_type: str
    duration_ms: int | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None
    status: str
    requests: list[WekaRequest | WekaStreamedRequest | WekaSubagent]
    models: list[str]
    tool_tokens: int = 0
    system_tokens: int = 0


class WekaTrace(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One recorded agent session (a Weka "trace")."""

    id: str
    models: list[str]
    block_size: int
    hash_id_scope: str
    tool_tokens: int = 0
    system_tokens: int = 0
    requests: list[WekaRequest | WekaStreamedRequest | WekaSubagent]
    totals: dict[str, Any] | None = None


def is_weka_object(obj: object) -> bool:
    """Whether a decoded JSON object looks like a Weka trace."""
    return isinstance(obj, dict) and "requests" in obj and ("block_size" in obj or "hash_id_scope" in obj)


def json_schema() -> dict[str, Any]:
    """JSON Schema of one Weka trace object as the reference defines it (the source of
    `schemas/weka-trace.schema.json`). Our reader is laxer: unknown keys only warn."""
    schema = msgspec.json.schema(WekaTrace)
    ids = {"type": "array", "items": {"type": "integer"}, "default": []}
    for name in ("WekaRequest", "WekaStreamedRequest"):
        properties = schema["$defs"][name]["properties"]
        properties["hash_ids"] = ids
        # The reference's defaults (UNSET in the struct only tells a written default from an absent key).
        properties["input_types"]["default"] = properties["output_types"]["default"] = []
        properties["stop"]["default"] = ""
    schema["title"] = "Weka / AgentX trace (one session)"
    schema["description"] = (
        "One object per trace file, or one per line of a JSONL corpus. Generated from agentx/trace/formats/weka.py."
    )
    return schema
