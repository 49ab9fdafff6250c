"""The Arrow trace's identity columns checked against its metadata: broken copies of the sample trace, each refused
with the cause named (file, row, session, agent), and any shuffle of a trace's rows named as rows out of order."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from builders import make_agent, make_request, make_session, make_trace, write_trace_table
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from paths import SAMPLE_TRACE
from strategies import examples
from strategies import traces as trace_strategy

from agentx.errors import Finding, TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats import arrow
from agentx.trace.io import load_trace
from agentx.trace.model import Trace

ORDER = "are not in the trace's order"


@pytest.fixture(scope="module")
def sample() -> pa.Table:
    with ipc.open_file(SAMPLE_TRACE) as reader:
        return reader.read_all()


def _column(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist()  # type: ignore[no-any-return]


def _with_column(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    index = table.schema.get_field_index(name)
    field = table.schema.field(index)
    return table.set_column(index, field, pa.array(values, field.type))


def _first_row(table: pa.Table, session: str, agent: str) -> int:
    """The 1-based row where `agent` of `session` begins."""
    pairs = list(zip(_column(table, "session_id"), _column(table, "agent_id"), strict=True))
    return pairs.index((session, agent)) + 1


def _errors(path: Path) -> list[Finding]:
    """The errors reading `path` raises: one paragraph naming the file, never a traceback."""
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}:")
    assert all(finding.file == str(path) and finding.severity == "error" for finding in caught.value.findings)
    return caught.value.findings


def _relink(table: pa.Table, session: str, agent: str, parent: str) -> pa.Table:
    """`table` with every row of `agent` in `session` naming `parent` as its parent."""
    rows = zip(_column(table, "session_id"), _column(table, "agent_id"), _column(table, "parent_agent_id"), strict=True)
    return _with_column(table, "parent_agent_id", [parent if (s, a) == (session, agent) else p for s, a, p in rows])


def test_the_intact_sample_reads_with_no_finding() -> None:
    findings = Findings()
    trace = load_trace(SAMPLE_TRACE, findings=findings)
    assert findings.items == []
    assert trace.request_count == 531


def test_a_parent_that_is_not_there(sample: pa.Table, tmp_path: Path) -> None:
    path = write_trace_table(_relink(sample, "session_005", "agent_002", "ghost"), tmp_path / "orphan.arrow")
    (error,) = _errors(path)
    assert (error.session, error.agent, error.line) == ("session_005", "agent_002", _first_row(sample, *_AGENT_002))
    assert error.message == 'parent_agent_id "ghost" names no agent of session "session_005"'


_AGENT_001 = ("session_005", "agent_001")
_AGENT_002 = ("session_005", "agent_002")
"""In the sample, session_005's agent_001 (a subagent of the root) spawned agent_002."""


def test_parents_that_form_a_loop(sample: pa.Table, tmp_path: Path) -> None:
    path = write_trace_table(_relink(sample, *_AGENT_001, "agent_002"), tmp_path / "loop.arrow")
    (error,) = _errors(path)
    one, two = _first_row(sample, *_AGENT_001), _first_row(sample, *_AGENT_002)
    assert (error.session, error.agent, error.line) == ("session_005", "agent_001", one)
    assert error.message == (
        'parent_agent_id links of session "session_005" form a cycle: '
        f'"agent_001" (row {one}) -> "agent_002" (row {two}) -> "agent_001" (row {one})'
    )


def test_agent_depth_off_the_parent_chain_everywhere(sample: pa.Table, tmp_path: Path) -> None:
    path = write_trace_table(_with_column(sample, "agent_depth", [7] * sample.num_rows), tmp_path / "deep.arrow")
    errors = _errors(path)
    agents = dict.fromkeys(zip(_column(sample, "session_id"), _column(sample, "agent_id"), strict=True))
    assert [(e.session, e.agent) for e in errors] == list(agents)  # one error per agent, each where its rows begin
    assert all(e.line == _first_row(sample, e.session or "", e.agent or "") for e in errors)
    roots = [e for e in errors if e.agent == ""]
    assert roots and all(e.message == "the root agent has agent_depth=7; a root is at depth 0" for e in roots)
    nested = next(e for e in errors if (e.session, e.agent) == _AGENT_002)
    assert nested.message == (
        'agent_depth=7 does not match its parent_agent_id chain "agent_002" -> "agent_001" -> "", which puts it at '
        "depth 2"
    )


@pytest.mark.parametrize("where", ["rows", "metadata"])
def test_two_sessions_that_swapped_ids(sample: pa.Table, tmp_path: Path, where: str) -> None:
    swap = {"session_000": "session_001", "session_001": "session_000"}
    if where == "rows":
        table = _with_column(sample, "session_id", [swap.get(s, s) for s in _column(sample, "session_id")])
        path = write_trace_table(table, tmp_path / "swapped.arrow")
        first, second = "session_001", "session_000"
    else:
        sessions = json.loads(sample.schema.metadata[b"agentx.sessions"])
        for session in sessions:
            session["session_id"] = swap.get(session["session_id"], session["session_id"])
        path = write_trace_table(sample, tmp_path / "swapped.arrow", sessions=json.dumps(sessions).encode())
        first, second = "session_000", "session_001"
    # session_000 has 10 requests, session_001 54: each id now stands where the metadata has the other.
    one, two = _errors(path)
    assert (one.session, one.agent, one.line) == (first, "", 1)
    assert (two.session, two.agent, two.line) == (second, "", 11)
    assert one.message == (
        f'rows 1–10 carry session_id "{first}", but the agentx.sessions metadata, which gives each session its rows '
        f'by position, has session "{second}" (10 requests) there: the ids in the rows and in the metadata disagree'
    )


def test_a_session_id_used_twice(sample: pa.Table, tmp_path: Path) -> None:
    ids = ["session_000" if s == "session_001" else s for s in _column(sample, "session_id")]
    (error,) = _errors(write_trace_table(_with_column(sample, "session_id", ids), tmp_path / "twice.arrow"))
    assert (error.session, error.agent, error.request, error.line) == ("session_000", "", 0, 11)
    assert error.message == (
        'request 0 of the root agent appears twice in session "session_000" (rows 1 and 11): two sessions, or two '
        "agents of one session, share an id"
    )


def test_rows_sorted_by_t_are_named_as_out_of_order(sample: pa.Table, tmp_path: Path) -> None:
    path = write_trace_table(sample.sort_by("t"), tmp_path / "by_t.arrow")
    errors = _errors(path)
    # One error per session whose rows moved, saying so; nothing derived from giving rows to the wrong agents.
    assert len({e.session for e in errors}) == len(errors) > 1
    for error in errors:
        assert error.message.startswith(f'rows of session "{error.session}" {ORDER} (row {error.line}, request ')
        assert error.message.endswith("then request_index")
        assert error.agent is not None and error.request is not None
        assert "hash_ids_kept" not in error.message
    # Within session_005, agent_002's rows came among its parent's, which the format keeps before them.
    inside = next(e for e in errors if e.session == "session_005")
    assert "comes after row" in inside.message and "of agent" in inside.message


def test_an_agent_request_before_its_predecessor(sample: pa.Table, tmp_path: Path) -> None:
    """Two requests of one agent swapped: named as the later request before the earlier one."""
    order = list(range(sample.num_rows))
    order[2], order[3] = 3, 2  # session_000's root requests 2 and 3
    (error,) = _errors(write_trace_table(sample.take(order), tmp_path / "swap.arrow"))
    assert (error.session, error.agent, error.request, error.line) == ("session_000", "", 2, 4)
    assert (
        f'rows of session "session_000" {ORDER} (row 4, request 2 of the root agent, comes after row 3, request 3 '
        in (error.message)
    )


def test_sessions_in_another_order(sample: pa.Table, tmp_path: Path) -> None:
    """Each session's rows intact, the sessions reversed: one error for the file, at the first session out of place."""
    ids = _column(sample, "session_id")
    order = sorted(range(sample.num_rows), key=lambda row: (-int(ids[row].split("_")[1]), row))
    (error,) = _errors(write_trace_table(sample.take(order), tmp_path / "reversed.arrow"))
    assert (error.session, error.line) == ("session_019", 1)
    assert error.message.startswith(
        "the sessions' rows are not in the trace's order (session \"session_019\" starts at row 1, where the "
        'agentx.sessions metadata has session "session_000")'
    )


def test_an_agent_moved_under_another_parent(sample: pa.Table, tmp_path: Path) -> None:
    """Parent and depth edited together: the rows make a sound tree, but not the metadata's."""
    moved = _relink(sample, *_AGENT_002, "")
    pairs = zip(_column(sample, "session_id"), _column(sample, "agent_id"), _column(sample, "agent_depth"), strict=True)
    moved = _with_column(moved, "agent_depth", [1 if (s, a) == _AGENT_002 else d for s, a, d in pairs])
    (error,) = _errors(write_trace_table(moved, tmp_path / "moved.arrow"))
    row = _first_row(sample, *_AGENT_002)
    assert (error.session, error.agent, error.line) == (*_AGENT_002, row)
    assert error.message == (
        f'rows of session "session_005" hold 8 request(s) of agent "agent_002" (parent "", depth 1) at row {row}, '
        'where the agentx.sessions metadata has 8 request(s) of agent "agent_002" (parent "agent_001", depth 2): the '
        "rows and the metadata disagree"
    )


def test_a_request_index_off_by_one(sample: pa.Table, tmp_path: Path) -> None:
    """Still in order and unique, just not the metadata's: the first row that differs is named."""
    indices = _column(sample, "request_index")
    shifted = [index + 1 if row < 10 else index for row, index in enumerate(indices)]  # session_000's root
    (error,) = _errors(write_trace_table(_with_column(sample, "request_index", shifted), tmp_path / "shifted.arrow"))
    assert (error.session, error.agent, error.request, error.line) == ("session_000", "", 1, 1)
    assert error.message == (
        'row 1 (session "session_000", request 1 of the root agent, parent none, depth 0) disagrees with the '
        'agentx.sessions metadata, which puts session "session_000", request 0 of the root agent, parent none, depth 0 '
        "there"
    )


def test_parquet_rows_are_checked_alike(sample: pa.Table, tmp_path: Path) -> None:
    path = tmp_path / "by_t.parquet"
    pq.write_table(sample.sort_by("t"), path)
    assert all(ORDER in error.message for error in _errors(path))


def test_a_table_without_the_identity_columns_is_read_by_position(sample: pa.Table, tmp_path: Path) -> None:
    bare = sample.drop_columns(["session_id", "agent_id", "parent_agent_id", "agent_depth", "request_index"])
    assert load_trace(write_trace_table(bare, tmp_path / "bare.arrow")) == load_trace(SAMPLE_TRACE)


def test_a_subagent_without_requests_is_still_a_parent(tmp_path: Path) -> None:
    """`b`'s parent `a` never ran, so no row names `a`: the metadata vouches for it."""
    idle = make_agent("a", [], t=1.0, subagents=[make_agent("b", [make_request(2.0)], t=2.0)])
    trace = make_trace(make_session("s", [make_request(0.0)], subagents=[idle]))
    table = arrow.to_table(trace)
    assert load_trace(write_trace_table(table, tmp_path / "idle.arrow")) == trace
    (error,) = _errors(write_trace_table(_relink(table, "s", "b", "c"), tmp_path / "lost.arrow"))
    assert (error.session, error.agent, error.line) == ("s", "b", 2)
    assert error.message == 'parent_agent_id "c" names no agent of session "s"'


@settings(max_examples=examples(30), deadline=None)
@given(trace_strategy(), st.data())
def test_any_shuffle_of_the_rows_is_named_as_rows_out_of_order(trace: Trace, data: st.DataObject) -> None:
    table = arrow.to_table(trace)
    order = data.draw(st.permutations(range(table.num_rows)))
    assume(order != sorted(order))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_trace_table(table.take(order), Path(tmp) / "shuffled.arrow")
        errors = _errors(path)
    sessions = {session.session_id for session in trace.sessions}
    assert errors and all(ORDER in error.message and error.session in sessions for error in errors)
