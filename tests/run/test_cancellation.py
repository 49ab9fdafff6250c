"""How a caller ends a run early, over real HTTP against the simulator: a stop (`RunStops`, Ctrl-C's meaning) returns
the partial result; a cancellation follows asyncio's contract (the task ends cancelled, `asyncio.timeout` raises
TimeoutError, a task group's cancelled child does not carry on), with the run's files written first, in whichever
phase it comes and however the run executes; `*_sync` inside a running loop says what to do instead."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
from builders import make_request, make_session, make_trace
from flat import replay_options
from prometheus_client.parser import text_string_to_metric_families

from agentx.errors import ConfigError, RunStopped
from agentx.records.record import read_records, to_records
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import RunStops
from agentx.run.replay import ReplayResult, replay, replay_sync
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
GRACE_S = 60.0
"""A grace period no test waits out: a cancellation ends the run at once."""


def _long_trace(sessions: int = 2) -> Trace:
    """Sessions of one request of 5,000 output tokens (a minute at the simulator's real time)."""
    return make_trace(
        *[make_session(f"s{i}", [make_request(0.0, 64, 5000, api_time=60.0)]) for i in range(sessions)],
        block_size=BLOCK,
    )


def _options(url: str, out_dir: Path, model: str = "sim-model", **kwargs: object) -> ReplayOptions:
    fields: dict[str, object] = {"delay_scale": 0.01, "grace_s": GRACE_S, "concurrency": 2, "sessions": 2}
    fields.update(kwargs)
    return replay_options(mode="closed", url=url, model=model, out_dir=out_dir, **fields)


def _sim_options(sim: SimServer, out_dir: Path, **kwargs: object) -> ReplayOptions:
    return _options(sim.url, out_dir, sim.model, **kwargs)


def _running(sim: SimServer) -> float:
    """The requests in the simulator's engine now (its `vllm:num_requests_running`)."""
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5.0) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:num_requests_running"
    )


async def _once_in_flight(sim: SimServer, requests: int = 2) -> None:
    """Return once the run's `requests` are in the simulator's engine and streaming (however long a loaded machine
    takes to start the run, or its workers)."""
    for _ in range(1200):
        if await asyncio.to_thread(_running, sim) >= requests:
            break
        await asyncio.sleep(0.025)
    await asyncio.sleep(0.4)


def _written_as_cancelled(out_dir: Path, requests: int, why: str = "the run was cancelled") -> None:
    """The run's files are whole: run.json says interrupted, and each request in flight is recorded cancelled, `why`."""
    document = json.loads((out_dir / RUN_FILE).read_text())
    assert document["run"]["interrupted"] is True
    records = to_records(read_records(out_dir / RECORDS_FILE))
    assert len(records) == requests
    assert {r.error_kind for r in records} == {"cancelled"}
    assert {r.error_message for r in records} == {f"cancelled: {why}"}
    assert all(r.http_status == 200 and r.osl_streamed_tokens > 0 for r in records)  # what arrived is kept


@pytest.mark.parametrize("workers", [1, 2], ids=["one process", "two workers"])
def test_a_cancelled_replay_ends_cancelled_with_its_files_written(
    slow_sim: SimServer, tmp_path: Path, workers: int
) -> None:
    options = _sim_options(slow_sim, tmp_path, workers=workers)

    async def main() -> tuple[asyncio.Task[ReplayResult], float]:
        task = asyncio.create_task(replay(_long_trace(), options))
        await _once_in_flight(slow_sim)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task, time.monotonic() - cancelled_at

    task, took_s = asyncio.run(main())
    assert task.cancelled()
    assert took_s < 10  # not the grace period: a cancellation ends the run at once
    # The workers hear a cancellation as the parent's two stops.
    _written_as_cancelled(
        tmp_path, 2, "the run was cancelled" if workers == 1 else "a second interrupt ended the grace period"
    )


def test_a_replay_under_asyncio_timeout_raises_timeout_error_with_its_files_written(
    slow_sim: SimServer, tmp_path: Path
) -> None:
    async def main() -> None:
        async with asyncio.timeout(2.0):
            await replay(_long_trace(), _sim_options(slow_sim, tmp_path))

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert time.monotonic() - started < 12
    _written_as_cancelled(tmp_path, requests=2)


def test_a_task_group_whose_other_task_fails_does_not_wait_for_the_replay(slow_sim: SimServer, tmp_path: Path) -> None:
    """The outer task's cancellation reaches the replay: it ends, written, and the group raises the failure."""

    async def fails_soon() -> None:
        await _once_in_flight(slow_sim)
        raise LookupError("the harness's own failure")

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(replay(_long_trace(), _sim_options(slow_sim, tmp_path)))
            group.create_task(fails_soon())

    started = time.monotonic()
    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(main())
    assert [type(error) for error in raised.value.exceptions] == [LookupError]
    assert time.monotonic() - started < 15
    _written_as_cancelled(tmp_path, requests=2)


def test_a_cancellation_while_the_server_is_probed_raises_at_once_and_writes_nothing(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: the run stays in its first probe
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    out = tmp_path / "run"
    try:

        async def main() -> asyncio.Task[ReplayResult]:
            task = asyncio.create_task(replay(_long_trace(), _options(url, out)))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return task

        assert asyncio.run(main()).cancelled()
    finally:
        listener.close()
    assert not (out / RECORDS_FILE).exists() and not (out / RUN_FILE).exists()


def test_a_stop_while_the_server_is_probed_raises_run_stopped(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    stops = RunStops()
    out = tmp_path / "run"
    try:

        async def main() -> None:
            asyncio.get_running_loop().call_later(0.5, stops.stop)
            await replay(_long_trace(), _options(url, out), RunHooks(stops=stops))

        started = time.monotonic()
        with pytest.raises(RunStopped, match="stopped while it probed the server"):
            asyncio.run(main())
        assert time.monotonic() - started < 5
    finally:
        listener.close()
    assert not (out / RECORDS_FILE).exists()


def test_a_stop_returns_the_partial_result_and_the_task_ends_normally(slow_sim: SimServer, tmp_path: Path) -> None:
    stops = RunStops()

    async def main() -> tuple[asyncio.Task[ReplayResult], ReplayResult]:
        task = asyncio.create_task(
            replay(_long_trace(), _sim_options(slow_sim, tmp_path, grace_s=0.3), RunHooks(stops=stops))
        )
        await _once_in_flight(slow_sim)
        stops.stop()  # from the loop's thread here; any thread may
        return task, await task

    task, result = asyncio.run(main())
    assert not task.cancelled() and result.run.interrupted and result.run.cancel_reason == "interrupted"
    records = to_records(read_records(result.run.records_path))
    assert [r.error_kind for r in records] == ["cancelled", "cancelled"]  # after the 0.3 s grace period
    assert json.loads((tmp_path / RUN_FILE).read_text())["run"]["interrupted"] is True


def test_a_stop_from_another_thread_reaches_the_run(slow_sim: SimServer, tmp_path: Path) -> None:
    import threading

    stops = RunStops()
    threading.Timer(1.5, stops.stop).start()
    threading.Timer(1.8, stops.stop).start()  # the second ends the grace period
    started = time.monotonic()
    result = asyncio.run(replay(_long_trace(), _sim_options(slow_sim, tmp_path), RunHooks(stops=stops)))
    assert result.run.interrupted and time.monotonic() - started < 10


def test_replay_sync_inside_a_running_loop_says_what_to_do_instead(tmp_path: Path) -> None:
    async def main() -> None:
        replay_sync(_long_trace(), _options("http://127.0.0.1:9", tmp_path))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match=r"agentx.replay_sync .* `await agentx.replay\(...\)` there instead"):
            asyncio.run(main())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert not tmp_path.joinpath(RECORDS_FILE).exists()
