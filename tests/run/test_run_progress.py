"""A library run's progress on standard logging (agentx.run.progress): off unless the caller turns it on; on, what
ends the run, the periodic counts and how it ended, in one process and over worker processes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import growing_chain, make_session, make_trace

from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.schedule.hooks import RunHooks
from agentx.run.progress import ProgressLog
from agentx.run.replay import replay_sync
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

LOGGER = "agentx.run.progress"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.02) as server:
        yield server


def _trace(sessions: int = 4) -> Trace:
    return make_trace(*(make_session(f"s{index}", growing_chain(3, base=1000 * index)) for index in range(sessions)))


def _options(sim: SimServer, out: Path, workers: int = 1) -> ReplayOptions:
    return ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(sessions=4, delay_scale=0),
        runtime=Runtime(metrics_interval_s=None, workers=workers),
    )


def test_the_log_off_counts_nothing_and_leaves_the_hooks_alone(sim: SimServer, tmp_path: Path) -> None:
    logging.getLogger(LOGGER).setLevel(logging.WARNING)
    try:
        hooks = RunHooks()
        assert ProgressLog(_options(sim, tmp_path), 4).hooks(hooks) is hooks
    finally:
        logging.getLogger(LOGGER).setLevel(logging.NOTSET)


def test_a_run_logs_its_end_its_counts_and_how_it_ended(
    sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    progress = ProgressLog(_options(sim, tmp_path / "x"), 4, interval_s=0.05)
    assert not progress.active  # the root logger's WARNING: off until asked
    caplog.set_level(logging.INFO, logger=LOGGER)
    result = replay_sync(_trace(), _options(sim, tmp_path / "run"))
    lines = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert lines[0] == (
        f"agentx: replaying against {sim.url} into {tmp_path / 'run'}; the run ends after 4 session trees (--sessions)"
    )
    assert any(line.startswith("agentx: profiling starts at ") for line in lines)
    rows = result.summary.counts.rows
    assert lines[-1].startswith("agentx: done at ") and lines[-1].endswith(f": {rows} requests recorded, 0 failed")


def test_a_run_over_processes_logs_its_start_and_its_end(
    sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    result = replay_sync(_trace(), _options(sim, tmp_path / "run", workers=2))
    lines = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert len(lines) == 2 and lines[0].startswith(f"agentx: replaying against {sim.url}")
    assert lines[1].endswith(f": {result.summary.counts.rows} requests recorded, 0 failed")
