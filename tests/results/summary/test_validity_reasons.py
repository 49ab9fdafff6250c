"""Validity in words: every reason with the figure that caused it, on the terminal and in run.json;
"not applicable" outside the agentx mode; "yes" for a run that meets the rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from paths import SAMPLE_TRACE
from tables80 import rendered

from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import META_EPOCH, META_FORMAT, META_RUN, META_RUN_ID, META_VERSION, SCHEMA, RequestRecord
from agentx.results.summary.checks.validity import (
    DISPATCH_LAG_EXCEEDED,
    RUN_CANCELLED,
    UNSAFE_OVERRIDE,
    Reason,
    validity,
)
from agentx.results.summary.summarize import summarize

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

S = 1_000_000_000


def _replay(out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """`agentx replay` of two sample sessions against the simulator: its stdout and its run.json."""
    command = [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--sessions", "2", "--concurrency", "2"]
    command += ["--sim-time-scale", "0.01", "--out", str(out), *args]
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout, json.loads((out / "run.json").read_text())


def test_a_demo_like_agentx_run_says_each_broken_lock_with_its_value(tmp_path: Path) -> None:
    stdout, run = _replay(tmp_path / "run", "--delay-scale", "0.05", "--system-idle-cap", "5")
    flat = " ".join(stdout.split())  # the table wraps long sentences between words
    assert "valid AgentX submission │ no (why below)" in flat
    assert "why the run is not a valid AgentX submission" in flat
    # No duration lock: the default rules' scenario gives the run its 3600 s (bounded by its 2 sessions here).
    sentences = [
        "recorded delays scaled by 0.05 (--delay-scale); the rules replay them as recorded",
        "system idle cap 5 s instead of the rules' 10 s (--system-idle-cap)",
    ]
    validity = run["summary"]["validity"]
    assert validity["valid"] is False and validity["applies"] is True and validity["mode"] == "agentx"
    assert validity["reasons"] == [UNSAFE_OVERRIDE]
    assert validity["explained"] == [{"code": UNSAFE_OVERRIDE, "message": sentence} for sentence in sentences]
    words = " ".join(flat.replace("│", " ").split())
    for sentence in sentences:
        assert sentence in words, words


def test_a_closed_mode_run_says_the_rules_do_not_apply(tmp_path: Path) -> None:
    stdout, run = _replay(tmp_path / "run", "--mode", "closed", "--delay-scale", "0")
    assert "valid AgentX submission │ not applicable (closed mode)" in " ".join(stdout.split())
    assert "why the run is not" not in stdout and "unsafe_override" not in stdout
    validity = run["summary"]["validity"]
    assert validity["applies"] is False and validity["mode"] == "closed"
    assert validity["explained"] == [
        {"code": UNSAFE_OVERRIDE, "message": "mode closed: the AgentX rules apply to --mode agentx only"}
    ]


def _record(sent_s: float, **overrides: Any) -> RequestRecord:
    sent = int(sent_s * S)
    values: dict[str, Any] = {
        "run_id": "run-1",
        "phase": "profiling",
        "lane": 0,
        "play": 0,
        "session_id": "s",
        "agent_id": "",
        "depth": 0,
        "turn": 0,
        "model": "m",
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_token_ns": sent + S // 10,
        "last_token_ns": sent + 4 * S,
        "end_ns": sent + 4 * S,
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 100,
        "osl_recorded_tokens": 11,
        "osl_streamed_tokens": 11,
    }
    values.update(overrides)
    return RequestRecord(**values)


def _table(records: list[RequestRecord], options: dict[str, Any]) -> pa.Table:
    metadata = {
        META_FORMAT: b"agentx-records",
        META_VERSION: b"1.6",
        META_RUN_ID: b"run-1",
        META_EPOCH: b"0",
        META_RUN: msgspec.json.encode(options),
    }
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA.with_metadata(metadata))


FAITHFUL = {"mode": "agentx", "duration_s": 1200.0, "delay_scale": 1.0, "locks_broken": [], "unsafe_override": False}


def test_a_run_that_meets_the_rules_says_yes() -> None:
    """A 1,200 s agentx run, every lock kept, requests back to back: valid, and the summary says "yes"."""
    table = _table([_record(4.0 * i) for i in range(300)], FAITHFUL)
    verdict = validity(table, {"options": FAITHFUL, "run": {"interrupted": False}})
    assert verdict.valid and verdict.applies and verdict.explained == [] and verdict.verdict() == "yes"
    assert verdict.details["coverage"]["applies"] is True  # a window long enough to be judged
    summary = summarize(table)
    summary.validity = verdict
    text = rendered(summary_table(summary), 120)
    assert "valid AgentX submission │ yes" in " ".join(text.split()) and "why the run" not in text


def test_each_other_reason_names_its_figure() -> None:
    late = [_record(float(i), scheduled_ns=int((i - 2.5) * S)) for i in range(1, 20)]
    verdict = validity(_table(late, FAITHFUL), {"options": FAITHFUL, "run": {"interrupted": True}})
    assert verdict.reasons == [RUN_CANCELLED, DISPATCH_LAG_EXCEEDED]
    assert verdict.explained == [
        Reason(code=RUN_CANCELLED, message="the run was interrupted (Ctrl-C or SIGTERM) before its end"),
        Reason(
            code=DISPATCH_LAG_EXCEEDED,
            message="dispatch lag p99 2.50 s is above 1 s: the client fell behind its schedule, so the run measured "
            "the client",
        ),
    ]
    overflowing = [_record(float(i)) for i in range(1, 10)] + [
        _record(10.0, status="error", error_kind="context_overflow", first_token_ns=None, last_token_ns=None)
    ]
    words = validity(_table(overflowing, FAITHFUL), None).explained
    assert [reason.message for reason in words] == [
        "1 of 10 profiling requests (10.0%) overflowed the model's context; at most 1% may",
        "the run has no run.json, which every run that ends writes: it crashed or is still going",
    ]


def test_a_run_json_with_codes_only_still_says_why() -> None:
    """run.json from before the sentences: the table falls back to the codes, in words."""
    table = _table([_record(1.0)], {"mode": "agentx", "unsafe_override": True})
    verdict = validity(table, {"options": {}, "run": {"interrupted": False}})
    assert verdict.explained == [Reason(code=UNSAFE_OVERRIDE, message="a locked rule of the scenario was overridden")]
    old = msgspec.convert({"valid": False, "reasons": [UNSAFE_OVERRIDE], "details": {}}, type(verdict))
    summary = summarize(table)
    summary.validity = old
    text = " ".join(rendered(summary_table(summary), 120).split())
    assert "why the run is not a valid AgentX submission" in text and "unsafe override" in text
