"""The native Arrow IPC / Parquet trace file: round trips, metadata, interoperability, refusals, size."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import duckdb
import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from builders import write_trace_table
from hypothesis import given, settings
from strategies import examples
from strategies import traces as trace_strategy

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats import arrow, weka_reader, weka_writer
from agentx.trace.io import load_trace, save_trace
from agentx.trace.model import FORMAT_NAME, FORMAT_VERSION, Agent, Provenance, Request, Session, Trace, delta_encode
from agentx.trace.validation import MAX_AGENT_DEPTH


def _small_trace() -> Trace:
    """Two sessions, a nested subagent tree, every optional field set somewhere."""
    previous: list[int] = []
    root_requests = []
    for index, ids in enumerate([[1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 9]]):
        kept, added = delta_encode(previous, ids)
        previous = ids
        root_requests.append(
            Request(
                t=index * 2.0,
                model="claude-opus-4-5",
                in_tokens=len(ids) * 16,
                out_tokens=10 + index,
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=None if index == 0 else 0.5,
                api_time=1.5,
                ttft=0.25 if index % 2 else None,
                type="s" if index % 2 else "n",
                input_types=("text",),
                output_types=("text", "tool_use"),
                stop="tool_use",
                acceptance_length=2.5 if index == 1 else None,
            )
        )
    grandchild = Agent(
        agent_id="c",
        t=3.0,
        spawn_after=1,
        requests=[
            Request(
                t=3.0,
                model="m",
                in_tokens=16,
                out_tokens=1,
                hash_ids_added=(7,),
                explicit_defaults=frozenset({"output_types", "stop"}),
            )
        ],
    )
    child = Agent(
        agent_id="b",
        t=2.5,
        spawn_after=2,
        subagent_type="Explore",
        status="completed",
        duration_ms=900,
        total_tokens=123,
        tool_use_count=4,
        models=["m"],
        tool_tokens=10,
        system_tokens=20,
        relative_times=True,
        requests=[
            Request(t=2.5, model="m", in_tokens=32, out_tokens=2, hash_ids_added=(1, 2)),
            Request(t=2.9, model="m", in_tokens=48, out_tokens=2, hash_ids_kept=2, hash_ids_added=(5,)),
        ],
        subagents=[grandchild],
    )
    never_ran = Agent(agent_id="d", t=None, status="async_launched", spawn_after=4)
    root = Agent(requests=root_requests, subagents=[child, never_ran], tool_tokens=100, system_tokens=50)
    other = Agent(requests=[Request(t=0.0, model="m", in_tokens=5, out_tokens=5, hash_ids_added=(1,))])
    return Trace(
        sessions=[
            Session(session_id="A", root=root, models=["claude-opus-4-5"], totals={"requests": 4, "x": [1, "y"]}),
            Session(session_id="B", root=other, start_s=12.5),
        ],
        block_size=16,
        hash_id_scope="global",
        provenance=Provenance(source_format="weka", source_path="/somewhere/a.jsonl", notes=["made by a test"]),
    )


@pytest.fixture
def small_trace() -> Trace:
    return _small_trace()


# ---------------------------------------------------------------------------------------------
# round trips


@settings(max_examples=examples(80), deadline=None)
@given(trace_strategy())
def test_model_to_arrow_to_model(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.arrow"
        arrow.write_arrow(trace, path)
        assert arrow.read_arrow(path) == trace


@settings(max_examples=examples(50), deadline=None)
@given(trace_strategy())
def test_model_to_parquet_to_model(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.parquet"
        arrow.write_parquet(trace, path)
        assert arrow.read_arrow(path) == trace


@settings(max_examples=examples(50), deadline=None)
@given(trace_strategy())
def test_table_round_trip_in_memory(trace: Trace) -> None:
    table = arrow.to_table(trace)
    assert table.num_rows == trace.request_count
    assert arrow.from_table(table) == trace


def test_every_field_survives(small_trace: Trace, tmp_path: Path) -> None:
    expected = copy.deepcopy(small_trace)
    for name in ("t.arrow", "t.parquet"):
        save_trace(small_trace, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back == expected
        assert back.provenance.notes == ["made by a test"]  # the writer's provenance, not the reader's path


def test_ipc_stream_format_is_read_too(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    path = tmp_path / "t.arrows"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert arrow.read_arrow(path) == small_trace


def test_empty_trace(tmp_path: Path) -> None:
    empty = Trace(sessions=[], block_size=64)
    arrow.write_arrow(empty, tmp_path / "e.arrow")
    assert arrow.read_arrow(tmp_path / "e.arrow") == empty
    sessions_only = Trace(sessions=[Session(session_id="s", root=Agent())], block_size=64)
    arrow.write_parquet(sessions_only, tmp_path / "e.parquet")
    assert arrow.read_arrow(tmp_path / "e.parquet") == sessions_only


# ---------------------------------------------------------------------------------------------
# the file's layout


def test_schema_metadata(small_trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    arrow.write_arrow(small_trace, path)
    with ipc.open_file(path) as reader:
        schema = reader.schema
    metadata = schema.metadata
    assert metadata[b"agentx.format"] == FORMAT_NAME.encode()
    assert metadata[b"agentx.version"] == FORMAT_VERSION.encode()
    assert metadata[b"agentx.block_size"] == str(small_trace.block_size).encode()
    assert metadata[b"agentx.hash_id_scope"] == small_trace.hash_id_scope.encode()
    assert json.loads(metadata[b"agentx.provenance"])["source_format"] == "weka"
    sessions = json.loads(metadata[b"agentx.sessions"])
    assert [s["session_id"] for s in sessions] == ["A", "B"]
    assert sessions[1]["start_s"] == 12.5
    assert [sub["agent_id"] for sub in sessions[0]["root"]["subagents"]] == ["b", "d"]
    assert schema.names == [field.name for field in arrow.SCHEMA]


def test_rows_are_one_per_request_in_session_agent_request_order(small_trace: Trace) -> None:
    table = arrow.to_table(small_trace)
    expected = [
        (session.session_id, agent.agent_id, None if parent is None else parent.agent_id, depth, index)
        for session in small_trace.sessions
        for agent, parent, depth in session.agents()
        for index in range(len(agent.requests))
    ]
    columns = ["session_id", "agent_id", "parent_agent_id", "agent_depth", "request_index"]
    rows = list(zip(*(table.column(name).to_pylist() for name in columns), strict=True))
    assert rows == expected
    full = [ids for s in small_trace.sessions for agent, _, _ in s.agents() for ids in agent.iter_hash_ids()]
    assert table.column("hash_ids_len").to_pylist() == [len(ids) for ids in full]


def test_file_opens_in_pyarrow_polars_and_duckdb(small_trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    arrow.write_arrow(small_trace, path)
    requests = [
        (s.session_id, a.agent_id, r) for s in small_trace.sessions for a, _, _ in s.agents() for r in a.requests
    ]

    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    assert table.num_rows == len(requests)
    assert table.column("in").to_pylist() == [r.in_tokens for _, _, r in requests]
    assert table.column("t").to_pylist() == [r.t for _, _, r in requests]

    frame = pl.read_ipc(path)
    assert frame.height == len(requests)
    assert {"session_id", "agent_id", "parent_agent_id", "t", "in", "out", "hash_ids_added"} <= set(frame.columns)
    assert frame["session_id"].cast(pl.String).to_list() == [s for s, _, _ in requests]
    assert frame["out"].to_list() == [r.out_tokens for _, _, r in requests]

    connection = duckdb.connect()
    connection.register("requests", table)
    grouped = connection.execute(
        'SELECT session_id, agent_id, count(*), sum("in") FROM requests GROUP BY ALL ORDER BY session_id, agent_id'
    ).fetchall()
    expected: dict[tuple[str, str], list[int]] = {}
    for session_id, agent_id, request in requests:
        expected.setdefault((session_id, agent_id), []).append(request.in_tokens)
    assert grouped == [(s, a, len(v), sum(v)) for (s, a), v in sorted(expected.items())]

    parquet = tmp_path / "t.parquet"
    arrow.write_parquet(small_trace, parquet)
    assert pq.read_table(parquet).num_rows == len(requests)
    assert duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{parquet}')").fetchone() == (len(requests),)
    assert pl.read_parquet(parquet).height == len(requests)


def test_arrow_is_much_smaller_than_weka_for_growing_contexts(tmp_path: Path) -> None:
    # One agent whose context grows by 20 blocks a turn: Weka repeats every id each turn (quadratic),
    # the delta encoding stores each id once (linear).
    turns, growth = 200, 20
    requests: list[Request] = []
    previous: list[int] = []
    for turn in range(turns):
        ids = list(range((turn + 1) * growth))
        kept, added = delta_encode(previous, ids)
        previous = ids
        requests.append(
            Request(
                t=turn * 1.0,
                model="m",
                in_tokens=len(ids) * 64,
                out_tokens=100,
                hash_ids_kept=kept,
                hash_ids_added=added,
            )
        )
    trace = Trace(sessions=[Session(session_id="grow", root=Agent(requests=requests))], block_size=64)
    weka_writer.write_weka(trace, tmp_path / "t.jsonl")
    arrow.write_arrow(trace, tmp_path / "t.arrow")
    weka_size = (tmp_path / "t.jsonl").stat().st_size
    arrow_size = (tmp_path / "t.arrow").stat().st_size
    assert weka_size > 20 * arrow_size, (weka_size, arrow_size)
    assert arrow.read_arrow(tmp_path / "t.arrow").sessions == weka_reader.read_weka(tmp_path / "t.jsonl").sessions


# ---------------------------------------------------------------------------------------------
# refusals


def _refusal(path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        load_trace(path, format="arrow")
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize("version", ["2.0", "10.1", "2"])
def test_newer_major_version_is_refused_with_upgrade_advice(small_trace: Trace, tmp_path: Path, version: str) -> None:
    path = write_trace_table(arrow.to_table(small_trace), tmp_path / "new.arrow", version=version.encode())
    message = _refusal(path)
    assert f"version {version}" in message and "Upgrade agentx" in message


def test_newer_minor_version_is_read(small_trace: Trace, tmp_path: Path) -> None:
    major = FORMAT_VERSION.split(".")[0]
    path = write_trace_table(arrow.to_table(small_trace), tmp_path / "minor.arrow", version=f"{major}.99".encode())
    back = arrow.read_arrow(path)
    assert back.format_version == f"{major}.99"
    assert back.sessions == small_trace.sessions


def test_a_version_1_0_file_has_no_explicit_defaults_column(small_trace: Trace, tmp_path: Path) -> None:
    """Files written before version 1.1 lack the column: no request had keys written at their default."""
    table = arrow.to_table(small_trace).drop_columns(["explicit_defaults"])
    back = arrow.read_arrow(write_trace_table(table, tmp_path / "old.arrow", version=b"1.0"))
    requests = [request for session in back.sessions for agent, _, _ in session.agents() for request in agent.requests]
    assert requests and all(request.explicit_defaults == frozenset() for request in requests)
    for session in small_trace.sessions:
        for agent, _, _ in session.agents():
            agent.requests = [msgspec.structs.replace(r, explicit_defaults=frozenset()) for r in agent.requests]
    assert back.sessions == small_trace.sessions


def test_non_agentx_arrow_files_are_refused(tmp_path: Path) -> None:
    table = pa.table({"t": [0.0, 1.0], "in": [1, 2]})
    path = tmp_path / "plain.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert "not an agentx trace table" in _refusal(path)
    parquet = tmp_path / "plain.parquet"
    pq.write_table(table, parquet)
    assert "not an agentx trace table" in _refusal(parquet)


def test_missing_metadata_or_columns_are_refused(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    assert "agentx.format" in _refusal(write_trace_table(table, tmp_path / "a.arrow", format=None))
    assert "not an agentx" in _refusal(write_trace_table(table, tmp_path / "b.arrow", format=b"other"))
    assert "version" in _refusal(write_trace_table(table, tmp_path / "c.arrow", version=b"x.y"))
    assert "metadata is corrupt" in _refusal(write_trace_table(table, tmp_path / "d.arrow", sessions=b"[{"))
    assert "metadata is corrupt" in _refusal(write_trace_table(table, tmp_path / "e.arrow", block_size=b"sixty"))
    assert "accounts for" in _refusal(write_trace_table(table, tmp_path / "f.arrow", sessions=b"[]"))
    dropped = table.drop_columns(["in"])
    assert "lacks column(s) in" in _refusal(write_trace_table(dropped, tmp_path / "g.arrow"))


def test_negative_request_counts_in_metadata_are_refused(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    sessions = json.loads(table.schema.metadata[b"agentx.sessions"])
    # Keep the total but make one count negative: rows would be attributed to the wrong agents.
    sessions[0]["root"]["request_count"] = -1
    sessions[1]["root"]["request_count"] += len(small_trace.sessions[0].root.requests) + 1
    path = write_trace_table(table, tmp_path / "neg.arrow", sessions=json.dumps(sessions).encode())
    assert "metadata is corrupt" in _refusal(path)


def test_invalid_values_are_refused_with_their_row(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    t = table.column("t").to_pylist()
    row = 2
    t[row] = -1.0
    bad = table.set_column(table.schema.get_field_index("t"), arrow.SCHEMA.field("t"), pa.array(t, pa.float64()))
    message = _refusal(write_trace_table(bad, tmp_path / "t.arrow"))
    assert f"{tmp_path / 't.arrow'}:{row + 1}" in message and 'session "A"' in message and f"request {row}" in message
    assert "t is negative" in message


def test_wrong_column_types_and_nulls_are_refused(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    index = table.schema.get_field_index("in")
    as_text = table.set_column(index, "in", pa.array(["x"] * table.num_rows))
    assert 'column "in" has type string' in _refusal(write_trace_table(as_text, tmp_path / "a.arrow"))
    with_null = table.set_column(index, "in", pa.array([None] + [1] * (table.num_rows - 1), pa.int64()))
    assert 'column "in" holds 1 null' in _refusal(write_trace_table(with_null, tmp_path / "b.arrow"))
    added = table.schema.get_field_index("hash_ids_added")
    lists = [[None, *ids] if row == 0 else ids for row, ids in enumerate(table.column(added).to_pylist())]
    null_id = table.set_column(added, "hash_ids_added", pa.array(lists, table.schema.field(added).type))
    assert 'column "hash_ids_added" holds 1 null' in _refusal(write_trace_table(null_id, tmp_path / "n.arrow"))
    # A compatible type (int32 for int64, plain strings for dictionary strings) is converted.
    converted = table.set_column(index, "in", table.column("in").cast(pa.int32()))
    model = table.schema.get_field_index("model")
    converted = converted.set_column(model, "model", table.column("model").cast(pa.string()))
    assert arrow.read_arrow(write_trace_table(converted, tmp_path / "c.arrow")) == small_trace


def test_invalid_utf8_is_refused_not_crashed_on(small_trace: Trace, tmp_path: Path) -> None:
    table = arrow.to_table(small_trace)
    rows = table.num_rows
    offsets = pa.array([2 * i for i in range(rows + 1)], pa.int32()).buffers()[1]
    data = pa.py_buffer(b"\xff\xfe" * rows)  # not UTF-8
    broken = pa.Array.from_buffers(pa.string(), rows, [None, offsets, data])
    bad = table.set_column(table.schema.get_field_index("stop"), "stop", broken)
    assert "not a readable Arrow/Parquet file" in _refusal(write_trace_table(bad, tmp_path / "utf8.arrow"))
    weird = write_trace_table(table, tmp_path / "meta.arrow", version=b"\xff1.0")
    assert "Upgrade" in _refusal(weird)  # an undecodable version is not a version this agentx reads


@pytest.mark.parametrize("depth", [MAX_AGENT_DEPTH + 1, 450, 5000])
def test_absurdly_nested_agents_are_refused(tmp_path: Path, depth: int) -> None:
    # One request, owned by the innermost of `depth` nested subagents (written by hand: the
    # writer itself recurses once per level).
    trace = Trace(
        sessions=[Session(session_id="s", root=Agent(requests=[Request(t=0.0, model="m", in_tokens=1, out_tokens=1)]))],
        block_size=64,
    )
    table = arrow.to_table(trace)
    # The row names its agent as the metadata does, so that only the nesting is wrong.
    for name, value in (("agent_id", f"a{depth}"), ("parent_agent_id", f"a{depth - 1}"), ("agent_depth", depth)):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), pa.array([value], table.schema.field(index).type))
    header = f'{{"agent_id":"a{depth}","t":0.0,"request_count":1}}'
    for level in range(depth - 1, 0, -1):
        header = f'{{"agent_id":"a{level}","t":0.0,"subagents":[{header}]}}'
    sessions = f'[{{"session_id":"s","root":{{"subagents":[{header}]}}}}]'
    path = write_trace_table(table, tmp_path / "deep.arrow", sessions=sessions.encode())
    message = _refusal(path)
    # Within msgspec's nesting limit the depth cap speaks; beyond it, the metadata cannot be decoded.
    expected = f"nest deeper than {MAX_AGENT_DEPTH} levels" if depth < 1000 else "metadata is corrupt"
    assert expected in message


def test_findings_receive_warnings(small_trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    arrow.write_arrow(small_trace, path)
    findings = Findings()
    arrow.read_arrow(path, findings=findings)
    # Subagent "d" never ran: a warning, located on its session and agent.
    assert any(f.severity == "warning" and f.agent == "d" and f.session == "A" for f in findings.items)
    assert all(f.severity == "warning" for f in findings.items)


def test_corrupt_parquet_page_is_one_paragraph(small_trace: Trace, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    arrow.write_parquet(small_trace, path)
    data = bytearray(path.read_bytes())
    data[4] ^= 0xFF  # the first page header, right after the magic: pyarrow's message spans lines
    path.write_bytes(bytes(data))
    message = _refusal(path)  # checks: one line, names the file
    assert "cannot read the file" in message or "not a readable" in message


def test_unreadable_files(tmp_path: Path) -> None:
    garbage = tmp_path / "g.arrow"
    garbage.write_bytes(b"ARROW1\x00\x00not really")
    assert "not a readable Arrow/Parquet file" in _refusal(garbage)
    empty = tmp_path / "e.arrow"
    empty.write_bytes(b"")
    assert "not a readable" in _refusal(empty)


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_leaves_the_garbage_collector_as_it_found_it(enabled: bool, tmp_path: Path) -> None:
    import gc

    path = tmp_path / "t.arrow"
    save_trace(Trace(sessions=[Session(session_id="s", root=Agent(requests=[]))], block_size=16), path)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        load_trace(path)
        assert gc.isenabled() is enabled
        bad = tmp_path / "bad.arrow"
        bad.write_bytes(b"ARROW1 but not really")
        with pytest.raises(TraceError):
            load_trace(bad, format="arrow")  # fails while loading: the collector is still restored
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_file_of_several_batches_keeps_each_rows_content_kinds(tmp_path: Path) -> None:
    """The native file is written `BATCH_ROWS` rows a batch, each batch's strings numbered by its own dictionary: the
    rows of a later batch read back their own kinds, not those of the first batch's numbers."""
    kinds = [("text",), ("tool_result",), ("text", "tool_result")]
    rows = arrow.BATCH_ROWS + 100
    sessions = [
        Session(
            session_id=f"s{index}",
            root=Agent(
                requests=[
                    Request(
                        t=0.0,
                        model="m",
                        in_tokens=1,
                        out_tokens=1,
                        # The first batch holds only the first kind; the second begins with the others.
                        input_types=kinds[0] if index < arrow.BATCH_ROWS else kinds[1 + index % 2],
                        output_types=("tool_use",) if index >= arrow.BATCH_ROWS else (),
                    )
                ]
            ),
        )
        for index in range(rows)
    ]
    trace = Trace(sessions=sessions, block_size=16)
    save_trace(trace, tmp_path / "t.arrow")
    with ipc.open_file(tmp_path / "t.arrow") as reader:
        assert reader.num_record_batches == 2
    assert load_trace(tmp_path / "t.arrow").sessions == sessions
