"""The run summary (agentx/results/summary/summarize.py and the modules it uses) against hand-computed InferenceX
aggregates."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from strategies import record_identity

from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import SCHEMA, RequestRecord, RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.replayer.telemetry.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, ServerMetrics, parse_counters
from agentx.results.summary.model import Slowdown, Summary
from agentx.results.summary.stats import PERCENTILES, Stats, percentile, percentile_key, rate_percentile, stats
from agentx.results.summary.summarize import summarize

MS = 1_000_000
S = 1_000_000_000


def rec(**overrides: Any) -> RequestRecord:
    """A successful profiling request: sent at 1 s, first token at 1.1 s, 11 tokens until 1.6 s, end 1.7 s."""
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "scheduled_ns": 1 * S,
        "sent_ns": 1 * S,
        "first_token_ns": 1 * S + 100 * MS,
        "last_token_ns": 1 * S + 600 * MS,
        "end_ns": 1 * S + 700 * MS,
        "chunk_times_ns": [1 * S + 100 * MS, 1 * S + 600 * MS],
        "chunk_tokens": [1, 10],
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 100,
        "osl_recorded_tokens": 11,
        "osl_streamed_tokens": 11,
    }
    values.update(overrides)
    return RequestRecord(**values)


def failed(kind: str, **overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "status": "error",
        "error_kind": kind,
        "first_token_ns": None,
        "last_token_ns": None,
        "chunk_times_ns": [],
        "chunk_tokens": [],
        "osl_streamed_tokens": 0,
    }
    values.update(overrides)
    return rec(**values)


def table(records: list[RequestRecord]) -> pa.Table:
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA)


def with_ttft(ttft_ms: int, **overrides: Any) -> RequestRecord:
    return rec(
        first_token_ns=1 * S + ttft_ms * MS, chunk_times_ns=[1 * S + ttft_ms * MS, 1 * S + 600 * MS], **overrides
    )


# ---------------------------------------------------------------------------------------------
# percentile


def test_percentile_by_the_inferencex_formula() -> None:
    # k = (n−1)p/100; v[f] + (k−f)(v[f+1]−v[f]) on the sorted values.
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(2.5)  # k = 1.5
    assert percentile(values, 75) == pytest.approx(3.25)  # k = 2.25
    assert percentile(values, 90) == pytest.approx(3.7)  # k = 2.7
    assert percentile(values, 100) == 4.0
    assert percentile([15.0, 20.0, 35.0, 40.0, 50.0], 40) == pytest.approx(29.0)  # k = 1.6: 20 + 0.6·15
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_no_values_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


FINITE = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


@given(st.lists(FINITE, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_percentile_equals_numpy_linear(values: list[float], p: float) -> None:
    expected = float(np.percentile(np.array(values), p, method="linear"))
    assert percentile(values, p) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@given(
    st.lists(FINITE, min_size=1, max_size=50),
    st.floats(min_value=0, max_value=100),
    st.floats(min_value=0, max_value=100),
)
def test_percentile_is_monotone_in_p(values: list[float], p: float, q: float) -> None:
    low, high = sorted((p, q))
    # interpolating between two equal neighbours can round by an ulp either way
    tolerance = 1e-9 * max(1.0, *map(abs, values))
    assert percentile(values, low) <= percentile(values, high) + tolerance
    assert min(values) - tolerance <= percentile(values, low) <= max(values) + tolerance


RATES = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)


@given(st.lists(RATES, min_size=1, max_size=50), st.floats(min_value=0, max_value=100), st.floats(0, 100))
def test_a_rates_percentile_is_the_slow_tail_and_falls_with_p(rates: list[float], p: float, q: float) -> None:
    """One direction for every throughput-like percentile: pN is the rate N% of the population reached at least
    (1 / pN of the times), so it falls as N rises, as InferenceX's interactivity (1 / p90 TPOT) does."""
    low, high = sorted((p, q))
    assert rate_percentile(rates, low) >= rate_percentile(rates, high) * (1 - 1e-9)
    assert rate_percentile(rates, p) == pytest.approx(1 / percentile([1 / r for r in rates], p), rel=1e-9)
    reached = sum(r >= rate_percentile(rates, p) * (1 - 1e-9) for r in rates)
    assert reached >= len(rates) * p / 100 - 1  # at least p% (less one: interpolation) reached it


# ---------------------------------------------------------------------------------------------
# counts and latency


def test_errors_and_warmup_are_counted_but_left_out_of_latency() -> None:
    records = [
        with_ttft(100),
        with_ttft(200),
        with_ttft(300),
        with_ttft(5, phase="warmup"),  # would drag the stats down
        failed("http"),
        failed("http"),
        failed("timeout", first_token_ns=1 * S + 1 * MS, last_token_ns=9 * S),  # partial stream, still an error
        failed("cancelled"),
        failed("http", phase="warmup"),
    ]
    summary = summarize(table(records))
    c = summary.counts
    assert (c.rows, c.kept, c.profiling, c.warmup_excluded) == (9, 3, 7, 2)
    assert c.errors == 3
    assert c.errors_by_kind == {"http": 2, "timeout": 1}
    assert c.cancelled == 1
    ttft = summary.latency.ttft_s
    assert ttft is not None
    assert ttft.count == 3
    assert ttft.mean == pytest.approx(0.2)
    assert ttft.p50 == pytest.approx(0.2)
    assert ttft.p90 == pytest.approx(0.28)  # k = 1.8: 0.2 + 0.8·0.1
    assert ttft.std == pytest.approx(math.sqrt(0.02 / 3))  # pstdev
    assert ttft.min == pytest.approx(0.1) and ttft.max == pytest.approx(0.3)
    e2e = summary.latency.e2el_s
    assert e2e is not None and e2e.count == 3 and e2e.max == pytest.approx(0.6)


def test_tpot_is_null_below_two_output_tokens_and_left_out() -> None:
    one_token = rec(last_token_ns=1 * S + 100 * MS, chunk_times_ns=[1 * S + 100 * MS], chunk_tokens=[1])
    one_token = msgspec.structs.replace(one_token, osl_streamed_tokens=1)
    assert one_token.tpot_s is None
    summary = summarize(table([one_token, rec()]))
    itl, ttft = summary.latency.tpot_s, summary.latency.ttft_s
    assert itl is not None and ttft is not None
    assert itl.count == 1 and itl.mean == pytest.approx(0.05)  # 0.5 s over 10 gaps
    assert ttft.count == 2  # the 1-token request still has a TTFT


def test_interactivity_is_one_over_itl_at_each_statistic() -> None:
    itls_s = [0.01, 0.02, 0.04, 0.05]
    records = [rec(last_token_ns=1 * S + 100 * MS + round(itl * 10 * S)) for itl in itls_s]  # OSL 11: 10 gaps
    summary = summarize(table(records))
    itl, intvty = summary.latency.tpot_s, summary.latency.interactivity_tps
    assert itl is not None and intvty is not None
    assert itl.p90 == pytest.approx(percentile(itls_s, 90))
    assert intvty.p90 == pytest.approx(1 / percentile(itls_s, 90))  # the slow tail: 1/p90 ITL, not p90 of 1/ITL
    assert intvty.p50 == pytest.approx(1 / percentile(itls_s, 50))
    assert intvty.mean == pytest.approx(1 / np.mean(itls_s))
    assert intvty.p99 == pytest.approx(1 / itl.p99)
    assert intvty.std == pytest.approx(float(np.std([1 / x for x in itls_s])))


def test_non_positive_latencies_are_dropped() -> None:
    # a first token stamped at the send instant gives TTFT 0: InferenceX drops ≤ 0 values
    summary = summarize(table([with_ttft(0), with_ttft(100)]))
    ttft = summary.latency.ttft_s
    assert ttft is not None and ttft.count == 1 and ttft.mean == pytest.approx(0.1)


def test_chunk_gaps_are_within_a_request_only() -> None:
    a = rec(chunk_times_ns=[10 * MS, 12 * MS, 15 * MS], chunk_tokens=[1, 4, 6])
    b = rec(chunk_times_ns=[100 * MS, 101 * MS], chunk_tokens=[1, 10])
    summary = summarize(table([a, b]))
    gaps, tokens = summary.latency.itl_s, summary.latency.chunk_tokens
    assert gaps is not None and tokens is not None
    assert gaps.count == 3  # 2 ms, 3 ms, 1 ms; not the 85 ms between the requests
    assert gaps.mean == pytest.approx(0.002)
    assert gaps.max == pytest.approx(0.003)
    assert tokens.count == 5 and tokens.mean == pytest.approx(22 / 5)


# ---------------------------------------------------------------------------------------------
# throughput


def test_throughput_over_first_start_to_last_end() -> None:
    records = [
        rec(sent_ns=1 * S, end_ns=3 * S, isl_server_tokens=100, osl_server_tokens=10),  # server counts win
        rec(sent_ns=2 * S, end_ns=5 * S, isl_sent_tokens=50, osl_streamed_tokens=20),  # else sent / streamed
        failed("http", sent_ns=0, end_ns=10 * S),  # outside the kept span
        rec(phase="warmup", sent_ns=0, end_ns=20 * S),
    ]
    summary = summarize(table(records), num_gpus=2)
    t = summary.throughput
    assert t is not None
    assert t.duration_s == pytest.approx(4.0)
    assert (t.input_tokens, t.output_tokens) == (150, 30)
    assert t.input_tps == pytest.approx(37.5)
    assert t.output_tps == pytest.approx(7.5)
    assert t.total_tps == pytest.approx(45.0)
    assert t.requests_per_s == pytest.approx(0.5)
    assert t.num_gpus == 2
    assert t.input_tps_per_gpu == pytest.approx(18.75)
    assert t.output_tps_per_gpu == pytest.approx(3.75)
    assert t.total_tps_per_gpu == pytest.approx(22.5)
    assert summarize(table(records)).throughput is not None
    assert summarize(table(records)).throughput.total_tps_per_gpu is None  # type: ignore[union-attr]


def test_bad_gpu_count_is_refused() -> None:
    with pytest.raises(ValueError):
        summarize(table([rec()]), num_gpus=0)


# ---------------------------------------------------------------------------------------------
# cache


def test_cache_hit_from_usage_counts_only_requests_that_report_it() -> None:
    records = [
        rec(isl_server_tokens=100, cached_tokens=40),
        rec(isl_server_tokens=300, cached_tokens=60),
        rec(isl_server_tokens=1000),  # no usage detail: neither hit nor miss
        failed("http", isl_server_tokens=500, cached_tokens=500),
    ]
    cache = summarize(table(records)).cache
    assert cache.usage_hit_rate == pytest.approx(0.25)
    assert (cache.usage_cached_tokens, cache.usage_reported_requests) == (100, 2)
    assert cache.server_hit_rate is None
    assert summarize(table([rec()])).cache.usage_hit_rate is None


def test_server_hit_rate_from_llamacpp_token_counters() -> None:
    # llama.cpp counts computed prompt tokens (cached excluded) and cached ones: hits over their sum.
    text_before = "llamacpp:prompt_tokens_total 500\nllamacpp:prompt_tokens_cached_total 100\n"
    text_after = "llamacpp:prompt_tokens_total 800\nllamacpp:prompt_tokens_cached_total 1000\n"
    metrics = ServerMetrics(before=parse_counters(text_before), after=parse_counters(text_after))
    assert summarize(table([rec()]), server_metrics=metrics).cache.server_hit_rate == pytest.approx(900 / 1200)


def test_server_hit_rate_from_counter_deltas() -> None:
    metrics = ServerMetrics(
        before={PREFIX_CACHE_HITS: 10, PREFIX_CACHE_QUERIES: 100},
        after={PREFIX_CACHE_HITS: 70, PREFIX_CACHE_QUERIES: 300},
    )
    assert summarize(table([rec()]), server_metrics=metrics).cache.server_hit_rate == pytest.approx(0.3)
    reset = ServerMetrics(before={PREFIX_CACHE_HITS: 90, PREFIX_CACHE_QUERIES: 100}, after=metrics.after)
    assert summarize(table([rec()]), server_metrics=reset).cache.server_hit_rate == 0.0  # a reset counts 0
    missing = ServerMetrics(before={}, after=metrics.after)
    assert summarize(table([rec()]), server_metrics=missing).cache.server_hit_rate is None
    idle = ServerMetrics(before=metrics.before, after=metrics.before)
    assert summarize(table([rec()]), server_metrics=idle).cache.server_hit_rate is None


def test_parse_counters_sums_engines() -> None:
    text = "\n".join(
        [
            "# HELP vllm:prefix_cache_hits_total hits",
            "# TYPE vllm:prefix_cache_hits_total counter",
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 12.0',
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 8.0',
            "vllm:prefix_cache_queries_total 50",
            "vllm:other_total 1",
        ]
    )
    assert parse_counters(text) == {PREFIX_CACHE_HITS: 20.0, PREFIX_CACHE_QUERIES: 50.0}


def test_theoretical_hit_over_kept_requests_with_blocks() -> None:
    records = [
        rec(theoretical_hit_blocks=3, theoretical_total_blocks=4),
        rec(theoretical_hit_blocks=1, theoretical_total_blocks=4),
        rec(),
        failed("http", theoretical_hit_blocks=0, theoretical_total_blocks=100),
    ]
    assert summarize(table(records)).cache.theoretical_hit_rate == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------
# fidelity, roll-ups, edge cases


def test_dispatch_lag_over_profiling_requests() -> None:
    lags_ms = [0, 1, 2, 3, 100]
    records = [rec(scheduled_ns=1 * S - lag * MS) for lag in lags_ms]
    records.append(rec(phase="warmup", scheduled_ns=0))  # 1 s late, but warmup
    lag = summarize(table(records)).dispatch_lag
    assert lag is not None
    assert lag.p50_s == pytest.approx(0.002)
    assert lag.p99_s == pytest.approx(percentile([x / 1000 for x in lags_ms], 99))
    assert lag.max_s == pytest.approx(0.1)


def test_play_and_session_rollups() -> None:
    records = [
        rec(play=0, lane=3, sent_ns=1 * S, end_ns=3 * S),
        rec(play=0, lane=3, session_id="s::sa", depth=1, sent_ns=2 * S, end_ns=6 * S),
        rec(play=1, lane=3, session_id="t", sent_ns=7 * S, end_ns=8 * S),
        failed("http", play=1, lane=3, session_id="t", sent_ns=9 * S, end_ns=10 * S),
    ]
    rollups = summarize(table(records)).rollups
    assert [(p.play, p.lane, p.root_session_id, p.sessions, p.requests, p.errors) for p in rollups.plays] == [
        (0, 3, "s", 2, 2, 0),
        (1, 3, "t", 1, 2, 1),
    ]
    assert [p.makespan_s for p in rollups.plays] == [pytest.approx(5.0), pytest.approx(3.0)]
    assert rollups.play_makespan_s is not None and rollups.play_makespan_s.max == pytest.approx(5.0)
    sessions = rollups.session_makespan_s
    assert sessions is not None and sessions.count == 3
    assert sorted([sessions.min, sessions.max]) == [pytest.approx(2.0), pytest.approx(4.0)]


def test_empty_table_gives_zero_counts() -> None:
    summary = summarize(SCHEMA.empty_table())
    assert summary.counts.rows == summary.counts.kept == summary.counts.errors == 0
    assert summary.latency.ttft_s is None and summary.latency.interactivity_tps is None
    assert summary.throughput is None and summary.dispatch_lag is None
    assert summary.cache.usage_hit_rate is None and summary.rollups.plays == []
    msgspec.json.encode(summary)
    _render(summary)


def test_only_failures_gives_no_latency_and_no_throughput() -> None:
    summary = summarize(table([failed("http"), failed("connection")]))
    assert summary.counts.kept == 0 and summary.counts.errors == 2
    assert summary.throughput is None and summary.latency.e2el_s is None


def test_an_older_file_without_optional_columns() -> None:
    # a minor version may add columns: a file without them still summarizes, with None for what needs them
    old = table([rec(cached_tokens=5)]).drop_columns(
        ["cached_tokens", "theoretical_hit_blocks", "theoretical_total_blocks", "isl_server_tokens"]
    )
    summary = summarize(old)
    assert summary.counts.kept == 1
    assert summary.cache.usage_hit_rate is None and summary.cache.theoretical_hit_rate is None
    assert summary.throughput is not None and summary.throughput.input_tokens == 100


def test_from_a_records_file_and_json(tmp_path: Path) -> None:
    path = tmp_path / "records.arrow"
    with RecordWriter(path, RunInfo(run_id="run-1", wall_epoch_ns=0)) as writer:
        for record in (with_ttft(100), with_ttft(300), failed("http"), rec(phase="warmup")):
            writer.append(record)
    summary = summarize(read_records(path), num_gpus=8)
    assert summary.run_id == "run-1"
    assert summary.counts.kept == 2 and summary.counts.errors == 1 and summary.counts.warmup_excluded == 1
    decoded = msgspec.json.decode(msgspec.json.encode(summary), type=Summary)
    assert decoded == summary
    text = _render(summary)
    assert "TTFT" in text and "profiling requests succeeded / sent" in text


def _render(summary: Summary) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    for item in summary_table(summary):
        console.print(item)
    return console.export_text()


# ---------------------------------------------------------------------------------------------
# slowdown vs the trace, event-loop lag, run metadata


def test_slowdown_per_request_session_and_play_against_recorded_api_time() -> None:
    records = [
        # play 0, session s: 2 s observed over 1 s recorded, then 1 s over 1 s → Σ 3 / 2
        rec(play=0, sent_ns=1 * S, end_ns=3 * S, api_time_recorded_s=1.0),
        rec(play=0, sent_ns=4 * S, end_ns=5 * S, api_time_recorded_s=1.0),
        # play 0, subagent session: 3 s over 0.5 s
        rec(play=0, session_id="s::sa", depth=1, sent_ns=2 * S, end_ns=5 * S, api_time_recorded_s=0.5),
        # play 1: 1 s over 4 s (faster than recorded); the unknown and zero recorded times do not count
        rec(play=1, session_id="t", sent_ns=6 * S, end_ns=7 * S, api_time_recorded_s=4.0),
        rec(play=1, session_id="t", sent_ns=7 * S, end_ns=9 * S),
        rec(play=1, session_id="t", sent_ns=9 * S, end_ns=10 * S, api_time_recorded_s=0.0),
        # failures and warmup are not server times to compare
        failed("http", play=1, session_id="t", sent_ns=1 * S, end_ns=100 * S, api_time_recorded_s=1.0),
        rec(play=1, session_id="t", phase="warmup", sent_ns=1 * S, end_ns=100 * S, api_time_recorded_s=1.0),
    ]
    summary = summarize(table(records))
    slow = summary.slowdown
    assert slow.requests is not None and slow.sessions is not None and slow.plays is not None
    assert slow.requests.count == 4
    assert sorted([slow.requests.min, slow.requests.max]) == [pytest.approx(0.25), pytest.approx(6.0)]
    assert slow.requests.mean == pytest.approx((2 + 1 + 6 + 0.25) / 4)
    assert slow.sessions.count == 3  # (0, s), (0, s::sa), (1, t)
    assert slow.sessions.p50 == pytest.approx(1.5)
    assert slow.plays.count == 2
    play0, play1 = (3 + 3) / 2.5, 1 / 4
    assert sorted([slow.plays.min, slow.plays.max]) == [pytest.approx(play1), pytest.approx(play0)]
    assert slow.plays.p50 == pytest.approx(percentile([play0, play1], 50))
    assert slow.plays.p90 == pytest.approx(percentile([play0, play1], 90))
    assert [p.slowdown for p in summary.rollups.plays] == [pytest.approx(play0), pytest.approx(play1)]
    assert slow.ttft is None  # no recorded TTFT anywhere
    assert "slowdown" in _render(summary)


def test_ttft_slowdown_where_the_trace_recorded_a_ttft() -> None:
    records = [
        with_ttft(100, ttft_recorded_s=0.05),  # 2×
        with_ttft(300, ttft_recorded_s=0.1),  # 3×
        with_ttft(200),  # unknown: left out
        failed("http", ttft_recorded_s=0.01),
    ]
    ttft = summarize(table(records)).slowdown.ttft
    assert ttft is not None and ttft.count == 2
    assert ttft.mean == pytest.approx(2.5) and ttft.p50 == pytest.approx(2.5)
    assert ttft.p99 == pytest.approx(percentile([2.0, 3.0], 99))


def test_a_file_without_recorded_time_columns_has_no_slowdown() -> None:
    old = table([rec(api_time_recorded_s=1.0, ttft_recorded_s=0.1)]).drop_columns(
        ["api_time_recorded_s", "ttft_recorded_s"]
    )
    summary = summarize(old)
    assert summary.counts.kept == 1
    assert summary.slowdown == Slowdown()
    assert [p.slowdown for p in summary.rollups.plays] == [None]
    assert "slowdown" not in _render(summary)


def test_loop_lag_samples_are_summarized_next_to_dispatch_lag() -> None:
    samples = [0.001, 0.002, 0.0005, 0.050, float("nan")]
    summary = summarize(table([rec()]), loop_lag_s=samples)
    lag = summary.loop_lag
    finite = [x for x in samples if math.isfinite(x)]
    assert lag is not None and lag.samples == 4
    assert lag.p50_s == pytest.approx(percentile(finite, 50))
    assert lag.p99_s == pytest.approx(percentile(finite, 99))
    assert lag.max_s == pytest.approx(0.050)
    assert "event-loop lag" in _render(summary)
    assert summarize(table([rec()])).loop_lag is None
    assert summarize(table([rec()]), loop_lag_s=[]).loop_lag is None


def test_run_metadata_shows_in_json_and_table() -> None:
    summary = summarize(table([rec()]))
    summary.stream_usage = "continuous"
    summary.calibration = {"separator": "§", "overhead_tokens": 7}
    decoded = msgspec.json.decode(msgspec.json.encode(summary))
    assert decoded["stream_usage"] == "continuous" and decoded["calibration"]["overhead_tokens"] == 7
    text = _render(summary)
    assert "stream usage" in text and "continuous" in text and "overhead_tokens=7" in text


def test_a_summary_json_of_the_previous_layout_still_decodes() -> None:
    current = msgspec.json.decode(msgspec.json.encode(summarize(table([rec()]))))
    for key in ("loop_lag", "slowdown", "stream_usage", "calibration"):
        del current[key]
    decoded = msgspec.json.decode(msgspec.json.encode(current), type=Summary)
    assert decoded.slowdown == Slowdown() and decoded.loop_lag is None


@given(st.lists(FINITE, min_size=1, max_size=40), st.lists(st.floats(0, 100), max_size=4))
def test_more_percentiles_are_computed_as_asked_and_read_back_by_at(values: list[float], more: list[float]) -> None:
    found = stats(np.array(values), more)
    assert found is not None
    for p in [*more, 50.0, 99.0]:
        assert found.at(p) == pytest.approx(percentile(values, p), rel=1e-9, abs=1e-9)
    assert set(found.more) == {percentile_key(p) for p in more if p not in PERCENTILES}
    with pytest.raises(KeyError):
        found.at(12.345)  # never asked for
    decoded = msgspec.json.decode(msgspec.json.encode(found), type=Stats)
    assert decoded == found


def test_the_summary_carries_the_percentiles_asked_for_interactivity_included() -> None:
    records = [rec(turn=i, last_token_ns=(2 + i) * S) for i in range(5)]
    summary = summarize(table(records), percentiles=(50.0, 99.9))
    assert summary.percentiles == [50.0, 99.9]
    tpot, intvty = summary.latency.tpot_s, summary.latency.interactivity_tps
    assert tpot is not None and intvty is not None
    assert intvty.at(99.9) == pytest.approx(1 / tpot.at(99.9))  # the slow tail, as p90
    assert intvty.at(99.9) <= intvty.at(50)
