"""Energy per token and per task from the GPUs' power: the DCGM text read, the energy over the window (counter and
integration), and whole runs against the simulator with a fake DCGM exporter fed a known power profile."""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from aiohttp import web
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.cli.display.compare_tables import compare_sections
from agentx.cli.display.report_tables import report_sections
from agentx.cli.display.summary_tables import summary_table
from agentx.errors import ConfigError
from agentx.records.record import read_records, run_info
from agentx.replayer.options.gpu_url import gpu_endpoint
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.telemetry.gpu import energy_scale_j, read_gpu_samples
from agentx.replayer.telemetry.gpu_file import (
    GPU_METRICS_FILE,
    GpuMetricsInfo,
    GpuMetricsWriter,
    GpuSample,
    aligned_gpu_times_ns,
    read_gpu_metrics,
)
from agentx.results.compare.build import compare
from agentx.results.compare.options import CompareOptions
from agentx.results.report.build import ReportOptions, build_report, load_series
from agentx.results.report.frontier import FrontierOptions, Point, frontier
from agentx.results.summary.energy import J_PER_MWH, gpu_energy
from agentx.run.replay import ReplayResult, replay_sync
from agentx.run.sweep import SweepOptions, sweep_sync
from agentx.sim.engine.config import EngineConfig
from agentx.sim.power import PowerMeter, PowerModel
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # whole runs against the simulator

BLOCK = 16
PASSWORD = "hunter2-very-secret"
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100",Hostname="node1"} 401.5
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100",Hostname="node1"} 398.25
DCGM_FI_DEV_POWER_USAGE_OTHER{gpu="0"} 1
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a",device="nvidia0",Hostname="node1"} 123456789 1700000000000
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-b",device="nvidia1",Hostname="node1"} NaN
"""


# ---------------------------------------------------------------------------------------------
# reading the exporter


def test_dcgm_text_is_read_per_gpu_in_watts_and_joules() -> None:
    samples = read_gpu_samples(DCGM_TEXT, "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert [(s.gpu, s.power_w, s.energy_j) for s in samples] == [
        ("node1:0", 401.5, pytest.approx(123456.789)),
        ("node1:1", 398.25, None),  # NaN counts as absent
    ]


def test_other_sources_by_name_and_unit() -> None:
    text = 'gpu_power_watts{uuid="u1"} 300\ngpu_energy_joules_total{uuid="u1"} 5000\n'
    samples = read_gpu_samples(text, "gpu_power_watts", "gpu_energy_joules_total")
    assert [(s.gpu, s.power_w, s.energy_j) for s in samples] == [("uuid=u1", 300.0, 5000.0)]
    assert energy_scale_j("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 1e-3
    assert [s.energy_j for s in read_gpu_samples(text, "gpu_power_watts", None)] == [None]


def test_the_url_splits_into_origin_and_path_and_a_bad_one_hides_its_password() -> None:
    assert gpu_endpoint("http://u:p@h:9400") == ("http://u:p@h:9400", "/metrics")
    assert gpu_endpoint("h:1234/dcgm/metrics") == ("http://h:1234", "/dcgm/metrics")
    with pytest.raises(ConfigError) as caught:
        gpu_endpoint(f"ftp://u:{PASSWORD}@h:9400/metrics")
    assert PASSWORD not in str(caught.value)
    with pytest.raises(ConfigError):
        Runtime(gpu_metrics_url=f"http://u:{PASSWORD}@h:0")


def test_gpu_metrics_with_the_metrics_interval_off_is_refused_not_left_unscraped(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--metrics-interval is off"):
        Runtime(gpu_metrics_url="http://127.0.0.1:9400", metrics_interval_s=None)
    args = ["replay", str(SAMPLE_TRACE), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, [*args, "--gpu-metrics", "http://127.0.0.1:9400", "--metrics-interval", "off"])
    assert result.exit_code == 2 and "--metrics-interval is off" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# energy over the window


def _ramp(times: np.ndarray, a: float = 300.0, b: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    """Power a + b·t and its exact integral since t = 0 plus a boot offset."""
    return a + b * times, 5e6 + a * times + b * times**2 / 2


def test_counter_and_integration_agree_and_match_the_exact_energy() -> None:
    times = np.arange(0.0, 20.01, 0.5)
    power, energy = _ramp(times)
    start, end = 3.2, 17.9
    exact = 300.0 * (end - start) + 20.0 * (end**2 - start**2) / 2
    counter = gpu_energy("0", times, power, energy, start, end)
    integrated = gpu_energy("0", times, power, np.full_like(energy, np.nan), start, end)
    assert counter is not None and integrated is not None
    assert (counter.source, integrated.source) == ("counter", "integrated")
    assert counter.energy_j == pytest.approx(exact, rel=1e-3)
    assert integrated.energy_j == pytest.approx(exact, rel=1e-9)  # the trapezoid is exact for a linear power
    assert counter.peak_w == pytest.approx(300 + 20 * 17.5)
    assert counter.mean_w == pytest.approx(exact / (end - start), rel=1e-3)


def test_edges_beyond_the_scrapes_carry_the_nearest_interval_on() -> None:
    times = np.array([1.0, 2.0, 3.0])
    result = gpu_energy("0", times, np.full(3, 400.0), 400.0 * times, 0.5, 3.5)
    assert result is not None and result.energy_j == pytest.approx(1200.0)
    integrated = gpu_energy("0", times, np.full(3, 400.0), np.full(3, np.nan), 0.5, 3.5)
    assert integrated is not None and integrated.energy_j == pytest.approx(1200.0)


def test_a_counter_that_falls_is_a_reset_and_the_power_is_integrated() -> None:
    times = np.arange(0.0, 5.0)
    energy = np.array([100.0, 500.0, 0.0, 400.0, 800.0])
    result = gpu_energy("0", times, np.full(5, 400.0), energy, 0.0, 4.0)
    assert result is not None and result.source == "integrated"
    assert result.energy_j == pytest.approx(1600.0)


# ---------------------------------------------------------------------------------------------
# the simulator's power model


def test_the_power_model_gauge_is_the_counters_rate() -> None:
    now, tokens = [0.0], [0]
    meter = PowerMeter(PowerModel(gpus=4, idle_w=150.0, per_token_j=0.5), lambda: tokens[0], lambda: now[0])
    now[0], tokens[0] = 2.0, 8000  # 8000 tokens × 0.5 J over 4 GPUs: 1000 J each, plus 300 J idle
    power, energy = meter.read()
    assert power == pytest.approx(650.0) and energy == pytest.approx(1300.0)
    now[0] = 3.0
    power, energy = meter.read()
    assert power == pytest.approx(150.0) and energy == pytest.approx(1450.0)
    samples = read_gpu_samples(
        meter.render().decode(), "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    )
    assert len(samples) == 4 and all(s.energy_j == pytest.approx(1450.0) for s in samples)


# ---------------------------------------------------------------------------------------------
# whole runs


class FakeDcgm:
    """A DCGM exporter on 127.0.0.1 in a thread of its own: `gpus` GPUs each at `watts(t)` W, t in s since it
    started, and the energy counter its exact integral `joules(t)` (in mJ, as DCGM); the first `failures` scrapes
    answer 500. With `password`, only basic auth with it is served."""

    def __init__(
        self,
        gpus: int,
        watts: Callable[[float], float],
        joules: Callable[[float], float],
        *,
        failures: int = 0,
        password: str | None = None,
    ) -> None:
        self.gpus, self.watts, self.joules, self.failures, self.password = gpus, watts, joules, failures, password
        self.scrapes = 0
        self.url = ""
        self._start = time.monotonic()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> FakeDcgm:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        if self.password is not None:
            token = base64.b64encode(f"bob:{self.password}".encode()).decode()
            if request.headers.get("Authorization") != f"Basic {token}":
                return web.Response(status=401, text="who are you")
        if self.scrapes <= self.failures:
            return web.Response(status=500, text="dcgm hiccup")
        t = time.monotonic() - self._start
        lines = []
        for gpu in range(self.gpus):
            labels = f'gpu="{gpu}",UUID="GPU-{gpu}",Hostname="fake"'
            lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {self.watts(t):.6f}")
            lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {1e9 + self.joules(t) * 1e3:.3f}")
        return web.Response(text="\n".join(lines) + "\n")


def _trace() -> Trace:
    """Eight sessions of three growing turns, their think times short."""
    sessions = []
    for s in range(8):
        requests = [
            Request(t=0.15 * turn, model="m", in_tokens=(turn + 2) * 4 * BLOCK, out_tokens=24, api_time=0.1,
                    hash_ids_kept=(turn + 1) * 4 if turn else 0,
                    hash_ids_added=tuple(range(1000 * s + (turn + 1) * 4 * (turn > 0), 1000 * s + (turn + 2) * 4)))
            for turn in range(3)
        ]  # fmt: skip
        sessions.append(Session(session_id=f"s{s}", root=Agent(requests=requests)))
    return Trace(sessions=sessions, block_size=BLOCK)


def _replay(sim: SimServer, out_dir: Path, gpu_url: str, **runtime: object) -> ReplayResult:
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out_dir,
        overwrite=True,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(sessions=8, delay_scale=1.0),
        runtime=msgspec.convert(
            {"metrics_interval_s": 0.2, "gpu_metrics_url": gpu_url, "grace_s": 5.0, **runtime}, Runtime
        ),
    )
    return replay_sync(_trace(), options, num_gpus=8)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    # Steps of 20 ms: 24 output tokens take ~0.5 s, so a run spans a few seconds and a dozen scrapes.
    engine = EngineConfig(block_size=BLOCK, step_overhead_s=0.02, prefill_s_per_token=0.0, decode_s_per_token=0.0,
                          attention_s_per_kv_token=0.0)  # fmt: skip
    with SimServer(engine, power=PowerModel(gpus=2, idle_w=250.0, per_token_j=0.0)) as server:
        yield server


def _user_url(url: str) -> str:
    return url.replace("http://", f"http://bob:{PASSWORD}@") + "/metrics"


def test_a_constant_400_w_on_8_gpus_is_what_the_run_measures(
    sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    with FakeDcgm(8, lambda t: 400.0, lambda t: 400.0 * t, failures=2, password=PASSWORD) as dcgm:
        result = _replay(sim, tmp_path / "run", _user_url(dcgm.url))
    summary = result.summary
    energy, throughput, tasks = summary.energy, summary.throughput, summary.tasks
    assert energy is not None and throughput is not None and tasks is not None and tasks.completed > 0
    assert energy.source == "counter" and len(energy.gpus) == 8
    assert energy.window_s == pytest.approx(throughput.duration_s)
    fed_j = 8 * 400.0 * throughput.duration_s
    tokens = throughput.input_tokens + throughput.output_tokens
    assert energy.mean_w == pytest.approx(3200.0, rel=0.02)
    assert energy.joules_per_output_token == pytest.approx(fed_j / throughput.output_tokens, rel=0.02)
    assert energy.joules_per_token == pytest.approx(fed_j / tokens, rel=0.02)
    assert energy.joules_per_task == pytest.approx(fed_j / tasks.completed, rel=0.02)
    assert energy.tasks_per_mwh == pytest.approx(tasks.completed / fed_j * J_PER_MWH, rel=0.02)
    assert energy.tokens_per_joule == pytest.approx(tokens / fed_j, rel=0.02)
    assert all(g.peak_w == pytest.approx(400.0) for g in energy.gpus)
    # The printed summary says it: J per task and the watts per GPU, beside what the figures include.
    (table,) = [t for t in summary_table(summary) if t.title.startswith("GPU energy")]
    shown = {str(row[0]): str(row[1]) for row in table.rows}
    assert "GPU board power only" in table.title
    assert shown["J per completed task · tasks per MWh"].startswith(f"{energy.joules_per_task:,.0f} · ")
    assert shown["W per GPU (8): mean · peak"] == f"{energy.mean_w / 8:,.0f} · 400"
    # The two failed scrapes are said once, and the run went on.
    said = [n for n in result.run.notices if n.startswith("GPU metrics")]
    assert len(said) == 1 and "HTTP 500" in said[0] and "dcgm hiccup" in said[0]
    # The password reaches neither the run's files nor what it said.
    out = capsys.readouterr()
    for path in (tmp_path / "run").iterdir():
        assert PASSWORD.encode() not in path.read_bytes(), path
    assert PASSWORD not in caplog.text + out.out + out.err
    assert "[redacted]" in (tmp_path / "run" / "run.json").read_text()
    assert read_gpu_metrics(tmp_path / "run" / GPU_METRICS_FILE).num_rows >= 8 * 5


def test_a_ramp_measured_by_the_counter_and_by_integration_agree(sim: SimServer, tmp_path: Path) -> None:
    with FakeDcgm(2, lambda t: 200.0 + 50.0 * t, lambda t: 200.0 * t + 25.0 * t * t) as dcgm:
        counted = _replay(sim, tmp_path / "counted", dcgm.url)
        integrated = _replay(sim, tmp_path / "integrated", dcgm.url, gpu_energy_metric="")
    for result in (counted, integrated):
        assert result.summary.energy is not None
    assert counted.summary.energy is not None and integrated.summary.energy is not None
    assert (counted.summary.energy.source, integrated.summary.energy.source) == ("counter", "integrated")
    table = read_gpu_metrics(tmp_path / "counted" / GPU_METRICS_FILE)
    assert table.column("energy_j").null_count == 0
    assert read_gpu_metrics(tmp_path / "integrated" / GPU_METRICS_FILE).column("energy_j").null_count > 0
    # The same file both ways: the counter's difference and the power integrated.
    records = read_records(tmp_path / "counted" / "records.arrow")
    times = np.asarray(aligned_gpu_times_ns(table, run_info(records).wall_epoch_ns), dtype=np.float64) / 1e9
    one = np.asarray([g == "fake:0" for g in table.column("gpu").to_pylist()])
    power = np.asarray(table.column("power_w").to_numpy(zero_copy_only=False), dtype=np.float64)[one]
    joules = np.asarray(table.column("energy_j").to_numpy(zero_copy_only=False), dtype=np.float64)[one]
    window = counted.summary.energy.window_s
    start = float(times[1])
    by_counter = gpu_energy("0", times[one], power, joules, start, start + window)
    by_power = gpu_energy("0", times[one], power, np.full_like(joules, math.nan), start, start + window)
    assert by_counter is not None and by_power is not None
    assert by_power.energy_j == pytest.approx(by_counter.energy_j, rel=0.02)


def test_the_simulators_power_model_end_to_end(sim: SimServer, tmp_path: Path) -> None:
    result = _replay(sim, tmp_path / "sim", sim.url + "/dcgm/metrics")
    energy = result.summary.energy
    assert energy is not None and energy.source == "counter" and len(energy.gpus) == 2
    assert energy.mean_w == pytest.approx(2 * 250.0, rel=0.02)  # idle only: per_token_j = 0
    assert all(g.peak_w is not None and g.peak_w == pytest.approx(250.0, rel=0.05) for g in energy.gpus)


def test_an_unreachable_exporter_is_said_once_and_the_run_has_no_energy(sim: SimServer, tmp_path: Path) -> None:
    result = _replay(sim, tmp_path / "none", f"http://bob:{PASSWORD}@127.0.0.1:9/metrics")
    said = [n for n in result.run.notices if n.startswith("GPU metrics")]
    assert len(said) == 1 and PASSWORD not in said[0]
    assert result.summary.energy is None and result.summary.counts.kept > 0
    assert not (tmp_path / "none" / GPU_METRICS_FILE).exists()


def test_the_file_of_a_killed_run_reads_back(tmp_path: Path) -> None:
    info = GpuMetricsInfo(run_id="r", wall_epoch_ns=10, url="http://h/metrics", power_metric="p",
                          energy_metric=None, interval_s=1.0)  # fmt: skip
    writer = GpuMetricsWriter(tmp_path / GPU_METRICS_FILE, info)
    writer.append(5, 0.001, [GpuSample("0", 400.0, None), GpuSample("1", 390.0, None)])
    table = read_gpu_metrics(tmp_path / GPU_METRICS_FILE)  # the stream, as a kill leaves it
    assert table.num_rows == 2 and table.column("power_w").to_pylist() == [400.0, 390.0]
    writer.close(epoch_ns=4)
    moved = read_gpu_metrics(tmp_path / GPU_METRICS_FILE)
    assert moved.column("time_ns").to_pylist() == [11, 11]
    assert isinstance(moved, pa.Table)


# ---------------------------------------------------------------------------------------------
# report and compare


def _point(label: str, x: float, tps: float, per_joule: float | None, per_mwh: float | None) -> Point:
    return Point(label=label, concurrency=None, interactivity_tps=x, total_tps_per_gpu=tps, output_tps_per_gpu=tps,
                 input_tps_per_gpu=0.0, num_gpus=8, gpus_known=True, tokens_per_joule=per_joule,
                 tasks_per_mwh=per_mwh)  # fmt: skip


def test_the_frontier_reads_energy_at_each_target_along_the_front() -> None:
    points = [_point("c1", 100.0, 1000.0, 2.0, 10.0), _point("c4", 50.0, 3000.0, 5.0, 30.0)]
    front = frontier(points, FrontierOptions(targets_tps=(50.0, 100.0, 200.0)))
    assert [(a.tokens_per_joule, a.tasks_per_mwh) for a in front.at_targets] == [(5.0, 30.0), (2.0, 10.0), (None, None)]
    unmeasured = frontier([*points[:1], _point("c4", 50.0, 3000.0, None, None)], FrontierOptions(targets_tps=(50.0,)))
    assert unmeasured.at_targets[0].tokens_per_joule is None


def test_compare_shows_the_energy_figures(sim: SimServer, tmp_path: Path) -> None:
    low = _replay(sim, tmp_path / "low", sim.url + "/dcgm/metrics")  # 2 × 250 W
    with FakeDcgm(8, lambda t: 400.0, lambda t: 400.0 * t) as dcgm:
        high = _replay(sim, tmp_path / "high", dcgm.url)  # 8 × 400 W
    comparison = compare([tmp_path / "low", tmp_path / "high"])
    rows = {row.metric: row for row in comparison.versus[0].rows}
    for name, figure in (("joules per token", "joules_per_token"), ("tokens per joule", "tokens_per_joule"),
                         ("joules per task", "joules_per_task"), ("tasks per MWh", "tasks_per_mwh")):  # fmt: skip
        row = rows[name]
        for result, value in ((low, row.baseline), (high, row.value)):
            assert result.summary.energy is not None and value is not None
            assert value == pytest.approx(getattr(result.summary.energy, figure), rel=0.02), name
    assert rows["joules per token"].better == "lower" and rows["tokens per joule"].better == "higher"
    relative = rows["joules per token"].relative
    assert relative is not None and relative > 3  # 3200 W against 500 W for about the same throughput


def test_sweeps_compare_tokens_per_joule_at_each_target(sim: SimServer, tmp_path: Path) -> None:
    options = ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=tmp_path / "sweep",
        load=ClosedLoad(concurrency=1),
        scenario=Scenario(duration_s=2.0, delay_scale=0.0),
        runtime=Runtime(metrics_interval_s=0.2, gpu_metrics_url=sim.url + "/dcgm/metrics", grace_s=5.0),
    )
    sweep = sweep_sync(_trace(), options, SweepOptions(concurrency=(1, 4), out_dir=tmp_path / "sweep", num_gpus=2))
    levels = [level.summary for level in sweep.levels if level.summary is not None]
    measured = [s.energy.tokens_per_joule for s in levels if s.energy is not None]
    speeds = [s.latency.interactivity_tps.p50 for s in levels if s.latency.interactivity_tps is not None]
    assert len(measured) == len(speeds) == 2 and all(m is not None for m in measured)
    target = (speeds[0] + speeds[1]) / 2
    frontier_options = FrontierOptions(statistic="p50", targets_tps=(target,))
    versus = compare([tmp_path / "sweep", tmp_path / "sweep"], CompareOptions(frontier=frontier_options)).sweeps[0]
    if versus.targets[0].value is None:
        # A machine too loaded to order the two levels along one front reads no throughput at the target: then no
        # energy either.
        assert versus.tokens_per_joule == []
        return
    row = versus.tokens_per_joule[0]
    assert row.value is not None and row.relative == pytest.approx(0.0)
    low, high = min(m for m in measured if m is not None), max(m for m in measured if m is not None)
    assert low * 0.98 <= row.value <= high * 1.02
    # Printed: compare's tokens-per-joule table, and the report's energy at each target.
    sections = compare_sections(compare([tmp_path / "sweep"] * 2, CompareOptions(frontier=frontier_options)))
    (shown,) = [section for section in sections if "tokens per joule" in section.title]
    assert shown.rows[0][1] == f"{row.baseline:,.3f}"
    # The cost table's target is the searched one, so the report's targets table holds that one row (at its default of
    # 50 tok/s/user it would add a second that a fast machine's levels may not reach).
    report = build_report(
        [load_series(tmp_path / "sweep")], ReportOptions(frontier=frontier_options, target_tps=target)
    )
    (energy_section,) = [s for s in report_sections(report) if s.title.startswith("GPU energy")]
    (at_target,) = report.series[0].targets
    assert at_target.tokens_per_joule is not None and energy_section.rows[0][1] == f"{at_target.tokens_per_joule:,.2f}"
