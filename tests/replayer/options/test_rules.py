"""The AgentX rule sets (agentx.replayer.options.rules): each difference between agentx-harness 1.0.12 and AIPerf 0.13.0
where it acts — the coverage verdict, the exports' schema, locks, the report's refusal of mixed rules, the
InferenceX metrics, the command line's scenario defaults and the request headers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from click.testing import CliRunner
from flat import replay_options
from hypothesis import given
from hypothesis import strategies as st
from paths import SAMPLE_TRACE
from validity_records import S, failed, rec, run_file, table

from agentx.cli import main
from agentx.replayer.options.locks import locks_broken
from agentx.replayer.options.rules import AIPERF_0_13_0, DEFAULT_RULES_NAME, HARNESS, RULE_SETS, rule_set
from agentx.results.export.aiperf_jsonl import jsonl_lines
from agentx.results.export.aiperf_metrics import HARNESS_TAGS, run_context
from agentx.results.export.aiperf_summary import aiperf_summary
from agentx.results.summary.checks.validity import INSUFFICIENT_COVERAGE, metric_coverage, validity
from agentx.results.summary.inferencex import inferencex_metrics, qps_windows

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

HARNESS_OPTIONS = {"rules": "agentx-harness-1.0.12", "mode": "agentx", "duration_s": 1000.0}


def test_the_default_rules_are_the_harness_and_every_rule_set_is_named_by_its_reference() -> None:
    assert DEFAULT_RULES_NAME == HARNESS.name == "agentx-harness-1.0.12"
    assert rule_set(None) is HARNESS and rule_set("aiperf-0.13.0") is AIPERF_0_13_0
    assert set(RULE_SETS) == {"agentx-harness-1.0.12", "aiperf-0.13.0"}
    with pytest.raises(ValueError, match=r"known are agentx-harness-1\.0\.12, aiperf-0\.13\.0"):
        rule_set("aiperf-0.12")
    # The rules differ where the references' code does (docs/agentx.md, "Rule sets").
    differing = {
        field
        for field in HARNESS.__struct_fields__
        if getattr(HARNESS, field) != getattr(AIPERF_0_13_0, field)
        and field not in ("name", "reference", "scenario", "aiperf_version", "defaults")
    }
    assert differing == {
        "join_waits_delay",
        "tree_idle_cap_mode",
        "tree_idle_cap_allowed",
        "warmup_lead_cap",
        "profiling_start",
        "pressure",
        "child_timers_capped",
        "system_cap_at_return",
        "coverage",
        "session_affinity_header",
        "export_harness_metrics",
    }


# -- coverage (§5)


def _until(stop_s: float, step_s: float = 5.0) -> list[Any]:
    return [rec(t, length_s=step_s) for t in np.arange(0.0, stop_s, step_s)]


def test_the_harness_coverage_needs_a_first_token_or_an_itl_in_the_last_5_percent() -> None:
    """1000 s configured: requests until 960 s (their ends and first tokens past 950 s) pass; until 900 s fail,
    with both ratios said; a run without the rule set (older files) keeps agentx's union rule."""
    ran = validity(table(_until(960.0)), run_file(HARNESS_OPTIONS, profiling_start_ns=0))
    assert ran.valid and ran.details["metric_duration_coverage"]["inter_token_latency_ratio"] >= 0.95
    short = validity(table(_until(900.0)), run_file(HARNESS_OPTIONS, profiling_start_ns=0))
    assert short.reasons == [INSUFFICIENT_COVERAGE]
    coverage = short.details["metric_duration_coverage"]
    assert coverage["ttft_ratio"] == pytest.approx(0.8951)  # the last first token: 895 s + 0.1 s
    assert coverage["inter_token_latency_ratio"] == pytest.approx(0.9)
    assert "past 95%" in short.explained[0].message
    # The same records under AIPerf 0.13.0's rules: agentx's union rule, which a steady run passes.
    older = validity(table(_until(900.0)), run_file({"mode": "agentx", "duration_s": 1000.0}))
    assert older.valid and "coverage" in older.details


def test_the_harness_coverage_is_skipped_below_900_s_and_for_a_cancelled_run() -> None:
    short = {**HARNESS_OPTIONS, "duration_s": 600.0}
    assert validity(table(_until(100.0)), run_file(short, profiling_start_ns=0)).valid
    interrupted = validity(table(_until(100.0)), run_file(HARNESS_OPTIONS, interrupted=True, profiling_start_ns=0))
    assert INSUFFICIENT_COVERAGE not in interrupted.reasons


def test_an_itl_needs_two_tokens_and_errors_count_for_nothing() -> None:
    """One-token answers have a first token but no ITL; failed requests have neither."""
    records = [rec(t, osl_streamed_tokens=1) for t in np.arange(0.0, 990.0, 10.0)]
    records += [failed("http", 995.0)]
    coverage = metric_coverage(
        table(records),
        np.ones(len(records), dtype=bool),
        np.array([r.status == "ok" for r in records]),
        {"profiling_start_ns": 0},
        1000.0,
    )
    assert coverage["inter_token_latency_ratio"] == 0.0 and coverage["ttft_ratio"] == pytest.approx(0.9801)


def test_the_profiling_start_is_the_recorded_one_else_the_end_of_the_warmup() -> None:
    warm = rec(0.0, length_s=100.0, phase="warmup")  # ends at 100 s
    records = [warm, *(rec(t) for t in np.arange(100.0, 1050.0, 10.0))]
    # Measured from the warmup's end (100 s): the last end at 1040.7 s is 94.07 % into the window, too early.
    estimated = validity(table(records), run_file(HARNESS_OPTIONS))
    assert estimated.reasons == [INSUFFICIENT_COVERAGE]
    assert estimated.details["metric_duration_coverage"]["inter_token_latency_ratio"] == pytest.approx(0.9407)
    assert estimated.details["metric_duration_coverage"]["ttft_ratio"] == pytest.approx(0.9401)
    # Measured from a profiling start the run recorded at 50 s instead, the same records reach 99.07 %.
    recorded = validity(table(records), run_file(HARNESS_OPTIONS, profiling_start_ns=50 * S))
    assert recorded.valid
    assert recorded.details["metric_duration_coverage"]["inter_token_latency_ratio"] == pytest.approx(0.9907)


def test_the_harness_coverage_judges_duration_bound_runs_only() -> None:
    """A run bounded by its sessions or requests ends when they are done, not at its duration: the harness skips
    its rule for a request-count run, and agentx for a run with `sessions` or `num_requests` too."""
    for bound in ({"sessions": 4}, {"num_requests": 100}):
        verdict = validity(table(_until(100.0)), run_file({**HARNESS_OPTIONS, **bound}, profiling_start_ns=0))
        assert verdict.valid and not verdict.details["metric_duration_coverage"]["applies"]


# -- the exports' schema (§6)


def _run_table(options: dict[str, Any], records: list[Any] | None = None) -> Any:
    return table(records if records is not None else [rec(float(i)) for i in range(5)], options)


def test_the_harness_schema_adds_the_full_response_metrics_and_names_the_rules() -> None:
    records = [rec(float(i), end_ns=int((i + 0.9) * S)) for i in range(4)]
    harness = aiperf_summary(_run_table(HARNESS_OPTIONS, records), run_file(HARNESS_OPTIONS, profiling_start_ns=0))
    older_options = {"mode": "agentx", "rules": "aiperf-0.13.0"}
    older = aiperf_summary(_run_table(older_options, records), run_file(older_options))
    assert set(harness) >= HARNESS_TAGS and not HARNESS_TAGS & set(older)
    # (end − first token) / (OSL − 1): (0.9 − 0.1) s / 10 tokens = 80 ms.
    assert harness["full_response_inter_token_latency"]["avg"] == pytest.approx(80.0)
    assert harness["full_decode_duration"]["avg"] == pytest.approx(800.0)
    assert harness["full_response_output_token_throughput_per_user"]["avg"] == pytest.approx(12.5)
    assert harness["metadata"]["scenario"] == "agentx" and older["metadata"]["scenario"] == "inferencex-agentx-mvp"
    assert harness["metadata"]["agentx"]["rules"]["name"] == "agentx-harness-1.0.12"
    assert older["metadata"]["agentx"]["rules"]["name"] == "aiperf-0.13.0"
    # What the harness's fork lacks: is_complete, and the two derived counts on a run without errors.
    assert "is_complete" not in harness and older["is_complete"] is True
    assert "completed_request_count" not in harness and "request_error_rate" not in harness
    assert older["completed_request_count"]["avg"] == 4
    # The coverage figures the harness writes once its rule applied (1000 s configured here: it did).
    (coverage,) = harness["metadata"]["metric_duration_coverage"]
    assert set(coverage) == {
        "phase_name",
        "expected_duration_seconds",
        "required_ratio",
        "ttft_ratio",
        "inter_token_latency_ratio",
    }


def test_failures_bring_the_counts_and_the_adjusted_full_response_metrics() -> None:
    records = [rec(0.0), rec(1.0), failed("http", 2.0)]
    document = aiperf_summary(_run_table(HARNESS_OPTIONS, records), run_file(HARNESS_OPTIONS, profiling_start_ns=0))
    assert document["completed_request_count"]["avg"] == 3
    assert {"adj_full_decode_duration", "adj_full_response_inter_token_latency"} <= set(document)


def test_every_jsonl_line_names_the_rules_and_carries_the_harness_metrics_only_under_them() -> None:
    for options, has_tags in ((HARNESS_OPTIONS, True), ({"mode": "agentx", "rules": "aiperf-0.13.0"}, False)):
        records = _run_table(options)
        for line in jsonl_lines(records, run_context(records, run_file(options))):
            item = json.loads(line)
            assert item["metadata"]["agentx_rules"] == options["rules"]
            assert (set(item["metrics"]) >= HARNESS_TAGS) is has_tags


# -- InferenceX's metrics (§7)


@given(st.lists(st.floats(0.0, 30.0, allow_nan=False), min_size=2, max_size=200))
def test_qps_windows_equal_inferencex_loop(ends: list[float]) -> None:
    """InferenceX's `compute_qps_stats`, written as its loop: 1 s windows from the first completion while one fits
    before the last completion, counting [start, start + 1)."""
    ordered = sorted(ends)
    found = qps_windows(np.asarray(ends))
    if ordered[-1] <= ordered[0]:
        assert found is None
        return
    counts, current = [], ordered[0]
    while current + 1.0 <= ordered[-1]:
        counts.append(sum(current <= end < current + 1.0 for end in ordered))
        current += 1.0
    assert found is not None
    if not counts:
        assert found.samples == 0 and found.mean == pytest.approx(len(ordered) / (ordered[-1] - ordered[0]))
        return
    assert found.samples == len(counts)
    assert found.mean == pytest.approx(float(np.mean(counts)))
    assert found.p90 == pytest.approx(float(np.percentile(counts, 90)))
    assert found.std == pytest.approx(float(np.std(counts)))


def test_full_response_and_e2e_normalized_interactivity() -> None:
    """Three requests: the interactivities are 1 / each statistic of the per-request seconds per token."""
    records = [
        rec(0.0, length_s=1.1, osl_server_tokens=11),  # full: (1.1 − 0.1) / 10 = 0.1 s; E2EL/OSL = 1.0 / 11
        rec(1.0, length_s=2.1, osl_server_tokens=11),  # full: 0.2 s; E2EL/OSL = 2.0 / 11
        rec(2.0, length_s=0.6, osl_server_tokens=1),  # no full-response value (OSL 1); E2EL/OSL = 0.5
    ]
    metrics = inferencex_metrics(table(records))
    assert metrics is not None and metrics.full_response_tpot_s is not None
    assert metrics.full_response_tpot_s.count == 2 and metrics.full_response_tpot_s.p50 == pytest.approx(0.15)
    assert metrics.full_response_interactivity_tps is not None
    assert metrics.full_response_interactivity_tps.p90 == pytest.approx(1 / 0.19)  # 1 / p90, the slow tail
    assert metrics.e2el_per_osl_s is not None and metrics.e2el_per_osl_s.count == 3
    assert metrics.e2e_norm_interactivity_tps is not None
    assert metrics.e2e_norm_interactivity_tps.p50 == pytest.approx(11 / 2.0)  # 1 / the median, 2.0 / 11


# -- locks (§5) and the report (§7)


def test_a_tree_idle_cap_breaks_a_lock_under_aiperf_0_13_0_only(tmp_path: Path) -> None:
    common: dict[str, Any] = {"url": "http://127.0.0.1:1", "model": "m", "out_dir": tmp_path, "duration_s": 1800.0}
    harness = replay_options(**common, tree_idle_cap_s=300.0)
    older = replay_options(**common, tree_idle_cap_s=300.0, rules="aiperf-0.13.0")
    assert locks_broken(harness) == []
    (broken,) = locks_broken(older)
    assert "per-tree idle cap of 300 s" in broken and "aiperf-0.13.0 rules forbid" in broken


def test_the_report_refuses_runs_of_different_rules_unless_asked(tmp_path: Path) -> None:
    from agentx.records.record import RunInfo
    from agentx.records.writer import RecordWriter

    dirs = []
    for rules in ("agentx-harness-1.0.12", "aiperf-0.13.0"):
        folder = tmp_path / rules
        folder.mkdir()
        info = RunInfo(run_id=rules, wall_epoch_ns=0, options={"mode": "agentx", "rules": rules, "concurrency": 1})
        with RecordWriter(folder / "records.arrow", info) as writer:
            for record in (rec(float(i), run_id=rules) for i in range(3)):
                writer.append(record)
        dirs.append(str(folder))
    refused = CliRunner().invoke(main, ["report", *dirs])
    assert refused.exit_code == 2
    assert "different AgentX rule sets" in refused.output and "--mixed-rules" in refused.output
    assert CliRunner().invoke(main, ["report", *dirs, "--mixed-rules"]).exit_code == 0
    assert CliRunner().invoke(main, ["report", dirs[0], dirs[0]]).exit_code == 0


# -- the command line's defaults and the headers


def _replay_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--sim-time-scale", "0.02"]
    command += ["--delay-scale", "0.02", "--sessions", "1", "--out", str(out), "--overwrite", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads((out / "run.json").read_text())
    # The run said what ends it as it started, as its options have it (each run here has --sessions 1).
    duration = document["options"]["duration_s"]
    ends = f"after {duration:,g} s (--duration), or after 1 session" if duration is not None else "after 1 session"
    assert f"the run ends {ends}" in result.stderr
    return document


def test_agentx_mode_takes_the_rule_sets_scenario_defaults_for_flags_left_unset(tmp_path: Path) -> None:
    harness = _replay_json(tmp_path, "--concurrency", "1")["options"]
    assert harness["rules"] == "agentx-harness-1.0.12"
    assert (harness["duration_s"], harness["seed"], harness["tree_idle_cap_s"]) == (3600.0, 42, 300.0)
    assert (harness["warmup_requests_per_lane"], harness["failed_request_threshold"]) == (10, 0.10)
    given_flags = _replay_json(tmp_path, "--seed", "7", "--tree-idle-cap", "off", "--warmup-requests-per-lane", "0")
    assert (given_flags["options"]["seed"], given_flags["options"]["tree_idle_cap_s"]) == (7, None)
    assert given_flags["options"]["warmup_requests_per_lane"] == 0
    older = _replay_json(tmp_path, "--rules", "aiperf-0.13.0")["options"]
    assert (older["duration_s"], older["seed"], older["tree_idle_cap_s"]) == (1800.0, 0, None)
    assert older["warmup_requests_per_lane"] == 0 and older["failed_request_threshold"] is None
    closed = _replay_json(tmp_path, "--mode", "closed")["options"]
    assert closed["duration_s"] is None and closed["seed"] == 0  # other modes keep the generic defaults
    assert closed["rules"] == "agentx-harness-1.0.12"
    # `replay --help` says each of these defaults as the runs above took them.
    flags = {
        "--duration": ("duration_s", "none"),
        "--seed": ("seed", ""),
        "--tree-idle-cap": ("tree_idle_cap_s", "off"),
        "--failed-request-threshold": ("failed_request_threshold", "off"),
        "--warmup-requests-per-lane": ("warmup_requests_per_lane", ""),
    }
    command = main.get_command(click.Context(main), "replay")
    assert command is not None
    for flag, (field, none) in flags.items():
        (option,) = [param for param in command.params if isinstance(param, click.Option) and flag in param.opts]

        def typed(value: object, none: str = none) -> str:
            return none if value is None else f"{value:g}" if isinstance(value, float) else str(value)

        otherwise = closed.get(field, older[field])  # a field of agentx's load only: its generic default
        expected = f"{typed(harness[field])} with --mode agentx, {typed(older[field])} under --rules aiperf-0.13.0"
        assert option.show_default == f"{expected}; else {typed(otherwise)}", flag
