"""Whether a run is a valid submission (docs/agentx.md §5): AIPerf's `submission_valid` and its reasons.

A run is valid unless one of these applies (reasons are reported in this order):

- `unsafe_override`: the run's options say `unsafe_override: true` (JSON boolean), either as
  `options["rules"]["unsafe_override"]` or as `options["unsafe_override"]`, in `run.json` or in the records
  file's metadata. Absent means false.
- `context_overflow_rate_exceeded`: over the profiling records,
  `overflows / (request_count + error_request_count + overflows)` > 1 %, where overflows are records with
  `error_kind = "context_overflow"`, `request_count` the successes and `error_request_count` every other
  failed record (cancelled ones included): the reference keeps overflows apart from the errors
  (`aiperf/records/records_manager.py`). The turns not sent after an overflow (`run.skipped_context_overflow` in
  `run.json`) are reported in the details, not counted.
- `run_cancelled`: `run.interrupted` is true or `run.cancel_reason` is non-empty; also when there is no run
  file at all, since every run that ends (interrupted ones included) writes `run.json`, so a run without one
  crashed or is still going.
- `insufficient_profile_metric_coverage`, by the rule set's coverage rule (`RuleSet.coverage`; the rule set is
  the options' `rules`, AIPerf 0.13.0's for a run that predates rule sets):
  - `last_metric` (agentx-harness 1.0.12, `aiperf/records/records_manager.py`,
    `_validate_profile_metric_duration_coverage`): for a run of a configured duration ≥ `COVERAGE_MIN_PHASE_S`
    (900 s) that was not cancelled, the TTFT ratio is (the last first token of a successful profiling request −
    the profiling start) / the duration, the ITL ratio the same of the last response end of a successful request
    with an ITL (OSL ≥ 2), each clipped to [0, 1]; the run fails when both are below
    `HARNESS_COVERAGE_MIN_RATIO` (95 %): nothing reached the last 5 % of the window. The profiling start is
    `run.profiling_start_ns` (else, for an older run.json, the last warmup request's end, or the first profiling
    request's due time). The harness exits non-zero on it, and so does `agentx replay` (exit 3).
  - `union` (agentx's own, AIPerf 0.13.0 has no coverage rule): the profiling window is [min `sent_ns`, max
    `end_ns`] over all profiling records (any status). The test applies only when the window lasts ≥
    `COVERAGE_MIN_PHASE_S` (900 s). An *observation* is a profiling record with status ok and a finite TTFT > 0
    and ITL > 0 (so OSL ≥ 2); it covers [`sent_ns`, `last_token_ns` + `COVERAGE_IDLE_ALLOWANCE_S`], clipped to
    the window. The run fails when the union of those intervals covers < `COVERAGE_MIN_FRACTION` (98 %) of the
    window. The 10 s allowance is the scenario's system-idle cap (§4b): a healthy run is never idle longer, so
    idle think time between turns is not a hole, but a stretch with no successful streamed request for more than
    10 s (a dead or erroring server, a stalled client) is.

- `dispatch_lag_exceeded`: the run fell behind its schedule: the p99 of the profiling records' dispatch lag
  (`sent − scheduled`, failed requests included) exceeds `DISPATCH_LAG_MAX_P99_S` (1 s). A request sent later
  than it was due measures the client, not the server (docs/agentx.md §4b: a request is never due in the past).
- `acceptance_mismatch`: a forced speculative acceptance length (`--spec-al`) that the realized one
  contradicts by more than the tolerance (agentx.results.summary.checks.acceptance): from the `acceptance` passed in,
  else from `run.json`'s `summary.acceptance.mismatch`.

Apart from the reasons, `details["inferencex_gate_passed"]` is InferenceX's post-run gate:
`error_request_count / completed_request_count ≤ 0.10` (inclusive), with completed = successes + errors > 0.

Each reason is also said in words with the figure that caused it (`Validity.explained`: one entry per broken lock under
`unsafe_override`, whose sentences agentx.replayer.options.locks wrote into the records' metadata). The rules judge the
AgentX scenario only: a run of another mode (`mode` in its options) gets `applies = False`, and its reasons are kept but
beside the point (the summary says "not applicable (closed mode)").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.errors import RecordsError
from agentx.records.record import run_info
from agentx.replayer.options.rules import AIPERF_0_13_0, RULE_SETS, RuleSet
from agentx.results.summary.checks.acceptance import Acceptance
from agentx.results.summary.columns import equals, floats
from agentx.results.summary.stats import FloatArray

CONTEXT_OVERFLOW_MAX_RATE: Final = 0.01
COVERAGE_MIN_PHASE_S: Final = 900.0
COVERAGE_MIN_FRACTION: Final = 0.98
HARNESS_COVERAGE_MIN_RATIO: Final = 0.95
COVERAGE_IDLE_ALLOWANCE_S: Final = 10.0
INFERENCEX_MAX_ERROR_RATE: Final = 0.10
DISPATCH_LAG_MAX_P99_S: Final = 1.0

UNSAFE_OVERRIDE: Final = "unsafe_override"
CONTEXT_OVERFLOW_RATE_EXCEEDED: Final = "context_overflow_rate_exceeded"
RUN_CANCELLED: Final = "run_cancelled"
INSUFFICIENT_COVERAGE: Final = "insufficient_profile_metric_coverage"
ACCEPTANCE_MISMATCH: Final = "acceptance_mismatch"
DISPATCH_LAG_EXCEEDED: Final = "dispatch_lag_exceeded"

_NS_PER_S: Final = 1e9


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    """One reason a run is not a valid submission: its code (`Validity.reasons`) and a sentence with the figure."""

    code: str
    message: str


class Validity(msgspec.Struct, kw_only=True):
    """The verdict on a run: `valid` is true exactly when `reasons` is empty; `details` holds the figures."""

    valid: bool
    reasons: list[str]
    """The codes, each once, in the module docstring's order (AIPerf's `submission_invalid_reasons`)."""
    details: dict[str, Any]
    explained: list[Reason] = []
    """Every reason in words, with the value that caused it; a code may appear more than once (one per lock)."""
    applies: bool = True
    """False for a run outside the agentx mode: the AgentX rules do not judge it (`mode` says which it was)."""
    mode: str | None = None
    """The run's mode from its options, when they say."""

    def verdict(self) -> str:
        """One short answer: "yes", "no", or "not applicable (closed mode)"."""
        if not self.applies:
            return f"not applicable ({self.mode} mode)"
        return "yes" if self.valid else "no"


def _builtins(run_file: Mapping[str, Any] | msgspec.Struct | None) -> dict[str, Any] | None:
    if run_file is None:
        return None
    if isinstance(run_file, msgspec.Struct):
        converted = msgspec.to_builtins(run_file, enc_hook=str)
        return converted if isinstance(converted, dict) else {}
    return dict(run_file)


def _unsafe(options: Any) -> bool:
    if not isinstance(options, Mapping):
        return False
    rules = options.get("rules")
    nested = isinstance(rules, Mapping) and rules.get("unsafe_override") is True
    return nested or options.get("unsafe_override") is True


def _locks(*options: Any) -> list[str]:
    """The broken locks' sentences (agentx.replayer.options.locks) the options carry, from the first that has them."""
    for found in options:
        locks = found.get("locks_broken") if isinstance(found, Mapping) else None
        if isinstance(locks, list) and locks:
            return [str(lock) for lock in locks]
    return []


def _option(options: Any, record_options: Any, name: str) -> Any:
    """Option `name` from run.json's options, else the records' metadata."""
    for found in (options, record_options):
        if isinstance(found, Mapping) and name in found:
            return found[name]
    return None


def _mode(*options: Any) -> str | None:
    for found in options:
        mode = found.get("mode") if isinstance(found, Mapping) else None
        if isinstance(mode, str):
            return mode
    return None


def _cancelled(document: Mapping[str, Any] | None, interrupted: bool, cancel_reason: Any) -> str:
    if document is None:
        return "the run has no run.json, which every run that ends writes: it crashed or is still going"
    if cancel_reason == "failure_threshold":
        return "the run was cancelled: more requests failed than --failed-request-threshold allows"
    if cancel_reason == "stalled":
        return "the run was stopped: the server made no progress with requests in flight for --stall-timeout"
    if cancel_reason == "write_failed":
        return "the run was stopped: its records could not be written (a full disk, a read-only file system)"
    if cancel_reason == "server_lost":
        return "the run was stopped: the server stopped answering (every request refused or reset before any byte)"
    if interrupted or cancel_reason == "interrupted":
        return "the run was interrupted (Ctrl-C or SIGTERM) before its end"
    return f"the run was cancelled ({cancel_reason})"


def covered_ns(starts_ns: FloatArray, ends_ns: FloatArray, lo_ns: float, hi_ns: float) -> float:
    """Length of the union of the intervals [start, end] clipped to [lo, hi] (empty ones ignored)."""
    starts, ends = np.clip(starts_ns, lo_ns, hi_ns), np.clip(ends_ns, lo_ns, hi_ns)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # Holes: before the first interval, between an interval and everything before it, after the last.
    holes = float(starts[0] - lo_ns) + float(np.maximum(starts[1:] - reach[:-1], 0.0).sum()) + float(hi_ns - reach[-1])
    return (hi_ns - lo_ns) - holes


def _coverage(table: pa.Table, profiling: npt.NDArray[np.bool_], ok: npt.NDArray[np.bool_]) -> dict[str, Any]:
    if not profiling.any():
        return {"applies": False, "phase_s": 0.0, "observations": 0, "covered_fraction": None}
    sent = floats(table, "sent_ns")
    end = floats(table, "end_ns")
    lo, hi = float(sent[profiling].min()), float(end[profiling].max())
    phase_s = (hi - lo) / _NS_PER_S
    ttft, itl = floats(table, "ttft_s"), floats(table, "tpot_s")
    last = floats(table, "last_token_ns")
    observed = (
        profiling
        & ok
        & np.isfinite(ttft)
        & (ttft > 0)
        & np.isfinite(itl)
        & (itl > 0)
        & np.isfinite(last)
        & np.isfinite(sent)
    )
    fraction = None
    if hi > lo:
        allowance_ns = COVERAGE_IDLE_ALLOWANCE_S * _NS_PER_S
        fraction = covered_ns(sent[observed], last[observed] + allowance_ns, lo, hi) / (hi - lo)
    return {
        "applies": phase_s >= COVERAGE_MIN_PHASE_S,
        "phase_s": phase_s,
        "observations": int(observed.sum()),
        "covered_fraction": fraction,
    }


def rules_of(*options: Any) -> RuleSet:
    """The rule set a run played, from the first options that name one; AIPerf 0.13.0's for a run that predates rule
    sets (agentx played those rules then)."""
    for found in options:
        name = found.get("rules") if isinstance(found, Mapping) else None
        if isinstance(name, str) and name in RULE_SETS:
            return RULE_SETS[name]
    return AIPERF_0_13_0


def profiling_start_ns(table: pa.Table, run: Mapping[str, Any]) -> float | None:
    """The profiling start in ns after the run start: `run.profiling_start_ns`, else the last warmup request's end,
    else the first profiling request's due time (None without profiling records)."""
    recorded = run.get("profiling_start_ns")
    if isinstance(recorded, int | float) and not isinstance(recorded, bool):
        return float(recorded)
    warmup = equals(table, "phase", "warmup", missing=False)
    if warmup.any():
        return float(np.nanmax(floats(table, "end_ns")[warmup]))
    scheduled = floats(table, "scheduled_ns")[~warmup]
    scheduled = scheduled[np.isfinite(scheduled)]
    return float(scheduled.min()) if scheduled.size else None


def metric_coverage(
    table: pa.Table,
    profiling: npt.NDArray[np.bool_],
    ok: npt.NDArray[np.bool_],
    run: Mapping[str, Any],
    duration: Any,
    bounded: bool = False,
) -> dict[str, Any]:
    """The harness's coverage figures (module docstring, `last_metric`): the configured duration, the ratio the run
    needs, the TTFT and ITL ratios, and whether the rule applies (not to a run `bounded` by its sessions or
    requests); the keys of its `metric_duration_coverage`."""
    configured = float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool) else None
    if bounded:  # it ends when its sessions or requests are done, not at its duration
        configured = None
    start = profiling_start_ns(table, run)
    result: dict[str, Any] = {
        "phase_name": "profiling",
        "expected_duration_seconds": configured,
        "required_ratio": HARNESS_COVERAGE_MIN_RATIO,
        "ttft_ratio": 0.0,
        "inter_token_latency_ratio": 0.0,
        "applies": configured is not None and configured >= COVERAGE_MIN_PHASE_S and start is not None,
    }
    if configured is None or start is None:
        return result
    good = profiling & ok
    first_token = floats(table, "first_token_ns")[good]
    first_token = first_token[np.isfinite(first_token)]
    itl = floats(table, "tpot_s")
    with_itl = good & np.isfinite(itl)
    ends = floats(table, "end_ns")[with_itl]
    ends = ends[np.isfinite(ends)]

    def ratio(times: npt.NDArray[np.float64]) -> float:
        if not times.size:
            return 0.0
        return min(max((float(times.max()) - start) / (configured * _NS_PER_S), 0.0), 1.0)

    result["ttft_ratio"] = ratio(first_token)
    result["inter_token_latency_ratio"] = ratio(ends)
    return result


def _acceptance_mismatch(acceptance: Acceptance | None, document: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The run's acceptance verdict as builtins (`mismatch`, `reasons`, ALs), from `acceptance` or `run.json`."""
    if acceptance is not None:
        return {
            "mismatch": acceptance.mismatch,
            "reasons": list(acceptance.mismatch_reasons),
            "forced_al": acceptance.forced_al,
            "realized_al": acceptance.realized_al,
            "realized_source": acceptance.realized_source,
        }
    summary = document.get("summary") if document is not None else None
    stored = summary.get("acceptance") if isinstance(summary, Mapping) else None
    if not isinstance(stored, Mapping):
        return None
    keys = ("forced_al", "realized_al", "realized_source")
    return {
        "mismatch": stored.get("mismatch") is True,
        "reasons": list(stored.get("mismatch_reasons") or []),
        **{key: stored.get(key) for key in keys},
    }


def validity(
    table: pa.Table, run_file: Mapping[str, Any] | msgspec.Struct | None, acceptance: Acceptance | None = None
) -> Validity:
    """The validity of a run from its records table and its `run.json` (a `RunFile`, its decoded dict, or None).

    The rules are the module docstring's. A dict keeps keys `RunFile` does not know yet (such as
    `run.skipped_context_overflow` and `run.cancel_reason`), so pass the decoded `run.json` when there is one.
    """
    document = _builtins(run_file)
    run: Mapping[str, Any] = {}
    options: Any = {}
    if document is not None:
        run = document.get("run") or {}
        options = document.get("options") or {}
    try:
        record_options: Any = run_info(table).options
    except RecordsError:  # a table built in memory, without the file's metadata
        record_options = {}
    reasons: list[str] = []
    explained: list[Reason] = []
    details: dict[str, Any] = {"run_file_missing": document is None}

    def fail(code: str, message: str) -> None:
        if code not in reasons:
            reasons.append(code)
        explained.append(Reason(code=code, message=message))

    unsafe = _unsafe(options) or _unsafe(record_options)
    details["unsafe_override"] = unsafe
    if unsafe:
        for lock in _locks(record_options, options) or ["a locked rule of the scenario was overridden"]:
            fail(UNSAFE_OVERRIDE, lock)

    profiling = ~equals(table, "phase", "warmup", missing=False)
    ok = equals(table, "status", "ok", missing=True)
    overflow = equals(table, "error_kind", "context_overflow", missing=False)
    request_count = int((profiling & ok).sum())
    overflows = int((profiling & ~ok & overflow).sum())
    error_count = int((profiling & ~ok & ~overflow).sum())
    skipped_raw = run.get("skipped_context_overflow", 0) if isinstance(run, Mapping) else 0
    skipped = int(skipped_raw) if isinstance(skipped_raw, int | float) else 0
    denominator = request_count + error_count + overflows
    overflow_rate = overflows / denominator if denominator else 0.0
    details |= {
        "request_count": request_count,
        "error_request_count": error_count,
        "context_overflow_count": overflows,
        "skipped_context_overflow_count": skipped,
        "context_overflow_rate": overflow_rate,
    }
    if overflow_rate > CONTEXT_OVERFLOW_MAX_RATE:
        fail(
            CONTEXT_OVERFLOW_RATE_EXCEEDED,
            f"{overflows:,} of {denominator:,} profiling requests ({overflow_rate:.1%}) overflowed the model's "
            f"context; at most {CONTEXT_OVERFLOW_MAX_RATE:.0%} may",
        )

    interrupted = bool(run.get("interrupted", False)) if isinstance(run, Mapping) else False
    cancel_reason = run.get("cancel_reason") if isinstance(run, Mapping) else None
    details |= {"interrupted": interrupted, "cancel_reason": cancel_reason or None}
    if interrupted or cancel_reason or document is None:
        fail(RUN_CANCELLED, _cancelled(document, interrupted, cancel_reason))

    rules = rules_of(options, record_options)
    details["rules"] = rules.name
    if rules.coverage == "last_metric":
        bounded = any(_option(options, record_options, name) is not None for name in ("sessions", "num_requests"))
        reached = metric_coverage(table, profiling, ok, run, _option(options, record_options, "duration_s"), bounded)
        details["metric_duration_coverage"] = reached
        cancelled = interrupted or bool(cancel_reason) or document is None
        best = max(reached["ttft_ratio"], reached["inter_token_latency_ratio"])
        if reached["applies"] and not cancelled and best < HARNESS_COVERAGE_MIN_RATIO:
            duration_s = reached["expected_duration_seconds"]
            fail(
                INSUFFICIENT_COVERAGE,
                f"the last first token came {reached['ttft_ratio']:.1%} and the last response with an ITL "
                f"{reached['inter_token_latency_ratio']:.1%} into the {duration_s:,.0f} s profiling window; the "
                f"rules need one of them past {HARNESS_COVERAGE_MIN_RATIO:.0%}: the server stopped answering or "
                "stalled before the end",
            )
    else:
        coverage = _coverage(table, profiling, ok)
        details["coverage"] = coverage
        fraction = coverage["covered_fraction"]
        if coverage["applies"] and (fraction is None or fraction < COVERAGE_MIN_FRACTION):
            share = "none" if fraction is None else f"{fraction:.1%}"
            fail(
                INSUFFICIENT_COVERAGE,
                f"successful streamed requests cover {share} of the {coverage['phase_s']:,.0f} s profiling window; "
                f"the rules need {COVERAGE_MIN_FRACTION:.0%}",
            )

    lag = floats(table, "dispatch_lag_s")[profiling]
    lag = lag[np.isfinite(lag)]
    lag_p99 = float(np.percentile(lag, 99)) if lag.size else None
    details["dispatch_lag_p99_s"] = lag_p99
    if lag_p99 is not None and lag_p99 > DISPATCH_LAG_MAX_P99_S:
        fail(
            DISPATCH_LAG_EXCEEDED,
            f"dispatch lag p99 {lag_p99:.2f} s is above {DISPATCH_LAG_MAX_P99_S:g} s: the client fell behind its "
            "schedule, so the run measured the client",
        )

    verdict = _acceptance_mismatch(acceptance, document)
    if verdict is not None:
        details["acceptance"] = verdict
        if verdict["mismatch"]:
            because = "; ".join(verdict["reasons"]) or "it differs"
            fail(ACCEPTANCE_MISMATCH, f"the realized speculative acceptance disagrees with the forced one: {because}")

    completed = request_count + error_count
    error_rate = error_count / completed if completed else None
    details["inferencex_error_rate"] = error_rate
    details["inferencex_gate_passed"] = error_rate is not None and error_rate <= INFERENCEX_MAX_ERROR_RATE
    mode = _mode(options, record_options)
    return Validity(
        valid=not reasons,
        reasons=reasons,
        details=details,
        explained=explained,
        applies=mode in (None, "agentx"),
        mode=mode,
    )
