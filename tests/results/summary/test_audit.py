"""The plausibility audit (agentx.results.summary.checks.audit): each finding provoked on purpose, none on a clean
run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from flat import replay_options
from paths import SAMPLE_TRACE
from rich.console import Console
from strategies import record_identity

from agentx import ReplayOptions, replay, replay_sync
from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import SCHEMA, RequestRecord
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.telemetry.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, ServerMetrics
from agentx.results.summary.checks.acceptance import Acceptance
from agentx.results.summary.checks.audit import Audit, Finding, audit
from agentx.results.summary.model import DispatchLag, LoopLag, Summary
from agentx.results.summary.server_telemetry import CounterStats, MeanPeak, SeriesStats, ServerTelemetry
from agentx.results.summary.summarize import summarize
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

MS = 1_000_000
S = 1_000_000_000


def rec(index: int = 0, **overrides: Any) -> RequestRecord:
    """A plausible request: 2,000-token prompt, 100 cached, TTFT 100 ms, 11 tokens at 50 ms each."""
    sent = (1 + index) * S
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "turn": index,
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_token_ns": sent + 100 * MS,
        "last_token_ns": sent + 600 * MS,
        "end_ns": sent + 700 * MS,
        "chunk_times_ns": [sent + 100 * MS + k * 50 * MS for k in range(11)],
        "chunk_tokens": [1] * 11,
        "isl_recorded_tokens": 2000,
        "isl_sent_tokens": 2000,
        "isl_server_tokens": 2000,
        "cached_tokens": 100,
        "osl_recorded_tokens": 11,
        "osl_server_tokens": 11,
        "osl_streamed_tokens": 11,
    }
    values.update(overrides)
    return RequestRecord(**values)


def table(records: list[RequestRecord]) -> pa.Table:
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA)


def codes(result: Audit | None) -> list[str]:
    assert result is not None
    return [finding.code for finding in result.findings]


def test_plausible_requests_have_no_findings() -> None:
    assert codes(summarize(table([rec(k) for k in range(50)])).audit) == []


def test_whole_responses_at_once_are_rejected_as_bundled_output() -> None:
    def bundled(k: int) -> RequestRecord:
        sent = (1 + k) * S
        at = sent + 600 * MS
        return rec(k, first_token_ns=at, last_token_ns=at + 20_000, chunk_times_ns=[at + 2_000 * j for j in range(11)])

    records = [rec(k) for k in range(40)] + [bundled(k) for k in range(40, 50)]
    result = summarize(table(records)).audit
    assert codes(result) == ["bundled_output"]
    assert result is not None
    finding = result.findings[0]
    assert finding.requests == 10 and "10 of 50 requests (20.0%)" in finding.evidence
    assert result.rejects("tpot") and result.rejects("interactivity") and not result.rejects("ttft")


def test_streams_a_client_stall_outlasts_are_not_blamed_on_the_server() -> None:
    """11 tokens at the run's median TPOT of 50 ms last 500 ms: a client whose loop lag reached 450 ms may have stalled
    550 ms (a stall that began just after a 100 ms sample shows that much shorter) and read them in one go; one whose
    lag reached 100 ms may not."""

    def bundled(k: int) -> RequestRecord:
        at = (1 + k) * S + 600 * MS
        return rec(k, first_token_ns=at, last_token_ns=at + 20_000, chunk_times_ns=[at + 2_000 * j for j in range(11)])

    records = table([rec(k) for k in range(40)] + [bundled(k) for k in range(40, 50)])
    summary = summarize(records)
    for stall_s, expected in ((0.1, ["bundled_output"]), (0.3, ["bundled_output"]), (0.45, []), (0.6, [])):
        summary.loop_lag = LoopLag(samples=100, p50_s=0.0, p99_s=0.01, max_s=stall_s)
        assert codes(audit(records, summary)) == expected


def test_one_bundled_request_in_hundreds_is_noise() -> None:
    at = 301 * S + 600 * MS
    odd = rec(300, first_token_ns=at, last_token_ns=at + 1_000, chunk_times_ns=[at] * 11)
    assert codes(summarize(table([rec(k) for k in range(300)] + [odd])).audit) == []


def test_chunks_far_above_the_forced_acceptance_warn_about_itl() -> None:
    def chunky(k: int) -> RequestRecord:
        sent = (1 + k) * S
        return rec(k, chunk_times_ns=[sent + 100 * MS, sent + 600 * MS], chunk_tokens=[1, 10])

    records = table([chunky(k) for k in range(20)])
    summary = summarize(records)
    assert codes(summary.audit) == ["chunk_bundling"]
    # The same chunks are what a forced acceptance length of 4 leads one to expect.
    summary.acceptance = Acceptance(
        forced_al=4.0, spec_k=4, tolerance=0.1, counters=None, stream=None, realized_al=None, realized_source=None,
        mismatch=False,
    )  # fmt: skip
    assert codes(audit(records, summary)) == []


def test_a_first_token_before_the_prefill_could_end_is_rejected() -> None:
    records = [rec(k) for k in range(30)] + [
        rec(30 + k, first_token_ns=(31 + k) * S + 300_000, isl_server_tokens=12_000, isl_sent_tokens=12_000)
        for k in range(3)
    ]
    result = summarize(table(records)).audit
    assert codes(result) == ["ttft_faster_than_prefill"]
    assert result is not None and result.rejects("ttft") and not result.rejects("tpot")
    assert "11,900 uncached tokens, TTFT 0.300 ms" in result.findings[0].evidence


def test_a_fast_ttft_on_a_cached_prompt_is_plausible() -> None:
    cached = [rec(k, first_token_ns=(1 + k) * S + 300_000, cached_tokens=1_984) for k in range(30)]
    assert codes(summarize(table(cached)).audit) == []


def test_prompt_counts_that_differ_and_absent_cached_tokens_warn() -> None:
    records = [rec(k, isl_server_tokens=2_300, cached_tokens=None) for k in range(20)]
    result = summarize(table(records)).audit
    assert codes(result) == ["prompt_tokens_differ", "cached_tokens_absent"]
    assert result is not None and not result.rejects("cache")
    assert "--enable-prompt-tokens-details" in result.findings[1].advice


def test_absent_cached_tokens_say_whether_the_servers_counters_stand_in_and_why_not() -> None:
    """The counters are read around every run: the advice never asks for --metrics-interval, and a server with no
    /metrics at all (404) is named as such."""
    records = table([rec(k, cached_tokens=None) for k in range(20)])

    def said(summary: Summary, **known: bool) -> Finding:
        result = audit(records, summary, **known)
        found = [finding for finding in result.findings if finding.code == "cached_tokens_absent"]
        assert len(found) == 1 and "--metrics-interval" not in found[0].advice
        return found[0]

    absent = said(summarize(records), metrics_not_served=True)
    assert absent.evidence.endswith("cached_tokens; the server exposes no /metrics (404)")
    assert "The server exposes no /metrics (404), so no counter of its can stand in either." in absent.advice
    silent = said(summarize(records))
    assert "Nor did the server's /metrics give prefix-cache counters" in silent.advice and "404" not in silent.advice
    counters = ServerMetrics(
        before={PREFIX_CACHE_HITS: 100, PREFIX_CACHE_QUERIES: 1_000},
        after={PREFIX_CACHE_HITS: 400, PREFIX_CACHE_QUERIES: 2_000},
    )
    counted = said(summarize(records, server_metrics=counters))
    assert counted.evidence.endswith("the server's counters say 30.0%")
    assert "The hit rate from the server's own counters (above) stands in." in counted.advice


def test_a_full_kv_cache_and_preemptions_warn() -> None:
    summary = summarize(table([rec(k) for k in range(5)]))
    summary.server_telemetry = ServerTelemetry(
        engine="vllm",
        endpoint="http://127.0.0.1:1/metrics",
        interval_s=1.0,
        scrapes=10,
        window_scrapes=10,
        window_start_s=0.0,
        window_end_s=10.0,
        kv_cache_usage_ratio=MeanPeak(mean=0.8, peak=1.0),
        series={
            "preemptions_total": SeriesStats(
                kind="counter", unit="", sources=["vllm:num_preemptions_total"], scrapes=10,
                counter=CounterStats(total=42.0, rate=4.2),
            )
        },
    )  # fmt: skip
    found = audit(table([rec(k) for k in range(5)]), summary)
    assert codes(found) == ["kv_cache_full", "preemptions"]
    assert "42 preemptions" in found.findings[1].evidence


@pytest.mark.parametrize(("p99_s", "severity"), [(0.2, "warning"), (3.0, "error")])
def test_a_client_behind_its_schedule_is_client_bound(p99_s: float, severity: str) -> None:
    records = table([rec(k) for k in range(5)])
    summary = summarize(records)
    summary.dispatch_lag = DispatchLag(p50_s=0.001, p99_s=p99_s, max_s=p99_s)
    found = audit(records, summary)
    assert codes(found) == ["client_bound"] and found.findings[0].severity == severity
    summary.dispatch_lag, summary.loop_lag = None, LoopLag(samples=100, p50_s=0.0, p99_s=p99_s, max_s=p99_s)
    assert codes(audit(records, summary)) == ["client_bound"]


def demo_options(server: SimServer, out_dir: Path, sessions: int = 8, **fields: object) -> ReplayOptions:
    """`make demo`'s run (`fields` change it)."""
    return replay_options(url=server.url, model=server.model, out_dir=out_dir, sessions=sessions, concurrency=4,
                          delay_scale=0.05, **fields)  # fmt: skip


def test_the_demo_run_is_audited_clean_and_a_client_that_blocks_its_loop_is_client_bound(tmp_path: Path) -> None:
    trace = load_trace(SAMPLE_TRACE)

    def blocking(_record: object) -> None:
        time.sleep(0.12)  # a harness doing slow work on the replay's event loop

    with SimServer(time_scale=0.05) as server:
        clean = replay_sync(trace, demo_options(server, tmp_path / "demo"))
        # A loaded machine (the suite beside other work) may add that the client fell behind, which is then true.
        assert [code for code in codes(clean.summary.audit) if code != "client_bound"] == []
        telemetry = clean.summary.server_telemetry
        assert telemetry is not None  # the simulator's own TTFT histogram, read as vLLM's
        server_s, requests = (
            telemetry.series["ttft_seconds_total"].counter,
            telemetry.series["ttft_requests_total"].counter,
        )
        assert server_s is not None and requests is not None and requests.total > 50
        assert clean.summary.latency.ttft_s is not None
        assert 0 < server_s.total / requests.total <= clean.summary.latency.ttft_s.mean
        blocked = asyncio.run(
            replay(trace, demo_options(server, tmp_path / "blocked", 4, num_requests=20), RunHooks(on_record=blocking))
        )
    result = blocked.summary.audit
    assert "client_bound" in codes(result)
    assert result is not None and any(f.code == "client_bound" and "lag p99" in f.evidence for f in result.findings)


def test_a_server_that_bundles_drops_cached_tokens_or_answers_before_the_prefill_is_caught(tmp_path: Path) -> None:
    trace = load_trace(SAMPLE_TRACE)
    with SimServer(time_scale=0.05, faults=FaultConfig(bundle_rate=1.0, drop_cached_tokens=True)) as server:
        bundling = replay_sync(trace, demo_options(server, tmp_path / "bundling", 4, num_requests=30))
    # A prefill of 25 µs a token (wall): the early token comes long before the engine's first (~20 ms against ~250 ms).
    early_faults = FaultConfig(early_first_token_rate=1.0)
    with SimServer(time_scale=0.05, prefill_s_per_token=5e-4, faults=early_faults) as server:
        early = replay_sync(trace, demo_options(server, tmp_path / "early", 4, num_requests=30))
    # A loaded machine (the suite beside other work) may add that the client fell behind, which is then true.
    found = codes(bundling.summary.audit)
    assert [code for code in found if code != "client_bound"] == ["bundled_output", "cached_tokens_absent"]
    assert "ttft_before_server" in codes(early.summary.audit)
    assert early.summary.audit is not None and early.summary.audit.rejects("ttft")
    console = Console(width=200, record=True)
    for table_ in summary_table(bundling.summary):
        console.print(table_)
    text = console.export_text()
    audit = bundling.summary.audit
    assert audit is not None and "TPOT (ms)  ✗ audit" in text
    assert ("TTFT (ms)  ✗ audit" in text) is audit.rejects("ttft")  # only a client far behind rejects TTFT here
    rejecting = sum(finding.severity == "error" for finding in audit.findings)
    assert rejecting == 1 + ("client_bound" in found and audit.rejects("ttft"))
    assert f"plausibility audit: {len(found)} findings, {rejecting} rejecting figures" in text
