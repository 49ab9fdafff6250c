"""from-logs on Claude Code session folders: transcripts, subagent files, and their links."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.synth.logs.from_logs import from_logs
from agentx.synth.logs.options import FromLogsOptions
from agentx.trace.io import load_trace
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SECRET = "zqclaudesecret42"


def _line(kind: str, time_s: int, content: Any, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": kind, "content": content}
    if kind == "assistant":
        message |= {"id": extra.pop("message_id"), "model": "claude-opus-4-5", "stop_reason": extra.pop("stop", None)}
        message["usage"] = extra.pop("usage")
    stamp = f"2025-06-01T10:{time_s // 60:02d}:{time_s % 60:02d}.000Z"
    return {
        "type": kind,
        "message": message,
        "timestamp": stamp,
        "cwd": f"/home/{SECRET}",
        "sessionId": SECRET,
        **extra,
    }


def _usage(fresh: int, read: int, written: int, out: int) -> dict[str, int]:
    return {
        "input_tokens": fresh,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
        "output_tokens": out,
    }


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def make_session(folder: Path) -> None:
    task = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "Task",
        "input": {"subagent_type": "Explore", "prompt": SECRET},
    }
    main_lines = [
        {"type": "summary", "summary": SECRET},
        _line("user", 0, f"fix the bug in {SECRET}.py"),
        _line(
            "assistant", 5, [{"type": "thinking", "thinking": SECRET}], message_id="m1", usage=_usage(3, 0, 20_000, 1)
        ),
        _line("assistant", 6, [task], message_id="m1", stop="tool_use", usage=_usage(3, 0, 20_000, 120)),
        _line(
            "user",
            60,
            [{"type": "tool_result", "tool_use_id": "toolu_1", "content": f"{SECRET} done\nagentId: abc123"}],
            toolUseResult={"agentId": "abc123", "content": SECRET},
        ),
        _line(
            "assistant",
            70,
            [{"type": "text", "text": SECRET}],
            message_id="m2",
            stop="end_turn",
            usage=_usage(5, 20_000, 300, 50),
        ),
    ]
    grep = {"type": "tool_use", "id": "toolu_9", "name": "Grep", "input": {"pattern": SECRET}}
    sub_lines = [
        _line("user", 7, f"explore {SECRET}", isSidechain=True),
        _line(
            "assistant", 12, [grep], message_id="s1", stop="tool_use", usage=_usage(4_000, 0, 0, 30), isSidechain=True
        ),
        _line(
            "user", 13, [{"type": "tool_result", "tool_use_id": "toolu_9", "content": SECRET * 50}], isSidechain=True
        ),
        _line(
            "assistant",
            50,
            [{"type": "text", "text": SECRET}],
            message_id="s2",
            stop="end_turn",
            usage=_usage(10, 4_000, 700, 80),
            isSidechain=True,
        ),
    ]
    _write(folder / "sess-1.jsonl", main_lines)
    _write(folder / "sess-1" / "subagents" / "agent-abc123.jsonl", sub_lines)


def test_a_session_folder_becomes_a_tree_with_its_subagent(tmp_path: Path) -> None:
    make_session(tmp_path / "project")
    trace = from_logs([tmp_path / "project"], FromLogsOptions(format="claude-code"))
    assert [f for f in validate(trace) if f.severity == "error"] == []
    (session,) = trace.sessions
    root = session.root
    assert [(r.t, r.api_time, r.in_tokens, r.out_tokens, r.stop) for r in root.requests] == [
        (0.0, 6.0, 20_003, 120, "tool_use"),
        (60.0, 10.0, 20_305, 50, "end_turn"),
    ]
    assert root.requests[1].input_types == ("tool_result",)
    assert root.requests[1].hash_ids_kept > 0  # the second request extends the first
    (sub,) = root.subagents
    assert (sub.spawn_after, sub.subagent_type, sub.t) == (1, "Explore", 6.0)
    assert [(r.t, r.in_tokens, r.out_tokens) for r in sub.requests] == [(7.0, 4_000, 30), (13.0, 4_710, 80)]
    assert sub.requests[0].think_time == 1.0  # from the root's response end at 6 s


def test_nothing_private_reaches_the_trace(tmp_path: Path) -> None:
    make_session(tmp_path / "project")
    out = tmp_path / "t.arrow"
    result = CliRunner().invoke(
        main, ["synth", "from-logs", str(tmp_path / "project"), "--format", "claude-code", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert SECRET.encode() not in out.read_bytes() and SECRET not in result.output
    weka = tmp_path / "t.weka.jsonl"
    CliRunner().invoke(main, ["convert", str(out), str(weka)])
    assert SECRET.encode() not in weka.read_bytes() and load_trace(out).request_count == 4
