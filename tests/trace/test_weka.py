"""Weka / AgentX trace JSON (docs/agentx.md §1): reading, writing, round trips, real data and bad input."""

from __future__ import annotations

import copy
import gzip
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, write_json
from strategies import traces as trace_strategy

from agentx.errors import Finding, TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats import arrow, weka_reader, weka_writer
from agentx.trace.io import load_trace
from agentx.trace.model import Provenance, Trace, delta_encode
from agentx.trace.validation import MAX_AGENT_DEPTH, MAX_BLOCK_SIZE, MAX_TOKENS_PER_REQUEST, validate

# ---------------------------------------------------------------------------------------------
# helpers


def _read(path: Path, **kwargs: Any) -> tuple[Trace, list[Finding]]:
    findings = Findings()
    trace = weka_reader.read_weka(path, findings=findings, **kwargs)
    return trace, findings.items


def _error(path: Path, **kwargs: Any) -> str:
    """The TraceError message for `path`, checked to be one paragraph naming the file."""
    with pytest.raises(TraceError) as caught:
        weka_reader.read_weka(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    return message


def _wire_requests(entries: list[dict[str, Any]]) -> int:
    """Requests in a Weka `requests` list, subagents' included (counted from the JSON itself)."""
    return sum(_wire_requests(e["requests"]) if e["type"] == "subagent" else 1 for e in entries)


def _without_weka_drops(trace: Trace) -> Trace:
    """A copy without what the Weka format documents as dropped (start_s, acceptance_length)
    and without provenance (which records where a trace was read from)."""
    copied = copy.deepcopy(trace)
    copied.provenance = Provenance()
    for session in copied.sessions:
        session.start_s = 0.0
        for agent, _, _ in session.agents():
            agent.requests = [msgspec.structs.replace(r, acceptance_length=None) for r in agent.requests]
    return copied


def _objects(path: Path) -> list[Any]:
    # Split on "\n" only: str.splitlines() would also split inside strings holding U+0085 or U+2028.
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


# ---------------------------------------------------------------------------------------------
# round trips (hypothesis)


@settings(max_examples=examples(80), deadline=None)
@given(trace_strategy())
def test_model_to_weka_to_model_loses_only_what_weka_drops(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        weka_writer.write_weka(trace, path)
        back, findings = _read(path)
    assert back.provenance.source_format == "weka"
    assert _without_weka_drops(back) == _without_weka_drops(trace)
    assert [f for f in findings if f.severity == "error"] == []


@settings(max_examples=examples(60), deadline=None)
@given(trace_strategy(acceptance=False, weka_start=True))
def test_weka_keeps_everything_else_exactly(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        weka_writer.write_weka(trace, path)
        back, _ = _read(path)
    back.provenance = trace.provenance
    assert back == trace


@settings(max_examples=examples(60), deadline=None)
@given(trace_strategy())
def test_weka_to_model_to_weka_reproduces_the_json_objects(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp) / "a.jsonl", Path(tmp) / "b.jsonl"
        weka_writer.write_weka(trace, first)
        weka_writer.write_weka(weka_reader.read_weka(first), second)
        assert _objects(second) == _objects(first)
        assert len(_objects(first)) == len(trace.sessions)


@settings(max_examples=examples(40), deadline=None)
@given(trace_strategy(max_sessions=1))
def test_writer_restores_relative_times_of_legacy_subagents(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "one.json"
        weka_writer.write_weka(trace, path)
        document = json.loads(path.read_text(encoding="utf-8"))

    def check(agent_entries: list[dict[str, Any]], agent: Any) -> None:
        calls = [e for e in agent_entries if e["type"] != "subagent"]
        subs = [e for e in agent_entries if e["type"] == "subagent"]
        assert len(calls) == len(agent.requests)
        for call, request in zip(calls, agent.requests, strict=True):
            if agent.relative_times:
                assert call["t"] < agent.t and math.isclose(agent.t + call["t"], request.t, abs_tol=1e-9)
            else:
                assert call["t"] == request.t
        for entry, sub in zip(subs, agent.subagents, strict=True):
            assert entry["agent_id"] == sub.agent_id and entry["t"] == sub.t
            check(entry.get("requests", []), sub)

    check(document["requests"], trace.sessions[0].root)


# ---------------------------------------------------------------------------------------------
# the real sample (the weka_sample_dir fixture of conftest.py)


def test_sample_directory_loads_with_the_expected_counts(weka_sample_dir: Path, weka_sample_files: list[Path]) -> None:
    trace, findings = _read(weka_sample_dir)
    documents = [json.loads(p.read_text(encoding="utf-8")) for p in weka_sample_files]
    assert [s.session_id for s in trace.sessions] == [d["id"] for d in documents]
    assert trace.request_count == sum(_wire_requests(d["requests"]) for d in documents)
    # The sample's README: 7 traces, 226 requests, block size 64, local ids.
    assert (len(trace.sessions), trace.request_count) == (7, 226)
    assert trace.block_size == 64 and trace.hash_id_scope == "session"
    assert findings == []
    assert validate(trace) == []


def test_sample_files_load_one_by_one(weka_sample_files: list[Path]) -> None:
    with_subagents = set()
    for path in weka_sample_files:
        document = json.loads(path.read_text(encoding="utf-8"))
        trace = load_trace(path)
        assert trace.provenance.source_format == "weka"
        (session,) = trace.sessions
        assert session.session_id == document["id"]
        assert session.request_count == _wire_requests(document["requests"])
        assert (session.root.tool_tokens, session.root.system_tokens) == (
            document.get("tool_tokens", 0),
            document.get("system_tokens", 0),
        )
        assert session.totals == document.get("totals")
        subagents = [e for e in document["requests"] if e["type"] == "subagent"]
        assert [a.agent_id for a in session.root.subagents] == [e["agent_id"] for e in subagents]
        if session.root.subagents:
            with_subagents.add(session.session_id)
    assert with_subagents == {"trace_0014", "trace_0277", "trace_0291"}


def test_sample_relative_subagent_times_become_absolute(weka_sample_files: list[Path]) -> None:
    checked = 0
    for path in weka_sample_files:
        document = json.loads(path.read_text(encoding="utf-8"))
        (session,) = weka_reader.read_weka(path).sessions
        agents = {agent.agent_id: agent for agent, _, _ in session.agents()}
        for entry in (e for e in document["requests"] if e["type"] == "subagent"):
            agent = agents[entry["agent_id"]]
            assert agent.t == entry["t"]
            inner = [call["t"] for call in entry["requests"]]
            # Legacy rule (docs/agentx.md §1c): an inner t below the spawn time is relative to it.
            expected = [entry["t"] + t if t < entry["t"] - 1e-6 else t for t in inner]
            assert [r.t for r in agent.requests] == expected
            assert agent.relative_times == any(t < entry["t"] - 1e-6 for t in inner)
            assert agent.t is not None and all(r.t >= agent.t for r in agent.requests)
            checked += 1
    assert checked > 0
    (trace_0277,) = [p for p in weka_sample_files if p.stem == "trace_0277"]
    (session,) = weka_reader.read_weka(trace_0277).sessions
    agent_001 = next(a for a, _, _ in session.agents() if a.agent_id == "agent_001")
    assert agent_001.relative_times and agent_001.requests[0].t == 79.224


def test_sample_weka_to_arrow_to_weka_reproduces_every_file(weka_sample_files: list[Path], tmp_path: Path) -> None:
    for path in weka_sample_files:
        original = json.loads(path.read_text(encoding="utf-8"))
        for suffix, write in ((".arrow", arrow.write_arrow), (".parquet", arrow.write_parquet)):
            native = tmp_path / f"{path.stem}{suffix}"
            write(weka_reader.read_weka(path), native)
            out = tmp_path / f"{path.stem}.json"
            weka_writer.write_weka(arrow.read_arrow(native), out)
            assert json.loads(out.read_text(encoding="utf-8")) == original, f"{path.name} via {suffix}"
        direct = tmp_path / f"{path.stem}.direct.json"
        weka_writer.write_weka(weka_reader.read_weka(path), direct)
        assert json.loads(direct.read_text(encoding="utf-8")) == original, path.name


def _round_trips(document: dict[str, Any], tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The document written back after Weka → Arrow → Weka, Weka → Parquet → Weka and Weka → Weka."""
    source = write_json(tmp_path / f"{document['id']}.json", document)
    back: dict[str, list[dict[str, Any]]] = {}
    for suffix, write in ((".arrow", arrow.write_arrow), (".parquet", arrow.write_parquet)):
        native = tmp_path / f"{document['id']}{suffix}"
        write(weka_reader.read_weka(source), native)
        weka_writer.write_weka(arrow.read_arrow(native), tmp_path / "out.json")
        back[suffix] = _objects(tmp_path / "out.json")
    weka_writer.write_weka(weka_reader.read_weka(source), tmp_path / "direct.json")
    back["direct"] = _objects(tmp_path / "direct.json")
    return back


def test_keys_written_at_their_default_are_written_back(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    """Older AgentX traces have no api_time and write `output_types: []`, `stop: ""` and `input_types: []`."""
    first, second = weka_trace["requests"]
    del first["api_time"], second["api_time"]
    first.update(input_types=[], output_types=[], stop="")
    second.update(input_types=["tool_result"], output_types=["text"], stop="")
    for via, documents in _round_trips(weka_trace, tmp_path).items():
        assert documents == [weka_trace], via


def test_keys_left_out_stay_out(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    first, second = weka_trace["requests"]
    first.update(output_types=[])  # only this key, of the three
    second.update(input_types=["text"], stop="end_turn")
    for via, documents in _round_trips(weka_trace, tmp_path).items():
        assert documents == [weka_trace], via
        assert "stop" not in documents[0]["requests"][0] and "input_types" not in documents[0]["requests"][0]


def test_sample_in_the_older_layout_round_trips_too(weka_sample_files: list[Path], tmp_path: Path) -> None:
    """The sample as the older AgentX traces write it: no api_time or think_time, empty types and stops kept."""

    def older(entries: list[dict[str, Any]]) -> None:
        for index, entry in enumerate(entries):
            if entry["type"] == "subagent":
                older(entry["requests"])
                continue
            entry.pop("api_time", None)
            entry.pop("think_time", None)
            if index % 2:
                entry.update(input_types=[], stop=entry.get("stop") or "tool_use")
            else:
                entry.update(output_types=[], stop="")

    for path in weka_sample_files:
        document = json.loads(path.read_text(encoding="utf-8"))
        older(document["requests"])
        for via, documents in _round_trips(document, tmp_path).items():
            assert documents == [document], f"{path.name} via {via}"


def test_sample_as_jsonl_and_gzip_gives_the_same_trace(weka_sample_dir: Path, tmp_path: Path) -> None:
    trace = weka_reader.read_weka(weka_sample_dir)
    jsonl = tmp_path / "all.jsonl"
    weka_writer.write_weka(trace, jsonl)
    assert jsonl.read_bytes().count(b"\n") == len(trace.sessions)
    packed = tmp_path / "all.jsonl.gz"
    packed.write_bytes(gzip.compress(jsonl.read_bytes()))
    for path in (jsonl, packed):
        again = weka_reader.read_weka(path)
        assert again.sessions == trace.sessions


# ---------------------------------------------------------------------------------------------
# layouts: one trace per file, directory, JSONL, pretty-printed, gzip


def test_one_trace_per_file(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    trace, findings = _read(write_json(tmp_path / "t.json", weka_trace))
    assert findings == []
    (session,) = trace.sessions
    assert session.session_id == weka_trace["id"]
    assert session.models == weka_trace["models"]
    requests = session.root.requests
    wire = weka_trace["requests"]
    assert [r.t for r in requests] == [w["t"] for w in wire]
    assert [r.type for r in requests] == [w["type"] for w in wire]
    assert [(r.in_tokens, r.out_tokens) for r in requests] == [(w["in"], w["out"]) for w in wire]
    assert [list(ids) for ids in session.root.iter_hash_ids()] == [w["hash_ids"] for w in wire]
    assert [r.ttft for r in requests] == [w.get("ttft") for w in wire]
    assert [r.think_time for r in requests] == [w.get("think_time") for w in wire]
    assert trace.block_size == weka_trace["block_size"]


def test_pretty_printed_single_trace(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    compact, _ = _read(write_json(tmp_path / "compact.json", weka_trace))
    path = write_json(tmp_path / "pretty.json", weka_trace, indent=2)
    assert path.read_text(encoding="utf-8").count("\n") > 10
    pretty, findings = _read(path)
    assert findings == []
    assert pretty.sessions == compact.sessions
    assert load_trace(path).sessions == compact.sessions  # detected as Weka from its first line "{"


def test_jsonl_with_blank_lines_and_line_numbers(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    documents = [copy.deepcopy(dict(weka_trace, id=f"s{i}")) for i in range(3)]
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps(documents[0]) + "\n\n" + json.dumps(documents[1]) + "\n" + json.dumps(documents[2]) + "\n"
    )
    trace, _ = _read(path)
    assert [s.session_id for s in trace.sessions] == ["s0", "s1", "s2"]
    # A problem in the last document is reported on its line (4: the blank line counts).
    documents[2]["requests"][0]["t"] = -1.0
    path.write_text(
        json.dumps(documents[0]) + "\n\n" + json.dumps(documents[1]) + "\n" + json.dumps(documents[2]) + "\n"
    )
    message = _error(path)
    assert f"{path}:4" in message and 'session "s2"' in message and "request 0" in message


def test_jsonl_may_start_with_blank_lines(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = tmp_path / "t.jsonl"
    bad = copy.deepcopy(dict(weka_trace, id="s2"))
    bad["requests"][1]["in"] = -1
    path.write_text("\n  \n" + json.dumps(weka_trace) + "\r\n" + json.dumps(bad) + "\n")
    assert f"{path}:4 " in _error(path)  # lines are still counted from the top of the file
    path.write_text("\n\n" + json.dumps(weka_trace) + "\n" + json.dumps(dict(weka_trace, id="s2")) + "\n")
    assert [s.session_id for s in _read(path)[0].sessions] == ["s1", "s2"]
    pretty = tmp_path / "pretty.json"
    pretty.write_text("\n" + json.dumps(weka_trace, indent=2))
    assert _read(pretty)[0].sessions[0].session_id == "s1"


def test_directory_of_files_and_gzip(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    write_json(tmp_path / "b.json", dict(weka_trace, id="b"))
    write_json(tmp_path / "a.jsonl", dict(weka_trace, id="a1"), dict(weka_trace, id="a2"))
    (tmp_path / "c.json.gz").write_bytes(gzip.compress(json.dumps(dict(weka_trace, id="c")).encode()))
    (tmp_path / "notes.txt").write_text("not a trace")
    trace, findings = _read(tmp_path)
    assert findings == []
    assert [s.session_id for s in trace.sessions] == ["a1", "a2", "b", "c"]  # files in name order
    assert trace.provenance.source_path == str(tmp_path)


def test_gzip_file_is_read_by_its_content_not_its_name(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(json.dumps(weka_trace).encode()))
    trace, _ = _read(path)
    assert trace.sessions[0].session_id == weka_trace["id"]


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    assert "no .json or .jsonl files" in _error(tmp_path)


def test_aliases_input_length_and_output_length(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    plain, _ = _read(write_json(tmp_path / "plain.json", weka_trace))
    for call in weka_trace["requests"]:
        call["input_length"] = call.pop("in")
        call["output_length"] = call.pop("out")
    aliased, findings = _read(write_json(tmp_path / "aliased.json", weka_trace))
    assert findings == []
    assert aliased.sessions == plain.sessions


def test_in_wins_over_its_alias_when_both_are_given(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0]["input_length"] = weka_trace["requests"][0]["in"] + 1
    trace, _ = _read(write_json(tmp_path / "t.json", weka_trace))
    assert trace.sessions[0].root.requests[0].in_tokens == weka_trace["requests"][0]["in"]


# ---------------------------------------------------------------------------------------------
# extensions beyond the reference: unknown keys, nested subagents, global scope


def test_unknown_keys_are_warnings_and_the_trace_still_loads(
    tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]
) -> None:
    weka_trace["requests"].append(weka_subagent)
    clean, _ = _read(write_json(tmp_path / "clean.json", weka_trace))
    weka_trace["producer"] = "x"
    weka_trace["requests"][0]["cache_read"] = 12
    weka_trace["requests"][1]["cache_read"] = 3
    weka_subagent["color"] = "blue"
    weka_subagent["requests"][0]["extra"] = [1]
    trace, findings = _read(write_json(tmp_path / "extra.json", weka_trace))
    assert trace.sessions == clean.sessions
    assert findings and all(f.severity == "warning" for f in findings)
    text = " | ".join(str(f) for f in findings)
    for key in ("producer", "cache_read", "color", "extra"):
        assert f'"{key}"' in text
    assert "(2×)" in next(str(f) for f in findings if "cache_read" in str(f))
    assert all(f.session == weka_trace["id"] and f.line == 1 for f in findings)


def test_nested_subagents_are_accepted(
    tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]
) -> None:
    inner = copy.deepcopy(weka_subagent)
    inner.update(agent_id="a2", t=2.5)
    inner["requests"][0]["t"] = 2.5
    weka_subagent["requests"].append(inner)
    weka_trace["requests"].insert(1, weka_subagent)
    trace, findings = _read(write_json(tmp_path / "t.json", weka_trace))
    assert [f for f in findings if f.severity == "error"] == []
    session = trace.sessions[0]
    shape = [(agent.agent_id, parent.agent_id if parent else None, depth) for agent, parent, depth in session.agents()]
    assert shape == [("", None, 0), ("a1", "", 1), ("a2", "a1", 2)]
    a1 = session.root.subagents[0]
    assert a1.spawn_after == 1  # it stood after the root's first request
    assert a1.subagents[0].spawn_after == 1
    assert (a1.subagent_type, a1.status, a1.duration_ms) == ("Explore", "completed", 1500)
    out = tmp_path / "out.json"
    weka_writer.write_weka(trace, out)
    assert json.loads(out.read_text(encoding="utf-8")) == weka_trace


@pytest.mark.parametrize("depth", [MAX_AGENT_DEPTH + 1, 450, 5000])
def test_absurdly_nested_subagents_are_refused(tmp_path: Path, weka_trace: dict[str, Any], depth: int) -> None:
    # Deep enough for msgspec's own limit (a RecursionError inside the decoder) or for the depth cap.
    entry = '{"t":2.0,"type":"n","model":"m","in":64,"out":3,"hash_ids":[9]}'
    for level in range(depth, 0, -1):
        entry = (
            f'{{"t":2.0,"type":"subagent","agent_id":"a{level}","subagent_type":"Explore","status":"completed",'
            f'"models":[],"requests":[{entry}]}}'
        )
    head = json.dumps(dict(weka_trace, requests=[]))[: -len("[]}")]
    for extra in ("", '"unknown": 1, '):  # the strict decoder and the tolerant second pass
        path = tmp_path / "deep.json"
        path.write_text(head.replace('"id"', extra + '"id"') + f"[{entry}]}}")
        message = _error(path)
        assert "nested too deeply" in message or f"deeper than {MAX_AGENT_DEPTH}" in message


def test_legacy_rule_is_per_value_like_the_reference(
    tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]
) -> None:
    weka_subagent["t"] = 5.0
    weka_subagent["requests"] = [
        dict(weka_subagent["requests"][0], t=0.0),  # relative: 5 + 0
        dict(weka_subagent["requests"][0], t=3.25),  # relative: 5 + 3.25
        dict(weka_subagent["requests"][0], t=9.0),  # not below the spawn: absolute
    ]
    weka_trace["requests"].append(weka_subagent)
    trace, _ = _read(write_json(tmp_path / "t.json", weka_trace))
    sub = trace.sessions[0].root.subagents[0]
    assert sub.relative_times
    assert [r.t for r in sub.requests] == [5.0, 8.25, 9.0]


@pytest.mark.parametrize(("written", "scope"), [("local", "session"), ("global", "global")])
def test_hash_id_scope(tmp_path: Path, weka_trace: dict[str, Any], written: str, scope: str) -> None:
    weka_trace["hash_id_scope"] = written
    trace, _ = _read(write_json(tmp_path / "t.json", weka_trace))
    assert trace.hash_id_scope == scope
    out = tmp_path / "out.json"
    weka_writer.write_weka(trace, out)
    assert json.loads(out.read_text(encoding="utf-8"))["hash_id_scope"] == written


@pytest.mark.parametrize("scope", ["shared", "", "LOCAL"])
def test_other_hash_id_scopes_are_errors(tmp_path: Path, weka_trace: dict[str, Any], scope: str) -> None:
    weka_trace["hash_id_scope"] = scope
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert f'hash_id_scope "{scope}"' in message and 'session "s1"' in message


def test_mixed_scopes_in_a_directory_are_an_error(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    write_json(tmp_path / "a.json", weka_trace)
    write_json(tmp_path / "b.json", dict(weka_trace, id="s2", hash_id_scope="global"))
    assert "mix hash-id scopes" in _error(tmp_path)


def test_mixed_block_sizes_need_an_override(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    write_json(tmp_path / "a.json", weka_trace)
    write_json(tmp_path / "b.json", dict(weka_trace, id="s2", block_size=32))
    message = _error(tmp_path)
    assert "disagree on block_size" in message
    assert str(tmp_path / "a.json") in message and str(tmp_path / "b.json") in message
    trace, _ = _read(tmp_path, block_size=16)
    assert trace.block_size == 16
    assert load_trace(tmp_path, block_size=16).block_size == 16


def test_block_size_override_applies_to_validation(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = write_json(tmp_path / "t.json", weka_trace)
    _, findings = _read(path)
    assert findings == []  # 100 tokens, 2 ids at 64
    _, findings = _read(path, block_size=16)
    assert any("needs 6 hash ids at block_size 16, has 2" in f.message for f in findings)


@pytest.mark.parametrize("block_size", [0, -64, MAX_BLOCK_SIZE + 1])
def test_impossible_block_sizes_are_errors(tmp_path: Path, weka_trace: dict[str, Any], block_size: int) -> None:
    weka_trace["block_size"] = block_size
    path = write_json(tmp_path / "t.json", weka_trace)
    assert f"block_size={block_size}" in _error(path)
    assert f"block_size={block_size}" in _error(
        write_json(tmp_path / "ok.json", dict(weka_trace, block_size=64)), block_size=block_size
    )


# ---------------------------------------------------------------------------------------------
# bad input: one TraceError naming file, line, session and request


def test_malformed_json(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(weka_trace).replace('"out": 5', '"out": 5,,'))
    message = _error(path)
    assert "malformed" in message and 'session "s1"' in message


def test_unknown_key_before_a_syntax_error(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    # The strict decoder stops at the unknown key; the tolerant second pass must still report the syntax error.
    weka_trace["zzz_unknown"] = 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(weka_trace)[:-1] + ',"late": }')
    message = _error(path)
    assert "malformed" in message and 'session "s1"' in message


def test_malformed_jsonl_line(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = tmp_path / "t.jsonl"
    good = json.dumps(weka_trace)
    bad = json.dumps(dict(weka_trace, id="s2"))[:-1] + "]"
    path.write_text(good + "\n" + bad + "\n" + json.dumps(dict(weka_trace, id="s3")) + "\n")
    message = _error(path)
    assert f"{path}:2" in message and 'session "s2"' in message


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_truncated_file(tmp_path: Path, weka_trace: dict[str, Any], fraction: float) -> None:
    text = json.dumps(weka_trace, indent=1)
    path = tmp_path / "t.json"
    path.write_text(text[: int(len(text) * fraction)])
    assert "truncated" in _error(path)


def test_truncated_gzip(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    packed = gzip.compress(json.dumps(weka_trace).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(packed[: len(packed) // 2])
    assert "gzip" in _error(path)
    path.write_bytes(packed[:10] + bytes(20) + packed[30:])  # corrupt deflate data: zlib.error
    assert "gzip" in _error(path)


def test_truncated_gzip_with_format_detection(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    packed = gzip.compress(json.dumps(weka_trace).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TraceError):
        load_trace(path)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("in", "12", "Expected `int | null`, got `str` at `$.requests[1].in`"),
        ("out", 1.5, "Expected `int | null`, got `float` at `$.requests[1].out`"),
        ("t", "0", "Expected `float`, got `str` at `$.requests[1].t`"),
        ("hash_ids", [1, "2"], "Expected `int`, got `str` at `$.requests[1].hash_ids[1]`"),
        ("type", "x", "Invalid value 'x' at `$.requests[1].type`"),
        ("model", None, "Expected `str`, got `null` at `$.requests[1].model`"),
    ],
)
def test_wrong_types(tmp_path: Path, weka_trace: dict[str, Any], key: str, value: object, expected: str) -> None:
    weka_trace["requests"][1][key] = value
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert expected in message and 'session "s1"' in message


@pytest.mark.parametrize("key", ["t", "api_time", "think_time", "ttft"])
def test_negative_times(tmp_path: Path, weka_trace: dict[str, Any], key: str) -> None:
    weka_trace["requests"][1][key] = -0.25
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert f"{key} is negative (-0.25)" in message
    assert f"{tmp_path / 't.json'}:1" in message and 'session "s1"' in message and "request 1" in message


def test_negative_subagent_times(tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]) -> None:
    weka_trace["requests"].append(dict(weka_subagent, duration_ms=-1))
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert "duration_ms is negative" in message and 'subagent "a1"' in message


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "NaN", "Infinity", "nan"])
def test_non_finite_times_cannot_get_in(tmp_path: Path, weka_trace: dict[str, Any], literal: str) -> None:
    # JSON has no NaN/inf; msgspec rejects the literals as malformed and 1e999 as out of range.
    weka_trace["requests"][1]["t"] = 123.0
    path = tmp_path / "t.json"
    path.write_text(json.dumps(weka_trace).replace("123.0", literal))
    message = _error(path)
    assert 'session "s1"' in message
    if "e999" in literal:
        assert "Number out of range at `$.requests[1].t`" in message
    else:
        assert "malformed" in message or "truncated" in message


@pytest.mark.parametrize("key", ["id", "models", "block_size", "hash_id_scope", "requests"])
def test_missing_trace_fields(tmp_path: Path, weka_trace: dict[str, Any], key: str) -> None:
    del weka_trace[key]
    assert f"missing required field `{key}`" in _error(write_json(tmp_path / "t.json", weka_trace))


@pytest.mark.parametrize("key", ["t", "model", "type"])
def test_missing_request_fields(tmp_path: Path, weka_trace: dict[str, Any], key: str) -> None:
    del weka_trace["requests"][1][key]
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert f"missing required field `{key}`" in message and "$.requests[1]" in message


@pytest.mark.parametrize("keys", [("in",), ("out",), ("in", "out")])
def test_missing_token_counts(tmp_path: Path, weka_trace: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        del weka_trace["requests"][1][key]
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert f"request lacks {' and '.join(keys)}" in message and "request 1" in message


@pytest.mark.parametrize("key", ["agent_id", "t"])
def test_missing_subagent_fields(
    tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any], key: str
) -> None:
    del weka_subagent[key]
    weka_trace["requests"].append(weka_subagent)
    assert f"missing required field `{key}`" in _error(write_json(tmp_path / "t.json", weka_trace))


@pytest.mark.parametrize("key", ["in", "out"])
def test_absurd_sizes(tmp_path: Path, weka_trace: dict[str, Any], key: str) -> None:
    weka_trace["requests"][1][key] = MAX_TOKENS_PER_REQUEST + 1
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert f"{key}={MAX_TOKENS_PER_REQUEST + 1} is absurdly large" in message and "request 1" in message
    weka_trace["requests"][1][key] = MAX_TOKENS_PER_REQUEST  # the limit itself is allowed
    trace, _ = _read(write_json(tmp_path / "limit.json", weka_trace))
    assert trace.request_count == 2


def test_negative_token_counts(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0]["in"] = -3
    assert "in=-3 is negative" in _error(write_json(tmp_path / "t.json", weka_trace))


def test_hash_ids_beyond_64_bits(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0]["hash_ids"] = [1, 1 << 64]
    assert f"hash id {1 << 64} does not fit in 64 bits" in _error(write_json(tmp_path / "t.json", weka_trace))


def test_duplicate_session_ids_in_jsonl(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    path = write_json(tmp_path / "t.jsonl", weka_trace, dict(weka_trace, id="other"), weka_trace)
    message = _error(path)
    assert f'{path}:3 session "s1": session id "s1" appears twice (first at {path}:1)' in message


def test_duplicate_session_ids_across_files(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    write_json(tmp_path / "a.json", weka_trace)
    write_json(tmp_path / "b.json", weka_trace)
    message = _error(tmp_path)
    assert f"{tmp_path / 'b.json'}:1" in message and "appears twice" in message and str(tmp_path / "a.json") in message


def test_duplicate_subagent_ids(tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]) -> None:
    weka_trace["requests"] += [weka_subagent, copy.deepcopy(weka_subagent)]
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert 'session "s1" subagent "a1": agent_id "a1" appears twice in this session' in message


def test_error_message_counts_further_errors(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0]["t"] = -1.0
    weka_trace["requests"][1]["t"] = -2.0
    message = _error(write_json(tmp_path / "t.json", weka_trace))
    assert message.endswith("(and 1 more error)")
    assert "request 0" in message.split(" (and")[0]


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------------
# validation warnings surface as findings, the trace still loads


def test_too_few_hash_ids_is_a_warning(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    block_size, in_tokens, ids = weka_trace["block_size"], 900, [1, 2, 3]
    weka_trace["requests"][0].update({"in": in_tokens, "hash_ids": ids})
    trace, findings = _read(write_json(tmp_path / "t.json", weka_trace))
    (finding,) = findings
    assert finding.severity == "warning" and (finding.session, finding.request, finding.line) == ("s1", 0, 1)
    needed = in_tokens // block_size
    assert re.search(
        rf"in={in_tokens} needs {needed} hash ids at block_size {block_size}, has {len(ids)}", str(finding)
    )
    assert "in=900 needs 14 hash ids at block_size 64, has 3" in finding.message
    assert trace.request_count == 2


def test_surplus_hash_ids_is_a_warning(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0].update({"in": 100, "hash_ids": [1, 2, 3, 4, 5]})
    _, findings = _read(write_json(tmp_path / "t.json", weka_trace))
    (finding,) = findings
    assert finding.severity == "warning"
    assert "in=100 covers 2 blocks at block_size 64, has 5 hash ids (the surplus is ignored)" in finding.message


def test_ttft_on_a_plain_request_is_a_warning(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"][0]["ttft"] = 0.2
    trace, findings = _read(write_json(tmp_path / "t.json", weka_trace))
    (finding,) = findings
    assert finding.severity == "warning" and 'ttft on a non-streamed ("n") request' in finding.message
    assert trace.sessions[0].root.requests[0].ttft == 0.2


# ---------------------------------------------------------------------------------------------
# writing


def test_writer_layouts(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    trace = weka_reader.read_weka(write_json(tmp_path / "in.jsonl", weka_trace, dict(weka_trace, id="s2")))
    single = weka_reader.read_weka(write_json(tmp_path / "one.json", weka_trace))
    weka_writer.write_weka(single, tmp_path / "out.json")
    assert not (tmp_path / "out.json").read_bytes().endswith(b"\n")  # one object
    assert json.loads((tmp_path / "out.json").read_text()) == weka_trace
    weka_writer.write_weka(trace, tmp_path / "many.json")  # several sessions: JSONL whatever the suffix
    assert _objects(tmp_path / "many.json") == [weka_trace, dict(weka_trace, id="s2")]
    weka_writer.write_weka(single, tmp_path / "one.jsonl")
    assert (tmp_path / "one.jsonl").read_bytes().count(b"\n") == 1


def test_writer_uses_only_reference_keys(
    tmp_path: Path, weka_trace: dict[str, Any], weka_subagent: dict[str, Any]
) -> None:
    weka_trace["requests"].append(weka_subagent)
    trace = weka_reader.read_weka(write_json(tmp_path / "in.json", weka_trace))
    trace.sessions[0].start_s = 12.0
    out = tmp_path / "out.json"
    weka_writer.write_weka(trace, out)
    text = out.read_text()
    assert "start_s" not in text and "acceptance_length" not in text and "relative_times" not in text
    assert _read(out)[1] == []  # the strict decoder saw no unknown keys


def test_writer_keeps_required_subagent_keys(tmp_path: Path, weka_trace: dict[str, Any]) -> None:
    weka_trace["requests"].append(
        {"t": 1.0, "type": "subagent", "agent_id": "bg", "subagent_type": "", "status": "", "models": []}
        | {"requests": []}
    )
    trace = weka_reader.read_weka(write_json(tmp_path / "in.json", weka_trace))
    out = tmp_path / "out.json"
    weka_writer.write_weka(trace, out)
    assert json.loads(out.read_text())["requests"][-1] == weka_trace["requests"][-1]


# ---------------------------------------------------------------------------------------------
# delta encoding on the JSON text (the reader's fast path) agrees with delta_encode on the ids

_id_lists = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(0, 30), max_size=12)


@st.composite
def _related_id_lists(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A previous and a current id list that share a prefix of any length, as agent turns do."""
    previous = draw(_id_lists)
    keep = draw(st.integers(0, len(previous)))
    return previous, previous[:keep] + draw(_id_lists)


def _as_json(ids: list[int], separator: str) -> bytes:
    return ("[" + separator.join(str(i) for i in ids) + "]").encode()


@settings(max_examples=examples(500), deadline=None)
@given(_related_id_lists(), st.sampled_from([",", ", ", " ,", " , "]), st.sampled_from([",", ", "]))
def test_text_delta_encoding_matches_delta_encode(
    pair: tuple[list[int], list[int]], previous_separator: str, current_separator: str
) -> None:
    previous, current = pair
    kept, added = weka_reader._delta_encode_json(
        _as_json(previous, previous_separator), len(previous), _as_json(current, current_separator)
    )
    assert (kept, added) == delta_encode(previous, current)


def test_text_delta_encoding_rejects_non_integers() -> None:
    with pytest.raises(msgspec.ValidationError):
        weka_reader._delta_encode_json(b"[1,2]", 2, b"[1,2,3.5]")
    with pytest.raises(msgspec.ValidationError):
        weka_reader._delta_encode_json(b"[1,2]", 2, b'[1,"2"]')
