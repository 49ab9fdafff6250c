"""AIPerf-compatible exports (agentx/results/export.py) and the `agentx export` command.

The compatibility test reimplements InferenceX's aggregation (docs/agentx.md §7) over nothing but our
`profile_export.jsonl` and checks it reproduces `agentx.results.summary.summarize` for the same run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import record_identity

from agentx.cli import main
from agentx.replay.engine import ReplayOptions
from agentx.replay.records import META_EPOCH, META_FORMAT, META_RUN, META_RUN_ID, META_VERSION, SCHEMA, RequestRecord
from agentx.replay.records import read_records as read_records_file
from agentx.results.export import (
    JSONL_FILE,
    SUMMARY_FILE,
    ExportError,
    aiperf_jsonl_lines,
    aiperf_summary,
    export_run,
)
from agentx.results.summary import Summary, summarize
from agentx.run import RUN_FILE, replay_sync
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

BLOCK = 16
MS = 1_000_000
S = 1_000_000_000
EPOCH_NS = 1_700_000_000_000_000_000
REL = 1e-9


# ---------------------------------------------------------------------------------------------
# InferenceX's aggregation (process_agentic_result.py, docs/agentx.md §7), reading only profile_export.jsonl


def ix_percentile(values: list[float], p: float) -> float:
    data = sorted(values)
    k = (len(data) - 1) * p / 100
    f = math.floor(k)
    if f + 1 >= len(data):
        return data[f]
    return data[f] + (k - f) * (data[f + 1] - data[f])


def ix_stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    result = {"mean": statistics.fmean(values), "std": statistics.pstdev(values)}
    for p in (50, 75, 90, 95):
        result[f"p{p}"] = ix_percentile(values, p)
    return result


def inferencex_aggregate(lines: Iterable[bytes]) -> dict[str, Any]:
    documents = [msgspec.json.decode(line) for line in lines]
    kept = [d for d in documents if not d["error"] and d["metadata"].get("benchmark_phase", "profiling") == "profiling"]

    def seconds(tag: str) -> list[float]:
        values = [d["metrics"][tag]["value"] / 1000 for d in kept if tag in d["metrics"]]
        return [v for v in values if math.isfinite(v) and v > 0]

    itl = seconds("inter_token_latency")
    itl_stats = ix_stats(itl)
    result: dict[str, Any] = {
        "kept": len(kept),
        "ttft": ix_stats(seconds("time_to_first_token")),
        "e2el": ix_stats(seconds("request_latency")),
        "itl": itl_stats,
        "intvty": None,
        "tput": None,
    }
    if itl_stats is not None:
        intvty = {key: 1 / value for key, value in itl_stats.items() if key != "std"}
        intvty["std"] = statistics.pstdev([1 / v for v in itl])
        result["intvty"] = intvty
    if kept:
        start = min(d["metadata"]["request_start_ns"] for d in kept)
        end = max(d["metadata"]["request_end_ns"] for d in kept)
        duration = (end - start) / 1e9
        isl = sum(d["metrics"]["input_sequence_length"]["value"] for d in kept)
        osl = sum(d["metrics"]["output_sequence_length"]["value"] for d in kept)
        if duration > 0:
            result["tput"] = {
                "duration": duration,
                "input_tput_tps": isl / duration,
                "output_tput_tps": osl / duration,
                "total_tput_tps": (isl + osl) / duration,
            }
    return result


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def assert_matches_summary(aggregate: dict[str, Any], summary: Summary) -> None:
    assert aggregate["kept"] == summary.counts.kept
    latency = summary.latency
    for key, ours in (("ttft", latency.ttft_s), ("e2el", latency.e2e_s), ("itl", latency.itl_s)):
        theirs = aggregate[key]
        assert (theirs is None) == (ours is None), key
        if theirs is not None and ours is not None:
            for stat in ("mean", "p50", "p75", "p90", "p95", "std"):
                assert close(theirs[stat], getattr(ours, stat)), (key, stat, theirs[stat], getattr(ours, stat))
    interactivity = latency.interactivity_tps
    assert (aggregate["intvty"] is None) == (interactivity is None)
    if interactivity is not None:
        for stat in ("mean", "p50", "p75", "p90", "p95", "std"):
            assert close(aggregate["intvty"][stat], getattr(interactivity, stat)), stat
    throughput = summary.throughput
    assert (aggregate["tput"] is None) == (throughput is None)
    if throughput is not None:
        tput = aggregate["tput"]
        assert close(tput["duration"], throughput.duration_s)
        assert close(tput["input_tput_tps"], throughput.input_tps)
        assert close(tput["output_tput_tps"], throughput.output_tps)
        assert close(tput["total_tput_tps"], throughput.total_tps)


# ---------------------------------------------------------------------------------------------
# a real run against the simulator (with injected 500s and connection resets)


def _req(t: float, in_tokens: int, out: int, kept: int, added: tuple[int, ...]) -> Request:
    return Request(
        t=t, model="m", in_tokens=in_tokens, out_tokens=out, api_time=0.5, hash_ids_kept=kept, hash_ids_added=added
    )


def _chain(start: float, n: int, *, out: int, base_id: int = 0) -> list[Request]:
    requests: list[Request] = []
    kept = 0
    for i in range(n):
        in_tokens = 40 + 37 * i
        blocks = -(-in_tokens // BLOCK)
        requests.append(_req(start + i, in_tokens, out + 3 * i, kept, tuple(range(base_id + kept, base_id + blocks))))
        kept = blocks
    return requests


def _trace() -> Trace:
    sessions = []
    for n in range(4):
        sub = Agent(agent_id="sub", spawn_after=1, t=1.0, requests=_chain(1.0, 3, out=20, base_id=1000))
        root = Agent(requests=_chain(0.0, 5, out=12), subagents=[sub])
        sessions.append(Session(session_id=f"s{n}", root=root))
    return Trace(sessions=sessions, block_size=BLOCK)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    faults = FaultConfig(error_500_rate=0.1, reset_rate=0.1, reset_after_chunks=2, seed=7)
    out = tmp_path_factory.mktemp("run")
    with SimServer(time_scale=0.01, block_size=BLOCK, faults=faults) as sim:
        options = ReplayOptions(
            mode="closed",
            url=sim.url,
            model=sim.model,
            out_dir=out,
            concurrency=2,
            delay_scale=0.01,
            grace_s=5.0,
            stream_usage="continuous",
            headers=(("X-Secret-Header", "do-not-export"),),
            api_key="sk-doNotExport123456",
        )
        result = replay_sync(_trace(), options)
    assert result.run.requests == _trace().request_count
    return out


def test_inferencex_aggregation_of_the_jsonl_equals_our_summary(run_dir: Path) -> None:
    path = export_run(run_dir, "aiperf-jsonl")
    assert path == run_dir / JSONL_FILE
    records = read_records_file(run_dir / "records.arrow")
    summary = summarize(records)
    assert summary.counts.kept > 10 and summary.counts.errors > 0  # the faults made both kinds
    with open(path, "rb") as lines:
        aggregate = inferencex_aggregate(lines)
    assert_matches_summary(aggregate, summary)
    # run.json's summary is the same one.
    stored = msgspec.json.decode((run_dir / RUN_FILE).read_bytes())["summary"]
    assert close(stored["latency"]["ttft_s"]["p90"], aggregate["ttft"]["p90"])


def test_real_run_jsonl_rows_and_no_secrets(run_dir: Path) -> None:
    path = export_run(run_dir, "aiperf-jsonl", run_dir / "elsewhere.jsonl")
    raw = path.read_bytes()
    assert b"do-not-export" not in raw and b"sk-doNotExport" not in raw and b"X-Secret-Header" not in raw
    documents = [msgspec.json.decode(line) for line in raw.splitlines()]
    table = read_records_file(run_dir / "records.arrow")
    assert len(documents) == table.num_rows
    conversations = {d["metadata"]["conversation_id"] for d in documents}
    assert {"s0", "s0::sa:sub"} <= conversations
    for document in documents:
        meta = document["metadata"]
        assert meta["request_start_ns"] <= meta["request_end_ns"]
        assert meta["x_correlation_id"] and meta["root_correlation_id"] == meta["x_correlation_id"]
        assert (meta["agent_depth"] > 0) == ("::sa:" in meta["conversation_id"])
        if document["error"] is not None:
            assert document["error"]["type"] in ("http", "connection", "protocol", "timeout")


def test_real_run_summary_file(run_dir: Path) -> None:
    path = export_run(run_dir, "aiperf-summary")
    assert path == run_dir / SUMMARY_FILE
    document = msgspec.json.decode(path.read_bytes())
    summary = summarize(read_records_file(run_dir / "records.arrow"))
    assert summary.latency.ttft_s is not None and summary.throughput is not None
    ttft = document["time_to_first_token"]
    assert ttft["unit"] == "ms" and ttft["count"] == summary.latency.ttft_s.count
    for stat, ours in (("avg", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("std", "std")):
        assert close(ttft[stat], 1000 * getattr(summary.latency.ttft_s, ours)), stat
    assert document["request_count"]["avg"] == summary.counts.kept
    assert document["error_request_count"]["avg"] == summary.counts.errors + summary.counts.cancelled
    assert close(document["benchmark_duration"]["avg"], summary.throughput.duration_s)
    assert close(document["output_token_throughput"]["avg"], summary.throughput.output_tps)
    hit = document["theoretical_prefix_cache_hit"]
    assert summary.cache.theoretical_hit_rate is not None
    assert close(hit["sum"] / hit["count"], summary.cache.theoretical_hit_rate)
    assert close(hit["avg"], 100 * summary.cache.theoretical_hit_rate)
    # A short closed-loop run breaks the scenario's locks: recorded as such, the only reason.
    assert document["metadata"]["submission_valid"] is False
    assert document["metadata"]["submission_invalid_reasons"] == ["unsafe_override"]
    assert b"do-not-export" not in path.read_bytes()


# ---------------------------------------------------------------------------------------------
# hand-built records


def rec(**overrides: Any) -> RequestRecord:
    """A successful profiling request: sent at 1 s, first token at 1.1 s, 11 tokens until 1.6 s, end 1.7 s."""
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "correlation_id": "corr-0",
        "scheduled_ns": 1 * S - 5 * MS,
        "sent_ns": 1 * S,
        "first_token_ns": 1 * S + 100 * MS,
        "last_token_ns": 1 * S + 600 * MS,
        "end_ns": 1 * S + 700 * MS,
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 100,
        "osl_recorded_tokens": 11,
        "osl_streamed_tokens": 11,
        "cached_tokens": 64,
    }
    values.update(overrides)
    return RequestRecord(**values)


def failed(kind: str, **overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "status": "error",
        "error_kind": kind,
        "first_token_ns": None,
        "last_token_ns": None,
        "osl_streamed_tokens": 0,
    }
    values.update(overrides)
    return rec(**values)


def table(records: list[RequestRecord]) -> pa.Table:
    metadata = {
        META_FORMAT: b"agentx-records",
        META_VERSION: b"1.2",
        META_RUN_ID: b"run-1",
        META_EPOCH: str(EPOCH_NS).encode(),
        META_RUN: b'{"headers": {"Authorization": "[redacted]"}}',
    }
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA.with_metadata(metadata))


def decoded(records: list[RequestRecord]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in aiperf_jsonl_lines(table(records))]


def test_one_row_per_record_with_wall_clock_times_and_ms_metrics() -> None:
    (row,) = decoded([rec()])
    meta = row["metadata"]
    assert meta["request_start_ns"] == EPOCH_NS + S
    assert meta["credit_issued_ns"] == EPOCH_NS + S - 5 * MS
    assert meta["request_ack_ns"] == EPOCH_NS + S + 100 * MS
    assert meta["request_end_ns"] == EPOCH_NS + S + 700 * MS
    assert meta["benchmark_phase"] == "profiling" and meta["was_cancelled"] is False
    assert meta["cancellation_time_ns"] is None
    assert meta["conversation_id"] == "s" and meta["turn_index"] == 0 and meta["agent_depth"] == 0
    assert meta["x_request_id"] == "run-1:0" and meta["session_num"] == 0
    assert meta["parent_correlation_id"] is None
    metrics = row["metrics"]
    assert metrics["time_to_first_token"] == {"value": pytest.approx(100.0), "unit": "ms"}
    assert metrics["request_latency"]["value"] == pytest.approx(600.0)
    assert metrics["inter_token_latency"]["value"] == pytest.approx(50.0)
    assert metrics["input_sequence_length"] == {"value": 100, "unit": "tokens"}
    assert metrics["output_sequence_length"] == {"value": 11, "unit": "tokens"}
    assert metrics["usage_prompt_cache_read_tokens"] == {"value": 64, "unit": "tokens"}
    assert row["error"] is None


def test_warmup_rows_are_exported_and_left_out_by_the_aggregation() -> None:
    records = [rec(phase="warmup", sent_ns=0, first_token_ns=50 * MS, last_token_ns=60 * MS, end_ns=70 * MS), rec()]
    rows = decoded(records)
    assert [r["metadata"]["benchmark_phase"] for r in rows] == ["warmup", "profiling"]
    aggregate = inferencex_aggregate(aiperf_jsonl_lines(table(records)))
    assert aggregate["kept"] == 1 and aggregate["ttft"]["mean"] == pytest.approx(0.1)
    assert_matches_summary(aggregate, summarize(table(records)))


def test_errors_carry_an_error_object_and_cancellations_are_flagged() -> None:
    http = failed("http", http_status=500, error_message="upstream failed, Bearer abcdefghijkl")
    cancelled = failed("cancelled", first_token_ns=1 * S + 100 * MS, end_ns=9 * S, error_message="cancelled")
    rows = decoded([http, cancelled])
    error = rows[0]["error"]
    assert error["code"] == 500 and error["type"] == "http"
    assert "abcdefghijkl" not in error["message"] and "[redacted]" in error["message"]
    assert rows[0]["metadata"]["was_cancelled"] is False
    assert rows[1]["error"]["type"] == "cancelled"
    assert rows[1]["metadata"]["was_cancelled"] is True
    assert rows[1]["metadata"]["cancellation_time_ns"] == EPOCH_NS + 9 * S
    assert "output_sequence_length" not in rows[0]["metrics"]
    assert inferencex_aggregate(aiperf_jsonl_lines(table([http, cancelled])))["kept"] == 0


def test_subagent_conversation_ids_and_session_numbers() -> None:
    rows = decoded(
        [
            rec(),
            rec(agent_id="explore", depth=1, turn=2),
            rec(turn=1),
            rec(play=1, correlation_id="corr-1"),
        ]
    )
    assert [r["metadata"]["conversation_id"] for r in rows] == ["s", "s::sa:explore", "s", "s"]
    assert [r["metadata"]["session_num"] for r in rows] == [0, 1, 0, 2]
    assert [r["metadata"]["request_num"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["metadata"]["parent_correlation_id"] == "corr-0"
    assert rows[3]["metadata"]["x_correlation_id"] == "corr-1"


def test_summary_document_counts_and_units() -> None:
    records = [
        rec(theoretical_hit_blocks=3, theoretical_total_blocks=4),
        rec(sent_ns=2 * S, first_token_ns=2 * S + 300 * MS, last_token_ns=2 * S + 800 * MS, end_ns=3 * S),
        failed("context_overflow"),
        rec(phase="warmup", theoretical_hit_blocks=0, theoretical_total_blocks=100),
    ]
    document = aiperf_summary(table(records), {"options": {}, "run": {"interrupted": False}})
    assert document["request_count"] == {"avg": 2, "unit": "requests"}
    assert document["error_request_count"]["avg"] == 1
    assert document["time_to_first_token"]["count"] == 2
    assert document["time_to_first_token"]["avg"] == pytest.approx(200.0)
    assert document["time_to_first_token"]["sum"] == pytest.approx(400.0)
    assert document["benchmark_duration"] == {"avg": 2.0, "unit": "sec"}
    assert document["theoretical_prefix_cache_hit"] == {"avg": 75.0, "sum": 3, "count": 4, "unit": "%"}
    assert document["metadata"]["submission_valid"] is False  # 1 overflow in 3 requests
    assert document["metadata"]["submission_invalid_reasons"] == ["context_overflow_rate_exceeded"]
    assert "Authorization" not in msgspec.json.encode(document).decode()


def test_summary_of_an_empty_run() -> None:
    document = aiperf_summary(table([]), None)
    assert document["request_count"]["avg"] == 0 and "benchmark_duration" not in document
    assert document["metadata"]["submission_invalid_reasons"] == ["run_cancelled"]  # no run.json


def _records() -> st.SearchStrategy[RequestRecord]:
    def build(
        phase: str, kind: str | None, sent_ms: int, ttft_ms: int, decode_ms: int, osl: int, server: bool
    ) -> RequestRecord:
        sent = sent_ms * MS
        first = sent + ttft_ms * MS
        last = first + decode_ms * MS
        fields: dict[str, Any] = {
            "phase": phase,
            "sent_ns": sent,
            "scheduled_ns": sent,
            "first_token_ns": first,
            "last_token_ns": last,
            "end_ns": last + MS,
            "osl_streamed_tokens": osl,
            "osl_server_tokens": osl + 1 if server else None,
            "isl_server_tokens": 120 if server else None,
        }
        if kind is not None:
            return failed(kind, **{k: v for k, v in fields.items() if "token_ns" not in k and "osl" not in k})
        return rec(**fields)

    return st.builds(
        build,
        st.sampled_from(["profiling", "profiling", "warmup"]),
        st.sampled_from([None, None, None, "http", "cancelled", "context_overflow"]),
        st.integers(0, 100_000),
        st.integers(0, 5_000),
        st.integers(0, 20_000),
        st.integers(0, 400),
        st.booleans(),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_records(), max_size=40))
def test_inferencex_aggregation_equals_summary_on_any_records(records: list[RequestRecord]) -> None:
    records_table = table(records)
    aggregate = inferencex_aggregate(aiperf_jsonl_lines(records_table))
    assert_matches_summary(aggregate, summarize(records_table))


# ---------------------------------------------------------------------------------------------
# the command


def _write_run(directory: Path, records: list[RequestRecord]) -> Path:
    from agentx.replay.records import RecordWriter, RunInfo

    directory.mkdir(parents=True, exist_ok=True)
    with RecordWriter(directory / "records.arrow", RunInfo(run_id="run-1", wall_epoch_ns=EPOCH_NS)) as writer:
        for record in records:
            writer.append(record)
    return directory


def test_cli_export_writes_both_files_and_says_where(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", [rec(), failed("http", http_status=503)])
    (run / RUN_FILE).write_bytes(msgspec.json.encode({"options": {}, "run": {"interrupted": False}, "summary": {}}))
    result = CliRunner().invoke(main, ["export", str(run), "--format", "aiperf-jsonl"])
    assert result.exit_code == 0, result.output
    assert str(run / JSONL_FILE) in result.output
    assert len((run / JSONL_FILE).read_bytes().splitlines()) == 2
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = CliRunner().invoke(main, ["export", str(run), "--format", "aiperf-summary", "--out", str(out_dir)])
    assert result.exit_code == 0, result.output
    assert str(out_dir / SUMMARY_FILE) in result.output and "submission_valid: true" in result.output


def _assert_clean_failure(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert expected in result.output


def test_cli_export_refuses_a_missing_or_unreadable_run_dir(tmp_path: Path) -> None:
    _assert_clean_failure(["export", str(tmp_path / "nope"), "--format", "aiperf-jsonl"], "no such run directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_clean_failure(["export", str(empty), "--format", "aiperf-jsonl"], "has no records.arrow")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "records.arrow").write_bytes(b"not arrow at all")
    _assert_clean_failure(["export", str(garbage), "--format", "aiperf-summary"], "error:")
    bad_run = _write_run(tmp_path / "badrun", [rec()])
    (bad_run / RUN_FILE).write_bytes(b"{truncated")
    _assert_clean_failure(["export", str(bad_run), "--format", "aiperf-summary"], "cannot read the run file")
    result = CliRunner().invoke(main, ["export", str(bad_run)])
    assert result.exit_code == 2  # --format is required (click's usage error)


def test_export_run_refuses_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown export format"):
        export_run(_write_run(tmp_path / "run", [rec()]), "csv")
    with pytest.raises(ExportError):
        export_run(tmp_path / "missing", "aiperf-jsonl")
