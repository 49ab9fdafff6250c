"""OTLP JSON GenAI spans: sessions, the agent tree, prefix reuse from cached tokens, errors by span, fuzzing."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats.cached_prefix import shared_blocks
from agentx.trace.formats.otlp import read_otlp
from agentx.trace.io import detect_format, load_trace, save_trace
from agentx.trace.model import Agent, Trace
from agentx.trace.validation import validate

EPOCH_NS = 1_760_000_000_000_000_000
BLOCK = 64


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the files hypothesis examples rewrite (they run one at a time)."""
    return tmp_path_factory.mktemp("examples")


# ---------------------------------------------------------------------------------------------
# building exports


def any_value(value: object) -> dict[str, Any]:
    """An OTLP JSON AnyValue (`intValue` as a string, as the protobuf JSON mapping writes int64)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    return {"stringValue": str(value)}


def span(
    span_id: str,
    parent: str,
    start_ms: float,
    end_ms: float,
    *,
    trace: str = "t1",
    name: str = "",
    attrs: dict[str, object] | None = None,
    **attributes: object,
) -> dict[str, Any]:
    """One span, its times in ms after EPOCH_NS; its attributes `attrs` and the keyword arguments, their names with
    `__` for `.` (gen_ai__usage__input_tokens)."""
    attributes = {**(attrs or {}), **attributes}
    made: dict[str, Any] = {
        "traceId": trace,
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(EPOCH_NS + round(start_ms * 1_000_000)),
        "endTimeUnixNano": str(EPOCH_NS + round(end_ms * 1_000_000)),
        "attributes": [{"key": key.replace("__", "."), "value": any_value(value)} for key, value in attributes.items()],
        "status": {},
    }
    if parent:
        made["parentSpanId"] = parent
    return made


def chat(
    span_id: str,
    parent: str,
    start_ms: float,
    end_ms: float,
    in_tokens: int,
    out_tokens: int,
    cached: int | None = None,
    *,
    model: str = "claude-sonnet-4-5",
    trace: str = "t1",
    **attributes: object,
) -> dict[str, Any]:
    usage: dict[str, object] = {
        "gen_ai__operation__name": "chat",
        "gen_ai__request__model": model,
        "gen_ai__usage__input_tokens": in_tokens,
        "gen_ai__usage__output_tokens": out_tokens,
    }
    if cached is not None:
        usage["gen_ai__usage__cache_read__input_tokens"] = cached
    return span(span_id, parent, start_ms, end_ms, trace=trace, name=f"chat {model}", attrs=usage | attributes)


def agent(
    span_id: str, parent: str, start_ms: float, end_ms: float, name: str, *, trace: str = "t1", **attributes: object
) -> dict[str, Any]:
    named: dict[str, object] = {"gen_ai__operation__name": "invoke_agent", "gen_ai__agent__name": name}
    return span(span_id, parent, start_ms, end_ms, trace=trace, name=f"invoke_agent {name}", attrs=named | attributes)


def tool(span_id: str, parent: str, start_ms: float, end_ms: float, name: str = "Read") -> dict[str, Any]:
    return span(span_id, parent, start_ms, end_ms, name=f"execute_tool {name}", gen_ai__operation__name="execute_tool")


def export(spans: Sequence[dict[str, Any]], scope: str = "agent.framework") -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "coder"}}]},
                "scopeSpans": [{"scope": {"name": scope, "version": "1.0"}, "spans": list(spans)}],
            }
        ]
    }


def write_export(path: Path, spans: Sequence[dict[str, Any]], *, indent: int | None = None, **options: Any) -> Path:
    path.write_text(json.dumps(export(spans, **options), indent=indent) + "\n")
    return path


def write_jsonl(path: Path, batches: Sequence[Sequence[dict[str, Any]] | str]) -> Path:
    path.write_text("".join((b if isinstance(b, str) else json.dumps(export(b))) + "\n" for b in batches))
    return path


def read_error(path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_otlp(path)
    return info.value


SESSION = [  # a coding agent: three calls, a Task tool running an explorer subagent of two calls between them
    agent("a0", "", 0, 20_000, "coder", gen_ai__agent__id="agent-coder"),
    chat("c1", "a0", 100, 1_100, 1_000, 50, 0),
    tool("t1", "a0", 1_200, 9_000, "Task"),
    agent("s1", "t1", 1_300, 8_900, "explorer"),
    chat("s1c1", "s1", 1_400, 2_000, 900, 40, 0, model="claude-haiku-4-5"),
    tool("s1t1", "s1", 2_050, 2_400, "Grep"),
    chat("s1c2", "s1", 2_500, 3_000, 1_500, 30, 896, model="claude-haiku-4-5"),
    chat("c2", "a0", 9_100, 10_000, 2_000, 60, 960),
    tool("t2", "a0", 10_050, 10_500, "Edit"),
    chat("c3", "a0", 10_600, 11_000, 2_600, 70, 1_990),
    span("h1", "c3", 10_610, 10_990, name="POST /v1/messages", http__request__method="POST"),
]


def kept_and_caps(trace: Trace) -> list[tuple[int, int]]:
    """(ids kept, the previous request's ids) of every request after an agent's first."""
    pairs = []
    for session in trace.sessions:
        for each, _, _ in session.agents():
            previous = 0
            for index, request in enumerate(each.requests):
                if index:
                    pairs.append((request.hash_ids_kept, previous))
                previous = request.hash_ids_len
    return pairs


# ---------------------------------------------------------------------------------------------
# one session, field by field


def test_session_with_a_subagent_field_by_field(tmp_path: Path) -> None:
    path = write_export(tmp_path / "spans.json", SESSION)
    findings = Findings()
    trace = read_otlp(path, findings=findings)
    assert findings.items == []
    assert (trace.block_size, trace.hash_id_scope) == (64, "global")
    assert (trace.provenance.source_format, trace.provenance.source_path) == ("otlp", str(path))
    [session] = trace.sessions
    assert (session.session_id, session.start_s) == ("t1", 0.0)
    assert session.models == ["claude-sonnet-4-5", "claude-haiku-4-5"]
    root = session.root
    assert [(r.t, r.api_time, r.think_time, r.in_tokens, r.out_tokens) for r in root.requests] == [
        (0.1, 1.0, None, 1_000, 50),
        (9.1, pytest.approx(0.9), pytest.approx(8.0), 2_000, 60),
        (10.6, pytest.approx(0.4), pytest.approx(0.6), 2_600, 70),
    ]
    assert all(r.model == "claude-sonnet-4-5" and r.type == "n" and r.ttft is None for r in root.requests)
    [sub] = root.subagents
    assert (sub.agent_id, sub.subagent_type, sub.spawn_after, sub.t, sub.duration_ms) == (
        "s1",
        "explorer",
        1,
        1.3,
        7600,
    )
    assert (sub.tool_use_count, sub.models, sub.subagents) == (1, ["claude-haiku-4-5"], [])
    assert [(r.t, r.think_time, r.in_tokens) for r in sub.requests] == [
        (1.4, None, 900),
        (2.5, pytest.approx(0.5), 1_500),
    ]
    # Blocks of 64: ceil(in / 64) ids; a later request keeps cached // 64 of its predecessor's ids.
    assert [(r.hash_ids_kept, r.hash_ids_len) for r in root.requests] == [(0, 16), (15, 32), (31, 41)]
    assert [(r.hash_ids_kept, r.hash_ids_len) for r in sub.requests] == [(0, 15), (14, 24)]
    assert list(root.hash_ids(1)[:15]) == list(root.hash_ids(0)[:15])
    assert shared_blocks(root.hash_ids(0), sub.hash_ids(0)) == 0  # another model and kind of agent: nothing shared
    assert [f for f in validate(trace) if f.severity == "error"] == []


def test_block_size_and_the_cap_at_the_previous_prompt(tmp_path: Path) -> None:
    spans = [
        chat("c1", "", 0, 100, 200, 10, 0),
        chat("c2", "", 200, 300, 900, 10, 800),  # more cached than the previous prompt (its answer was cached too)
        chat("c3", "", 400, 500, 1_000, 10, 900),
    ]
    findings = Findings()
    trace = read_otlp(write_export(tmp_path / "s.json", spans), block_size=100, findings=findings)
    assert trace.block_size == 100
    assert [(r.hash_ids_kept, r.hash_ids_len) for r in trace.sessions[0].root.requests] == [(0, 2), (2, 9), (9, 10)]
    assert [w.message for w in findings.warnings] == [
        "1 request(s) had a cached prefix longer than their agent's previous prompt (the provider cached its own "
        "answer too): they share the whole previous prompt"
    ]


def test_first_requests_share_a_preamble_across_sessions(tmp_path: Path) -> None:
    spans = [
        chat("a", "", 0, 100, 3_000, 10, 0, trace="x"),
        chat("b", "", 5_000, 5_100, 3_000, 10, 2_560, trace="y"),  # 40 blocks of a system prompt cached before
        chat("c", "", 6_000, 6_100, 3_000, 10, 1_280, trace="z"),
        chat("d", "", 7_000, 7_100, 3_000, 10, 2_560, trace="w", model="gpt-5"),  # another model: another preamble
    ]
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    x, y, z, w = (session.root.hash_ids(0) for session in trace.sessions)
    # y's cached system prompt is what x's prompt sent before it; z shares its own 20 blocks; another model nothing.
    assert (shared_blocks(x, y), shared_blocks(y, z), shared_blocks(y, w)) == (40, 20, 0)
    assert [s.start_s for s in trace.sessions] == [0.0, 5.0, 6.0, 7.0]


# ---------------------------------------------------------------------------------------------
# sessions and the tree


def test_conversations_group_traces_and_name_sessions(tmp_path: Path) -> None:
    spans = [
        agent("a", "", 0, 1_000, "coder", trace="turn1", gen_ai__conversation__id="conv-A"),
        chat("a1", "a", 100, 900, 500, 10, 0, trace="turn1"),
        agent("b", "", 500, 2_000, "coder", trace="other", gen_ai__conversation__id="conv-B"),
        chat("b1", "b", 600, 1_900, 700, 10, 0, trace="other"),
        agent("c", "", 30_000, 31_000, "coder", trace="turn2", gen_ai__conversation__id="conv-A"),
        chat("c1", "c", 30_100, 30_900, 800, 10, 448, trace="turn2"),
        chat("n1", "", 40_000, 40_500, 100, 10, 0, trace="loose"),
    ]
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    assert [(s.session_id, s.start_s, s.request_count) for s in trace.sessions] == [
        ("conv-A", 0.0, 2),
        ("conv-B", 0.5, 1),
        ("loose", 40.0, 1),
    ]
    turns = trace.sessions[0].root.requests
    assert [(r.t, r.think_time, r.hash_ids_kept) for r in turns] == [(0.1, None, 0), (30.1, pytest.approx(29.2), 7)]


def test_nested_subagents_and_a_repeated_agent_id(tmp_path: Path) -> None:
    spans = [
        agent("root", "", 0, 10_000, "lead"),
        chat("r1", "root", 10, 20, 100, 5, 0),
        agent("w1", "root", 30, 900, "worker", gen_ai__agent__id="worker"),
        chat("w1c", "w1", 40, 50, 100, 5, 0),
        agent("deep", "w1", 60, 800, "helper"),
        chat("dc", "deep", 70, 80, 100, 5, 0),
        chat("r2", "root", 950, 960, 200, 5, 64),
        agent("w2", "root", 1_000, 2_000, "worker", gen_ai__agent__id="worker"),
        chat("w2c", "w2", 1_010, 1_020, 100, 5, 0),
        agent("idle", "root", 2_100, 2_200, "worker"),  # made no call: left out
    ]
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    root = trace.sessions[0].root
    assert [(a.agent_id, a.subagent_type, a.spawn_after) for a in root.subagents] == [
        ("worker", "worker", 1),
        ("worker#2", "worker", 2),
    ]
    [deep] = root.subagents[0].subagents
    assert (deep.agent_id, deep.subagent_type, deep.spawn_after, deep.t) == ("deep", "helper", 1, 0.06)
    assert [f for f in validate(trace) if f.severity == "error"] == []


def test_spans_that_are_no_llm_call_are_ignored(tmp_path: Path) -> None:
    spans = [
        chat("c1", "", 0, 100, 300, 10, 0),
        span("e", "", 10, 20, name="embeddings", gen_ai__operation__name="embeddings", gen_ai__usage__input_tokens=9),
        span("w", "", 0, 500, name="workflow", gen_ai__operation__name="invoke_workflow",
             gen_ai__usage__input_tokens=9),
        span("x", "", 0, 1, name="db query"),
        {"traceId": "t1", "spanId": "y", "name": "no times at all"},
        # No operation name, but token counts: an LLM call (OpenLLMetry writes these).
        span("legacy", "", 200, 300, name="openai.chat", gen_ai__usage__prompt_tokens=400,
             gen_ai__usage__completion_tokens=7, gen_ai__usage__cache_read_input_tokens=256),
    ]  # fmt: skip
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    requests = trace.sessions[0].root.requests
    assert [(r.in_tokens, r.out_tokens, r.hash_ids_kept) for r in requests] == [(300, 10, 0), (400, 7, 4)]


def test_openinference_spans(tmp_path: Path) -> None:
    spans = [
        span("a", "", 0, 1_000, name="Agent", openinference__span__kind="AGENT", agent__name="planner",
             session__id="sess-1"),
        span("s", "a", 10, 900, name="Agent", openinference__span__kind="AGENT", agent__name="researcher"),
        span("l1", "s", 20, 30, name="ChatAnthropic", openinference__span__kind="LLM", llm__model_name="m",
             llm__token_count__prompt=1_000, llm__token_count__completion=9,
             llm__token_count__prompt_details__cache_read=0),
        span("l2", "s", 40, 50, name="ChatAnthropic", openinference__span__kind="LLM", llm__model_name="m",
             llm__token_count__prompt=1_100, llm__token_count__completion=9,
             llm__token_count__prompt_details__cache_read=1_000),
        span("ch", "s", 60, 70, name="chain", openinference__span__kind="CHAIN", llm__token_count__prompt=5),
    ]  # fmt: skip
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    [session] = trace.sessions
    assert session.session_id == "sess-1" and session.root.requests == []
    [sub] = session.root.subagents
    assert (sub.agent_id, sub.subagent_type) == ("s", "researcher")
    assert [(r.model, r.in_tokens, r.hash_ids_kept) for r in sub.requests] == [("m", 1_000, 0), ("m", 1_100, 15)]


def test_a_call_instrumented_twice_counts_once(tmp_path: Path) -> None:
    spans = [
        chat("outer", "", 0, 1_000, 500, 10, 0, model="framework-name"),
        chat("inner", "outer", 5, 990, 500, 10, 0),
    ]
    findings = Findings()
    trace = read_otlp(write_export(tmp_path / "s.json", spans), findings=findings)
    assert [(r.model, r.t) for r in trace.sessions[0].root.requests] == [("claude-sonnet-4-5", 0.0)]
    assert [w.message for w in findings.warnings] == [
        "1 LLM span(s) enclose another LLM span (one call instrumented twice?): only the innermost are kept"
    ]


def test_streaming_ttft_and_finish_reason(tmp_path: Path) -> None:
    spans = [
        chat("c1", "", 0, 2_000, 100, 10, 0, gen_ai__response__time_to_first_chunk=0.25,
             gen_ai__response__finish_reasons=["tool_calls"]),
        chat("c2", "", 3_000, 4_000, 100, 10, 0, gen_ai__request__stream=True),
    ]  # fmt: skip
    requests = read_otlp(write_export(tmp_path / "s.json", spans)).sessions[0].root.requests
    assert [(r.type, r.ttft, r.stop) for r in requests] == [("s", 0.25, "tool_calls"), ("s", None, "")]


# ---------------------------------------------------------------------------------------------
# input and its cached part


def test_input_reported_without_the_cache_is_made_whole(tmp_path: Path) -> None:
    def anthropic(span_id: str, start: float, uncached: int, read: int, written: int) -> dict[str, Any]:
        return chat(span_id, "", start, start + 100, uncached, 10, read,
                    gen_ai__usage__cache_creation__input_tokens=written)  # fmt: skip

    spans = [
        anthropic("c1", 0, 20, 0, 4_000),  # creation > input: reported apart
        anthropic("c2", 200, 30, 4_000, 10),
        anthropic("c3", 400, 500, 300, 0),  # shows nothing itself; its scope and model did
    ]
    findings = Findings()
    trace = read_otlp(write_export(tmp_path / "s.json", spans), findings=findings)
    assert [r.in_tokens for r in trace.sessions[0].root.requests] == [4_020, 4_040, 800]
    assert [w.message for w in findings.warnings] == [
        "3 LLM span(s) report input tokens without their cached part, as Anthropic's API does (first: span c1, "
        "scope 'agent.framework'): their input is taken as input + cache read + cache creation"
    ]


def test_the_total_tells_how_input_was_counted(tmp_path: Path) -> None:
    spans = [
        chat("apart", "", 0, 100, 400, 10, 300, gen_ai__usage__total_tokens=710),
        chat("whole", "", 200, 300, 400, 10, 300, model="gpt-5", gen_ai__usage__total_tokens=410),
        chat("plain", "", 400, 500, 400, 10, 300, model="gpt-5"),
    ]
    trace = read_otlp(write_export(tmp_path / "s.json", spans))
    assert [r.in_tokens for r in trace.sessions[0].root.requests] == [700, 400, 400]


def test_no_cached_attribute_claims_no_reuse_with_one_warning(tmp_path: Path) -> None:
    spans = [chat("c1", "", 0, 100, 640, 10), chat("c2", "", 200, 300, 1_280, 10), chat("c3", "", 400, 500, 99, 1, 0)]
    path = write_export(tmp_path / "s.json", spans, indent=2)
    findings = Findings()
    trace = read_otlp(path, findings=findings)
    assert [r.hash_ids_kept for r in trace.sessions[0].root.requests] == [0, 0, 0]
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"spanId": "c1"' in text)
    assert [str(w) for w in findings.warnings] == [
        f"{path}:{line}: 2 of 3 LLM span(s) carry no cached-input attribute (such as "
        "gen_ai.usage.cache_read.input_tokens): taken as 0 cached tokens, no prefix reuse claimed for them (first: "
        "span c1)"
    ]


def test_a_failed_call_without_usage_is_left_out(tmp_path: Path) -> None:
    failed = span("f", "", 0, 50, name="chat m", gen_ai__operation__name="chat", error__type="429")
    findings = Findings()
    trace = read_otlp(
        write_jsonl(tmp_path / "s.jsonl", [[failed], [chat("c", "", 100, 200, 10, 1, 0)]]), findings=findings
    )
    assert trace.request_count == 1
    assert [(w.line, w.message) for w in findings.warnings] == [
        (1, "1 LLM span(s) carry no input token count (failed calls?): left out (first: span f)")
    ]


# ---------------------------------------------------------------------------------------------
# the file's forms, detection and the Arrow round trip


def test_every_form_reads_the_same_and_survives_arrow(tmp_path: Path) -> None:
    one_line = write_export(tmp_path / "one.json", SESSION)
    pretty = write_export(tmp_path / "pretty.json", SESSION, indent=2)
    # The Collector's file exporter: batches as they end, one export a line, spans of a trace over many lines.
    jsonl = write_jsonl(tmp_path / "collector.jsonl", [SESSION[4:7], SESSION[7:], SESSION[:4]])
    packed = tmp_path / "collector.jsonl.gz"
    packed.write_bytes(gzip.compress(jsonl.read_bytes()))
    expected = read_otlp(one_line).sessions
    for path in (one_line, pretty, jsonl, packed):
        assert detect_format(path) == "otlp", path
        trace = load_trace(path)
        assert trace.sessions == expected, path
    arrow = tmp_path / "spans.arrow"
    save_trace(load_trace(packed), arrow)
    back = load_trace(arrow)
    assert (back.sessions, back.block_size, back.hash_id_scope) == (expected, 64, "global")
    assert back.provenance.source_format == "otlp"
    assert load_trace(pretty, block_size=16).block_size == 16


# ---------------------------------------------------------------------------------------------
# errors


def test_a_malformed_line_names_the_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [SESSION[:3], '{"resourceSpans": [{"scopeSpans": [', SESSION[3:]])
    message = str(read_error(path))
    assert message.startswith(f"{path}:2: the JSON ends early (truncated file?)")


def test_a_malformed_pretty_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{\n  "resourceSpans": [\n    {"scopeSpans": [}\n  ]\n}\n')
    assert str(read_error(path)).startswith(f"{path}:3: JSON is malformed")
    path.write_text('{\n  "resourceSpans": {}\n}\n')
    assert str(read_error(path)) == f"{path}: Expected `array`, got `object` at `$.resourceSpans`"


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"endTimeUnixNano": None}, "span c2: endTimeUnixNano is missing"),
        ({"startTimeUnixNano": "soon"}, "span c2: startTimeUnixNano 'soon' is not a time in nanoseconds"),
        (
            {"endTimeUnixNano": str(EPOCH_NS)},
            f"span c2: it ends before it starts (endTimeUnixNano {EPOCH_NS} < startTimeUnixNano "
            f"{EPOCH_NS + 200_000_000})",
        ),
        ({"attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "-5"}}]},
         "span c2: gen_ai.usage.input_tokens=-5 is negative"),
        ({"attributes": [{"key": "gen_ai.usage.output_tokens", "value": {"stringValue": "many"}}]},
         "span c2: gen_ai.usage.output_tokens is not a whole number of tokens"),
        ({"attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "1000000000"}}]},
         "span c2: gen_ai.usage.input_tokens=1000000000 is absurdly large (limit 100,000,000)"),
        ({"attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": []}}]},
         "span c2: attribute gen_ai.usage.input_tokens: Expected `int | float | str | null`, got `array` at "
         "`$.intValue`"),
        ({"attributes": 5}, "span c2: Expected `array`, got `int` at `$.attributes`"),
        ({"attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "5000000"}},
                         {"key": "gen_ai.usage.cache_read.input_tokens", "value": {"intValue": "99000000"}}]},
         "span c2: input + cache read + cache creation = 104000000 is absurdly large (limit 100,000,000)"),
    ],
)  # fmt: skip
def test_a_bad_span_names_its_span_id(tmp_path: Path, bad: dict[str, Any], problem: str) -> None:
    broken = chat("c2", "", 200, 300, 100, 10, 0)
    for key, value in bad.items():
        if key == "attributes" and isinstance(value, list):
            replaced = {kv["key"] for kv in value}
            value = [kv for kv in broken["attributes"] if kv["key"] not in replaced] + value
        if value is None:
            broken.pop(key)
        else:
            broken[key] = value
    spans = [chat("c1", "", 0, 100, 100, 10, 0), broken]
    jsonl = write_jsonl(tmp_path / "s.jsonl", [spans[:1], spans[1:]])
    assert str(read_error(jsonl)) == f"{jsonl}:2: {problem}"
    pretty = write_export(tmp_path / "s.json", spans, indent=2)
    line = next(n for n, text in enumerate(pretty.read_text().splitlines(), 1) if '"spanId": "c2"' in text)
    assert str(read_error(pretty)) == f"{pretty}:{line}: {problem}"


def test_ids_with_control_characters_stay_on_one_line(tmp_path: Path) -> None:
    broken = chat("c\n2", "", 200, 300, 100, 10, 0)
    broken.pop("endTimeUnixNano")
    path = write_jsonl(tmp_path / "s.jsonl", [[broken]])
    assert str(read_error(path)) == f"{path}:1: span c\\n2: endTimeUnixNano is missing"


def test_tree_errors(tmp_path: Path) -> None:
    loop = [chat("c", "b", 0, 10, 5, 1, 0), span("a", "b", 0, 10), span("b", "a", 0, 10)]
    path = write_jsonl(tmp_path / "loop.jsonl", [loop])
    assert str(read_error(path)) == f"{path}:1: parentSpanId links form a cycle: b -> a -> b"
    twice = write_jsonl(tmp_path / "twice.jsonl", [[chat("c", "", 0, 10, 5, 1, 0)], [chat("c", "", 0, 10, 5, 1, 0)]])
    assert str(read_error(twice)) == f"{twice}:2: span c of trace t1 appears again (first on line 1)"


def test_files_without_llm_spans(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    assert str(read_error(empty)) == f"{empty}: the file holds no OTLP export"
    tools_only = write_export(tmp_path / "tools.json", [tool("t", "", 0, 10), agent("a", "", 0, 20, "x")])
    assert str(read_error(tools_only)) == (
        f"{tools_only}: the file holds no LLM span (gen_ai.operation.name chat, text_completion or generate_content, "
        "or a span with gen_ai.usage token counts)"
    )
    assert "cannot read the file" in str(read_error(tmp_path / "absent.json"))


# ---------------------------------------------------------------------------------------------
# property: random span trees load, validate, and keep their structure


@st.composite
def span_trees(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, int]]:
    """Spans of one trace under a root agent (times nested, children in order), with what the reader should make of
    them: each LLM span's agent ("" for the root, else the subagent span's id) and its cached tokens."""
    spans: list[dict[str, Any]] = []
    owner_of: dict[str, str] = {}
    cached_of: dict[str, int] = {}

    def grow(parent: str, agent_id: str, start: int, end: int, depth: int) -> None:
        count = draw(st.integers(0, 4 if depth < 3 else 2))
        cursor = start
        width = max(1, (end - start) // (count + 1))
        for index in range(count):
            begin, finish = cursor + 1, cursor + width
            cursor = finish
            span_id = f"{parent}.{index}"
            kind = draw(st.sampled_from(["chat", "chat", "tool", "agent", "other"] if depth < 4 else ["chat"]))
            if kind == "chat":
                in_tokens = draw(st.integers(0, 5_000))
                cached = draw(st.none() | st.integers(0, in_tokens))
                spans.append(chat(span_id, parent, begin, finish, in_tokens, draw(st.integers(1, 500)), cached))
                owner_of[span_id], cached_of[span_id] = agent_id, cached or 0
            elif kind == "agent":
                spans.append(agent(span_id, parent, begin, finish, draw(st.sampled_from(["explore", "plan"]))))
                grow(span_id, span_id, begin, finish, depth + 1)
            else:
                spans.append(
                    tool(span_id, parent, begin, finish) if kind == "tool" else span(span_id, parent, begin, finish)
                )
                grow(span_id, agent_id, begin, finish, depth + 1)

    spans.append(agent("r", "", 0, 1_000_000, "lead"))
    grow("r", "", 0, 1_000_000, 0)
    return spans, owner_of, cached_of


@settings(max_examples=examples(100), deadline=None)
@given(tree=span_trees(), order=st.randoms(use_true_random=False), pretty=st.booleans())
def test_random_span_trees_load_and_validate(
    scratch: Path, tree: tuple[list[dict[str, Any]], dict[str, str], dict[str, int]], order: random.Random, pretty: bool
) -> None:
    spans, owner_of, cached_of = tree
    shuffled = list(spans)
    order.shuffle(shuffled)
    path = write_export(scratch / "tree.json", shuffled, indent=2 if pretty else None)
    if not owner_of:
        assert "holds no LLM span" in str(read_error(path))
        return
    trace = load_trace(path)
    assert [f for f in validate(trace) if f.severity == "error"] == []
    [session] = trace.sessions
    assert session.request_count == len(owner_of)
    by_agent: dict[str, list[str]] = {}
    for span_id, owner in owner_of.items():
        by_agent.setdefault(owner, []).append(span_id)
    agents: dict[str, Agent] = {each.agent_id: each for each, _, _ in session.agents()}
    assert set(by_agent) <= set(agents)
    assert all(not agents[a].requests and (a == "" or agents[a].subagents) for a in set(agents) - set(by_agent))
    for agent_id, members in by_agent.items():
        got = agents[agent_id]
        members.sort(key=lambda span_id: [int(part) for part in span_id.split(".")[1:]])  # the tree's order is time's
        assert [r.hash_ids_kept for r in got.requests[1:]] == [
            min(cached_of[span_id] // BLOCK, previous.hash_ids_len)
            for span_id, previous in zip(members[1:], got.requests, strict=False)
        ]
    for kept, cap in kept_and_caps(trace):
        assert kept <= cap


# ---------------------------------------------------------------------------------------------
# fuzzing: a mutated export either reads into a valid trace or raises TraceError, in one line

FIELDS = ["traceId", "spanId", "parentSpanId", "startTimeUnixNano", "endTimeUnixNano", "attributes", "name"]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.sampled_from(["0", "-1", "1e3", "s1", "t1", "NaN", "", str(EPOCH_NS)])
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["intValue", "x"]), inner, max_size=2),
    max_leaves=5,
)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), pretty=st.booleans())
def test_fuzz_mutated_exports(scratch: Path, data: st.DataObject, pretty: bool) -> None:
    spans = json.loads(json.dumps(SESSION))
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(st.sampled_from(spans))
        kind = data.draw(st.sampled_from(["field", "drop", "attribute", "relink"]))
        if kind == "field":
            target[data.draw(st.sampled_from(FIELDS))] = data.draw(json_values)
        elif kind == "drop":
            target.pop(data.draw(st.sampled_from(FIELDS)), None)
        elif kind == "attribute" and isinstance(target.get("attributes"), list) and target["attributes"]:
            chosen = data.draw(st.sampled_from(target["attributes"]))
            if isinstance(chosen, dict):
                chosen["value"] = data.draw(json_values)
        else:
            target["parentSpanId"] = data.draw(
                st.sampled_from(["", "nowhere", *(s.get("spanId", "") for s in SESSION)])
            )
    text = json.dumps(export(spans), indent=2 if pretty else None)
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(text)))
        text = text[:cut]
    path = scratch / "fuzz.json"
    path.write_text(text)
    try:
        trace = read_otlp(path)
    except TraceError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert [f for f in validate(trace) if f.severity == "error"] == []


OTLP_TOKENS = [b'"resourceSpans"', b'"scopeSpans"', b'"spans"', b'"spanId"', b'"traceId"', b'"startTimeUnixNano"']
SOUP = [*OTLP_TOKENS, b"{", b"}", b"[", b"]", b":", b",", b'"1"', b"1", b"-1", b"null", b"\n", b"  "]


@settings(max_examples=examples(300), deadline=None)
@given(blob=st.binary(max_size=300) | st.lists(st.sampled_from(SOUP), max_size=60).map(b"".join))
def test_fuzz_arbitrary_bytes(scratch: Path, blob: bytes) -> None:
    path = scratch / "blob.json"
    path.write_bytes(blob)
    try:
        trace = read_otlp(path)
    except TraceError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert [f for f in validate(trace) if f.severity == "error"] == []
