"""Server telemetry over a run: each engine's `/metrics` names mapped onto agentx's series,
server_metrics.arrow written as the run goes, the scraper's answers to what a server says, the summary, the plot and
the AIPerf export."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from loopback import serve
from paths import SAMPLE_TRACE
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from tables80 import WIDTHS, assert_fits

from agentx.cli import main
from agentx.cli.display.summary_tables import summary_table
from agentx.errors import ServerMetricsError
from agentx.records.record import read_records, run_info
from agentx.records.run_folder import SERVER_METRICS_FILE
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.options.server_client import server_client
from agentx.replayer.telemetry.arrow_file import (
    SCHEMA,
    ServerMetricsInfo,
    TelemetryWriter,
    aligned_times_ns,
    read_server_metrics,
    server_metrics_info,
)
from agentx.replayer.telemetry.scrape import Telemetry
from agentx.replayer.telemetry.series import (
    TELEMETRY_NAMES,
    detect_engine,
    engine_names,
    read_samples,
    telemetry_sources,
    telemetry_values,
)
from agentx.replayer.telemetry.ticks import QuietWaiter
from agentx.results.export.export_run import aiperf_summary
from agentx.results.summary.server_telemetry import summarize_telemetry
from agentx.results.summary.summarize import summarize
from agentx.run.replay import ReplayResult, replay, replay_sync
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _values(text: str) -> tuple[str | None, dict[str, float]]:
    samples = read_samples(text, engine_names())
    engine = detect_engine(samples)
    return engine, telemetry_values(samples, engine) if engine is not None else {}


# ---------------------------------------------------------------------------------------------
# each engine's names


def test_vllm_as_prometheus_client_exposes_it_two_data_parallel_engines() -> None:
    """Counts and counters add up over the engines' label sets; the KV-cache usage (a ratio) is their mean."""
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    running = Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry)
    usage = Gauge("vllm:kv_cache_usage_perc", "usage", labels, registry=registry)
    hits = Counter("vllm:prefix_cache_hits", "hits", labels, registry=registry)
    queries = Counter("vllm:prefix_cache_queries", "queries", labels, registry=registry)
    drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=registry)
    histogram_like = Gauge("vllm:num_requests_running_max", "a longer name", labels, registry=registry)
    for rank, (run, wait, used, hit, query) in {"0": (3, 1, 0.25, 80, 100), "1": (5, 0, 0.75, 20, 100)}.items():
        running.labels(rank, "m").set(run)
        waiting.labels(rank, "m").set(wait)
        usage.labels(rank, "m").set(used)
        hits.labels(rank, "m").inc(hit)
        queries.labels(rank, "m").inc(query)
        drafts.labels(rank, "m").inc(7)
        histogram_like.labels(rank, "m").set(99)
    engine, values = _values(generate_latest(registry).decode())
    assert engine == "vllm"
    assert values == {
        "requests_running": 8.0,
        "requests_waiting": 1.0,
        "kv_cache_usage_ratio": 0.5,
        "prefix_cache_hits_total": 100.0,
        "prefix_cache_queries_total": 200.0,
        "spec_drafts_total": 14.0,
    }


def test_vllm_before_the_kv_cache_rename() -> None:
    text = 'vllm:num_requests_running{model_name="m"} 2\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert _values(text) == ("vllm", {"requests_running": 2.0, "kv_cache_usage_ratio": 0.5})


def test_sglang() -> None:
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 12.0',
            'sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 4.0',
            'sglang:token_usage{model_name="qwen",engine_type="unified",tp_rank="0"} 0.61',
            'sglang:cache_hit_rate{model_name="qwen",engine_type="unified",tp_rank="0"} 0.83',
            'sglang:spec_accept_length{model_name="qwen",engine_type="unified",tp_rank="0"} 2.9',
            'sglang:prompt_tokens_total{model_name="qwen"} 4096.0',
            'sglang:cached_tokens_total{model_name="qwen",cache_source="device"} 3000.0',
            'sglang:cached_tokens_total{model_name="qwen",cache_source="host"} 168.0',
            'sglang:generation_tokens_total{model_name="qwen"} 512.0',
            'sglang:num_retracted_requests_total{model_name="qwen"} 3.0',
        ]
    )
    assert _values(text) == (
        "sglang",
        {
            "requests_running": 12.0,
            "requests_waiting": 4.0,
            "kv_cache_usage_ratio": 0.61,
            "prefix_cache_hit_ratio": 0.83,
            "spec_acceptance_length": 2.9,
            "prompt_tokens_total": 4096.0,
            "prefix_cache_queries_total": 4096.0,
            "prefix_cache_hits_total": 3168.0,
            "generation_tokens_total": 512.0,
            "preemptions_total": 3.0,
        },
    )


def test_llama_cpp_queries_are_its_cached_plus_its_computed_prompt_tokens() -> None:
    text = "\n".join(
        [
            "# TYPE llamacpp:requests_processing gauge",
            "llamacpp:requests_processing 2",
            "llamacpp:requests_deferred 1",
            "llamacpp:kv_cache_usage_ratio 0.125",
            "llamacpp:prompt_tokens_total 300",
            "llamacpp:prompt_tokens_cached_total 700",
            "llamacpp:tokens_predicted_total 50",
            "llamacpp:spec_decode_num_drafts_total 10",
        ]
    )
    assert _values(text) == (
        "llamacpp",
        {
            "requests_running": 2.0,
            "requests_waiting": 1.0,
            "kv_cache_usage_ratio": 0.125,
            "prefix_cache_hits_total": 700.0,
            "prefix_cache_queries_total": 1000.0,
            "prompt_tokens_total": 1000.0,
            "generation_tokens_total": 50.0,
            "spec_drafts_total": 10.0,
        },
    )


TRTLLM = "\n".join(
    [
        "# HELP trtllm_num_requests_running Number of active requests",
        "# TYPE trtllm_num_requests_running gauge",
        'trtllm_num_requests_running{model_name="llama",engine_type="trtllm"} 6.0',
        'trtllm_num_requests_waiting{model_name="llama",engine_type="trtllm"} 2.0',
        'trtllm_kv_cache_utilization{model_name="llama",engine_type="trtllm"} 0.4',
        'trtllm_kv_cache_hit_rate{model_name="llama",engine_type="trtllm"} 0.7',
        'trtllm_kv_cache_reused_blocks_total{model_name="llama",engine_type="trtllm"} 70.0',
        'trtllm_kv_cache_missed_blocks_total{model_name="llama",engine_type="trtllm"} 30.0',
        'trtllm_prompt_tokens_total{model_name="llama",engine_type="trtllm"} 6400.0',
        'trtllm_generation_tokens_total{model_name="llama",engine_type="trtllm"} 800.0',
        'trtllm_spec_decode_acceptance_length{model_name="llama",engine_type="trtllm"} 2.5',
    ]
)


def test_tensorrt_llm_hits_are_kv_blocks_reused_of_reused_plus_missed() -> None:
    assert _values(TRTLLM) == (
        "trtllm",
        {
            "requests_running": 6.0,
            "requests_waiting": 2.0,
            "kv_cache_usage_ratio": 0.4,
            "prefix_cache_hit_ratio": 0.7,
            "prefix_cache_hits_total": 70.0,
            "prefix_cache_queries_total": 100.0,
            "prompt_tokens_total": 6400.0,
            "generation_tokens_total": 800.0,
            "spec_acceptance_length": 2.5,
        },
    )


def test_an_unknown_engine_and_other_engines_names_stay_out() -> None:
    text = "myengine:num_requests_running 4\nmyengine:kv_cache_usage 0.5\nprocess_cpu_seconds_total 12.5\n"
    assert _values(text) == (None, {})
    # A vLLM server also exposing another engine's name: only its own are read as its series.
    samples = read_samples("vllm:num_requests_running 1\nsglang:num_queue_reqs 9\n", engine_names())
    assert detect_engine(samples) == "vllm"
    assert telemetry_values(samples, "vllm") == {"requests_running": 1.0}
    assert telemetry_sources(samples, "vllm") == {"requests_running": ["vllm:num_requests_running"]}


def test_samples_are_read_as_prometheus_writes_them_and_odd_lines_cost_only_themselves() -> None:
    text = "\n".join(
        [
            # a brace and a space in a label value, then a timestamp
            'vllm:num_requests_running{model_name="a} b",engine="0"} 3 1700000000000',
            "vllm:num_requests_running\t2",
            "vllm:num_requests_waiting NaN",
            "vllm:kv_cache_usage_perc +Inf",
            "vllm:prefix_cache_hits_total not-a-number",
            "vllm:prefix_cache_queries_total",
            "vllm:num_requests_running_other 5",
            "# vllm:num_requests_waiting 7",
        ]
    )
    names = engine_names("vllm")
    assert read_samples(text, names) == {"vllm:num_requests_running": [3.0, 2.0]}


# ---------------------------------------------------------------------------------------------
# the file


def _info(run_id: str = "r", epoch_ns: int = 10**18) -> ServerMetricsInfo:
    return ServerMetricsInfo(
        run_id=run_id,
        wall_epoch_ns=epoch_ns,
        engine="vllm",
        endpoint="/metrics",
        interval_s=1.0,
        sources={"requests_running": ["vllm:num_requests_running"]},
    )


def test_rows_are_on_disk_as_each_scrape_is_written_and_the_closed_file_is_an_ipc_file(tmp_path: Path) -> None:
    path = tmp_path / SERVER_METRICS_FILE
    writer = TelemetryWriter(path, _info())
    writer.append(1_000, 0.002, {"requests_running": 3.0, "kv_cache_usage_ratio": 0.5})
    writer.append(2_000, 0.003, {"requests_running": 4.0})
    # Never closed (a killed run): both rows read back from the stream.
    live = read_server_metrics(path)
    assert live.column("time_ns").to_pylist() == [1_000, 2_000]
    assert live.column("requests_running").to_pylist() == [3.0, 4.0]
    assert live.column("kv_cache_usage_ratio").to_pylist() == [0.5, None]
    # A torn last batch (the kill came mid-write) costs that batch only.
    data = path.read_bytes()
    torn = tmp_path / "torn.arrow"
    torn.write_bytes(data[:-40])
    assert read_server_metrics(torn).num_rows == 1
    writer.info.sources["requests_waiting"] = ["vllm:num_requests_waiting"]  # seen after the first scrape
    writer.close()
    assert writer.finalized and path.read_bytes()[:6] == b"ARROW1"
    closed = pa.ipc.open_file(path).read_all()
    assert closed.column("requests_running").to_pylist() == [3.0, 4.0]
    assert closed.schema.names == SCHEMA.names
    assert server_metrics_info(closed.schema).sources["requests_waiting"] == ["vllm:num_requests_waiting"]


def test_closing_onto_the_records_epoch_moves_the_times(tmp_path: Path) -> None:
    """A `--workers` run scrapes on the parent's own clock; closing moves its times onto the merged records'."""
    path = tmp_path / SERVER_METRICS_FILE
    writer = TelemetryWriter(path, _info(epoch_ns=10**18 + 500))
    writer.append(1_000, 0.001, {"requests_running": 1.0})
    assert aligned_times_ns(read_server_metrics(path), 10**18) == [1_500]  # a killed run's file aligns the same way
    writer.close(epoch_ns=10**18)
    table = read_server_metrics(path)
    assert table.column("time_ns").to_pylist() == [1_500]
    assert server_metrics_info(table.schema).wall_epoch_ns == 10**18


# ---------------------------------------------------------------------------------------------
# the summary


def _records(run_id: str, epoch_ns: int, rows: list[tuple[str, int, int]]) -> pa.Table:
    """A records table of (phase, scheduled_ns = sent_ns, end_ns) rows."""
    table = pa.table(
        {
            "phase": [phase for phase, _, _ in rows],
            "status": ["ok"] * len(rows),
            "scheduled_ns": [start for _, start, _ in rows],
            "sent_ns": [start for _, start, _ in rows],
            "end_ns": [end for _, _, end in rows],
        }
    )
    return table.replace_schema_metadata({b"agentx.run_id": run_id.encode(), b"agentx.wall_epoch_ns": str(epoch_ns)})


def _telemetry(run_id: str, epoch_ns: int, times_s: list[float], **columns: list[float | None]) -> pa.Table:
    path_rows: dict[str, list[float | None]] = {name: [None] * len(times_s) for name in TELEMETRY_NAMES}
    path_rows.update(columns)
    table = pa.table(
        {
            "time_ns": pa.array([int(t * 1e9) for t in times_s], pa.int64()),
            "scrape_s": [0.001] * len(times_s),
            **{name: pa.array(values, pa.float64()) for name, values in path_rows.items()},
        }
    )
    info = _info(run_id, epoch_ns)
    info.sources = {name: [f"vllm:{name}"] for name in columns}
    return table.replace_schema_metadata(
        {
            b"agentx.format": b"agentx-server-metrics",
            b"agentx.version": b"1.0",
            b"agentx.run_id": run_id.encode(),
            b"agentx.wall_epoch_ns": str(epoch_ns).encode(),
            b"agentx.engine": b"vllm",
            b"agentx.endpoint": b"/metrics",
            b"agentx.interval_s": b"1.0",
            b"agentx.sources": msgspec.json.encode(info.sources),
        }
    )


def test_the_summary_covers_the_profiling_phase_as_aiperf_computes_server_metrics() -> None:
    """Warmup from 0 to 2 s, profiling to 6 s: gauges over the scrapes inside, counters from the scrape before."""
    records = _records("r", 10**18, [("warmup", 0, 2 * 10**9), ("profiling", 2 * 10**9, 6 * 10**9)])
    telemetry = _telemetry(
        "r",
        10**18,
        [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5],
        requests_running=[9, 9, 1, 2, 3, 4, 9],
        kv_cache_usage_ratio=[0.9, 0.9, 0.1, 0.2, None, 0.4, 0.9],
        prefix_cache_hits_total=[0, 10, 20, 40, 60, 80, 500],
        prefix_cache_queries_total=[0, 100, 120, 150, 180, 220, 900],
    )
    result = summarize_telemetry(telemetry, records)
    assert result is not None
    assert (result.scrapes, result.window_scrapes) == (7, 4)
    assert (result.window_start_s, result.window_end_s) == (2.0, 6.0)
    assert result.requests_running is not None and result.kv_cache_usage_ratio is not None
    assert (result.requests_running.mean, result.requests_running.peak) == (2.5, 4.0)
    assert result.kv_cache_usage_ratio.mean == pytest.approx(0.7 / 3) and result.kv_cache_usage_ratio.peak == 0.4
    gauge = result.series["requests_running"].gauge
    assert gauge is not None
    inside = np.array([1.0, 2.0, 3.0, 4.0])
    assert gauge.std == pytest.approx(float(np.std(inside, ddof=1)))
    assert gauge.p50 == pytest.approx(2.5) and gauge.p90 == pytest.approx(float(np.percentile(inside, 90)))
    # From the scrape at 1.5 s (before the window) to the last one inside (5.5 s): 70 of 120.
    assert result.prefix_cache_hit_rate == pytest.approx(70 / 120) and result.prefix_cache_hit_source == "counters"
    hits = result.series["prefix_cache_hits_total"].counter
    assert hits is not None and hits.total == 70 and hits.rate == pytest.approx(70 / 4.0)
    assert "requests_waiting" not in result.series  # a series the server does not expose


def test_the_summary_leaves_out_another_runs_file_and_falls_back_to_the_engines_hit_gauge() -> None:
    records = _records("r", 10**18, [("profiling", 0, 4 * 10**9)])
    assert summarize_telemetry(_telemetry("other", 10**18, [1.0], requests_running=[1]), records) is None
    gauge_only = _telemetry("r", 10**18 - 10**9, [1.0, 2.0, 3.0], prefix_cache_hit_ratio=[0.5, 0.7, 0.9])
    result = summarize_telemetry(gauge_only, records)
    # Its own origin 1 s before the records': the scrapes fall at 0, 1 and 2 s of the run, all inside.
    assert result is not None and result.window_scrapes == 3
    assert result.prefix_cache_hit_rate == pytest.approx(0.7) and result.prefix_cache_hit_source == "gauge"


def test_a_counter_that_falls_was_reset_and_counts_zero() -> None:
    records = _records("r", 0, [("profiling", 0, 3 * 10**9)])
    result = summarize_telemetry(_telemetry("r", 0, [1.0, 2.0], generation_tokens_total=[500, 20]), records)
    assert result is not None
    counter = result.series["generation_tokens_total"].counter
    assert counter is not None and counter.total == 0.0


# ---------------------------------------------------------------------------------------------
# the scraper against stand-in servers


@asynccontextmanager
async def _stand_in(routes: dict[str, tuple[int, str]]) -> AsyncIterator[str]:
    """A server answering GET `path` with (status, body) and 404 to anything else; yields its URL."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        status, body = routes.get(request.path, (404, "not found"))
        return web.Response(status=status, text=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    async with serve(app) as url:
        yield url


async def _scrape(url: str, path: Path, scrapes: int, clock: QuietWaiter | None = None) -> Telemetry:
    server = Server(url=url, model="m")
    options = ReplayOptions(server=server, out_dir=path.parent)
    client = server_client(options.server, options.connection, limit=1)
    client.open()
    telemetry = Telemetry(client, path, run_id="r", wall_epoch_ns=0, start_ns=0, interval_s=1.0, clock=clock)
    try:
        for _ in range(scrapes):
            if not await telemetry.scrape():
                break
    finally:
        telemetry.close()
        await client.close()
    return telemetry


def test_tensorrt_llm_is_found_at_prometheus_metrics(tmp_path: Path) -> None:
    """trtllm-serve answers JSON at /metrics and Prometheus text at /prometheus/metrics."""

    async def go() -> Telemetry:
        routes = {"/metrics": (200, '[{"iter": 3, "numActiveRequests": 6}]'), "/prometheus/metrics": (200, TRTLLM)}
        async with _stand_in(routes) as url:
            return await _scrape(url, tmp_path / SERVER_METRICS_FILE, 2)

    telemetry = asyncio.run(go())
    assert (telemetry.engine, telemetry.endpoint, telemetry.notices) == ("trtllm", "/prometheus/metrics", [])
    table = read_server_metrics(tmp_path / SERVER_METRICS_FILE)
    assert table.column("requests_running").to_pylist() == [6.0, 6.0]
    assert server_metrics_info(table.schema).endpoint == "/prometheus/metrics"


@pytest.mark.parametrize(
    ("routes", "said"),
    [
        ({}, "not available (/metrics: HTTP 404; /prometheus/metrics: HTTP 404)"),
        (
            {"/metrics": (200, "process_cpu_seconds_total 1\n")},
            "not available (/metrics: none of the names agentx knows; /prometheus/metrics: HTTP 404)",
        ),
        ({"/metrics": (401, '{"error": "no key"}')}, "HTTP 401: no key; the server refused the credentials"),
    ],
)
def test_a_server_without_telemetry_is_said_once_and_leaves_no_file(
    tmp_path: Path, routes: dict[str, tuple[int, str]], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> Telemetry:
        async with _stand_in(routes) as url:
            return await _scrape(url, tmp_path / SERVER_METRICS_FILE, 5)

    with caplog.at_level(logging.WARNING, logger="agentx"):
        telemetry = asyncio.run(go())
    assert len(telemetry.notices) == 1 and said in telemetry.notices[0], telemetry.notices
    assert [r.getMessage() for r in caplog.records if "server telemetry" in r.getMessage()] == telemetry.notices
    assert not (tmp_path / SERVER_METRICS_FILE).exists()
    assert telemetry.not_served == (not routes)  # only 404 at every endpoint is a server without /metrics


def test_a_failing_scrape_leaves_no_row_is_said_once_and_scraping_goes_on(tmp_path: Path) -> None:
    routes = {"/metrics": (200, "vllm:num_requests_running 2\n")}

    async def go() -> Telemetry:
        async with _stand_in(routes) as url:
            path = tmp_path / SERVER_METRICS_FILE
            server = Server(url=url, model="m")
            client = server_client(server, ReplayOptions(server=server, out_dir=tmp_path).connection, limit=1)
            client.open()
            telemetry = Telemetry(client, path, run_id="r", wall_epoch_ns=0, start_ns=0, interval_s=1.0)
            assert await telemetry.scrape()
            routes["/metrics"] = (503, "overloaded")
            assert await telemetry.scrape() and await telemetry.scrape()
            routes["/metrics"] = (200, "vllm:num_requests_running 5\n")
            assert await telemetry.scrape()
            telemetry.close()
            await client.close()
            return telemetry

    telemetry = asyncio.run(go())
    assert telemetry.failures == 2 and len(telemetry.notices) == 1 and "HTTP 503" in telemetry.notices[0]
    rows = read_server_metrics(tmp_path / SERVER_METRICS_FILE).column("requests_running").to_pylist()
    assert rows == [2.0, 5.0]


class _Clock:
    """Stands for the run's DispatchClock: records the gaps asked for."""

    def __init__(self) -> None:
        self.waits: list[tuple[int, float]] = []

    async def until_quiet(self, span_ns: int, patience_s: float) -> None:
        self.waits.append((span_ns, patience_s))


def test_a_scrape_waits_for_a_gap_between_due_requests_to_send_and_to_read(tmp_path: Path) -> None:
    """The scraper shares the replay's loop: it sends, and reads its answer, where no request is due within 2 ms."""
    clock = _Clock()

    async def go() -> None:
        async with _stand_in({"/metrics": (200, "vllm:num_requests_running 1\n")}) as url:
            await _scrape(url, tmp_path / SERVER_METRICS_FILE, 1, clock)

    asyncio.run(go())
    assert [span for span, _ in clock.waits] == [2_000_000, 2_000_000]


# ---------------------------------------------------------------------------------------------
# a real replay against the simulator


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReplayResult, Path]]:
    """Four lanes of the sample corpus against the simulator for 5 s, the telemetry scraped every second."""
    trace = load_trace(SAMPLE_TRACE)
    out = tmp_path_factory.mktemp("run")
    with SimServer(time_scale=0.05, block_size=trace.block_size) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=out,
            load=ClosedLoad(concurrency=4),
            scenario=Scenario(duration_s=5.0, delay_scale=0.05),
            runtime=Runtime(grace_s=1.0),
        )
        yield asyncio.run(replay(trace, options)), out


def test_a_replay_writes_about_a_row_a_second_on_the_records_clock(replayed: tuple[ReplayResult, Path]) -> None:
    result, out = replayed
    path = out / SERVER_METRICS_FILE
    assert path.read_bytes()[:6] == b"ARROW1"  # closed as an IPC file
    table = read_server_metrics(path)
    records = read_records(out / "records.arrow")
    info = server_metrics_info(table.schema)
    assert (info.run_id, info.wall_epoch_ns) == (result.run.run_id, run_info(records).wall_epoch_ns)
    assert (info.engine, info.endpoint, info.interval_s) == ("vllm", "/metrics", 1.0)
    times_s = np.array(table.column("time_ns").to_pylist()) / 1e9
    gaps = np.diff(times_s)
    assert (gaps > 0).all()
    assert np.median(gaps) == pytest.approx(1.0, abs=0.1)
    assert abs(table.num_rows - result.run.elapsed_s) <= 1.5, (table.num_rows, result.run.elapsed_s)
    assert times_s[0] < 0.5  # the first scrape as the run starts
    # Plausible values: the server never runs more than the client has in flight.
    sent, end = (np.array(records.column(name).to_pylist()) for name in ("sent_ns", "end_ns"))
    edges = np.concatenate([sent, end])
    order = np.lexsort((np.concatenate([np.ones_like(sent), -np.ones_like(end)]), edges))
    most_in_flight = np.cumsum(np.concatenate([np.ones_like(sent), -np.ones_like(end)])[order]).max()
    running = np.array(table.column("requests_running").to_pylist())
    waiting = np.array(table.column("requests_waiting").to_pylist())
    assert (running >= 0).all() and (waiting >= 0).all() and (running + waiting <= most_in_flight).all()
    assert running.max() >= 1
    usage = np.array(table.column("kv_cache_usage_ratio").to_pylist())
    assert ((usage >= 0) & (usage <= 1)).all() and usage.max() > 0
    hits, queries = (
        np.array(table.column(n).to_pylist()) for n in ("prefix_cache_hits_total", "prefix_cache_queries_total")
    )
    assert (np.diff(hits) >= 0).all() and (np.diff(queries) >= 0).all() and (hits <= queries).all()
    assert table.column("prefix_cache_hit_ratio").null_count == table.num_rows  # vLLM has counters, not that gauge
    assert (np.array(table.column("scrape_s").to_pylist()) < 1.0).all()


def test_the_replays_summary_carries_the_telemetry(replayed: tuple[ReplayResult, Path]) -> None:
    result, out = replayed
    telemetry = result.summary.server_telemetry
    assert telemetry is not None and telemetry.engine == "vllm" and telemetry.window_scrapes >= 3
    assert telemetry.requests_running is not None and telemetry.requests_waiting is not None
    assert telemetry.requests_running.peak >= telemetry.requests_running.mean > 0
    assert telemetry.kv_cache_usage_ratio is not None and 0 < telemetry.kv_cache_usage_ratio.peak <= 1
    assert telemetry.prefix_cache_hit_rate is not None and 0 < telemetry.prefix_cache_hit_rate < 1
    # The same from the files alone, and in run.json.
    table = read_server_metrics(out / SERVER_METRICS_FILE)
    again = summarize(read_records(out / "records.arrow"), telemetry=table).server_telemetry
    assert again == telemetry
    document = msgspec.json.decode((out / "run.json").read_bytes())
    assert document["summary"]["server_telemetry"]["requests_running"] == msgspec.to_builtins(
        telemetry.requests_running
    )
    assert document["options"]["metrics_interval_s"] == 1.0
    assert result.run.notices == []


def test_the_summary_table_shows_the_telemetry_within_the_width(replayed: tuple[ReplayResult, Path]) -> None:
    result, _ = replayed
    tables = summary_table(result.summary)
    title = tables[-1].title
    assert title.startswith("server telemetry (vllm, ") and "every 1 s" in title
    for width in WIDTHS:
        text = assert_fits(tables, width)
        assert "running requests" in text and "KV-cache usage" in text and "prefix-cache hit (counters)" in text


def test_the_aiperf_summary_export_has_the_server_metrics(replayed: tuple[ReplayResult, Path]) -> None:
    result, out = replayed
    run_file = msgspec.json.decode((out / "run.json").read_bytes())
    document = aiperf_summary(read_records(out / "records.arrow"), run_file)
    section = document["server_metrics"]
    assert section["schema_version"] == "1.1" and section["metrics_phase"] == "profiling"
    [endpoint] = section["summary"]["endpoints_configured"]
    assert endpoint.startswith("http://127.0.0.1:") and endpoint.endswith("/metrics")
    metrics: dict[str, Any] = section["metrics"]
    telemetry = result.summary.server_telemetry
    assert telemetry is not None
    running = metrics["vllm:num_requests_running"]
    assert running["type"] == "gauge" and running["unit"] == "requests"
    [series] = running["series"]
    assert series["endpoint_url"].endswith("/metrics") and "@" not in series["endpoint_url"]
    gauge = telemetry.series["requests_running"].gauge
    assert gauge is not None and series["stats"] == msgspec.to_builtins(gauge)
    assert set(series["stats"]) == {
        "avg",
        "min",
        "max",
        "std",
        "p1",
        "p5",
        "p10",
        "p25",
        "p50",
        "p75",
        "p90",
        "p95",
        "p99",
    }
    hits = metrics["vllm:prefix_cache_hits"]  # a counter under its family name, as AIPerf's parser gives it
    assert hits["type"] == "counter" and set(hits["series"][0]["stats"]) == {"total", "rate"}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries"} <= set(metrics)
    assert not any(name.endswith("_total") for name in metrics)


def test_the_report_plots_the_telemetry(replayed: tuple[ReplayResult, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, out = replayed
    plots = tmp_path / "plots"
    outcome = CliRunner().invoke(main, ["report", str(out), "--plots", str(plots)])
    assert outcome.exit_code == 0, outcome.output
    from matplotlib.image import imread

    pixels = imread(plots / "server_metrics.png")
    assert pixels.shape[0] > 400 and pixels.std() > 0.01
    assert "server telemetry (vllm)" in (plots / "server_metrics.svg").read_text()


def _replay_without_metrics(out_dir: Path, **runtime: Any) -> ReplayResult:
    """A replay against a stand-in server with no /metrics (404), whose usage carries no cached tokens."""
    from aiohttp import web

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = b'{"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
        chunk += b'"usage":{"prompt_tokens":1,"completion_tokens":1}}'
        await response.write(b"data: " + chunk + b"\n\ndata: [DONE]\n\n")
        return response

    async def go() -> ReplayResult:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        async with serve(app) as url:
            options = ReplayOptions(
                server=Server(url=url, model="m", stream_usage="final"),
                out_dir=out_dir,
                overwrite=True,
                load=ClosedLoad(concurrency=2),
                scenario=Scenario(sessions=3, delay_scale=0.0),
                runtime=Runtime(**runtime),
            )
            return await replay(load_trace(SAMPLE_TRACE), options)

    return asyncio.run(go())


def test_a_server_without_metrics_runs_fine_says_so_once_and_leaves_no_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stand-in server with no /metrics (404); a replaced run's server_metrics.arrow is removed, not kept."""
    (tmp_path / "records.arrow").write_bytes(b"an older run")
    (tmp_path / SERVER_METRICS_FILE).write_bytes(b"an older run's telemetry")
    with caplog.at_level(logging.WARNING, logger="agentx"):
        result = _replay_without_metrics(tmp_path)
    assert result.run.requests > 0 and result.run.errors == 0
    said = [r.getMessage() for r in caplog.records if "server telemetry" in r.getMessage()]
    assert len(said) == 1 and "not available" in said[0]
    assert [n for n in result.run.notices if "server telemetry" in n] == said
    assert not (tmp_path / SERVER_METRICS_FILE).exists()
    assert result.summary.server_telemetry is None
    assert math.isfinite(result.summary.counts.kept)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_audit_says_a_server_without_metrics_has_none_rather_than_to_scrape_it(
    tmp_path: Path, workers: int
) -> None:
    """The run scraped /metrics and got 404 at every endpoint: no cached tokens, and no counters to stand in, are
    said as such (in run.json too), never as advice to turn scraping on."""
    result = _replay_without_metrics(tmp_path, workers=workers)
    assert result.summary.audit is not None
    found = [finding for finding in result.summary.audit.findings if finding.code == "cached_tokens_absent"]
    assert len(found) == 1, result.summary.audit
    assert found[0].evidence.endswith("; the server exposes no /metrics (404)")
    assert "The server exposes no /metrics (404)" in found[0].advice and "--metrics-interval" not in found[0].advice
    kept = json.loads((tmp_path / "run.json").read_text())["summary"]["audit"]["findings"]
    assert [finding["advice"] for finding in kept if finding["code"] == "cached_tokens_absent"] == [found[0].advice]


def test_a_workers_run_scrapes_from_the_parent_onto_the_merged_records_clock(tmp_path: Path) -> None:
    with SimServer(time_scale=0.05) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(concurrency=2),
            scenario=Scenario(duration_s=3.0, delay_scale=0.05),
            runtime=Runtime(grace_s=1.0, metrics_interval_s=0.5, workers=2),
        )
        result = replay_sync(load_trace(SAMPLE_TRACE), options, trace_path=SAMPLE_TRACE)
    records = read_records(tmp_path / "records.arrow")
    table = read_server_metrics(tmp_path / SERVER_METRICS_FILE)
    info = server_metrics_info(table.schema)
    assert (info.run_id, info.wall_epoch_ns) == (result.run.run_id, run_info(records).wall_epoch_ns)
    assert info.interval_s == 0.5 and table.num_rows >= 6
    times = np.array(table.column("time_ns").to_pylist())
    sent, end = np.array(records.column("sent_ns").to_pylist()), np.array(records.column("end_ns").to_pylist())
    # Scraping starts before the workers do (their start-up) and ends after them: it spans the records.
    assert times[0] < sent.min() and times[-1] > end.max() - 1e9
    busy = (times > sent.min()) & (times < end.max())
    assert np.array(table.column("requests_running").to_pylist())[busy].max() >= 1
    assert result.summary.server_telemetry is not None and result.summary.server_telemetry.window_scrapes >= 3


def test_a_killed_replay_keeps_every_scrape_up_to_the_kill(tmp_path: Path) -> None:
    """SIGKILL mid-run: server_metrics.arrow stays a stream that reads back up to its last scrape."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    with SimServer(time_scale=0.05) as sim:
        args = [
            "replay",
            str(SAMPLE_TRACE),
            "--url",
            sim.url,
            "--model",
            sim.model,
            "--concurrency",
            "2",
            "--mode",
            "closed",
        ]
        args += ["--delay-scale", "0.05", "--metrics-interval", "0.2", "--out", str(out), "--json"]
        child = subprocess.Popen([sys.executable, "-m", "agentx.cli", *args], stdout=subprocess.PIPE, text=True)
        path = out / SERVER_METRICS_FILE
        rows = 0
        try:
            deadline = time.monotonic() + 120
            while rows < 5 and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.1)
                with contextlib.suppress(ServerMetricsError):  # not created yet, or its first row half written
                    rows = read_server_metrics(path).num_rows
        finally:
            child.kill()
            child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL and rows >= 5
    assert not path.read_bytes().startswith(b"ARROW1") and not (out / "run.json").exists()
    table = read_server_metrics(path)
    assert table.num_rows >= rows and (np.diff(table.column("time_ns").to_pylist()) > 0).all()
    records = read_records(out / "records.arrow")
    assert server_metrics_info(table.schema).run_id == run_info(records).run_id


def test_scraping_off_starts_nothing_and_still_removes_a_replaced_runs_file(tmp_path: Path) -> None:
    from agentx.replayer.telemetry.scrape import start_telemetry

    (tmp_path / SERVER_METRICS_FILE).write_bytes(b"an older run's telemetry")
    options = ReplayOptions(
        server=Server(url="http://127.0.0.1:9", model="m"), out_dir=tmp_path, runtime=Runtime(metrics_interval_s=None)
    )
    assert start_telemetry(options, run_id="r", wall_epoch_ns=0, start_ns=0) is None
    assert not (tmp_path / SERVER_METRICS_FILE).exists()
    flags = CliRunner().invoke(main, ["replay", "--help"]).output
    assert "--metrics-interval S|off" in flags


def test_what_a_refusing_server_says_is_kept_without_the_credentials(tmp_path: Path) -> None:
    from agentx.replayer.telemetry.scrape import start_telemetry

    key = "sk-telemetry-0123456789abcdef"

    async def go() -> list[str]:
        async with _stand_in({"/metrics": (401, f'{{"error": "invalid key {key}"}}')}) as url:
            options = ReplayOptions(server=Server(url=url, model="m", api_key=key), out_dir=tmp_path)
            task = start_telemetry(options, run_id="r", wall_epoch_ns=0, start_ns=0)
            assert task is not None
            await asyncio.wait_for(asyncio.shield(task.task), timeout=10)  # it stops by itself after a 401
            await task.stop()
            return task.notices

    [notice] = asyncio.run(go())
    assert "HTTP 401: invalid key" in notice and key not in notice
