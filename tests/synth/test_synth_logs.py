"""from-logs: proxy captures in, an anonymized trace out, with lengths, sharing and trees recovered."""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.ipc as ipc
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import SAMPLE_TRACE
from strategies import examples

from agentx.cli import main
from agentx.errors import TraceError
from agentx.synth.logs.from_logs import from_logs
from agentx.synth.logs.hashing import ChainHasher
from agentx.synth.logs.mock_logs import MockFormat, mock_logs
from agentx.synth.logs.options import FromLogsOptions
from agentx.synth.logs.render import render_anthropic
from agentx.synth.logs.tokenize import ApproxTokenizer
from agentx.trace.io import load_trace, save_trace
from agentx.trace.model import Agent, Trace
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

FUZZ_KEYS = [
    *("request", "response", "messages", "content", "role", "type", "text", "system", "tools", "usage"),
    *("input_tokens", "output_tokens", "prompt_tokens", "choices", "message", "delta", "tool_calls", "function"),
    *("session", "start", "end", "first_token", "agent", "parent", "stop_reason", "finish_reason", "input", "name"),
]

Canon = tuple[Any, ...]


def canonical(agent: Agent, first_seen: dict[int, int]) -> tuple[Canon, list[float]]:
    """An agent tree with ids renumbered in first-seen order and subagents in a fixed order, and
    its times (t, api_time, think_time; -1 for none) in the same order, to compare approximately."""
    requests: list[Canon] = []
    times: list[float] = []
    for request, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True):
        renumbered = tuple(first_seen.setdefault(i, len(first_seen)) for i in ids)
        requests.append((request.in_tokens, request.out_tokens, renumbered, request.input_types))
        think = -1.0 if request.think_time is None else request.think_time
        times.extend((request.t, request.api_time or 0.0, think))
    children = sorted((canonical(sub, first_seen) for sub in agent.subagents), key=lambda child: child[0])
    for _, child_times in children:
        times.extend(child_times)
    return (agent.spawn_after, tuple(requests), tuple(exact for exact, _ in children)), times


def assert_same_session(recovered: Agent, original: Agent) -> None:
    got, want = canonical(recovered, {}), canonical(original, {})
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=1e-5)


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def sample() -> Trace:
    return load_trace(SAMPLE_TRACE)


@pytest.mark.parametrize(
    ("fmt", "usage_in"), [("anthropic-proxy", False), ("openai-proxy", False), ("anthropic-proxy", True)]
)
def test_round_trip_recovers_tree_lengths_and_sharing(
    sample: Trace, tmp_path: Path, fmt: MockFormat, usage_in: bool
) -> None:
    logs = write_jsonl(tmp_path / "capture.jsonl", mock_logs(sample, fmt=fmt, seed=3, usage_in=usage_in))
    trace = from_logs([logs], FromLogsOptions(format=fmt, block_size=sample.block_size))
    assert [f for f in validate(trace) if f.severity == "error"] == []
    assert len(trace.sessions) == len(sample.sessions)
    assert trace.request_count == sample.request_count
    for original, recovered in zip(sample.sessions, trace.sessions, strict=True):
        assert_same_session(recovered.root, original.root)


def test_round_trip_of_a_generated_trace(tmp_path: Path) -> None:
    from agentx.synth.generation import generate
    from agentx.synth.presets import preset

    source = generate(preset("agentic-coding"), sessions=12, seed=5)
    logs = write_jsonl(tmp_path / "capture.jsonl", mock_logs(source, seed=1))
    trace = from_logs([logs], FromLogsOptions(format="anthropic-proxy", block_size=source.block_size))
    for original, recovered in zip(source.sessions, trace.sessions, strict=True):
        assert_same_session(recovered.root, original.root)


def test_global_scope_shares_the_same_system_prompt_across_sessions(tmp_path: Path) -> None:
    system = " ".join(f"word{i}" for i in range(600))
    lines = []
    for session in range(3):
        body = {"model": "m", "system": system, "messages": [{"role": "user", "content": f"task number {session}"}]}
        response = {
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"output_tokens": 2},
        }
        lines.append(
            {
                "session": f"s{session}",
                "start": 100.0 + session,
                "end": 100.5 + session,
                "request": body,
                "response": response,
            }
        )
    logs = write_jsonl(tmp_path / "c.jsonl", lines)
    trace = from_logs([logs], FromLogsOptions(format="anthropic-proxy", block_size=16, scope="global"))
    ids = [s.root.hash_ids(0) for s in trace.sessions]
    assert ids[0][:5] == ids[1][:5] == ids[2][:5]
    assert ids[0][-1] != ids[1][-1]
    local = from_logs([logs], FromLogsOptions(format="anthropic-proxy", block_size=16))
    assert all(s.root.hash_ids(0)[0] == 0 for s in local.sessions)


def test_usage_gives_in_and_the_ids_match_it(tmp_path: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there " * 200}]}
    usage = {"input_tokens": 10, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 50, "output_tokens": 7}
    response = {"content": [], "stop_reason": "tool_use", "usage": usage}
    logs = write_jsonl(tmp_path / "c.jsonl", [{"start": 5, "end": 6, "request": body, "response": response}])
    trace = from_logs([logs], FromLogsOptions(format="anthropic-proxy", block_size=64))
    request = trace.sessions[0].root.requests[0]
    assert (request.in_tokens, request.out_tokens, request.stop) == (360, 7, "tool_use")
    assert request.hash_ids_len == 6  # ceil(360 / 64)
    assert validate(trace) == []


def test_streamed_responses_as_events_or_sse_text(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 20, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 12}},
    ]
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"session": "a", "start": 1.0, "end": 2.0, "first_token": 1.25, "request": body, "response": events},
        {"session": "b", "start": 1.0, "end": 2.0, "request": body, "response": sse},
    ]
    trace = from_logs([write_jsonl(tmp_path / "c.jsonl", lines)], FromLogsOptions(format="anthropic-proxy"))
    for session in trace.sessions:
        request = session.root.requests[0]
        assert (request.in_tokens, request.out_tokens, request.stop, request.type) == (20, 12, "end_turn", "s")
    assert trace.sessions[0].root.requests[0].ttft == pytest.approx(0.25)


SECRETS = {
    name: f"zq{name}{i}x7"
    for i, name in enumerate(
        [
            "system",
            "tool",
            "desc",
            "prop",
            "text",
            "toolname",
            "arg",
            "path",
            "result",
            "image",
            "out",
            "think",
            "stop",
            "session",
            "model",
            "agent",
            "parent",
            "meta",
            "salt",
            "dir",
            "file",
        ]
    )
}


def _secret_exchange(start: float, turns: int) -> dict[str, Any]:
    s = SECRETS
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"please {s['text']} now"}]
    for turn in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": s["think"], "signature": s["meta"]},
                    {
                        "type": "tool_use",
                        "id": f"t{turn}",
                        "name": s["toolname"],
                        "input": {"file_path": f"/home/{s['path']}/a.py", "q": s["arg"]},
                    },
                ],
            }
        )
        image = base64.b64encode(s["image"].encode()).decode()
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{turn}", "content": f"{s['result']} " * 30},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
                ],
            }
        )
    body = {
        "model": s["model"],
        "system": [{"type": "text", "text": f"You are {s['system']}. " * 40}],
        "tools": [{"name": s["tool"], "description": s["desc"], "input_schema": {"properties": {s["prop"]: {}}}}],
        "metadata": {"user_id": s["meta"]},
        "messages": messages,
    }
    response = {
        "model": s["model"],
        "content": [{"type": "text", "text": s["out"]}, {"type": "thinking", "thinking": s["think"]}],
        "stop_reason": s["stop"],
        "usage": {"input_tokens": 900 + 300 * turns, "output_tokens": 50},
    }
    return {
        "session": s["session"],
        "agent": s["agent"],
        "parent": s["parent"],
        "start": start,
        "end": start + 2,
        "request": body,
        "response": response,
        "note": s["meta"],
    }


def test_no_secret_survives_in_any_byte_written(tmp_path: Path) -> None:
    """Secrets planted in every field (texts, tool args, paths, keys, models, salt) never reach the trace."""
    folder = tmp_path / SECRETS["dir"]
    folder.mkdir()
    logs = write_jsonl(folder / f"{SECRETS['file']}.jsonl", [_secret_exchange(1000.0 + 10 * i, i) for i in range(4)])
    salt_file = tmp_path / "salt"
    salt_file.write_text(SECRETS["salt"])
    out = tmp_path / "trace.arrow"
    result = CliRunner().invoke(
        main,
        [
            "synth",
            "from-logs",
            str(logs),
            "--format",
            "anthropic-proxy",
            "--out",
            str(out),
            "--salt-file",
            str(salt_file),
            "--relabel-models",
            "--block-size",
            "16",
        ],
    )
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    assert trace.request_count == 4 and validate(trace) == []
    weka = tmp_path / "trace.weka.jsonl"
    save_trace(trace, weka)
    table = ipc.open_file(out).read_all()
    decoded = json.dumps(table.to_pylist()).encode() + b"".join(k + v for k, v in (table.schema.metadata or {}).items())
    written = {
        "arrow bytes": out.read_bytes(),
        "arrow decoded": decoded,
        "weka export": weka.read_bytes(),
        "cli output": result.output.encode(),
    }
    # The raw digests of every block of every prompt, in every form a leak could take.
    hasher = ChainHasher(SECRETS["salt"].encode(), 16)
    digests = []
    for i in range(4):
        body = _secret_exchange(0.0, i)["request"]
        tokens = [t for segment in render_anthropic(body).segments for t in ApproxTokenizer().encode(segment)]
        digests.extend(hasher.digests(tokens))
    for name, data in written.items():
        lowered = data.lower()
        for field, secret in SECRETS.items():
            assert secret.encode().lower() not in lowered, f"{field} secret found in {name}"
        for digest in digests:
            for form in (
                digest,
                digest.hex().encode(),
                str(int.from_bytes(digest[:8], "big", signed=True)).encode(),
                str(int.from_bytes(digest[:8], "little", signed=True)).encode(),
            ):
                assert form not in data, f"a raw digest found in {name}"
    assert trace.sessions[0].models == ["model-1"] and trace.provenance.source_path == ""


def test_a_bad_line_fails_with_exit_2_naming_file_and_line(tmp_path: Path) -> None:
    good = {
        "start": 1,
        "end": 2,
        "request": {"messages": [{"role": "user", "content": "x"}]},
        "response": {"content": []},
    }
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "end": "yesterday"}) + "\n")
    result = CliRunner().invoke(
        main, ["synth", "from-logs", str(path), "--format", "anthropic-proxy", "--out", str(tmp_path / "o.arrow")]
    )
    assert result.exit_code == 2
    assert f"{path}:2" in result.output and "ISO 8601" in result.output
    assert "Traceback" not in result.output
    path.write_text("{broken\n")
    result = CliRunner().invoke(
        main, ["synth", "from-logs", str(path), "--format", "openai-proxy", "--out", str(tmp_path / "o.arrow")]
    )
    assert result.exit_code == 2 and f"{path}:1" in result.output


def test_an_existing_out_is_refused_before_the_logs_are_read_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "o.arrow"
    out.write_bytes(b"a user's file")
    missing = tmp_path / "not-read.jsonl"
    args = ["synth", "from-logs", str(missing), "--format", "anthropic-proxy", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and f"{out} already exists; pass --overwrite to replace it" in result.output
    assert out.read_bytes() == b"a user's file"
    logs = write_jsonl(tmp_path / "c.jsonl", [_secret_exchange(1000.0, 0)])
    result = CliRunner().invoke(main, ["synth", "from-logs", str(logs), *args[3:], "--overwrite"])
    assert result.exit_code == 0, result.output
    assert load_trace(out).request_count == 1


def test_unlinked_sessions_inside_a_tool_call_become_subagents(tmp_path: Path) -> None:
    """Without session keys: a conversation wholly inside another's tool call is its child."""

    def exchange(start: float, end: float, text: str) -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        return {"start": start, "end": end, "request": body, "response": {"content": [], "usage": {"output_tokens": 3}}}

    parent1 = exchange(0, 1, "parent task")
    parent2 = exchange(10, 11, "parent task")
    parent2["request"]["messages"] += [{"role": "assistant", "content": "call"}, {"role": "user", "content": "done"}]
    lines = [parent1, exchange(2, 3, "child job"), parent2, exchange(50, 51, "another user")]
    trace = from_logs([write_jsonl(tmp_path / "c.jsonl", lines)], FromLogsOptions(format="openai-proxy", block_size=4))
    assert len(trace.sessions) == 2
    root = trace.sessions[0].root
    assert len(root.requests) == 2 and [s.spawn_after for s in root.subagents] == [1]


def test_a_tokenizer_file_gives_exact_counts_and_is_recorded(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(["<|user|>", "hello", "world", "again"])}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world again hello"}]}
    response = {"content": [{"type": "text", "text": "world world"}], "stop_reason": "end_turn"}
    logs = write_jsonl(tmp_path / "c.jsonl", [{"start": 0, "end": 1, "request": body, "response": response}])
    trace = from_logs([logs], FromLogsOptions(format="anthropic-proxy", block_size=2, tokenizer_path=str(path)))
    request = trace.sessions[0].root.requests[0]
    assert (request.in_tokens, request.out_tokens, request.hash_ids_len) == (5, 2, 3)  # marker + 4 words
    assert "tokenizer: tokenizer.json" in trace.provenance.notes
    with pytest.raises(ValueError, match=r"not a usable tokenizer\.json"):
        from_logs([logs], FromLogsOptions(format="anthropic-proxy", tokenizer_path=str(logs)))


def test_the_trace_depends_on_which_blocks_are_equal_not_on_the_salt(sample: Trace, tmp_path: Path) -> None:
    logs = write_jsonl(tmp_path / "c.jsonl", mock_logs(sample, seed=2, usage_in=True))
    options = FromLogsOptions(format="anthropic-proxy")
    keyed = from_logs([logs], options, salt=b"one salt")
    assert msgspec.json.encode(keyed) == msgspec.json.encode(from_logs([logs], options))  # a random salt


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FUZZ_KEYS), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.dictionaries(st.sampled_from(FUZZ_KEYS), json_values, max_size=8),
    st.sampled_from(["anthropic-proxy", "openai-proxy"]),
)
def test_any_line_is_read_or_rejected_with_its_location(line: dict[str, Any], fmt: str) -> None:
    """Arbitrary JSON in the capture fields: an exchange or a TraceError naming file and line, nothing else."""
    path = Path(tempfile.mkdtemp()) / "fuzz.jsonl"
    line = {"start": 1.0, "end": 2.0, **line}
    path.write_bytes(msgspec.json.encode(line) + b"\n")
    try:
        trace = from_logs([path], FromLogsOptions(format=fmt))  # type: ignore[arg-type]
    except TraceError as exc:
        assert f"{path}:1" in str(exc) or str(path) in str(exc)
    else:
        assert [f for f in validate(trace) if f.severity == "error"] == []
