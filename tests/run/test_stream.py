"""`agentx.stream_replay`: records as requests finish, over real HTTP against the simulator."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from flat import replay_options
from paths import SAMPLE_TRACE

import agentx
from agentx.records.record import to_records
from agentx.records.run_folder import RUN_FILE
from agentx.replayer.http.client import ServerUnreachable

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@pytest.fixture(scope="module")
def trace() -> agentx.trace.Trace:
    return agentx.trace.load_trace(SAMPLE_TRACE)


@pytest.fixture(scope="module")
def sim(trace: agentx.trace.Trace) -> Iterator[agentx.sim.SimServer]:
    with agentx.sim.SimServer(time_scale=0.02, block_size=trace.block_size) as server:
        yield server


def _options(sim: agentx.sim.SimServer, out_dir: Path, **kwargs: object) -> agentx.ReplayOptions:
    fields: dict[str, object] = {"delay_scale": 0.01, "grace_s": 5.0, "concurrency": 2}
    fields.update(kwargs)
    return replay_options(mode="closed", url=sim.url, model=sim.model, out_dir=out_dir, **fields)


def _keys(records: list[agentx.RequestRecord]) -> list[tuple[int, str, str, int]]:
    return sorted((r.play, r.session_id, r.agent_id, r.turn) for r in records)


def test_yields_every_record_as_it_finishes_then_ends_with_the_result(
    sim: agentx.sim.SimServer, trace: agentx.trace.Trace, tmp_path: Path
) -> None:
    async def consume() -> tuple[list[agentx.RequestRecord], list[bool], agentx.ReplayStream]:
        stream = agentx.stream_replay(trace, _options(sim, tmp_path, sessions=3))
        seen: list[agentx.RequestRecord] = []
        running: list[bool] = []  # whether the run was still going when each record arrived
        async for record in stream:
            seen.append(record)
            running.append(stream.result is None)
        return seen, running, stream

    seen, running, stream = asyncio.run(consume())
    expected = sum(s.request_count for s in trace.sessions[:3])
    assert len(seen) == expected
    assert all(running)  # every record came while the run went, not after it
    assert stream.result is not None and not stream.result.run.interrupted
    on_disk = agentx.read_records(stream.result.run.records_path)
    assert _keys(seen) == _keys(to_records(on_disk))
    assert stream.result.summary.counts.kept == expected == agentx.summarize(on_disk).counts.kept
    run_file = json.loads((tmp_path / RUN_FILE).read_text())
    assert run_file["run"]["requests"] == expected and run_file["summary"]["counts"]["kept"] == expected


def test_cancelling_the_consumer_stops_the_run_gracefully(
    sim: agentx.sim.SimServer, trace: agentx.trace.Trace, tmp_path: Path
) -> None:
    # Real think times at 1/20 scale: the whole trace would take minutes; the consumer quits after 3 records.
    options = _options(sim, tmp_path, delay_scale=0.05, grace_s=2.0, concurrency=2)
    stream = agentx.stream_replay(trace, options)

    async def main() -> list[agentx.RequestRecord]:
        seen: list[agentx.RequestRecord] = []
        enough = asyncio.Event()

        async def consume() -> None:
            async for record in stream:
                seen.append(record)
                if len(seen) == 3:
                    enough.set()

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(enough.wait(), 60)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        return seen

    seen = asyncio.run(main())
    assert len(seen) >= 3
    result = stream.result
    assert result is not None and result.run.interrupted
    assert result.run.requests < trace.request_count  # it did stop early
    assert result.run.requests >= len(seen)
    assert (tmp_path / "records.arrow").exists()
    run_file = json.loads((tmp_path / RUN_FILE).read_text())
    assert run_file["run"]["interrupted"] is True
    assert run_file["summary"]["counts"]["rows"] == result.run.requests


def test_leaving_the_async_with_block_early_stops_the_run(
    sim: agentx.sim.SimServer, trace: agentx.trace.Trace, tmp_path: Path
) -> None:
    options = _options(sim, tmp_path, delay_scale=0.05, grace_s=2.0)

    async def main() -> agentx.ReplayStream:
        async with agentx.stream_replay(trace, options) as stream:
            async for _ in stream:
                break
        return stream

    stream = asyncio.run(main())
    assert stream.result is not None and stream.result.run.interrupted
    assert 1 <= stream.result.run.requests < trace.request_count
    assert (tmp_path / RUN_FILE).exists()


def test_an_unreachable_server_raises_from_the_iteration(trace: agentx.trace.Trace, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = agentx.ReplayOptions(
        server=agentx.Server(url=f"http://127.0.0.1:{port}", model="m"),
        out_dir=tmp_path / "run",
        load=agentx.ClosedLoad(),
    )

    async def main() -> None:
        async for _ in agentx.stream_replay(trace, options):
            pass

    with pytest.raises(ServerUnreachable):
        asyncio.run(main())
    assert not (tmp_path / "run").exists()
