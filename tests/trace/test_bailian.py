"""Bailian / Qwen JSONL: sessions from parent links, errors with their location, fuzzing."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats.bailian import read_bailian
from agentx.trace.io import detect_format, load_trace
from agentx.trace.model import Request
from agentx.trace.validation import validate

FIXTURE_SETTINGS = settings(deadline=None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the files hypothesis examples rewrite (they run one at a time)."""
    return tmp_path_factory.mktemp("examples")


def write_lines(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def row(chat_id: int, parent: int = -1, timestamp: float = 0.0, turn: int = 1, **extra: Any) -> dict[str, Any]:
    base = {"chat_id": chat_id, "parent_chat_id": parent, "timestamp": timestamp, "input_length": 16}
    return base | {"output_length": 4, "type": "text", "turn": turn, "hash_ids": [chat_id]} | extra


def read_errors(path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_bailian(path)
    return info.value


def test_two_conversations_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "qwen.jsonl"
    path.write_text(
        '{"chat_id": 100, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 40, "output_length": 5, '
        '"type": "text", "turn": 1, "hash_ids": [1, 2, 3]}\n'
        '{"chat_id": 200, "timestamp": 12.5, "input_length": 20, "output_length": 7, "type": "image", '
        '"hash_ids": [9, 10]}\n'
        "\n"
        '{"chat_id": 102, "parent_chat_id": 101, "timestamp": 30.25, "input_length": 90, "output_length": 3, '
        '"type": "search", "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]}\n'
        '{"chat_id": 101, "parent_chat_id": 100, "timestamp": 20.0, "input_length": 64, "output_length": 4, '
        '"type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]}\n'
        '{"chat_id": 201, "parent_chat_id": 200, "timestamp": 13.0, "input_length": 33, "output_length": 1, '
        '"type": "file", "turn": 2, "hash_ids": [9, 11, 12]}\n'
    )
    findings = Findings()
    trace = read_bailian(path, findings=findings)
    assert findings.errors == []
    assert (trace.block_size, trace.hash_id_scope) == (16, "global")
    assert (trace.provenance.source_format, trace.provenance.source_path) == ("bailian", str(path))
    assert [s.session_id for s in trace.sessions] == ["100", "200"]
    first, second = trace.sessions
    assert (first.start_s, second.start_s) == (10.0, 12.5)
    assert first.root.subagents == [] and first.models == []
    assert first.root.requests == [
        Request(t=0.0, model="", in_tokens=40, out_tokens=5, hash_ids_added=(1, 2, 3), input_types=("text",)),
        Request(
            t=10.0, model="", in_tokens=64, out_tokens=4, hash_ids_kept=3, hash_ids_added=(4,), input_types=("text",)
        ),
        Request(
            t=20.25,
            model="",
            in_tokens=90,
            out_tokens=3,
            hash_ids_kept=4,
            hash_ids_added=(5, 6),
            input_types=("search",),
        ),
    ]
    assert all(r.think_time is None and r.api_time is None for r in first.root.requests)
    assert second.root.requests == [
        Request(t=0.0, model="", in_tokens=20, out_tokens=7, hash_ids_added=(9, 10), input_types=("image",)),
        Request(
            t=0.5, model="", in_tokens=33, out_tokens=1, hash_ids_kept=1, hash_ids_added=(11, 12), input_types=("file",)
        ),
    ]
    assert read_bailian(path, block_size=32).block_size == 32


def test_equal_turns_keep_file_order_and_type_is_optional(tmp_path: Path) -> None:
    rows = [row(1), row(3, parent=1, timestamp=2, turn=2), row(2, parent=1, timestamp=1, turn=2)]
    rows[0].pop("type")
    trace = read_bailian(write_lines(tmp_path / "t.jsonl", rows))
    assert [list(ids) for ids in trace.sessions[0].root.iter_hash_ids()] == [[1], [3], [2]]
    assert [r.input_types for r in trace.sessions[0].root.requests] == [(), ("text",), ("text",)]


def test_missing_parent_starts_its_own_session_with_one_warning(tmp_path: Path) -> None:
    rows = [row(1), row(5, parent=4, timestamp=3, turn=4), row(6, parent=5, timestamp=4, turn=5), row(8, parent=7)]
    findings = Findings()
    trace = read_bailian(write_lines(tmp_path / "window.jsonl", rows), findings=findings)
    assert [(s.session_id, s.start_s, s.request_count) for s in trace.sessions] == [
        ("1", 0.0, 1),
        ("5", 3.0, 2),
        ("8", 0.0, 1),
    ]
    assert [(w.line, w.message) for w in findings.warnings] == [
        (
            2,
            "2 row(s) name a parent_chat_id that is not in the file (first: chat_id 5, parent 4); "
            "each starts its own session",
        )
    ]


def test_unknown_keys_warn_once_per_key(tmp_path: Path) -> None:
    findings = Findings()
    read_bailian(write_lines(tmp_path / "k.jsonl", [row(1, region="eu"), row(2, region="us")]), findings=findings)
    assert [(w.line, w.message) for w in findings.warnings] == [(1, 'unknown key "region" ignored (2 rows)')]


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        ('{"chat_id": 7, "timestamp": 1.0, "input_length": 3', "the JSON ends early (truncated line?)"),
        ('{"chat_id": "7", "timestamp": 1, "input_length": 3, "output_length": 1}', "Expected `int`, got `str`"),
        ('{"chat_id": 7, "input_length": 3, "output_length": 1}', "Object missing required field `timestamp`"),
        ('{"chat_id": 7, "timestamp": 1, "output_length": 1}', "Object missing required field `input_length`"),
        ('{"chat_id": 7, "timestamp": 1, "input_length": 3, "output_length": 1, "turn": 1.5}', "at `$.turn`"),
        (
            '{"chat_id": 7, "timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [true]}',
            "`$.hash_ids[0]`",
        ),
        ('{"chat_id": 7, "timestamp": 1e999, "input_length": 3, "output_length": 1}', "Number out of range"),
        ("7", "Expected `object`, got `int`"),
    ],
)
def test_undecodable_rows_name_file_and_line(tmp_path: Path, bad_row: str, problem: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [row(1), bad_row])
    message = str(read_errors(path))
    assert message.startswith(f"{path}:2: ")
    assert problem in message


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        (row(7, parent=1, timestamp=-2.0, turn=2), "timestamp=-2.0 must be finite and >= 0 (seconds)"),
        (row(7, parent=1, timestamp=1.0, turn=2, input_length=-1), "input_length=-1 is negative"),
        (row(7, parent=1, timestamp=1.0, turn=2, output_length=-9), "output_length=-9 is negative"),
        (row(7, parent=1, timestamp=1.0, turn=2, input_length=10**9), "in=1000000000 is absurdly large"),
        (row(7, parent=1, timestamp=1.0, turn=2, hash_ids=[1 << 64]), "does not fit in 64 bits"),
        (row(7, parent=1, timestamp=0.25, turn=2), "t is negative (-0.25)"),
    ],
)
def test_bad_values_name_file_line_session_and_request(tmp_path: Path, bad_row: dict[str, Any], problem: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [row(1, timestamp=0.5), bad_row])
    message = str(read_errors(path))
    assert message.startswith(f'{path}:2 session "1" request 1: ')
    assert problem in message


def test_duplicate_chat_id_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "dup.jsonl", [row(1), row(2), row(1, timestamp=5)])
    assert str(read_errors(path)) == f"{path}:3: chat_id 1 appears again (first on line 1)"


def test_parent_cycles_are_errors(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "cycle.jsonl", [row(1), row(2, parent=3), row(3, parent=2), row(4, parent=3)])
    error = read_errors(path)
    assert [str(f) for f in error.findings] == [
        f"{path}:2: parent_chat_id links form a cycle: 2 (line 2) -> 3 (line 3) -> 2 (line 2)"
    ]
    itself = write_lines(tmp_path / "self.jsonl", [row(9, parent=9)])
    assert str(read_errors(itself)) == f"{itself}:1: parent_chat_id links form a cycle: 9 (line 1) -> 9 (line 1)"


def test_empty_unreadable_and_gzip_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert str(read_errors(empty)) == f"{empty}: the file holds no rows"
    assert "cannot read the file" in str(read_errors(tmp_path / "absent.jsonl"))
    packed = tmp_path / "qwen.jsonl.gz"
    packed.write_bytes(gzip.compress(json.dumps(row(1)).encode() + b"\n"))
    assert read_bailian(packed).sessions[0].session_id == "1"


@pytest.mark.parametrize("name", ["qwen_traceA_blksz_16.txt", "trace.jsonl", "noext"])
def test_load_trace_detects_bailian_from_content(tmp_path: Path, name: str) -> None:
    path = write_lines(tmp_path / name, [row(1), row(2, parent=1, turn=2)])
    assert detect_format(path) == "bailian"
    trace = load_trace(path)
    assert (trace.provenance.source_format, trace.block_size, len(trace.sessions)) == ("bailian", 16, 1)
    assert load_trace(path, block_size=64).block_size == 64


# ---------------------------------------------------------------------------------------------
# property: any forest of conversations, rows in any order, comes back as one session per tree


@st.composite
def forests(draw: st.DrawFn, max_rows: int = 25) -> list[dict[str, Any]]:
    """Rows of random conversation trees (chat ids unique, children after parents in time)."""
    count = draw(st.integers(min_value=1, max_value=max_rows))
    ids = draw(st.lists(st.integers(min_value=0, max_value=10**12), min_size=count, max_size=count, unique=True))
    rows: list[dict[str, Any]] = []
    for index, chat_id in enumerate(ids):
        parent = draw(st.none() | st.integers(min_value=0, max_value=index - 1)) if index else None
        if parent is None:
            start, turn = draw(st.integers(min_value=0, max_value=10**6)) / 8, 1
        else:
            start, turn = rows[parent]["timestamp"], rows[parent]["turn"] + 1
        rows.append(
            {
                "chat_id": chat_id,
                "parent_chat_id": -1 if parent is None else ids[parent],
                "timestamp": start + draw(st.integers(min_value=0, max_value=10**4)) / 4,
                "input_length": draw(st.integers(min_value=0, max_value=10**5)),
                "output_length": draw(st.integers(min_value=0, max_value=10**4)),
                "type": draw(st.sampled_from(["text", "search", "image", "file"])),
                "turn": turn,
                "hash_ids": draw(st.lists(st.integers(min_value=0, max_value=(1 << 63) - 1), max_size=6)),
            }
        )
    return rows


def root_of(rows: list[dict[str, Any]], chat: dict[str, Any]) -> int:
    by_id = {r["chat_id"]: r for r in rows}
    while chat["parent_chat_id"] != -1:
        chat = by_id[chat["parent_chat_id"]]
    return int(chat["chat_id"])


@FIXTURE_SETTINGS
@given(rows=forests(), order=st.randoms(use_true_random=False))
def test_any_row_order_gives_one_session_per_tree(
    scratch: Path, rows: list[dict[str, Any]], order: random.Random
) -> None:
    shuffled = list(rows)
    order.shuffle(shuffled)
    trace = read_bailian(write_lines(scratch / "rows.jsonl", shuffled))
    by_root: dict[int, list[dict[str, Any]]] = {}
    for chat in shuffled:
        by_root.setdefault(root_of(rows, chat), []).append(chat)
    assert [s.session_id for s in trace.sessions] == [str(root) for root in by_root]
    for session in trace.sessions:
        expected = sorted(by_root[int(session.session_id)], key=lambda chat: chat["turn"])  # stable: file order
        root = next(chat for chat in expected if chat["parent_chat_id"] == -1)
        assert session.start_s == root["timestamp"]
        assert [(r.t, r.in_tokens, r.out_tokens, r.input_types) for r in session.root.requests] == [
            (chat["timestamp"] - root["timestamp"], chat["input_length"], chat["output_length"], (chat["type"],))
            for chat in expected
        ]
        assert [list(ids) for ids in session.root.iter_hash_ids()] == [chat["hash_ids"] for chat in expected]


# ---------------------------------------------------------------------------------------------
# fuzzing: any input either reads into a valid trace or raises TraceError

BAILIAN_TOKENS = [b'"chat_id"', b'"parent_chat_id"', b'"timestamp"', b'"input_length"', b'"output_length"', b'"turn"']
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.integers(min_value=-2, max_value=30)  # small ints make parent links hit other rows
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
bailian_keys = st.sampled_from(
    ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn", "hash_ids", "other"]
)


def json_soup(keys: list[bytes]) -> st.SearchStrategy[bytes]:
    tokens = [*keys, b"{", b"}", b"[", b"]", b":", b",", b'"s"', b"1", b"-1", b"0.5", b"1e999", b"null", b"\n"]
    return st.lists(st.sampled_from(tokens), max_size=60).map(b"".join)


def check_read(path: Path) -> None:
    try:
        trace = read_bailian(path)
    except TraceError:
        event("rejected with TraceError")
        return
    event("read")
    assert [f for f in validate(trace) if f.severity == "error"] == []


@settings(max_examples=examples(400), deadline=None)
@given(blob=st.binary(max_size=300) | json_soup(BAILIAN_TOKENS))
def test_fuzz_arbitrary_bytes(scratch: Path, blob: bytes) -> None:
    path = scratch / "blob.jsonl"
    path.write_bytes(blob)
    check_read(path)


@settings(max_examples=examples(500), deadline=None)
@given(rows=forests(max_rows=10), data=st.data())
def test_fuzz_mutated_rows(scratch: Path, rows: list[dict[str, Any]], data: st.DataObject) -> None:
    lines = [json.dumps(chat) for chat in rows]
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
        kind = data.draw(st.sampled_from(["relink", "set", "drop", "cut", "byte"]))
        try:
            chat = json.loads(lines[at])
        except json.JSONDecodeError:
            chat = None
        if not isinstance(chat, dict):  # an earlier mutation broke the row, or cut it to another JSON value ("0")
            kind = "cut"
        if kind == "relink":  # keeps the row valid but may orphan it, loop it or merge conversations
            chat["parent_chat_id"] = data.draw(st.sampled_from([-1, -2, 10**15] + [r["chat_id"] for r in rows]))
            chat["turn"] = data.draw(st.integers(min_value=-3, max_value=30))
            lines[at] = json.dumps(chat)
        elif kind == "set":
            chat[data.draw(bailian_keys)] = data.draw(json_values)
            lines[at] = json.dumps(chat)
        elif kind == "drop":
            chat.pop(data.draw(st.sampled_from(sorted(chat))))
            lines[at] = json.dumps(chat)
        elif kind == "cut":
            lines[at] = lines[at][: data.draw(st.integers(min_value=0, max_value=len(lines[at])))]
        else:
            spot = data.draw(st.integers(min_value=0, max_value=len(lines[at]) - 1))
            lines[at] = lines[at][:spot] + data.draw(st.characters(codec="utf-8")) + lines[at][spot + 1 :]
    check_read(write_lines(scratch / "rows.jsonl", lines))
