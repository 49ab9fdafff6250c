"""TraceLab round JSONL: the public examples (skipped cleanly when ../shared/data is absent), files the tests write
(gzip, subagent threads, repeated threads, rows out of order), errors naming file and line, and the hash-id rule."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import SHARED_DATA
from strategies import examples

from agentx.errors import TraceError
from agentx.trace.findings import Findings
from agentx.trace.formats.cached_prefix import CachedPrefixIds, shared_blocks
from agentx.trace.io import detect_format, load_trace, save_trace
from agentx.trace.model import Agent, Trace
from agentx.trace.stats import prefix_cache_hits
from agentx.trace.validation import validate

EXAMPLES = SHARED_DATA / "tracelab"
SHAPES = ("sanitized", "derived")
BLOCK = 64
_T0 = datetime(2026, 6, 1, 5, 40, tzinfo=UTC)


def _example(shape: str) -> Path:
    path = EXAMPLES / shape / "round_trace.jsonl"
    if not path.exists():
        pytest.skip(f"TraceLab's public examples not found at {path} (they are not part of the repository)")
    return path


def _stamp(seconds: float) -> str:
    return (_T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _row(
    session: str, index: int, start_s: float, *, total: int, prefix: int, out: int = 100, **extra: Any
) -> dict[str, Any]:
    """A round whose input arrives at `start_s`, answered 1 s later (a first block at +0.4 s)."""
    events = [
        {"event_type": "tool_result" if index else "user_message", "timestamp": _stamp(start_s)},
        {"event_type": "reasoning", "timestamp": _stamp(start_s + 0.4)},
        {"event_type": "tool_call", "timestamp": _stamp(start_s + 1.0), "tool_name": "Bash"},
    ]
    return {
        "provider": "claude", "session_id": session, "round_index": index, "round_id": f"{session}-{index}",
        "model": "claude-opus-4-8", "input_tokens_total": total, "prefix_tokens": prefix,
        "newly_append_tokens": total - prefix, "output_tokens": out, "timing_events": events, "tools": [], **extra,
    }  # fmt: skip


def _write(path: Path, rows: list[dict[str, Any]], *, compress: bool = False) -> Path:
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def _thread(session: str, start_s: float, rounds: int, *, base: int = 20_000, **extra: Any) -> list[dict[str, Any]]:
    rows = []
    for index in range(rounds):
        total = base + 3_000 * index
        prefix = 0 if index == 0 else base + 3_000 * (index - 1)
        rows.append(_row(session, index, start_s + 10 * index, total=total, prefix=prefix, **extra))
    return rows


def _reuse_blocks(agent: Agent) -> list[int]:
    """Each request's leading ids shared with the agent's previous request (0 for the first)."""
    shared: list[int] = []
    previous: tuple[int, ...] = ()
    for ids in agent.iter_hash_ids():
        shared.append(shared_blocks(previous, ids))
        previous = ids
    return shared


# ---------------------------------------------------------------------------------------------
# the public examples


@pytest.mark.parametrize("shape", SHAPES)
def test_the_public_examples_load_with_each_rounds_reuse_within_a_block_of_the_source(shape: str) -> None:
    path = _example(shape)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert detect_format(path) == "tracelab"
    findings = Findings()
    trace = load_trace(path, findings=findings)
    assert [f.severity for f in findings.items] == ["warning"]  # the answers the provider cached
    assert (trace.block_size, trace.hash_id_scope, trace.provenance.source_format) == (BLOCK, "global", "tracelab")
    assert [len(s.root.requests) for s in trace.sessions] == [10, 9]
    assert [s.session_id for s in trace.sessions] == list(dict.fromkeys(row["session_id"] for row in rows))
    requests = [r for s in trace.sessions for r in s.root.requests]
    assert [r.in_tokens for r in requests] == [row["input_tokens_total"] for row in rows]
    assert [r.out_tokens for r in requests] == [row["output_tokens"] for row in rows]
    assert [r.model for r in requests] == [row["model"] for row in rows]
    for session in trace.sessions:
        session_rows = [row for row in rows if row["session_id"] == session.session_id]
        shared = _reuse_blocks(session.root)
        for index, (row, request) in enumerate(zip(session_rows, session.root.requests, strict=True)):
            assert request.hash_ids_len == -(-row["input_tokens_total"] // BLOCK)
            if index == 0:
                assert request.think_time is None and request.t == 0
                continue
            # The source's reuse as a replay can have it: the cached prefix within the previous prompt.
            reusable = min(row["prefix_tokens"], session_rows[index - 1]["input_tokens_total"])
            assert shared[index] * BLOCK <= max(row["prefix_tokens"], shared[index] * BLOCK)
            assert abs(reusable - shared[index] * BLOCK) < BLOCK, (session.session_id, index)
            assert request.think_time is not None and request.think_time >= 0
            assert request.api_time is not None and request.api_time > 0
            assert request.ttft is not None and 0 < request.ttft <= request.api_time
        assert [r.t for r in session.root.requests] == sorted(r.t for r in session.root.requests)
    # The WebSearch tool of the Claude session's first round took 19.3 s: what its second round waited on.
    assert trace.sessions[0].root.requests[1].think_time == pytest.approx(19.291, abs=1e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_public_examples_convert_to_arrow_and_back(shape: str, tmp_path: Path) -> None:
    trace = load_trace(_example(shape))
    save_trace(trace, tmp_path / "t.arrow")
    again = load_trace(tmp_path / "t.arrow")
    assert again.sessions == trace.sessions
    assert again.block_size == BLOCK and again.hash_id_scope == "global"


# ---------------------------------------------------------------------------------------------
# files the tests write


def test_gzip_and_rows_out_of_order_read_in_round_index_then_file_order(tmp_path: Path) -> None:
    rows = _thread("s", 0, 4)
    path = _write(tmp_path / "t.jsonl.gz", [rows[2], rows[0], rows[3], rows[1]], compress=True)
    trace = load_trace(path)
    (session,) = trace.sessions
    assert [r.in_tokens for r in session.root.requests] == [20_000, 23_000, 26_000, 29_000]
    assert _reuse_blocks(session.root) == [0, 20_000 // BLOCK, 23_000 // BLOCK, 26_000 // BLOCK]
    assert [r.think_time for r in session.root.requests][1:] == pytest.approx([9.0, 9.0, 9.0])
    assert [r.api_time for r in session.root.requests] == pytest.approx([1.0] * 4)
    assert [r.ttft for r in session.root.requests] == pytest.approx([0.4] * 4)
    assert session.root.requests[0].input_types == ("text",)
    assert session.root.requests[1].input_types == ("tool_result",)
    assert session.root.requests[1].output_types == ("thinking", "tool_use")


def test_a_thread_numbered_from_zero_again_inside_its_parents_span_is_a_subagent(tmp_path: Path) -> None:
    parent = _thread("s", 0, 6)
    child = _thread("s", 25, 3, base=8_000)  # starts after the parent's third round (t = 0, 10, 20)
    path = _write(tmp_path / "t.jsonl", parent + child)
    findings = Findings()
    trace = load_trace(path, findings=findings)
    (session,) = trace.sessions
    (sub,) = session.root.subagents
    assert len(session.root.requests) == 6 and len(sub.requests) == 3
    assert sub.spawn_after == 3 and sub.t == pytest.approx(25.0)
    assert sub.duration_ms == 21_000
    assert [r.in_tokens for r in sub.requests] == [8_000, 11_000, 14_000]
    # A subagent's first round draws on its own preamble, not the parent's.
    assert sub.requests[0].hash_ids_added[0] not in set(next(session.root.iter_hash_ids()))
    assert _reuse_blocks(sub) == [0, 8_000 // BLOCK, 11_000 // BLOCK]
    assert findings.items == []


def test_session_file_keys_the_threads_of_derived_rows(tmp_path: Path) -> None:
    # Interleaved in the file, each thread named by its file: the index order alone would mix them up.
    parent = _thread("s", 0, 4, session_file="main.jsonl")
    child = _thread("s", 5, 2, base=8_000, session_file="agent-1.jsonl")
    path = _write(tmp_path / "t.jsonl", [parent[0], child[0], parent[1], child[1], parent[2], parent[3]])
    (session,) = load_trace(path).sessions
    assert [r.in_tokens for r in session.root.requests] == [20_000, 23_000, 26_000, 29_000]
    assert [r.in_tokens for r in session.root.subagents[0].requests] == [8_000, 11_000]


def test_a_thread_ingested_twice_is_kept_once_with_a_warning(tmp_path: Path) -> None:
    rows = _thread("s", 0, 3)
    findings = Findings()
    trace = load_trace(_write(tmp_path / "t.jsonl", rows + rows), findings=findings)
    (session,) = trace.sessions
    assert len(session.root.requests) == 3 and not session.root.subagents
    assert [f.message for f in findings.items] == [
        "3 row(s) repeat another agent's rounds exactly (a session ingested twice): kept once"
    ]


def test_a_thread_no_other_spans_is_a_session_of_its_own_and_first_rounds_share_their_preamble(
    tmp_path: Path,
) -> None:
    first = _thread("s", 0, 2)
    later = [_row("s", index, 500 + 10 * index, total=30_000 + index, prefix=12_800) for index in range(2)]
    other = [_row("t", 0, 900, total=15_000, prefix=6_400)]
    trace = load_trace(_write(tmp_path / "t.jsonl", first + later + other))
    assert [s.session_id for s in trace.sessions] == ["s", "s#2", "t"]
    assert [s.start_s for s in trace.sessions] == pytest.approx([0.0, 500.0, 900.0])
    firsts = [next(s.root.iter_hash_ids()) for s in trace.sessions]
    # A first round shares its cached prefix's whole blocks with the first rounds of its model before it: the first
    # one's prompt wrote what the second found cached.
    assert shared_blocks(firsts[0], firsts[1]) == 12_800 // BLOCK
    assert shared_blocks(firsts[1], firsts[2]) == 6_400 // BLOCK


def test_block_size_overrides_the_default(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path / "t.jsonl", _thread("s", 0, 2)), block_size=16)
    assert trace.block_size == 16
    assert _reuse_blocks(trace.sessions[0].root) == [0, 20_000 // 16]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "JSON is malformed"),
        (json.dumps(_row("s", 1, 5, total=10, prefix=20)).encode(), "prefix_tokens=20 exceeds input_tokens_total=10"),
        (json.dumps(_row("s", 1, 5, total=-1, prefix=0)).encode(), "input_tokens_total=-1 is negative"),
        (json.dumps({**_row("s", 1, 5, total=10, prefix=0), "timing_events": []}).encode(), "no timestamped"),
        (json.dumps({"session_id": "s", "round_index": 1}).encode(), "input_tokens_total"),
    ],
)
def test_a_bad_row_is_one_error_naming_the_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(_row("s", 0, 0, total=100, prefix=0)).encode() + b"\n" + line + b"\n")
    with pytest.raises(TraceError) as raised:
        load_trace(path, format="tracelab")
    text = str(raised.value)
    assert f"{path}:2" in text and message in text
    assert len(raised.value.findings) == 1


def test_a_file_of_blank_lines_says_it_holds_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(TraceError, match="holds no rows"):
        load_trace(path, format="tracelab")


# ---------------------------------------------------------------------------------------------
# the hash-id rule


_ROUNDS = st.lists(
    st.tuples(st.integers(0, 5_000), st.integers(0, 5_000), st.integers(0, 600)), min_size=1, max_size=12
)


@given(rounds=_ROUNDS, block=st.sampled_from([1, 16, 64, 512]))
def test_a_rounds_shared_blocks_are_its_cached_prefix_in_whole_blocks(
    rounds: list[tuple[int, int, int]], block: int
) -> None:
    """Shared blocks never exceed the cached prefix rounded down to blocks, and fall short of it by less than a block
    wherever the previous prompt covers it; beyond the previous prompt they are all of it."""
    ids = CachedPrefixIds(block)
    previous: tuple[int, ...] = ()
    previous_in = 0
    beyond = 0
    sent: set[int] = set()
    for index, (grown, cached_share, _) in enumerate(rounds):
        in_tokens = previous_in + grown if index else grown
        cached = min(in_tokens, cached_share * in_tokens // 5_000 if index else cached_share)
        kept = 0
        if index:
            kept, added = ids.next_round(previous, in_tokens, cached)
            current = previous[:kept] + added
            shared = shared_blocks(previous, current)
            assert shared >= kept
            assert kept * block <= cached
            if cached <= previous_in:
                assert cached - kept * block < block
            else:
                beyond += kept < cached // block
                assert kept == min(cached // block, len(previous))
        else:
            current = ids.first_round("m", in_tokens, cached)
        assert len(current) == -(-in_tokens // block)
        # Every prompt's first new block is one no earlier prompt sent: a leading-run count stops there.
        new = current[kept if index else 0 :]
        if new and index:
            assert new[0] not in sent
        sent.update(current)
        previous, previous_in = current, in_tokens
    assert ids.beyond_previous >= beyond


@given(
    rounds=st.lists(st.tuples(st.integers(1, 4_000), st.integers(0, 4_000)), min_size=2, max_size=6),
    block=st.sampled_from([1, 64]),
)
def test_a_first_round_shares_its_cached_prefix_with_the_first_rounds_before_it(
    rounds: list[tuple[int, int]], block: int
) -> None:
    """As far as they reach: a first round shares `cached // B` blocks with the longest earlier first round, and
    nothing with another preamble's."""
    ids = CachedPrefixIds(block)
    firsts: list[tuple[int, ...]] = []
    for in_tokens, cached_share in rounds:
        cached = min(cached_share, in_tokens)
        current = ids.first_round("m", in_tokens, cached)
        if firsts:
            reach = max(map(len, firsts))
            assert max(shared_blocks(first, current) for first in firsts) == min(cached // block, reach)
        firsts.append(current)
    other = ids.first_round("n", 4_000, 4_000)
    assert all(shared_blocks(other, first) == 0 for first in firsts)


def test_the_trace_built_is_valid_for_the_model(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path / "t.jsonl", _thread("s", 0, 5) + _thread("s", 12, 2, base=5_000)))
    assert isinstance(trace, Trace)
    for agent, parent, _ in trace.sessions[0].agents():
        assert agent.requests[0].hash_ids_kept == 0
        for request in agent.requests:
            assert request.type == "s"
        if parent is not None:
            assert 0 <= agent.spawn_after <= len(parent.requests)


def test_the_traces_own_hit_count_is_each_rounds_shared_prefix(tmp_path: Path) -> None:
    """Blocks numbered from the shared table repeat across rounds and sessions, never after the same prefix: the
    trace's infinite-cache count finds exactly the shared blocks."""
    rows = _thread("s", 0, 5) + _thread("t", 100, 4, base=21_000) + _thread("u", 200, 3, base=19_000)
    trace = load_trace(_write(tmp_path / "t.jsonl", rows))
    hits, _ = prefix_cache_hits(trace, causal=False)
    expected = []
    for session in trace.sessions:
        expected += _reuse_blocks(session.root)
    assert hits.tolist() == expected


# ---------------------------------------------------------------------------------------------
# fuzzing: a mutated file either reads into a valid trace or raises TraceError, in one line


_WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, -1, 10**9, 1 << 63]),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["2026-06-01T05:40:20.151Z", "2026-06-01T05:40:20", "2026-13-01T00:00:00Z", "user_message"]),
    st.lists(st.integers(-2, 2), max_size=2),
    st.builds(dict),
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_file_reads_into_a_valid_trace_or_one_line_of_error(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    rows = _thread("s", 0, 4) + _thread("s", 12, 2, base=5_000) + _thread("t", 50, 2)
    for _ in range(data.draw(st.integers(1, 4))):
        target: dict[str, Any] = data.draw(st.sampled_from(rows))
        listed = target.get("timing_events")
        events = [event for event in listed if isinstance(event, dict) and event] if isinstance(listed, list) else []
        in_an_event: bool = data.draw(st.booleans())
        if events and in_an_event:
            target = data.draw(st.sampled_from(events))
        if not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            del target[key]
        else:
            target[key] = data.draw(_WEIRD)
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if data.draw(st.integers(0, 4)) == 0:
        text = text[: data.draw(st.integers(0, len(text)))]
    path = tmp_path_factory.mktemp("fuzz") / "rows.jsonl"
    path.write_bytes(text)
    try:
        trace = load_trace(path, format="tracelab")
    except TraceError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert [f for f in validate(trace) if f.severity == "error"] == []
