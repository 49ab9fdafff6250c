"""Run validity (agentx/results/summary/checks/validity.py): every reason of docs/agentx.md §5 and the InferenceX
gate, on hand-built runs."""

from __future__ import annotations

import msgspec
import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from validity_records import S, failed, rec, run_file, table

from agentx.records.record import RequestRecord
from agentx.results.summary.checks.validity import (
    CONTEXT_OVERFLOW_RATE_EXCEEDED,
    DISPATCH_LAG_EXCEEDED,
    INSUFFICIENT_COVERAGE,
    RUN_CANCELLED,
    UNSAFE_OVERRIDE,
    covered_ns,
    validity,
)


def test_a_clean_short_run_is_valid_and_passes_the_gate() -> None:
    verdict = validity(table([rec(i) for i in range(10)]), run_file())
    assert verdict.valid and verdict.reasons == []
    assert verdict.details["inferencex_gate_passed"] is True
    assert verdict.details["coverage"]["applies"] is False  # 9.7 s < 900 s


def test_unsafe_override_nested_top_level_or_in_the_records_metadata() -> None:
    records = table([rec()])
    assert validity(records, run_file({"rules": {"unsafe_override": True}})).reasons == [UNSAFE_OVERRIDE]
    assert validity(records, run_file({"unsafe_override": True})).reasons == [UNSAFE_OVERRIDE]
    assert validity(table([rec()], {"rules": {"unsafe_override": True}}), run_file()).reasons == [UNSAFE_OVERRIDE]
    assert validity(records, run_file({"unsafe_override": False, "rules": {}})).valid
    assert validity(records, run_file({"unsafe_override": "yes"})).valid  # only a JSON true counts


def test_a_run_behind_its_schedule_is_not_valid() -> None:
    """Dispatch lag p99 above 1 s: requests went out later than due, so the run measured the client."""

    def late(i: int, lag_s: float) -> RequestRecord:
        return rec(i, scheduled_ns=int((i - lag_s) * S))

    on_time = [late(i, 0.002) for i in range(1, 100)]
    verdict = validity(table([*on_time, late(100, 30.0)]), run_file())
    assert verdict.valid and verdict.details["dispatch_lag_p99_s"] < 1.0  # one late request of 100: p99 holds
    behind = validity(table([*on_time[:90], *(late(i, 5.0) for i in range(91, 101))]), run_file())
    assert behind.reasons == [DISPATCH_LAG_EXCEEDED] and behind.details["dispatch_lag_p99_s"] > 1.0
    warmup_late = [late(i, 5.0) for i in range(101, 121)]
    warmup_late = [msgspec.structs.replace(r, phase="warmup") for r in warmup_late]
    assert validity(table([*on_time, *warmup_late]), run_file()).valid  # only profiling requests count


def test_context_overflow_rate_above_one_percent() -> None:
    ok = [rec(i) for i in range(98)]
    one = validity(table([*ok, rec(98), failed("context_overflow", 99)]), run_file())
    assert one.valid and one.details["context_overflow_rate"] == 0.01  # exactly 1 %: not above it
    two = validity(table([*ok, failed("context_overflow", 98), failed("context_overflow", 99)]), run_file())
    assert two.reasons == [CONTEXT_OVERFLOW_RATE_EXCEEDED]
    assert two.details["context_overflow_rate"] == 0.02
    # Overflows are not errors (the reference counts them apart), and the turns not sent after an overflow are
    # no requests: they join no count.
    skipped = validity(
        table([*ok, failed("context_overflow", 98), failed("context_overflow", 99)]),
        run_file(skipped_context_overflow=100),
    )
    assert skipped.reasons == [CONTEXT_OVERFLOW_RATE_EXCEEDED] and skipped.details["context_overflow_rate"] == 0.02
    assert skipped.details["error_request_count"] == 0 and skipped.details["skipped_context_overflow_count"] == 100


def test_warmup_overflows_do_not_count() -> None:
    records = [rec(i) for i in range(10)] + [failed("context_overflow", 20 + i, phase="warmup") for i in range(5)]
    assert validity(table(records), run_file()).valid


def test_run_cancelled_by_interruption_a_cancel_reason_or_no_run_file() -> None:
    records = table([rec()])
    assert validity(records, run_file(interrupted=True)).reasons == [RUN_CANCELLED]
    verdict = validity(records, run_file(cancel_reason="failed_request_threshold"))
    assert verdict.reasons == [RUN_CANCELLED] and verdict.details["cancel_reason"] == "failed_request_threshold"
    missing = validity(records, None)
    assert missing.reasons == [RUN_CANCELLED] and missing.details["run_file_missing"] is True
    assert validity(records, run_file(cancel_reason="")).valid


def _steady(start_s: float, stop_s: float, step_s: float = 5.0) -> list[RequestRecord]:
    """Back-to-back 5 s requests from `start_s` until `stop_s`."""
    return [rec(t, length_s=step_s) for t in np.arange(start_s, stop_s, step_s)]


def test_coverage_holds_for_a_steady_long_run() -> None:
    verdict = validity(table(_steady(0, 1000)), run_file())
    coverage = verdict.details["coverage"]
    assert verdict.valid and coverage["applies"] and coverage["covered_fraction"] > 0.99


def test_coverage_tolerates_think_time_up_to_the_idle_allowance() -> None:
    # 5 s requests with 8 s of idle after each: every hole is inside the 10 s allowance.
    records = [rec(t, length_s=5.0) for t in np.arange(0, 1300, 13.0)]
    assert validity(table(records), run_file()).valid


def test_a_long_stretch_of_errors_breaks_coverage() -> None:
    # 1000 s of profiling; from 500 s to 560 s the server only returns errors.
    records = _steady(0, 500) + [failed("http", t) for t in np.arange(500, 560, 1.0)] + _steady(560, 1000)
    verdict = validity(table(records), run_file())
    assert verdict.reasons == [INSUFFICIENT_COVERAGE]
    assert 0.93 < verdict.details["coverage"]["covered_fraction"] < 0.98


def test_a_run_that_stops_observing_early_fails_coverage() -> None:
    records = [*_steady(0, 900), failed("timeout", 950.0, length_s=50.0)]
    assert validity(table(records), run_file()).reasons == [INSUFFICIENT_COVERAGE]


def test_coverage_needs_itl_not_only_ttft() -> None:
    # One-token answers have a TTFT but no ITL: they are not observations.
    records = [rec(t, length_s=5.0, osl_streamed_tokens=1) for t in np.arange(0, 1000, 5.0)]
    verdict = validity(table(records), run_file())
    assert verdict.reasons == [INSUFFICIENT_COVERAGE] and verdict.details["coverage"]["observations"] == 0


def test_coverage_does_not_apply_below_900_s() -> None:
    records = _steady(0, 400) + [failed("http", t) for t in np.arange(400, 800, 1.0)] + _steady(800, 895)
    verdict = validity(table(records), run_file())
    assert verdict.valid and verdict.details["coverage"]["applies"] is False


def test_inferencex_gate_is_inclusive_and_separate_from_validity() -> None:
    ok = [rec(i) for i in range(90)]
    ten = validity(table([*ok, *(failed("http", 100 + i) for i in range(10))]), run_file())
    assert ten.details["inferencex_error_rate"] == 0.10 and ten.details["inferencex_gate_passed"] is True
    eleven = validity(table([*ok[:89], *(failed("http", 100 + i) for i in range(11))]), run_file())
    assert eleven.details["inferencex_gate_passed"] is False
    assert eleven.valid  # the gate is InferenceX's, not a submission reason
    assert validity(table([]), run_file()).details["inferencex_gate_passed"] is False  # nothing completed


def test_reasons_accumulate_in_the_table_order() -> None:
    records = [rec(1), failed("context_overflow", 2)]
    verdict = validity(table(records), run_file({"unsafe_override": True}, interrupted=True))
    assert verdict.reasons == [UNSAFE_OVERRIDE, CONTEXT_OVERFLOW_RATE_EXCEEDED, RUN_CANCELLED]
    assert not verdict.valid


def test_a_run_file_struct_is_accepted() -> None:
    from pathlib import Path

    from agentx.replayer.run_result import RunResult
    from agentx.results.folders.run_file import RunFile
    from agentx.results.summary.summarize import summarize

    records = table([rec()])
    result = RunResult(
        run_id="run-1",
        records_path=Path("records.arrow"),
        requests=1,
        errors=0,
        trees_started=1,
        trees_finished=1,
        interrupted=True,
        elapsed_s=1.0,
    )
    document = RunFile(options={"rules": {"unsafe_override": True}}, run=result, summary=summarize(records))
    assert validity(records, document).reasons == [UNSAFE_OVERRIDE, RUN_CANCELLED]


def test_a_table_without_metadata_or_optional_columns() -> None:
    bare = pa.table({"sent_ns": [0, S], "end_ns": [S, 2 * S]})
    verdict = validity(bare, run_file())
    assert verdict.valid and verdict.details["request_count"] == 2


intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 30)), max_size=12)


@given(intervals, st.integers(0, 40), st.integers(0, 60))
def test_covered_ns_equals_a_brute_force_union(spans: list[tuple[int, int]], lo: int, width: int) -> None:
    hi = lo + width
    starts = np.array([float(s) for s, _ in spans])
    ends = np.array([float(s + n) for s, n in spans])
    covered_units = {u for s, n in spans for u in range(s, s + n) if lo <= u < hi}
    assert covered_ns(starts, ends, float(lo), float(hi)) == len(covered_units)
