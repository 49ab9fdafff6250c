"""Reading a server's `/metrics` (agentx/replayer/telemetry/metrics.py): what prometheus_client's parser gives
for the names agentx reads, and what an odd or broken exposition costs (that line's figures, never the run)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from agentx.replayer.telemetry.metrics import (
    CACHE_METRICS,
    METRIC_LABELS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    SCRAPED_METRICS,
    SGLANG_ACCEPT_LENGTH,
    VLLM_ACCEPTED_PER_POS,
    VLLM_DRAFTS,
    ServerMetrics,
    counter_delta,
    labelled,
    parse_counters,
)


def test_reads_what_prometheus_client_exposes() -> None:
    """vLLM exposes its metrics with prometheus_client: `# TYPE x counter` over samples `x_total` and `x_created`."""
    registry = CollectorRegistry()
    hits = Counter("vllm:prefix_cache_hits", "hits", ["engine", "model_name"], registry=registry)
    queries = Counter("vllm:prefix_cache_queries", "queries", ["engine", "model_name"], registry=registry)
    per_pos = Counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "per pos", ["engine", "position"], registry=registry
    )
    length = Gauge("sglang:spec_accept_length", "AL", registry=registry)
    hits.labels("0", "m").inc(12)
    hits.labels("1", "m").inc(8)
    queries.labels("0", "m").inc(50)
    for engine in ("0", "1"):
        per_pos.labels(engine, "0").inc(30)
        per_pos.labels(engine, "1").inc(10)
    length.set(2.5)
    text = generate_latest(registry).decode()
    assert parse_counters(text) == {PREFIX_CACHE_HITS: 20.0, PREFIX_CACHE_QUERIES: 50.0}
    assert parse_counters(text, SCRAPED_METRICS, METRIC_LABELS) == {
        PREFIX_CACHE_HITS: 20.0,
        PREFIX_CACHE_QUERIES: 50.0,
        labelled(VLLM_ACCEPTED_PER_POS, "position", "0"): 60.0,
        labelled(VLLM_ACCEPTED_PER_POS, "position", "1"): 20.0,
        SGLANG_ACCEPT_LENGTH: 2.5,
    }


def test_names_are_matched_as_exposed() -> None:
    """`_total` is part of the name read: a counter exposed without it, or a `_created` sample, is another name."""
    text = "\n".join(
        [
            "# TYPE vllm:prefix_cache_hits counter",
            "vllm:prefix_cache_hits 7",
            "vllm:prefix_cache_hits_created 1.7e9",
            "vllm:prefix_cache_hits_total_extra 3",
            "vllm:prefix_cache_queries_total 9",
        ]
    )
    assert parse_counters(text) == {PREFIX_CACHE_QUERIES: 9.0}


def test_malformed_lines_are_skipped_and_the_rest_read() -> None:
    text = "\n".join(
        [
            "vllm:prefix_cache_hits_total{engine=0} 5",  # unquoted label value
            "vllm:prefix_cache_hits_total",  # no value
            "vllm:prefix_cache_hits_total twelve",
            'vllm:prefix_cache_hits_total{engine="0" 5',  # unclosed labels
            "vllm:prefix_cache_hits_total 1_000",  # Prometheus takes no digit separators
            'vllm:prefix_cache_hits_total{engine="1"} 4',
            "# a comment",
            "#vllm:prefix_cache_queries_total 99",
            "   vllm:prefix_cache_queries_total   10   1700000000000  ",  # spaces and a timestamp
            "vllm:other_total{broken 1",  # a metric not read may be broken too
            "",
        ]
    )
    assert parse_counters(text) == {PREFIX_CACHE_HITS: 4.0, PREFIX_CACHE_QUERIES: 10.0}


def test_non_finite_values_count_as_absent() -> None:
    text = "vllm:prefix_cache_hits_total NaN\nvllm:prefix_cache_queries_total +Inf\nsglang:spec_accept_length -Inf\n"
    assert parse_counters(text, SCRAPED_METRICS) == {}
    text = 'vllm:prefix_cache_hits_total{engine="0"} NaN\nvllm:prefix_cache_hits_total{engine="1"} 3\n'
    assert parse_counters(text) == {PREFIX_CACHE_HITS: 3.0}


def test_per_label_keys_unescape_values_and_skip_samples_without_the_label() -> None:
    text = "\n".join(
        [
            f'{VLLM_ACCEPTED_PER_POS}{{position="0",engine="0"}} 3',
            f'{VLLM_ACCEPTED_PER_POS}{{engine="1",position="0"}} 4',
            f'{VLLM_ACCEPTED_PER_POS}{{position="a\\"b"}} 1',
            f'{VLLM_ACCEPTED_PER_POS}{{engine="2"}} 100',
            f"{VLLM_ACCEPTED_PER_POS} 100",
            f'{VLLM_DRAFTS}{{position="0"}} 9',
        ]
    )
    assert parse_counters(text, (VLLM_ACCEPTED_PER_POS, VLLM_DRAFTS), METRIC_LABELS) == {
        labelled(VLLM_ACCEPTED_PER_POS, "position", "0"): 7.0,
        labelled(VLLM_ACCEPTED_PER_POS, "position", 'a"b'): 1.0,
        VLLM_DRAFTS: 9.0,
    }


def test_counter_delta_and_server_metrics() -> None:
    metrics = ServerMetrics(before={"a": 5.0, "b": 9.0}, after={"a": 8.0, "b": 2.0, "c": 1.0})
    assert metrics.delta("a") == 3.0
    assert metrics.delta("b") == 0.0  # went down: the server restarted
    assert metrics.delta("c") is None and metrics.delta("d") is None
    assert counter_delta(metrics.before, metrics.after, "a") == 3.0


# ---------------------------------------------------------------------------------------------
# properties

_READ = st.sampled_from(CACHE_METRICS)
_NOT_READ = st.sampled_from(["vllm:num_requests_running", "vllm:prefix_cache_hits_created", "process_cpu_seconds"])
_label_values = st.text(alphabet='az09 ,={}#"\\\né', max_size=4)
"""Label values with what the text format escapes (quote, backslash, newline) and what it leaves as is."""
_values = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False) | st.integers(0, 10**12).map(float)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def _expositions(draw: st.DrawFn) -> tuple[str, dict[str, float]]:
    """An exposition of samples read and not read, with HELP/TYPE lines and labels; and the sums it holds."""
    lines: list[str] = []
    expected: dict[str, float] = {}
    for _ in range(draw(st.integers(0, 8))):
        name = draw(_READ | _NOT_READ)
        if draw(st.booleans()):
            lines += [f"# HELP {name} some help", f"# TYPE {name} counter"]
        labels = draw(st.dictionaries(st.sampled_from(["engine", "model_name", "le"]), _label_values, max_size=3))
        value = draw(_values)
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        timestamp = draw(st.sampled_from(["", " 1700000000000"]))
        lines.append(f"{name}{{{label_text}}} {value!r}{timestamp}" if labels else f"{name} {value!r}{timestamp}")
        if name in CACHE_METRICS:
            expected[name] = expected.get(name, 0.0) + value
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"])), expected


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_expositions())
def test_sums_every_series_of_each_name_read(case: tuple[str, dict[str, float]]) -> None:
    text, expected = case
    assert parse_counters(text) == expected


@settings(deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_read_without_raising(text: str) -> None:
    found = parse_counters("vllm:prefix_cache_hits_total" + text, SCRAPED_METRICS, METRIC_LABELS)
    assert all(math.isfinite(value) for value in found.values())


@pytest.mark.parametrize("line", ["vllm:prefix_cache_hits_total{", "vllm:prefix_cache_hits_total{}}", "{} 1"])
def test_broken_label_sets_do_not_raise(line: str) -> None:
    assert parse_counters(line + " 1\nvllm:prefix_cache_queries_total 2") == {PREFIX_CACHE_QUERIES: 2.0}
