"""`agentx import aiperf` (agentx.results.imports): real artifact folders of agentx-harness 1.0.12 and AIPerf 0.13.0
(tests/fixtures/aiperf_artifacts, made against the simulator) become run folders whose records carry the tools' own
per-request figures and whose summary, report and re-export agree with the tools' own summaries."""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import FIXTURES
from strategies import examples, record_identity

from agentx.cli import main
from agentx.errors import ArtifactError, RunExists
from agentx.records.record import RequestRecord, RunInfo, read_records, run_info, to_records
from agentx.records.writer import RecordWriter
from agentx.results.export.export_run import aiperf_summary, load_run, write_aiperf_jsonl
from agentx.results.folders.run_file import read_run_file
from agentx.results.imports.aiperf_folder import JSONL_FILE, SUMMARY_FILE, ImportedRun, import_aiperf
from agentx.results.imports.aiperf_records import ErrorDetails, error_kind, requested_osl, spread

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

ARTIFACTS = FIXTURES / "aiperf_artifacts"
TOOLS = {"harness_1_0_12": "agentx-harness-1.0.12", "aiperf_0_13_0": "aiperf-0.13.0"}
"""Each fixture folder and the agentx rule set of the tool that wrote it."""
MS = 1_000_000


def _lines(name: str) -> list[dict[str, Any]]:
    text = (ARTIFACTS / name / JSONL_FILE).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _tool_summary(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ARTIFACTS / name / SUMMARY_FILE).read_text())
    return document


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ImportedRun]:
    out = tmp_path_factory.mktemp("imported")
    return {name: import_aiperf(ARTIFACTS / name, out / name) for name in TOOLS}


def _value(line: dict[str, Any], tag: str) -> Any:
    metric = line["metrics"].get(tag)
    return None if metric is None else metric["value"]


# ---------------------------------------------------------------------------------------------
# the records


@pytest.mark.parametrize("name", list(TOOLS))
def test_one_record_per_line_with_the_tools_own_figures(imported: dict[str, ImportedRun], name: str) -> None:
    lines = _lines(name)
    table = read_records(imported[name].run_dir / "records.arrow")
    records = to_records(table)
    assert len(records) == len(lines) == imported[name].run.requests
    epoch = run_info(table).wall_epoch_ns
    for line, record in zip(lines, records, strict=True):
        meta = line["metadata"]
        assert record.phase == meta["benchmark_phase"]
        assert record.request_id == meta["x_request_id"]
        assert record.correlation_id == meta["x_correlation_id"]
        assert record.session_id == meta["source_trace_id"]
        assert (record.session_id + (f"::sa:{record.agent_id}" if record.agent_id else "")) == meta["conversation_id"]
        assert (record.turn, record.depth) == (meta["turn_index"], meta["agent_depth"])
        assert epoch + record.sent_ns == meta["request_start_ns"]
        assert epoch + record.scheduled_ns == meta["credit_issued_ns"]
        assert epoch + record.end_ns == meta["request_end_ns"]
        assert record.scheduled_ns >= 0 and record.sent_ns >= 0
        assert record.model == "agentx-sim"
        if line.get("error"):
            assert record.status == "error" and record.ttft_s is None and record.chunk_times_ns == []
            continue
        assert record.status == "ok"
        assert record.ttft_s is not None and record.e2el_s is not None
        assert math.isclose(record.ttft_s * 1e3, _value(line, "time_to_first_token"), abs_tol=1e-6)
        assert math.isclose(record.e2el_s * 1e3, _value(line, "request_latency"), abs_tol=1e-6)
        assert record.isl_tokens == _value(line, "input_sequence_length") == record.isl_server_tokens
        assert record.osl_tokens == _value(line, "output_sequence_length") == record.osl_server_tokens
        assert record.cached_tokens == _value(line, "usage_prompt_cache_read_tokens")
        gaps = _value(line, "inter_chunk_latency") or []
        assert len(record.chunk_times_ns) == len(gaps) + 1
        assert record.chunk_times_ns[0] == record.first_token_ns
        assert record.chunk_times_ns[-1] == record.last_token_ns
        rebuilt = [(b - a) / MS for a, b in itertools.pairwise(record.chunk_times_ns)]
        assert rebuilt == pytest.approx(gaps, abs=1e-6)
        assert sum(record.chunk_tokens) == record.osl_streamed_tokens
        if record.osl_tokens >= 2:
            assert math.isclose(record.tpot_s * 1e3, _value(line, "inter_token_latency"), rel_tol=1e-9)  # type: ignore[operator]


def test_plays_are_root_sessions_and_lanes_hold_one_play_at_a_time(imported: dict[str, ImportedRun]) -> None:
    for name in TOOLS:
        records = to_records(read_records(imported[name].run_dir / "records.arrow"))
        by_root: dict[str, set[int]] = {}
        spans: dict[int, tuple[int, int, int]] = {}
        for record in records:
            by_root.setdefault(record.root_correlation_id, set()).add(record.play)
            start, end, lane = spans.get(record.play, (record.sent_ns, record.end_ns, record.lane))
            assert lane == record.lane
            spans[record.play] = (min(start, record.sent_ns), max(end, record.end_ns), lane)
        assert all(len(plays) == 1 for plays in by_root.values())
        assert len(spans) == imported[name].run.trees_started == len(by_root)
        for lane in {lane for _, _, lane in spans.values()}:
            held = sorted((start, end) for start, end, on in spans.values() if on == lane)
            assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(held))


def test_failed_requests_keep_their_kind_status_and_message(imported: dict[str, ImportedRun]) -> None:
    records = to_records(read_records(imported["harness_1_0_12"].run_dir / "records.arrow"))
    failed = {record.error_kind: record for record in records if record.status == "error"}
    assert set(failed) == {"http", "connection"}
    assert failed["http"].http_status == 500 and "Internal server error" in (failed["http"].error_message or "")
    assert failed["connection"].http_status is None
    assert (failed["connection"].error_message or "").startswith("ClientPayloadError: ")
    summary = imported["harness_1_0_12"].summary
    assert summary.counts.errors_by_kind == {"http": 1, "connection": 1}
    assert summary.counts.errors == _tool_summary("harness_1_0_12")["error_request_count"]["avg"]


# ---------------------------------------------------------------------------------------------
# the run: options, summary, validity, telemetry


@pytest.mark.parametrize("name", list(TOOLS))
def test_options_name_the_tool_its_rules_and_its_settings(imported: dict[str, ImportedRun], name: str) -> None:
    run = imported[name]
    tool = _tool_summary(name)
    options = run.options
    assert options["imported_from"] == "aiperf" and options["rules"] == TOOLS[name]
    assert options["tool_version"] == tool["aiperf_version"] and options["benchmark_id"] == tool["benchmark_id"]
    assert options["concurrency"] == 2 and options["mode"] == "agentx" and options["duration_s"] == 30.0
    assert options["model"] == "agentx-sim" and options["url"].startswith("http://127.0.0.1:")
    assert run.run.run_id == tool["benchmark_id"]
    assert run_info(read_records(run.run_dir / "records.arrow")).options == options
    assert run.summary.rules == TOOLS[name]
    assert run.summary.validity is not None
    assert run.summary.validity.reasons == tool["metadata"]["submission_invalid_reasons"] == ["unsafe_override"]
    assert run.run.interrupted is tool["was_cancelled"] is False


@pytest.mark.parametrize("name", list(TOOLS))
def test_summary_statistics_equal_the_tools_own(imported: dict[str, ImportedRun], name: str) -> None:
    tool = _tool_summary(name)
    summary = imported[name].summary
    assert summary.counts.kept == tool["request_count"]["avg"]
    for ours, tag in ((summary.latency.ttft_s, "time_to_first_token"), (summary.latency.e2el_s, "request_latency")):
        assert ours is not None
        assert ours.count == tool[tag]["count"]
        assert math.isclose(ours.p50 * 1e3, tool[tag]["p50"], rel_tol=1e-9)
        assert math.isclose(ours.mean * 1e3, tool[tag]["avg"], rel_tol=1e-9)
        assert math.isclose(ours.p99 * 1e3, tool[tag]["p99"], rel_tol=1e-9)
    tpot = summary.latency.tpot_s
    assert tpot is not None and math.isclose(tpot.p50 * 1e3, tool["inter_token_latency"]["p50"], rel_tol=1e-9)


@pytest.mark.parametrize("name", list(TOOLS))
def test_the_re_export_of_an_imported_run_equals_the_tools_summary(imported: dict[str, ImportedRun], name: str) -> None:
    table, run_file = load_run(imported[name].run_dir)
    ours, tool = aiperf_summary(table, run_file), _tool_summary(name)
    for tag in (
        "time_to_first_token",
        "time_to_second_token",
        "inter_token_latency",
        "request_latency",
        "inter_chunk_latency",
        "input_sequence_length",
        "output_sequence_length",
    ):
        for stat in ("avg", "p1", "p50", "p90", "p99", "min", "max", "count"):
            assert ours[tag][stat] == pytest.approx(tool[tag][stat], rel=1e-9), (tag, stat)
    assert ours["request_count"]["avg"] == tool["request_count"]["avg"]
    assert ours["metadata"]["submission_invalid_reasons"] == tool["metadata"]["submission_invalid_reasons"]


@pytest.mark.parametrize("name", list(TOOLS))
def test_server_telemetry_and_cache_counters_come_from_the_metrics_export(
    imported: dict[str, ImportedRun], name: str
) -> None:
    document = json.loads((ARTIFACTS / name / "server_metrics_export.json").read_text())
    export = document["metrics"]
    telemetry = imported[name].summary.server_telemetry
    assert telemetry is not None and telemetry.engine == "vllm" and telemetry.endpoint == "/metrics"
    running = export["vllm:num_requests_running"]["series"][0]["stats"]
    assert telemetry.requests_running is not None
    assert (telemetry.requests_running.mean, telemetry.requests_running.peak) == (running["avg"], running["max"])
    hits = export["vllm:prefix_cache_hits"]["series"][0]["stats"]["total"]
    queries = export["vllm:prefix_cache_queries"]["series"][0]["stats"]["total"]
    assert telemetry.prefix_cache_hit_rate == pytest.approx(hits / queries)
    assert imported[name].summary.cache.server_hit_rate == pytest.approx(hits / queries)
    assert telemetry.series["generation_tokens_total"].counter is not None
    assert (
        telemetry.series["generation_tokens_total"].counter.total
        == export["vllm:generation_tokens"]["series"][0]["stats"]["total"]
    )
    epoch = run_info(read_records(imported[name].run_dir / "records.arrow")).wall_epoch_ns
    profiling = document["summary"]["phase_time_ranges"]["profiling"]
    assert imported[name].run.profiling_start_ns == profiling["start_ns"] - epoch
    assert (telemetry.window_start_s, telemetry.window_end_s) == (
        (profiling["start_ns"] - epoch) / 1e9,
        (profiling["end_ns"] - epoch) / 1e9,
    )


def test_run_json_reads_back_as_a_run_file_with_the_notices(imported: dict[str, ImportedRun]) -> None:
    run_dir = imported["harness_1_0_12"].run_dir
    run_file = read_run_file(run_dir / "run.json")
    assert run_file.run.requests == 51 and run_file.run.warmup_requests == 22 and run_file.run.errors == 2
    assert run_file.summary.latency.ttft_s == imported["harness_1_0_12"].summary.latency.ttft_s
    notices = " ".join(run_file.run.notices)
    assert "no tokens per chunk" in notices and "no lane" in notices and "trace's ISL" in notices


# ---------------------------------------------------------------------------------------------
# what AIPerf leaves out, and round trips


def test_a_folder_without_summary_or_server_metrics_imports_and_says_what_is_unknown(tmp_path: Path) -> None:
    source = tmp_path / "bare"
    source.mkdir()
    (source / JSONL_FILE).write_bytes((ARTIFACTS / "aiperf_0_13_0" / JSONL_FILE).read_bytes())
    run = import_aiperf(source, tmp_path / "run")
    assert run.options == {"imported_from": "aiperf", "tool": "aiperf", "artifact_dir": str(source.resolve())}
    assert run.summary.server_telemetry is None and run.summary.cache.server_hit_rate is None
    assert run.run.requests == len(_lines("aiperf_0_13_0")) and run.run.profiling_start_ns is None
    notices = " ".join(run.run.notices)
    assert f"no {SUMMARY_FILE}" in notices and "no server_metrics_export.json" in notices
    assert len(run.run.run_id) == 32  # a digest of the records file: no benchmark id without the summary


def test_a_non_streaming_record_has_no_chunks_and_says_so(tmp_path: Path) -> None:
    line = _lines("aiperf_0_13_0")[5]
    for tag in ("time_to_first_token", "inter_chunk_latency", "inter_token_latency"):
        line["metrics"].pop(tag)
    source = tmp_path / "art"
    source.mkdir()
    (source / JSONL_FILE).write_text(json.dumps(line) + "\n")
    run = import_aiperf(source, tmp_path / "run")
    (record,) = to_records(read_records(tmp_path / "run" / "records.arrow"))
    assert record.chunk_times_ns == [] and record.ttft_s is None and record.e2el_s is not None
    assert record.osl_streamed_tokens == _value(line, "output_sequence_length")
    assert any("non-streaming" in notice for notice in run.run.notices)


@given(st.integers(0, 5_000), st.integers(1, 40))
def test_tokens_spread_over_chunks_sum_to_the_osl_and_differ_by_at_most_one(osl: int, chunks: int) -> None:
    spread_tokens = spread(osl, chunks)
    assert len(spread_tokens) == chunks and sum(spread_tokens) == osl
    assert max(spread_tokens) - min(spread_tokens) <= 1 and spread_tokens == sorted(spread_tokens, reverse=True)


@given(st.integers(1, 10_000), st.integers(1, 10_000))
def test_the_requested_osl_is_recovered_from_the_mismatch(osl: int, asked: int) -> None:
    assert requested_osl(osl, (osl - asked) / asked * 100.0) == asked
    assert requested_osl(osl, None) == osl


AGENTS = st.sampled_from([("", 0), ("w1", 1), ("fa:001", 1), ("deep", 2)])


@st.composite
def agentx_records(draw: st.DrawFn) -> list[RequestRecord]:
    """Records as a replay writes them: consistent chunk times, any phase, agent and outcome."""
    records = []
    for i in range(draw(st.integers(1, 8))):
        agent, depth = draw(AGENTS)
        scheduled = draw(st.integers(0, 10**10))
        sent = scheduled + draw(st.integers(0, 10**8))
        gaps = draw(st.lists(st.integers(0, 10**8), max_size=6))
        first = sent + draw(st.integers(1, 10**9))
        chunks = [first]
        for gap in gaps:
            chunks.append(chunks[-1] + gap)
        chunk_tokens = draw(st.lists(st.integers(0, 5), min_size=len(chunks), max_size=len(chunks)))
        kind = draw(
            st.sampled_from([None, None, "http", "rate_limited", "timeout", "connection", "protocol", "cancelled"])
        )
        fields: dict[str, Any] = {
            **record_identity(phase=draw(st.sampled_from(["warmup", "profiling"])), lane=draw(st.integers(0, 3))),
            "session_id": draw(st.sampled_from(["s1", "s2"])),
            "agent_id": agent,
            "depth": depth,
            "turn": draw(st.integers(0, 50)),
            "request_id": f"req-{i}",
            "correlation_id": f"corr-{i}",
            "root_correlation_id": "root-0",
            "scheduled_ns": scheduled,
            "sent_ns": sent,
            "response_ns": sent + 1,
            "first_token_ns": first,
            "last_token_ns": chunks[-1],
            "end_ns": chunks[-1] + draw(st.integers(0, 10**6)),
            "chunk_times_ns": chunks,
            "chunk_tokens": chunk_tokens,
            "isl_recorded_tokens": 10,
            "isl_sent_tokens": draw(st.integers(0, 10**6)),
            "isl_server_tokens": draw(st.none() | st.integers(0, 10**6)),
            "osl_recorded_tokens": 10,
            "osl_streamed_tokens": sum(chunk_tokens),
            "cached_tokens": draw(st.none() | st.integers(0, 1000)),
        }
        if kind is not None:
            fields |= {"status": "error", "error_kind": kind, "error_message": f"{kind} went wrong"}
            if kind == "http":  # 429 is the `rate_limited` kind's
                fields |= {"http_status": draw(st.integers(400, 599).filter(lambda status: status != 429))}
            elif kind == "rate_limited":
                fields |= {"http_status": 429}
        records.append(RequestRecord(**fields))
    return records


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agentx_records())
def test_agentx_own_export_imports_back_to_the_same_records(records: list[RequestRecord]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        run_dir, artifacts = Path(folder) / "run", Path(folder) / "artifacts"
        run_dir.mkdir()
        artifacts.mkdir()
        with RecordWriter(run_dir / "records.arrow", RunInfo(run_id="run-1", wall_epoch_ns=10**18)) as writer:
            for record in records:
                writer.append(record)
        write_aiperf_jsonl(read_records(run_dir / "records.arrow"), artifacts / JSONL_FILE)
        import_aiperf(artifacts, Path(folder) / "imported")
        table = read_records(Path(folder) / "imported" / "records.arrow")
        back = to_records(table)
    shift = min(min(record.scheduled_ns, record.sent_ns) for record in records)
    assert run_info(table).wall_epoch_ns == 10**18 + shift
    for original, imported in zip(records, back, strict=True):
        same = ("phase", "lane", "session_id", "agent_id", "depth", "turn", "request_id", "correlation_id", "status")
        assert {name: getattr(imported, name) for name in same} == {name: getattr(original, name) for name in same}
        assert imported.root_correlation_id == original.root_correlation_id
        assert (imported.sent_ns, imported.end_ns) == (original.sent_ns - shift, original.end_ns - shift)
        assert imported.isl_tokens == original.isl_tokens
        assert imported.error_kind == original.error_kind
        if original.error_kind in ("http", "rate_limited"):
            assert imported.http_status == original.http_status
        if original.status == "ok":
            assert [t + shift for t in imported.chunk_times_ns] == original.chunk_times_ns
            assert (imported.ttft_s, imported.e2el_s) == (original.ttft_s, original.e2el_s)
            assert imported.osl_tokens == original.osl_tokens
            assert imported.cached_tokens == original.cached_tokens


def test_a_servers_499_is_an_http_error_and_only_aiperfs_own_mark_is_a_cancellation() -> None:
    answered = ErrorDetails(code=499, type="HTTP 499", message="client closed request")
    assert error_kind(answered, cancelled=False, overflow=False) == ("http", 499)
    marked = ErrorDetails(code=499, type="RequestCancellationError", message="cancelled")
    assert error_kind(marked, cancelled=False, overflow=False) == ("cancelled", None)
    assert error_kind(answered, cancelled=True, overflow=False) == ("cancelled", None)


# ---------------------------------------------------------------------------------------------
# mistakes, and the command


def test_a_missing_folder_or_records_file_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no such directory"):
        import_aiperf(tmp_path / "nope", tmp_path / "run")
    with pytest.raises(ArtifactError, match=f"no {JSONL_FILE}"):
        import_aiperf(tmp_path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _artifacts(tmp_path: Path, jsonl: str, summary: str | None = None) -> Path:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / JSONL_FILE).write_text(jsonl)
    if summary is not None:
        (folder / SUMMARY_FILE).write_text(summary)
    return folder


def _assert_one_paragraph_error(args: list[str], *expected: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert result.stdout == "" and result.stderr.startswith("error: ") and result.stderr.count("error:") == 1
    assert "\n\n" not in result.stderr.strip()
    for text in expected:
        assert text in result.stderr


def test_the_command_refuses_bad_artifacts_in_one_paragraph(tmp_path: Path) -> None:
    good = (ARTIFACTS / "aiperf_0_13_0" / JSONL_FILE).read_text().splitlines()
    out = str(tmp_path / "run")
    _assert_one_paragraph_error(["import", "aiperf", str(tmp_path / "nope"), "--out", out], "no such directory")
    bad_line = _artifacts(tmp_path, "\n".join([*good[:3], '{"metadata": {"request_start_ns": "soon"}}']))
    _assert_one_paragraph_error(["import", "aiperf", str(bad_line), "--out", out], f"{JSONL_FILE}:4:")
    (bad_line / JSONL_FILE).write_text("\n" + good[0].replace('"unit":"ms"', '"unit":"fortnights"', 1) + "\n")
    _assert_one_paragraph_error(["import", "aiperf", str(bad_line), "--out", out], f"{JSONL_FILE}:2:", "duration")
    (bad_line / JSONL_FILE).write_text("\n")
    _assert_one_paragraph_error(["import", "aiperf", str(bad_line), "--out", out], "holds no record")
    (bad_line / JSONL_FILE).write_text(good[0] + "\n")
    (bad_line / SUMMARY_FILE).write_text("{cut short")
    _assert_one_paragraph_error(["import", "aiperf", str(bad_line), "--out", out], SUMMARY_FILE)
    assert not (tmp_path / "run").exists()


def test_the_command_imports_refuses_an_existing_run_and_report_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["import", "aiperf", str(ARTIFACTS / "harness_1_0_12"), "--out", str(out), "--gpus", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "imported 51 requests (22 warmup, 2 failed)" in result.stderr and "note: " in result.stderr
    assert "agentx-harness 1.0.12" in result.stdout and str(out / "run.json") in result.stdout
    _assert_one_paragraph_error(args, "already holds a run", "--overwrite")
    with pytest.raises(RunExists):
        import_aiperf(ARTIFACTS / "harness_1_0_12", out)
    result = CliRunner().invoke(main, [*args, "--overwrite", "--json"])
    assert result.exit_code == 0, result.output
    summary = msgspec.json.decode(result.stdout)
    assert summary["throughput"]["num_gpus"] == 2
    report = CliRunner().invoke(main, ["report", str(out), "--json"])
    assert report.exit_code == 0, report.output
    (series,) = msgspec.json.decode(report.stdout)["series"]
    (level,) = series["levels"]
    assert level["concurrency"] == 2 and level["requests"] == 27 and level["status"] == "ok"
    assert level["ttft_p50_s"] * 1e3 == pytest.approx(_tool_summary("harness_1_0_12")["time_to_first_token"]["p50"])
