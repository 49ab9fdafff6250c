"""from-logs on Codex CLI rollouts: the public TraceLab example (skipped cleanly when ../shared/data is absent),
rollouts the tests write (plain, gzip, a folder of sessions, subagents, copied history), errors naming file and
line, and the command line end to end."""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import SHARED_DATA
from strategies import examples

from agentx.cli import main
from agentx.errors import TraceError
from agentx.synth.logs import codex
from agentx.synth.logs.from_logs import from_logs
from agentx.synth.logs.options import FromLogsOptions
from agentx.trace.formats.cached_prefix import shared_blocks
from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Trace
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # runs the CLI (tests/project/test_tiers.py)

EXAMPLE = SHARED_DATA / "tracelab" / "codex" / "trace.json"
DERIVED = SHARED_DATA / "tracelab" / "derived" / "round_trace.jsonl"
SECRET = "zqcodexsecret42"
BLOCK = 64
_T0 = datetime(2026, 3, 21, 10, 0, tzinfo=UTC)
OPTIONS = FromLogsOptions(format="codex")


def _example() -> tuple[Path, list[dict[str, Any]]]:
    if not EXAMPLE.exists() or not DERIVED.exists():
        pytest.skip(f"TraceLab's public Codex example not found at {EXAMPLE} (it is not part of the repository)")
    rows = [row for row in map(json.loads, DERIVED.read_text().splitlines()) if row["provider"] == "codex"]
    return EXAMPLE, sorted(rows, key=lambda row: row["round_index"])


def _errors(trace: Trace) -> list[str]:
    return [str(f) for f in validate(trace) if f.severity == "error"]


def _full_ids(agent: Agent) -> list[tuple[int, ...]]:
    return list(agent.iter_hash_ids())


# Rollouts written here


def _stamp(seconds: float) -> str:
    return (_T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _record(seconds: float, kind: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"timestamp": _stamp(seconds), "type": kind, "payload": payload, **extra}


def _meta(seconds: float, thread: str, **extra: Any) -> dict[str, Any]:
    payload = {"id": thread, "timestamp": _stamp(seconds), "cwd": f"/home/{SECRET}", "source": "cli", **extra}
    return _record(seconds, "session_meta", payload | {"base_instructions": {"text": SECRET}})


def _item(seconds: float, kind: str, **fields: Any) -> dict[str, Any]:
    return _record(seconds, "response_item", {"type": kind, **fields})


def _event(seconds: float, kind: str, **fields: Any) -> dict[str, Any]:
    return _record(seconds, "event_msg", {"type": kind, **fields})


def _usage(fresh: int, cached: int, out: int, reasoning: int = 0) -> dict[str, int]:
    return {
        "input_tokens": fresh + cached,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "reasoning_output_tokens": reasoning,
        "total_tokens": fresh + cached + out,
    }


class _Rollout:
    """A thread's records: each round a user message or tool output, reasoning, a tool call or answer, its usage."""

    def __init__(self, thread: str, start: float, model: str = "gpt-5.4", **meta: Any) -> None:
        self.records = [_meta(start, thread, **meta)]
        self.total = dict.fromkeys(_usage(0, 0, 0), 0)
        self.clock = start

    def turn(self, model: str = "gpt-5.4", text: str = SECRET, images: int = 0) -> None:
        self.clock += 1
        self.records += [
            _event(self.clock, "task_started", turn_id=SECRET),
            _record(self.clock, "turn_context", {"model": model, "cwd": f"/home/{SECRET}"}),
            _item(self.clock, "message", role="user", content=[{"type": "input_text", "text": text}]),
            _event(self.clock, "user_message", message=text, images=[SECRET] * images, local_images=[]),
        ]

    def round(self, fresh: int, cached: int, out: int, *, tool: bool = True, think: float = 2.0) -> None:
        """One model round: first output 1 s after the input, usage 1 s later, then (with `tool`) the tool output."""
        last = _usage(fresh, cached, out, reasoning=out // 4)
        self.total = {key: self.total[key] + last[key] for key in last}
        start = self.clock
        self.records += [
            _item(start + 1, "reasoning", summary=[], content=None, encrypted_content=SECRET),
            _event(start + 1.5, "agent_message", message=SECRET),
            _item(start + 1.5, "message", role="assistant", content=[{"type": "output_text", "text": SECRET}]),
        ]
        if tool:
            self.records.append(_item(start + 1.6, "function_call", name="exec_command", arguments=SECRET))
        info = {"total_token_usage": dict(self.total), "last_token_usage": last, "model_context_window": 258400}
        self.records += [
            _event(start + 2, "token_count", info=info, rate_limits=None),
            _event(start + 2.01, "token_count", info=info, rate_limits={"primary": {"used_percent": 3.0}}),
            _event(start + 2.02, "token_count", info=None, rate_limits={"primary": {"used_percent": 4.0}}),
        ]
        self.clock = start + 2 + think
        if tool:
            self.records.append(_item(self.clock, "function_call_output", call_id=SECRET, output=SECRET))

    def lines(self) -> bytes:
        return b"".join(msgspec.json.encode(record) + b"\n" for record in self.records)

    def write(self, path: Path, *, compress: bool = False) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(self.lines()) if compress else self.lines())
        return path


def _session(thread: str, start: float, rounds: int = 3, **meta: Any) -> _Rollout:
    rollout = _Rollout(thread, start, **meta)
    rollout.turn()
    for index in range(rounds):
        rollout.round(300 + 10 * index, 1_000 + 320 * index, 50 + index, tool=index < rounds - 1)
    return rollout


# The public example


def test_the_public_example_matches_tracelabs_rounds() -> None:
    path, rows = _example()
    trace = from_logs([path], OPTIONS)
    assert _errors(trace) == [] and trace.hash_id_scope == "global" and trace.block_size == BLOCK
    (session,) = trace.sessions
    requests = session.root.requests
    assert [(r.in_tokens, r.out_tokens) for r in requests] == [
        (row["input_tokens_total"], row["output_tokens"]) for row in rows
    ]
    assert len(requests) == 9 and session.root.subagents == []
    rounds = codex._read_file(path).rounds  # type: ignore[union-attr]  # the figures a trace does not carry
    assert [(r.usage.cached_input_tokens, r.usage.reasoning_output_tokens) for r in rounds] == [
        (row["prefix_tokens"], row["reasoning_output_tokens"]) for row in rows
    ]
    ids = _full_ids(session.root)
    assert [len(i) for i in ids] == [-(-row["input_tokens_total"] // BLOCK) for row in rows]
    for index in range(1, len(rows)):  # the cached prefix, capped at the previous prompt
        shared = min(rows[index]["prefix_tokens"] // BLOCK, len(ids[index - 1]))
        assert shared_blocks(ids[index - 1], ids[index]) == shared == requests[index].hash_ids_kept
    assert requests[0].t == 0.0 and requests[0].think_time is None
    assert all(r.think_time is not None and r.think_time > 0 for r in requests[1:])
    assert all(r.ttft is not None and 0 < r.ttft <= r.api_time for r in requests if r.api_time is not None)
    assert requests[0].api_time == pytest.approx(6.214)  # the user message at 05:59.328 to the usage at 06:05.542
    assert [r.input_types for r in requests[:2]] == [("text",), ("tool_result",)]
    assert requests[0].output_types == ("text", "thinking", "tool_use") and requests[-1].output_types == ("text",)
    assert session.models == ["gpt-5.4"]


def test_the_public_example_as_plain_and_gzip_jsonl_gives_the_same_trace(tmp_path: Path) -> None:
    path, _ = _example()
    text = path.read_text()
    records = [json.loads(chunk) for chunk in re.split(r"^===== record \d+ =====$", text, flags=re.M)[1:]]
    plain = tmp_path / "rollout.jsonl"
    plain.write_text("".join(json.dumps(record) + "\n" for record in records))
    packed = tmp_path / "rollout.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expanded = msgspec.json.encode(from_logs([path], OPTIONS).sessions)
    assert msgspec.json.encode(from_logs([plain], OPTIONS).sessions) == expanded
    assert msgspec.json.encode(from_logs([packed], OPTIONS).sessions) == expanded


# Rollouts written here


def test_a_folder_of_rollouts_becomes_one_session_each_in_start_order(tmp_path: Path) -> None:
    folder = tmp_path / "sessions" / "2026" / "03" / "21"
    _session("thread-b", 100.0).write(folder / "rollout-b.jsonl.gz", compress=True)
    _session("thread-a", 0.0, rounds=2).write(folder / "rollout-a.jsonl")
    trace = from_logs([tmp_path / "sessions"], OPTIONS)
    assert _errors(trace) == []
    first, second = trace.sessions
    assert (first.session_id, second.session_id) == ("s000000", "s000001")
    assert (first.start_s, second.start_s) == (0.0, 100.0)
    assert [len(s.root.requests) for s in trace.sessions] == [2, 3]  # repeated and empty token_counts: no rounds
    requests = second.root.requests
    assert [(r.t, r.api_time, r.ttft, r.think_time) for r in requests] == [
        (0.0, 2.0, 1.0, None),
        (4.0, 2.0, 1.0, 2.0),
        (8.0, 2.0, 1.0, 2.0),
    ]
    assert [(r.in_tokens, r.out_tokens) for r in requests] == [(1_300, 50), (1_630, 51), (1_960, 52)]
    assert [r.input_types for r in requests] == [("text",), ("tool_result",), ("tool_result",)]
    assert [r.output_types for r in requests] == [("text", "thinking", "tool_use")] * 2 + [("text", "thinking")]
    assert all(r.type == "s" for r in requests)
    # Both sessions open with the same model's system prompt: their first rounds share its cached blocks.
    assert shared_blocks(_full_ids(first.root)[0], _full_ids(second.root)[0]) == 1_000 // BLOCK
    assert [r.hash_ids_kept for r in requests] == [0, 1_320 // BLOCK, 1_640 // BLOCK]
    assert SECRET.encode() not in msgspec.json.encode(trace)


def test_models_follow_the_turn_context_and_are_relabelled_on_request(tmp_path: Path) -> None:
    rollout = _Rollout("thread", 0.0)
    rollout.turn(model="gpt-big", images=1)
    rollout.round(100, 0, 10, tool=False)
    rollout.turn(model="gpt-small")
    rollout.round(100, 64, 10, tool=False)
    path = rollout.write(tmp_path / "rollout.jsonl")
    trace = from_logs([path], OPTIONS)
    requests = trace.sessions[0].root.requests
    assert [(r.model, r.input_types) for r in requests] == [("gpt-big", ("text", "image")), ("gpt-small", ("text",))]
    options = FromLogsOptions(format="codex", relabel_models=True, model_map=(("gpt-small", "small"),))
    relabelled = from_logs([path], options)
    assert [r.model for r in relabelled.sessions[0].root.requests] == ["model-1", "small"]


def test_a_spawned_thread_is_its_parents_subagent(tmp_path: Path) -> None:
    parent = _session("parent", 0.0)
    source = {"subagent": {"thread_spawn": {"parent_thread_id": "parent", "depth": 1, "agent_role": SECRET}}}
    child = _Rollout("child", 4.5, source=source)
    child.turn()
    child.round(500, 0, 20, tool=False, think=0.0)
    parent.write(tmp_path / "rollout-parent.jsonl")
    child.write(tmp_path / "rollout-child.jsonl")
    trace = from_logs([tmp_path], OPTIONS)
    assert _errors(trace) == []
    (session,) = trace.sessions
    (sub,) = session.root.subagents
    # The session starts at the parent's first user message (1 s); the child, created at 4.5 s after the parent's
    # first round ended (3 s), asks at 5.5 s, during the parent's second round (5 s to 7 s): no think time.
    assert (sub.agent_id, sub.subagent_type, sub.spawn_after, sub.t) == ("a1", "thread_spawn", 1, 3.5)
    assert [(r.t, r.in_tokens, r.think_time) for r in sub.requests] == [(4.5, 500, 0.0)]
    assert sub.duration_ms == 3_000 and sub.status == "completed"
    assert session.root.requests[2].think_time == 1.5  # from the child's end at 7.5 s, the session's latest
    assert session.models == ["gpt-5.4"]


def test_a_subagent_without_its_parent_is_a_session_of_its_own(tmp_path: Path) -> None:
    child = _session("child", 0.0, source={"subagent": "review"}, parent_thread_id="missing")
    trace = from_logs([child.write(tmp_path / "rollout.jsonl")], OPTIONS)
    (session,) = trace.sessions
    assert len(session.root.requests) == 3 and session.root.subagents == []


def test_history_copied_from_the_parent_is_left_out(tmp_path: Path) -> None:
    """A fork copies its parent's records, token_counts included: by ordinal when Codex numbers them, else by usage
    (another rollout's round)."""
    parent = _session("parent", 0.0)
    parent.write(tmp_path / "parent" / "rollout-parent.jsonl")
    by_usage = _Rollout("fork", 20.0, forked_from_id="parent")
    by_usage.records += parent.records  # the parent's session_meta, then its records
    by_usage.total = dict(parent.total)
    by_usage.clock = 20.0
    by_usage.turn()
    by_usage.round(700, 2_000, 30, tool=False)
    by_usage.write(tmp_path / "fork" / "rollout-fork.jsonl")
    trace = from_logs([tmp_path / "parent", tmp_path / "fork"], OPTIONS)
    assert [[r.in_tokens for r in s.root.requests] for s in trace.sessions] == [[1_300, 1_630, 1_960], [2_700]]
    assert any(note.startswith("3 round(s) copied") for note in trace.provenance.notes)

    numbered = _Rollout("child", 20.0, source={"subagent": {"thread_spawn": {"parent_thread_id": "parent"}}})
    numbered.records += parent.records
    numbered.records[0]["payload"]["subagent_history_start_ordinal"] = len(numbered.records)
    numbered.total, numbered.clock = dict(parent.total), 20.0
    numbered.turn()
    numbered.round(700, 2_000, 30, tool=False)
    numbered.records = [record | {"ordinal": index} for index, record in enumerate(numbered.records)]
    alone = from_logs([numbered.write(tmp_path / "child.jsonl")], OPTIONS)  # the parent's rollout not given
    assert [[r.in_tokens for r in s.root.requests] for s in alone.sessions] == [[2_700]]


def test_a_rollout_given_twice_is_read_once_and_two_copies_of_a_thread_are_refused(tmp_path: Path) -> None:
    path = _session("thread", 0.0).write(tmp_path / "a" / "rollout.jsonl")
    assert from_logs([path, tmp_path / "a"], OPTIONS).request_count == 3
    _session("thread", 0.0).write(tmp_path / "b" / "rollout.jsonl")
    with pytest.raises(TraceError, match="give each rollout once"):
        from_logs([tmp_path / "a", tmp_path / "b"], OPTIONS)


def test_rollouts_without_rounds_are_refused(tmp_path: Path) -> None:
    rollout = _Rollout("thread", 0.0)
    rollout.turn()
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TraceError, match="no Codex model rounds"):
        from_logs([rollout.write(tmp_path / "rollout.jsonl"), tmp_path / "empty.jsonl"], OPTIONS)


# Errors


@pytest.mark.parametrize(
    ("line", "record", "message"),
    [
        (1, _record(0, "event_msg", {"type": "user_message"}), "starts with a session_meta record"),
        (3, "{not json", "not a JSON object"),
        (3, {"type": "event_msg", "payload": {}}, "not a Codex rollout record"),
        (3, {**_event(9, "user_message"), "timestamp": "yesterday"}, "timestamp: 'yesterday' is not"),
        (3, _event(9, "token_count", info={"last_token_usage": {"input_tokens": -1}}), "token_count's payload"),
        (3, _record(9, "turn_context", {"model": 5}), "turn_context's payload: Expected `str | null`"),
        (3, _event(9, "token_count", info={"last_token_usage": {"output_tokens": 10**9}}), "a round of more than"),
    ],
)
def test_a_bad_record_is_named_by_file_and_line(tmp_path: Path, line: int, record: Any, message: str) -> None:
    lines = [msgspec.json.encode(r).decode() for r in _session("thread", 0.0).records]
    lines.insert(line - 1, record if isinstance(record, str) else msgspec.json.encode(record).decode())
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=re.escape(message)) as caught:
        from_logs([path], OPTIONS)
    assert str(caught.value).startswith(f"{path}:{line}: ") and "\n" not in str(caught.value)


def test_a_bad_record_of_the_expanded_view_is_named_by_its_number(tmp_path: Path) -> None:
    rollout = _session("thread", 0.0)
    parts = ["# a heading\n", "\n"]
    for index, record in enumerate(rollout.records, start=1):
        body = json.dumps(record, indent=2) if index != 4 else '{"type": "event_msg",'
        parts.append(f"===== record {index:04d} =====\n{body}\n")
    path = tmp_path / "trace.json"
    path.write_text("".join(parts))
    with pytest.raises(TraceError) as caught:
        from_logs([path], OPTIONS)
    line = "".join(parts).splitlines().index('{"type": "event_msg",') + 1
    assert str(caught.value).startswith(f"{path}:{line}: record 0004: not a JSON object")


JSON_KEYS = ["type", "payload", "timestamp", "info", "last_token_usage", "total_token_usage", "input_tokens", "id"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=6) | st.just("2026-03-21T10:00:00Z"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(JSON_KEYS), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(["event_msg", "response_item", "turn_context", "session_meta"]), json_values)
def test_any_payload_is_read_or_rejected_with_its_location(kind: str, payload: Any) -> None:
    path = Path(tempfile.mkdtemp()) / "fuzz.jsonl"
    rollout = _session("thread", 0.0)
    rollout.records.insert(2, {"timestamp": _stamp(1.0), "type": kind, "payload": payload})
    path.write_bytes(rollout.lines())
    try:
        trace = from_logs([path], OPTIONS)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}:3: ")
    else:
        assert _errors(trace) == []


# The command line


def test_the_command_line_writes_an_arrow_trace_with_nothing_private(tmp_path: Path) -> None:
    _session("thread-a", 0.0).write(tmp_path / "sessions" / "rollout-a.jsonl")
    _session("thread-b", 50.0).write(tmp_path / "sessions" / "rollout-b.jsonl.gz", compress=True)
    out = tmp_path / "codex.arrow"
    args = ["synth", "from-logs", str(tmp_path / "sessions"), "--format", "codex", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--relabel-models"])
    assert result.exit_code == 0, result.output
    assert "2 sessions, 6 requests" in result.output
    trace = load_trace(out)
    assert trace.request_count == 6 and trace.hash_id_scope == "global"
    assert trace.sessions[0].models == ["model-1"]
    assert SECRET.encode() not in out.read_bytes() and b"thread-a" not in out.read_bytes()


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "rollout.jsonl"
    bad.write_text('{"timestamp": "2026-03-21T10:00:00Z", "type": "session_meta", "payload": {}}\n')
    result = CliRunner().invoke(main, ["synth", "from-logs", str(bad), "--format", "codex", "--out", "x.arrow"])
    assert result.exit_code == 2
    assert f"{bad}:1: session_meta's payload: Object missing required field `id`" in result.output
    assert "Traceback" not in result.output
