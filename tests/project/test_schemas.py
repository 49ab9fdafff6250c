"""The checked-in schemas are generated from the code; this fails when they drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.make_schemas import SCHEMAS, generated


@pytest.mark.parametrize("name", sorted(generated()))
def test_checked_in_schema_matches_the_code(name: str) -> None:
    committed = (SCHEMAS / name).read_text(encoding="utf-8")
    assert committed == generated()[name], f"schemas/{name} is stale: run `make schemas`"


def test_weka_schema_lists_every_field_of_the_reference() -> None:
    schema = json.loads((SCHEMAS / "weka-trace.schema.json").read_text(encoding="utf-8"))
    definitions = schema["$defs"]
    trace_fields = set(definitions["WekaTrace"]["properties"])
    assert {"id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests", "totals"} <= (
        trace_fields
    )
    request_fields = set(definitions["WekaRequest"]["properties"])
    assert {"t", "type", "model", "in", "out", "hash_ids", "input_types", "output_types", "stop"} <= request_fields
    assert {"api_time", "think_time", "ttft", "input_length", "output_length"} <= request_fields
    subagent_fields = set(definitions["WekaSubagent"]["properties"])
    assert {"agent_id", "subagent_type", "status", "duration_ms", "total_tokens", "tool_use_count"} <= subagent_fields


def test_arrow_layout_names_every_column() -> None:
    from agentx.trace.formats.arrow import SCHEMA

    text = (SCHEMAS / "trace.arrow.md").read_text(encoding="utf-8")
    for field in SCHEMA:
        assert f"`{field.name}`" in text


def test_schemas_dir_is_where_the_script_writes() -> None:
    assert Path(SCHEMAS).name == "schemas" and (SCHEMAS.parent / "pyproject.toml").exists()
