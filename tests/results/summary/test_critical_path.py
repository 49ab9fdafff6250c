"""Where a session's time goes (agentx.results.summary.explain.critical_path): each play's critical path through its
subagent DAG, and its makespan split into server time, think, join waits, client lag and the idle caps' cuts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.ipc
import pytest
from builders import make_agent, make_request, make_session, make_trace
from flat import replay_options
from hypothesis import given
from hypothesis import strategies as st
from strategies import record_identity

from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import SCHEMA, RequestRecord, read_records, to_records
from agentx.replayer.run_replay import run_replay
from agentx.results.report.plots import on_critical_path
from agentx.results.summary.explain.critical_path import RELEASE_COLUMNS, critical_path, play_paths
from agentx.results.summary.summarize import summarize
from agentx.sim.process import SimServer
from agentx.trace.model import Session

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
S = 1_000_000_000
"""One second in ns."""
SCALE = 0.002
"""The delay scale of the replays: the root's 3.7 s recorded think becomes 7.4 ms, the slow subagent takes longer."""


def _record(
    request_id: str,
    released_by: str,
    scheduled_s: float,
    sent_s: float,
    end_s: float,
    *,
    agent_id: str = "",
    turn: int = 0,
    think_s: float = 0.0,
    idle_cut_s: float = 0.0,
    join_wait_s: float = 0.0,
) -> RequestRecord:
    """A request of play 0 of session "s", its times in seconds."""
    return RequestRecord(
        **record_identity(agent_id=agent_id, depth=1 if agent_id else 0, turn=turn),  # type: ignore[arg-type]
        request_id=request_id,
        released_by_request_id=released_by,
        scheduled_ns=round(scheduled_s * S),
        sent_ns=round(sent_s * S),
        end_ns=round(end_s * S),
        isl_recorded_tokens=10,
        isl_sent_tokens=10,
        osl_recorded_tokens=1,
        think_s=think_s,
        idle_cut_s=idle_cut_s,
        join_wait_s=join_wait_s,
    )


def _table(records: list[RequestRecord]) -> pa.Table:
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA)


def test_a_join_held_by_the_slower_subagent_puts_that_subagent_on_the_path() -> None:
    """The root's turn 0 (0–1 s) spawns two subagents; its turn 1 is due 0.5 s after turn 0 ends, but joins both. The
    slow one ends at 5 s and releases it: the path runs through it, and the 3.5 s past the root's own due are the
    join's wait, taken out of what the slow subagent did meanwhile."""
    own_due_s, slow_sent_s, slow_end_s = 1.5, 1.001, 5.0
    records = [
        _record("t0", "", 0.0, 0.0, 1.0),
        _record("fast", "t0", 1.0, 1.0005, 2.0, agent_id="fast"),
        _record("slow", "t0", 1.0, slow_sent_s, slow_end_s, agent_id="slow"),
        _record("t1", "slow", slow_end_s, 5.002, 6.0, turn=1, join_wait_s=slow_end_s - own_due_s),
    ]
    (path,) = play_paths(_table(records)) or []
    assert path.request_ids == ["t0", "slow", "t1"]
    parts = path.parts
    assert path.makespan_s == 6.0
    assert parts.join_wait_s == pytest.approx(slow_end_s - own_due_s, abs=1e-9)
    # Server time: turn 0, the slow subagent up to the root's own due, turn 1.
    assert parts.server_s == pytest.approx(1.0 + (own_due_s - slow_sent_s) + (6.0 - 5.002), abs=1e-9)
    assert parts.client_lag_s == pytest.approx((slow_sent_s - 1.0) + (5.002 - slow_end_s), abs=1e-9)
    assert parts.think_s == parts.idle_cut_s == 0.0
    assert parts.total_s() == pytest.approx(path.makespan_s, abs=1e-9)


def test_a_think_the_idle_caps_shortened_is_credited() -> None:
    """Three turns of one agent, 2 s of think before each later one; the caps cut 1.5 s of the second's."""
    records = [
        _record("a", "", 0.0, 0.0, 1.0),
        _record("b", "a", 3.0, 3.0, 4.0, turn=1, think_s=2.0),
        _record("c", "b", 4.5, 4.5, 5.0, turn=2, think_s=2.0, idle_cut_s=1.5),
    ]
    summary = critical_path(_table(records))
    assert summary is not None and summary.plays == 1
    parts = summary.parts
    assert (parts.server_s, parts.think_s, parts.idle_cut_s, parts.join_wait_s) == pytest.approx((2.5, 4.0, 1.5, 0.0))
    assert summary.makespan_s == 5.0 and parts.total_s() == pytest.approx(5.0)
    assert summary.shares.total_s() == pytest.approx(1.0)


@st.composite
def _plays(draw: st.DrawFn) -> list[RequestRecord]:
    """Requests of a few plays with any times and any releases, consistent or not: the split must still add up."""
    records: list[RequestRecord] = []
    for index in range(draw(st.integers(1, 12))):
        scheduled = draw(st.integers(0, 10_000)) / 1000
        sent = scheduled + draw(st.integers(0, 500)) / 1000
        end = sent + draw(st.integers(0, 3000)) / 1000
        released_by = draw(st.sampled_from(["", *(r.request_id for r in records)]))
        record = _record(
            f"r{index}",
            released_by,
            scheduled,
            sent,
            end,
            turn=index,
            think_s=draw(st.integers(0, 5000)) / 1000,
            idle_cut_s=draw(st.integers(0, 2000)) / 1000,
            join_wait_s=draw(st.integers(0, 3000)) / 1000,
        )
        records.append(msgspec.structs.replace(record, play=draw(st.integers(0, 2))))
    return records


@given(_plays())
def test_every_plays_parts_add_up_to_its_makespan_whatever_the_records_say(records: list[RequestRecord]) -> None:
    paths = play_paths(_table(records)) or []
    assert sorted(path.play for path in paths) == sorted({r.play for r in records})
    for path in paths:
        play = [r for r in records if r.play == path.play]
        assert path.makespan_s == (max(r.end_ns for r in play) - min(r.sent_ns for r in play)) / 1e9
        parts = path.parts
        assert min(parts.server_s, parts.think_s, parts.join_wait_s, parts.idle_cut_s, parts.client_lag_s) >= 0
        assert parts.total_s() == pytest.approx(path.makespan_s, rel=0, abs=1e-9)
        last = next(r for r in play if r.request_id == path.request_ids[-1])
        assert last.end_ns == max(r.end_ns for r in play)


def test_a_records_file_without_the_release_columns_gives_none(tmp_path: Path) -> None:
    """A records file of format 1.10 says nothing of what released each request: no analysis, no error."""
    records = [_record("a", "", 0.0, 0.0, 1.0), _record("b", "a", 1.0, 1.0, 2.0, turn=1)]
    assert critical_path(_table(records)) is not None
    newer = ("seen_any_scope_blocks", "lru_hit_blocks", *RELEASE_COLUMNS)
    metadata = {b"agentx.format": b"agentx-records", b"agentx.version": b"1.10", b"agentx.run_id": b"run-1"}
    older = _table(records).drop_columns(list(newer)).replace_schema_metadata(metadata)
    path = tmp_path / "records.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, older.schema) as writer:
        writer.write_table(older)
    table = read_records(path)
    assert not set(newer) & set(table.column_names)
    assert play_paths(table) is None and critical_path(table) is None
    summary = summarize(table)
    assert summary.critical_path is None and summary.cache_misses is None and summary.counts.kept == 2


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK, max_model_len=2048) as server:
        yield server


def _fan_out(session_id: str) -> Session:
    """Turn 0, then a fast and a slow subagent spawned together, both joined by turn 1 (3.7 s recorded after turn 0's
    end), then turn 2 one second after turn 1."""
    fast = make_request(1.0, 64, 4, api_time=0.5, added=(100, 101, 102, 103))
    slow = make_request(1.0, 64, 200, api_time=3.0, added=(200, 201, 202, 203))
    turns = [
        make_request(0.0, 48, 8, api_time=0.5, added=(0, 1, 2)),
        make_request(4.2, 80, 8, api_time=0.5, kept=3, added=(3, 4)),
        make_request(5.7, 96, 8, api_time=0.5, kept=5, added=(5,)),
    ]
    subagents = [make_agent("fast", [fast], spawn_after=1, t=1.0), make_agent("slow", [slow], spawn_after=1, t=1.0)]
    return make_session(session_id, turns, subagents=subagents)


def test_on_a_replay_every_play_splits_exactly_and_its_join_goes_through_the_slower_subagent(
    sim: SimServer, tmp_path: Path
) -> None:
    trace = make_trace(_fan_out("a"), _fan_out("b"), block_size=BLOCK, hash_id_scope="session")
    options = replay_options(
        mode="closed",
        url=sim.url,
        model=sim.model,
        out_dir=tmp_path,
        concurrency=2,
        sessions=4,
        delay_scale=SCALE,
        split_flattened_agents=False,
    )
    result = asyncio.run(run_replay(trace, options))
    table = read_records(result.records_path)
    records = to_records(table)
    assert len(records) == 4 * 5 and all(r.status == "ok" for r in records)
    by_id = {r.request_id: r for r in records}

    # The records say what released each request: its due time is that release plus the think applied.
    for record in records:
        if record.released_by_request_id:
            releaser = by_id[record.released_by_request_id]
            assert record.think_s is not None and record.idle_cut_s is not None
            release_ns = record.scheduled_ns - round(record.think_s * 1e9) + round(record.idle_cut_s * 1e9)
            assert release_ns == releaser.end_ns, record

    paths = play_paths(table)
    assert paths is not None and sorted(p.play for p in paths) == [0, 1, 2, 3]
    for path in paths:
        play = [r for r in records if r.play == path.play]
        makespan_ns = max(r.end_ns for r in play) - min(r.sent_ns for r in play)
        assert path.makespan_s == makespan_ns / 1e9
        assert path.parts.total_s() == pytest.approx(path.makespan_s, rel=0, abs=1e-9)
        on_path = [by_id[request_id] for request_id in path.request_ids]
        assert [(r.agent_id, r.turn) for r in on_path] == [("", 0), ("slow", 0), ("", 1), ("", 2)]
        join = on_path[2]
        turn0 = on_path[0]
        # The join waited for the slow subagent past its own due: turn 0's end plus its scaled recorded think.
        own_due_ns = turn0.end_ns + int((4.2 - 0.5) * SCALE * 1e9)
        assert join.scheduled_ns == on_path[1].end_ns > own_due_ns
        assert path.parts.join_wait_s == pytest.approx((join.scheduled_ns - own_due_ns) / 1e9, abs=2e-9)
        assert path.parts.think_s == pytest.approx(on_path[3].think_s, abs=1e-9)  # turn 2's, the path's only one

    summary = summarize(table)
    assert summary.critical_path is not None and summary.critical_path.plays == 4
    assert summary.critical_path.parts.total_s() == pytest.approx(summary.critical_path.makespan_s, abs=1e-8)
    (shown,) = [t for t in summary_table(summary) if t.title == "where the plays' time went (critical path)"]
    waiting = next(row for row in shown.rows if row[0] == "waiting on joins")
    assert float(waiting[1]) > 0
    assert float(waiting[1]) == pytest.approx(summary.critical_path.parts.join_wait_s, abs=5e-4)
    # The swimlanes mark exactly the path's requests.
    marked = on_critical_path(table)
    assert marked is not None
    ids = table.column("request_id").to_pylist()
    assert {ids[i] for i in range(len(ids)) if marked[i]} == {i for p in paths for i in p.request_ids}


def test_an_idle_cap_cut_shows_in_the_records_and_the_split_still_adds_up(sim: SimServer, tmp_path: Path) -> None:
    """A 20 s recorded think at delay scale 0.01 (0.2 s) under a 10 ms system idle cap: the caps cut most of it."""
    turns = [
        make_request(0.0, 32, 4, api_time=0.5, added=(0, 1)),
        make_request(20.5, 48, 4, api_time=0.5, kept=2, added=(2,)),
    ]
    trace = make_trace(make_session("s", turns), block_size=BLOCK)
    options = replay_options(
        mode="closed", url=sim.url, model=sim.model, out_dir=tmp_path, delay_scale=0.01, system_idle_cap_s=0.01
    )
    table = read_records(asyncio.run(run_replay(trace, options)).records_path)
    first, second = sorted(to_records(table), key=lambda r: r.turn)
    assert second.think_s is not None and second.idle_cut_s is not None
    assert second.think_s == pytest.approx(0.2) and 0.15 < second.idle_cut_s <= 0.2
    assert second.scheduled_ns - first.end_ns == round(second.think_s * 1e9) - round(second.idle_cut_s * 1e9)
    (path,) = play_paths(table) or []
    assert path.parts.idle_cut_s == pytest.approx(second.idle_cut_s, abs=1e-9)
    assert path.parts.think_s == pytest.approx(0.2, abs=1e-9)
    assert path.parts.total_s() == pytest.approx(path.makespan_s, abs=1e-9)
