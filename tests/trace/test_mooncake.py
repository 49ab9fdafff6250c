"""Mooncake JSONL: reading both row shapes, errors with their location, writing, round trips, fuzzing."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from paths import SHARED_DATA
from strategies import examples

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats.mooncake import read_mooncake, write_mooncake
from agentx.trace.io import detect_format, load_trace
from agentx.trace.model import Agent, Request, Session, Trace, delta_encode
from agentx.trace.validation import validate

REAL_TRACE = SHARED_DATA / "mooncake" / "conversation_trace.jsonl"
FIXTURE_SETTINGS = settings(deadline=None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the files hypothesis examples rewrite (they run one at a time)."""
    return tmp_path_factory.mktemp("examples")


def write_lines(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def full_ids(session: Session) -> list[tuple[int, ...]]:
    return list(session.root.iter_hash_ids())


def read_errors(path: Path) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    return info.value


# ---------------------------------------------------------------------------------------------
# reading


def test_plain_rows_become_one_request_sessions(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}\n'
        "\n"
        '{"timestamp": 3047, "input_length": 600, "output_length": 20, "hash_ids": [0, 2]}\n'
    )
    trace = read_mooncake(path)
    assert trace.block_size == 512
    assert trace.hash_id_scope == "global"
    assert trace.provenance.source_format == "mooncake"
    assert trace.provenance.source_path == str(path)
    assert [s.session_id for s in trace.sessions] == ["mc-1", "mc-3"]
    assert [s.start_s for s in trace.sessions] == [0.0, 3.047]
    second = trace.sessions[1]
    assert second.root.subagents == []
    assert second.root.requests == [
        Request(t=0.0, model="", in_tokens=600, out_tokens=20, hash_ids_kept=0, hash_ids_added=(0, 2))
    ]
    assert second.root.requests[0].think_time is None and second.root.requests[0].api_time is None
    assert read_mooncake(path, block_size=64).block_size == 64


def test_session_rows_group_in_file_order(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "sessions.jsonl",
        [
            {"session_id": "b", "timestamp": 5000, "input_length": 700, "output_length": 5, "hash_ids": [7, 8]},
            {"session_id": "a", "timestamp": 1000, "input_length": 100, "output_length": 10, "hash_ids": [1]},
            {"session_id": "a", "delay": 2500, "input_length": 300, "output_length": 20, "hash_ids": [1, 2]},
            {"session_id": "b", "input_length": 800, "output_length": 6, "hash_ids": [9], "model": "m1"},
            {"session_id": "a", "timestamp": 4000, "input_length": 350, "output_length": 30, "hash_ids": [1, 2, 3]},
            {"session_id": "a", "delay": 500, "timestamp": 9000, "input_length": 400, "output_length": 1},
        ],
    )
    trace = read_mooncake(path)
    assert [s.session_id for s in trace.sessions] == ["b", "a"]
    b, a = trace.sessions
    assert (a.start_s, b.start_s) == (1.0, 5.0)
    assert [r.t for r in a.root.requests] == [0.0, 2.5, 3.0, 8.0]
    assert [r.think_time for r in a.root.requests] == [None, 2.5, None, 0.5]
    assert [r.in_tokens for r in a.root.requests] == [100, 300, 350, 400]
    assert full_ids(a) == [(1,), (1, 2), (1, 2, 3), ()]
    assert [(r.hash_ids_kept, r.hash_ids_added) for r in a.root.requests] == [(0, (1,)), (1, (2,)), (2, (3,)), (0, ())]
    # A row with neither timestamp nor delay follows the previous one at once; incremental ids stay as written.
    assert [(r.t, r.think_time, r.model) for r in b.root.requests] == [(0.0, None, ""), (0.0, 0.0, "m1")]
    assert full_ids(b) == [(7, 8), (9,)]
    assert b.models == ["m1"]


def test_first_row_without_timestamp_starts_at_zero(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {"session_id": "s", "delay": 1500, "input_length": 1, "output_length": 1},
            {"session_id": "s", "timestamp": 4000, "input_length": 1, "output_length": 1},
            {"input_length": 1, "output_length": 1},
        ],
    )
    trace = read_mooncake(path)
    s, plain = trace.sessions
    assert s.start_s == 0.0
    assert [(r.t, r.think_time) for r in s.root.requests] == [(1.5, None), (4.0, None)]
    assert (plain.session_id, plain.start_s, plain.root.requests[0].t) == ("mc-3", 0.0, 0.0)


def test_content_and_unknown_keys_warn_once_per_key(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"timestamp": i, "input_length": 10, "output_length": 2, "extra": {"k": i}, "priority": 1, "colour": "red"}
        for i in range(3)
    ]
    rows[1].pop("colour")
    findings = Findings()
    trace = read_mooncake(write_lines(tmp_path / "k.jsonl", rows), findings=findings)
    assert trace.request_count == 3
    messages = sorted((w.message, w.line) for w in findings.warnings if "dropped" in w.message or "key" in w.message)
    assert messages == [
        ('"extra" dropped from 3 rows: agentx replays Mooncake rows by length only', 1),
        ('"priority" dropped from 3 rows: agentx replays Mooncake rows by length only', 1),
        ('unknown key "colour" ignored (2 rows)', 1),
    ]
    assert findings.errors == []


def test_messages_row_lacks_input_length(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "m.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "output_length": 5}])
    findings = Findings()
    with pytest.raises(
        TraceError, match=r"m\.jsonl:1 session \"mc-1\" request 0: Object missing required field `input_length`"
    ):
        read_mooncake(path, findings=findings)
    assert any('"messages" dropped from 1 row' in w.message for w in findings.warnings)


GOOD_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        ('{"timestamp": 5, "input_length": 6', "the JSON ends early (truncated line?)"),
        ('{"timestamp": 5, "input_length": 6,, "output_length": 1}', "JSON is malformed"),
        ('{"input_length": "600", "output_length": 1}', "Expected `int`, got `str` at `$.input_length`"),
        ('{"input_length": 6.5, "output_length": 1}', "Expected `int`, got `float` at `$.input_length`"),
        ('{"timestamp": "soon", "input_length": 6, "output_length": 1}', "Expected `float | null`, got `str`"),
        ("[1, 2]", "Expected `object`, got `array`"),
        ('{"output_length": 1}', "Object missing required field `input_length`"),
        ('{"input_length": 600}', "Object missing required field `output_length`"),
        ('{"input_length": -3, "output_length": 1}', "input_length=-3 is negative"),
        ('{"input_length": 3, "output_length": -1}', "output_length=-1 is negative"),
        ('{"timestamp": -1, "input_length": 3, "output_length": 1}', "timestamp=-1.0 must be finite and >= 0"),
        ('{"timestamp": 1e999, "input_length": 3, "output_length": 1}', "Number out of range at `$.timestamp`"),
        ('{"input_length": 3, "output_length": 1, "hash_ids": [1, 2.5]}', "Expected `int`, got `float`"),
        ('{"input_length": 3, "output_length": 1, "hash_ids": [1, "x"]}', "at `$.hash_ids[1]`"),
        ('{"input_length": 3, "output_length": 1, "hash_ids": [18446744073709551616]}', "does not fit in 64 bits"),
        ('{"input_length": 1000000000, "output_length": 1}', "in=1000000000 is absurdly large"),
        ('{"input_length": 3, "output_length": 1, "model": 7}', "Expected `str | null`, got `int` at `$.model`"),
        ('{"input_length": 3, "output_length": 1, "extra": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
    ],
)
def test_errors_name_file_line_and_problem(tmp_path: Path, bad_row: str, problem: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [GOOD_ROW, bad_row])
    message = str(read_errors(path))
    assert message.startswith(f'{path}:2 session "mc-2" request 0: ')
    assert problem in message


def test_session_row_errors_name_session_and_request(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "s.jsonl",
        [
            '{"session_id": "chat-9", "timestamp": 0, "input_length": 5, "output_length": 1}',
            '{"session_id": "chat-9", "delay": -20, "input_length": 5, "output_length": 1}',
            '{"session_id": "chat-9", "delay": 20, "input_length": 5, "output_length": "x"}',
        ],
    )
    error = read_errors(path)
    assert [str(f) for f in error.findings] == [
        f'{path}:2 session "chat-9" request 1: delay=-20.0 must be finite and >= 0 (milliseconds)',
        f'{path}:3 session "chat-9" request 1: Expected `int`, got `str` at `$.output_length`',
    ]
    assert str(error).endswith("(and 1 more error)")


def test_timestamp_before_the_session_start_is_an_error(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "s.jsonl",
        [
            {"session_id": "s", "timestamp": 5000, "input_length": 5, "output_length": 1},
            {"session_id": "s", "timestamp": 4000, "input_length": 5, "output_length": 1},
        ],
    )
    assert str(read_errors(path)) == f'{path}:2 session "s" request 1: t is negative (-1.0)'


def test_session_id_colliding_with_a_plain_row_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "c.jsonl", [GOOD_ROW, {"session_id": "mc-1", "input_length": 1, "output_length": 1}])
    assert 'session id "mc-1" appears twice' in str(read_errors(path))


def test_empty_and_unreadable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert str(read_errors(empty)) == f"{empty}: the file holds no rows"
    assert "cannot read the file" in str(read_errors(tmp_path / "absent.jsonl"))
    assert "cannot read the file" in str(read_errors(tmp_path))


def test_gzip_input_and_corrupt_gzip(tmp_path: Path) -> None:
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress((GOOD_ROW + "\n").encode()))
    assert read_mooncake(packed).sessions[0].root.requests[0].in_tokens == 600
    truncated = tmp_path / "truncated.gz"
    truncated.write_bytes(packed.read_bytes()[:-12])
    assert str(read_errors(truncated)).startswith(
        f"{truncated}: cannot read the gzip data (truncated or corrupt file?)"
    )
    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"\x1f\x8b" + bytes(range(200)))
    assert "cannot read the file" in str(read_errors(garbage))


# ---------------------------------------------------------------------------------------------
# writing


def request(t: float, in_tokens: int, ids: tuple[int, ...] = (), api_time: float | None = None) -> Request:
    return Request(t=t, model="m", in_tokens=in_tokens, out_tokens=1, hash_ids_added=ids, api_time=api_time)


def test_single_request_sessions_write_plain_rows(tmp_path: Path) -> None:
    trace = Trace(
        sessions=[
            Session(session_id="x", start_s=2.0, root=Agent(requests=[request(0.25, 10, (4, 5))])),
            Session(session_id="empty", root=Agent()),
            Session(session_id="y", start_s=0.0, root=Agent(requests=[request(1.0004, 20)])),
        ],
        block_size=512,
        hash_id_scope="global",
    )
    path = tmp_path / "out.jsonl"
    write_mooncake(trace, path)
    assert path.read_text().splitlines() == [
        '{"timestamp": 2250, "input_length": 10, "output_length": 1, "hash_ids": [4, 5]}',
        '{"timestamp": 1000, "input_length": 20, "output_length": 1, "hash_ids": []}',
    ]


def test_sessions_with_subagents_write_the_session_variant(tmp_path: Path) -> None:
    sub = Agent(
        agent_id="sub",
        spawn_after=1,
        t=1.0,
        requests=[request(1.5, 30, (9,)), Request(t=4.0, model="m", in_tokens=31, out_tokens=1, hash_ids_kept=1)],
    )
    second = Request(t=2.0, model="m", in_tokens=20, out_tokens=1, hash_ids_kept=1, hash_ids_added=(2,), api_time=2.5)
    root = Agent(requests=[request(0.0, 10, (1,)), second], subagents=[sub])
    trace = Trace(
        sessions=[
            Session(session_id="s1", start_s=10.0, root=root),
            Session(session_id="s2", start_s=3.0, root=Agent(requests=[request(0.5, 5)])),
        ],
        block_size=512,
        hash_id_scope="global",
    )
    path = tmp_path / "out.jsonl"
    write_mooncake(trace, path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"session_id": "s1", "timestamp": 10000, "input_length": 10, "output_length": 1, "hash_ids": [1]},
        {"session_id": "s1", "delay": 1500, "input_length": 30, "output_length": 1, "hash_ids": [9]},
        {"session_id": "s1", "delay": 500, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]},
        # Starts at 4.0 while the previous request runs until 4.5: the delay cannot be negative.
        {"session_id": "s1", "delay": 0, "input_length": 31, "output_length": 1, "hash_ids": [9]},
        {"session_id": "s2", "timestamp": 3500, "input_length": 5, "output_length": 1, "hash_ids": []},
    ]
    back = read_mooncake(path)
    assert [s.session_id for s in back.sessions] == ["s1", "s2"]
    assert [r.t for r in back.sessions[0].root.requests] == [0.0, 1.5, 2.0, 2.0]
    assert full_ids(back.sessions[0]) == [(1,), (9,), (1, 2), (9,)]


def test_session_scoped_ids_are_renumbered_apart(tmp_path: Path) -> None:
    """Weka ids are per session: written as global Mooncake ids they must not collide across sessions."""

    def session(name: str) -> Session:
        first = request(0.0, 10, (1, 2))
        second = Request(t=1.0, model="m", in_tokens=20, out_tokens=1, hash_ids_kept=2, hash_ids_added=(7,))
        return Session(session_id=name, root=Agent(requests=[first, second]))

    trace = Trace(sessions=[session("a"), session("b")], block_size=64, hash_id_scope="session")
    path = tmp_path / "out.jsonl"
    write_mooncake(trace, path)
    assert [json.loads(line)["hash_ids"] for line in path.read_text().splitlines()] == [
        [0, 1],
        [0, 1, 2],
        [3, 4],
        [3, 4, 5],
    ]


# ---------------------------------------------------------------------------------------------
# round trips

hash_id_lists = st.lists(st.integers(min_value=0, max_value=(1 << 63) - 1), max_size=12)
lengths = st.integers(min_value=0, max_value=2_000_000)
plain_rows = st.tuples(st.integers(min_value=0, max_value=10**13), lengths, lengths, hash_id_lists).map(
    lambda values: dict(zip(("timestamp", "input_length", "output_length", "hash_ids"), values, strict=True))
)
session_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)


@st.composite
def canonical_sessions(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Session-variant rows as the writer produces them: sessions contiguous, delays after the first row."""
    rows: list[dict[str, Any]] = []
    for name in draw(st.lists(session_names, min_size=1, max_size=5, unique=True)):
        count = draw(st.integers(min_value=1, max_value=6))
        for index in range(count):
            row: dict[str, Any] = {"session_id": name}
            if index == 0:
                row["timestamp"] = draw(st.integers(min_value=0, max_value=10**13))
            else:
                row["delay"] = draw(st.integers(min_value=0, max_value=10**9))
            row.update(input_length=draw(lengths), output_length=draw(lengths), hash_ids=draw(hash_id_lists))
            rows.append(row)
    return rows


def round_trip(directory: Path, rows: list[dict[str, Any]]) -> tuple[str, str]:
    source = write_lines(directory / "source.jsonl", rows)
    trace = read_mooncake(source)
    assert not [f for f in validate(trace) if f.severity == "error"]
    written = directory / "written.jsonl"
    write_mooncake(trace, written)
    return source.read_text(), written.read_text()


@FIXTURE_SETTINGS
@given(rows=st.lists(plain_rows, min_size=1, max_size=20))
def test_plain_rows_round_trip_byte_for_byte(scratch: Path, rows: list[dict[str, Any]]) -> None:
    source, written = round_trip(scratch, rows)
    assert written == source


@FIXTURE_SETTINGS
@given(rows=canonical_sessions())
def test_session_rows_round_trip_byte_for_byte(scratch: Path, rows: list[dict[str, Any]]) -> None:
    source, written = round_trip(scratch, rows)
    if len({row["session_id"] for row in rows}) == len(rows):  # all single requests: written as plain rows
        source = "".join(json.dumps({k: v for k, v in row.items() if k != "session_id"}) + "\n" for row in rows)
    assert written == source


@FIXTURE_SETTINGS
@given(rows=canonical_sessions().filter(lambda rows: len({r["session_id"] for r in rows}) < len(rows)), data=st.data())
def test_interleaved_session_rows_regroup(scratch: Path, rows: list[dict[str, Any]], data: st.DataObject) -> None:
    """Shuffling sessions together keeps each session's rows; the writer puts them back together."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row)
    queues = list(by_session.values())
    shuffled: list[dict[str, Any]] = []
    while any(queues):
        queue = data.draw(st.sampled_from([q for q in queues if q]))
        shuffled.append(queue.pop(0))
    order = list(dict.fromkeys(row["session_id"] for row in shuffled))
    _, written = round_trip(scratch, shuffled)
    expected = [row for name in order for row in rows if row["session_id"] == name]
    assert [json.loads(line) for line in written.splitlines()] == expected


@st.composite
def model_traces(draw: st.DrawFn) -> Trace:
    """Traces with whole-millisecond times, some with subagents, api times and models."""
    ms = st.integers(min_value=0, max_value=10**7).map(lambda value: value / 1000)

    def agent(agent_id: str) -> Agent:
        requests: list[Request] = []
        previous: list[int] = []
        for t in sorted(draw(st.lists(ms, min_size=1, max_size=4))):
            ids = draw(hash_id_lists)
            kept, added = delta_encode(previous, ids)
            previous = ids
            requests.append(
                Request(
                    t=t,
                    model=draw(st.sampled_from(["", "m"])),
                    in_tokens=draw(lengths),
                    out_tokens=draw(lengths),
                    hash_ids_kept=kept,
                    hash_ids_added=added,
                    api_time=draw(st.none() | ms),
                    think_time=draw(st.none() | ms),
                )
            )
        return Agent(agent_id=agent_id, requests=requests, t=requests[0].t if agent_id else None)

    sessions = []
    for index in range(draw(st.integers(min_value=1, max_value=4))):
        root = agent("")
        if draw(st.booleans()):
            root.subagents.append(agent("sub"))
        sessions.append(Session(session_id=f"s{index}", start_s=draw(ms), root=root))
    if draw(st.booleans()):  # single-request sessions only: the plain shape
        for session in sessions:
            session.root = Agent(requests=session.root.requests[:1])
    return Trace(sessions=sessions, block_size=512, hash_id_scope="global")


def flattened(session: Session) -> list[tuple[Request, tuple[int, ...]]]:
    entries = [
        (r, ids)
        for agent, _, _ in session.agents()
        for r, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True)
    ]
    return sorted(entries, key=lambda entry: entry[0].t)


@FIXTURE_SETTINGS
@given(trace=model_traces())
def test_model_to_mooncake_keeps_lengths_ids_and_timing(scratch: Path, trace: Trace) -> None:
    path = scratch / "trace.jsonl"
    write_mooncake(trace, path)
    back = read_mooncake(path)
    plain = all(s.request_count == 1 for s in trace.sessions)
    assert len(back.sessions) == len(trace.sessions)
    for line, (original, read) in enumerate(zip(trace.sessions, back.sessions, strict=True), start=1):
        assert read.session_id == (f"mc-{line}" if plain else original.session_id)
        expected = flattened(original)
        requests = read.root.requests
        assert read.root.subagents == []
        assert [(r.in_tokens, r.out_tokens) for r in requests] == [(r.in_tokens, r.out_tokens) for r, _ in expected]
        assert full_ids(read) == [ids for _, ids in expected]
        assert all(r.model == "" and r.api_time is None for r in requests)
        assert read.start_s == pytest.approx(original.start_s + expected[0][0].t, abs=5e-4)
        for index in range(1, len(requests)):
            previous = expected[index - 1][0]
            gap = max(0.0, expected[index][0].t - previous.end)
            assert requests[index].think_time == pytest.approx(gap, abs=5e-4)
            assert requests[index].t == pytest.approx(requests[index - 1].t + gap, abs=5e-4)
        if all(r.api_time is None for r, _ in expected):  # start-to-start gaps are then exact
            assert [r.t for r in requests] == pytest.approx([r.t - expected[0][0].t for r, _ in expected], abs=1e-6)


@pytest.mark.skipif(not REAL_TRACE.exists(), reason=f"real Mooncake trace not present at {REAL_TRACE}")
def test_real_conversation_trace_round_trips(tmp_path: Path) -> None:
    findings = Findings()
    trace = read_mooncake(REAL_TRACE, findings=findings)
    assert trace.request_count == len(trace.sessions) == 12031
    assert findings.errors == []
    written = tmp_path / "written.jsonl"
    write_mooncake(trace, written)
    assert written.read_bytes() == REAL_TRACE.read_bytes()


# ---------------------------------------------------------------------------------------------
# fuzzing: any input either reads into a valid trace or raises TraceError

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
mooncake_keys = st.sampled_from(
    ["timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay", "model", "messages", "other"]
)


MOONCAKE_TOKENS = [b'"timestamp"', b'"input_length"', b'"output_length"', b'"hash_ids"', b'"session_id"', b'"delay"']


def json_soup(keys: list[bytes]) -> st.SearchStrategy[bytes]:
    """Byte strings made of JSON tokens and the format's keys: far more of them parse than random bytes."""
    tokens = [*keys, b"{", b"}", b"[", b"]", b":", b",", b'"s"', b"1", b"-7", b"0.5", b"1e999", b"null", b"true", b"\n"]
    return st.lists(st.sampled_from(tokens), max_size=60).map(b"".join)


def check_read(path: Path, reader: Callable[[Path], Trace]) -> Trace | None:
    try:
        trace = reader(path)
    except TraceError:
        event("rejected with TraceError")
        return None
    event("read")
    assert [f for f in validate(trace) if f.severity == "error"] == []
    return trace


def mutate_line(line: str, data: st.DataObject) -> str:
    """One random edit of a JSON line: a key set, removed or added, or its text cut or altered."""
    kind = data.draw(st.sampled_from(["regroup", "retime", "set", "drop", "cut", "byte"]))
    row = json.loads(line)
    if not isinstance(row, dict):  # an earlier cut left another JSON value ("0", "[]"): break it further
        return line[::-1]
    if kind == "regroup":  # valid, but may merge sessions or collide with a plain row's "mc-<line>"
        row["session_id"] = data.draw(st.sampled_from(["a", "b", "mc-1", "mc-2"]))
    elif kind == "retime":
        row[data.draw(st.sampled_from(["timestamp", "delay"]))] = data.draw(
            st.integers(-2, 10**6) | st.floats(0, 1e300)
        )
    elif kind == "set":
        row[data.draw(mooncake_keys)] = data.draw(json_values)
    elif kind == "drop" and row:
        row.pop(data.draw(st.sampled_from(sorted(row))))
    elif kind == "cut":
        return line[: data.draw(st.integers(min_value=0, max_value=len(line)))]
    elif kind == "byte":
        at = data.draw(st.integers(min_value=0, max_value=len(line) - 1))
        return line[:at] + data.draw(st.characters(codec="utf-8", exclude_categories=["Cs"])) + line[at + 1 :]
    return json.dumps(row)


@settings(max_examples=examples(400), deadline=None)
@given(blob=st.binary(max_size=300) | json_soup(MOONCAKE_TOKENS))
def test_fuzz_arbitrary_bytes(scratch: Path, blob: bytes) -> None:
    path = scratch / "blob.jsonl"
    path.write_bytes(blob)
    check_read(path, read_mooncake)


@settings(max_examples=examples(500), deadline=None)
@given(rows=st.lists(plain_rows, min_size=1, max_size=4) | canonical_sessions(), data=st.data())
def test_fuzz_mutated_rows(scratch: Path, rows: list[dict[str, Any]], data: st.DataObject) -> None:
    lines = [json.dumps(row) for row in rows]
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
        try:
            lines[at] = mutate_line(lines[at], data)
        except json.JSONDecodeError:  # an earlier edit already broke this line: break it further
            lines[at] = lines[at][::-1]
    trace = check_read(write_lines(scratch / "rows.jsonl", lines), read_mooncake)
    if trace is not None:  # whatever was read can be written and read again
        write_mooncake(trace, scratch / "again.jsonl")
        again = read_mooncake(scratch / "again.jsonl")
        assert again.request_count == trace.request_count


# ---------------------------------------------------------------------------------------------
# format detection


@pytest.mark.parametrize(
    "first_row",
    [
        GOOD_ROW,
        '{"session_id": "s", "timestamp": 0, "input_length": 5, "output_length": 1}',
        '{"hash_ids": [1], "input_length": 5, "output_length": 1}',
    ],
)
def test_load_trace_detects_mooncake_from_content(tmp_path: Path, first_row: str) -> None:
    path = write_lines(tmp_path / "requests.txt", [first_row])
    assert detect_format(path) == "mooncake"
    trace = load_trace(path, block_size=128)
    assert (trace.provenance.source_format, trace.block_size, trace.request_count) == ("mooncake", 128, 1)
    packed = tmp_path / "requests.bin"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert load_trace(packed).provenance.source_format == "mooncake"
