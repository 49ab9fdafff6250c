"""A small OpenTelemetry GenAI export, as an agent framework writes one in OTLP JSON: one conversation whose agent
calls a model four times, runs tools between the calls, and hands a task to a subagent that calls the model twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_T0_NS = 1_780_000_000_000_000_000
_TRACE_ID = "5b8efff798038103d269b633813fc60c"
MODEL = "claude-opus-4-8"


def _attributes(**values: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, value in values.items():
        name = key.replace("__", ".")
        if isinstance(value, bool):
            out.append({"key": name, "value": {"boolValue": value}})
        elif isinstance(value, int):
            out.append({"key": name, "value": {"intValue": str(value)}})  # OTLP JSON writes 64-bit ints as strings
        else:
            out.append({"key": name, "value": {"stringValue": str(value)}})
    return out


def _span(span_id: str, parent: str, name: str, start_s: float, end_s: float, **attributes: Any) -> dict[str, Any]:
    return {
        "traceId": _TRACE_ID,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 3 if name.startswith("chat") else 1,
        "startTimeUnixNano": str(_T0_NS + round(start_s * 1e9)),
        "endTimeUnixNano": str(_T0_NS + round(end_s * 1e9)),
        "attributes": _attributes(gen_ai__conversation__id="conv-1", **attributes),
        "status": {},
    }


def _chat(
    span_id: str, parent: str, start_s: float, end_s: float, in_tokens: int, cached: int, out: int
) -> dict[str, Any]:
    return _span(
        span_id, parent, f"chat {MODEL}", start_s, end_s,
        gen_ai__operation__name="chat", gen_ai__provider__name="anthropic", gen_ai__request__model=MODEL,
        gen_ai__usage__input_tokens=in_tokens, gen_ai__usage__cache_read__input_tokens=cached,
        gen_ai__usage__output_tokens=out,
    )  # fmt: skip


def _tool(span_id: str, parent: str, start_s: float, end_s: float, tool: str) -> dict[str, Any]:
    return _span(span_id, parent, f"execute_tool {tool}", start_s, end_s, gen_ai__operation__name="execute_tool",
                 gen_ai__tool__name=tool)  # fmt: skip


def agent_session_spans() -> list[dict[str, Any]]:
    """The spans: the agent's four calls (10k tokens growing by ~3k, each cached up to the previous prompt), its
    tools, and a subagent's two calls under the Task tool's span."""
    root, task = "a000000000000001", "a000000000000050"
    return [
        _span(root, "", "invoke_agent coder", 0.0, 60.0, gen_ai__operation__name="invoke_agent",
              gen_ai__agent__name="coder", gen_ai__agent__id="coder-1"),
        _chat("c000000000000001", root, 0.5, 4.0, 10_000, 0, 300),
        _tool("b000000000000001", root, 4.1, 6.0, "Bash"),
        _chat("c000000000000002", root, 6.1, 9.0, 13_000, 10_000, 250),
        _tool("b000000000000002", root, 9.1, 30.0, "Task"),
        _span(task, "b000000000000002", "invoke_agent explorer", 9.2, 29.5, gen_ai__operation__name="invoke_agent",
              gen_ai__agent__name="explorer", gen_ai__agent__id="explorer-1"),
        _chat("c000000000000051", task, 9.3, 12.0, 6_000, 0, 400),
        _tool("b000000000000051", task, 12.1, 20.0, "Grep"),
        _chat("c000000000000052", task, 20.1, 29.0, 8_000, 6_000, 600),
        _chat("c000000000000003", root, 30.2, 34.0, 16_500, 13_000, 200),
        _tool("b000000000000003", root, 34.1, 35.0, "Edit"),
        _chat("c000000000000004", root, 35.2, 40.0, 17_200, 16_500, 150),
    ]  # fmt: skip


def write_agent_session(path: Path) -> Path:
    """The export, pretty-printed, at `path`."""
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(service__name="coding-agent")},
                "scopeSpans": [
                    {"scope": {"name": "opentelemetry.instrumentation.genai"}, "spans": agent_session_spans()}
                ],
            }
        ]
    }
    path.write_text(json.dumps(document, indent=2))
    return path
