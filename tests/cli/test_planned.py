"""The progress bar's denominator (agentx/cli/display/planned.py): the profiling requests a run will send, equal to what
runs against the simulator send in each mode, resumed first trees and the cache-pressure stage included."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flat import replay_options
from paths import SAMPLE_TRACE

import agentx
from agentx.cli.display.planned import planned_requests
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.plan.preparation import prepare_trace
from agentx.replayer.plan.steps import session_order
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(SAMPLE_TRACE)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01) as server:
        yield server


def test_counts_follow_the_engines_order_without_a_server(trace: Trace, tmp_path: Path) -> None:
    def options(**kwargs: Any) -> ReplayOptions:
        return replay_options(url="http://x", model="m", out_dir=tmp_path, mode="closed", **kwargs)

    assert planned_requests(trace, options()) == trace.request_count  # one pass
    assert planned_requests(trace, options(sessions=3)) == sum(s.request_count for s in trace.sessions[:3])
    assert planned_requests(trace, options(sessions=3, num_requests=10)) == 10
    assert planned_requests(trace, options(duration_s=60)) is None  # ends by time only
    assert planned_requests(trace, options(duration_s=60, num_requests=25)) == 25
    three = sum(s.request_count for s in trace.sessions[:3])
    assert planned_requests(trace, options(sessions=3, num_requests=10**6)) == three  # the smaller bound
    order = list(itertools.islice(session_order(len(trace.sessions), "shuffle", 7), 30))
    expected = sum(trace.sessions[i].request_count for i in order)
    assert planned_requests(trace, options(sessions=30, session_order="shuffle", seed=7)) == expected
    assert expected != sum(s.request_count for s in (trace.sessions * 2)[:30])  # the order matters here
    # --max-context-length drops sessions before the order is drawn
    peaks = [
        max(r.in_tokens + r.out_tokens for agent, _, _ in s.agents() for r in agent.requests) for s in trace.sessions
    ]
    limit = sorted(peaks)[len(peaks) // 2]
    kept = sum(s.request_count for s, peak in zip(trace.sessions, peaks, strict=True) if peak <= limit)
    assert planned_requests(trace, options(max_context_length=limit)) == kept < trace.request_count


def test_trace_mode_counts_sessions_in_recorded_start_order(tmp_path: Path) -> None:
    def session(index: int) -> Session:
        start = 100.0 - 10 * index  # the later in the file, the earlier it starts
        requests = [Request(t=start + turn, model="m", in_tokens=64, out_tokens=8) for turn in range(index + 1)]
        return Session(session_id=f"s{index}", root=Agent(requests=requests))

    reversed_starts = Trace(sessions=[session(i) for i in range(4)], block_size=16)
    for mode, expected in (("trace", 4 + 3), ("closed", 1 + 2)):
        options = replay_options(url="http://x", model="m", out_dir=tmp_path, mode=mode, sessions=2)
        assert planned_requests(reversed_starts, options) == expected, mode


@pytest.mark.parametrize(
    "flat",
    [
        {"mode": "agentx", "concurrency": 3, "sessions": 7},
        {"mode": "agentx", "concurrency": 2, "sessions": 6, "warmup_requests_per_lane": 2, "session_order": "shuffle"},
        {"mode": "closed", "concurrency": 3, "sessions": 5},
        {"mode": "trace", "speedup": 1000.0, "sessions": 4},
        {"mode": "agentx", "concurrency": 2, "num_requests": 40},
    ],
    ids=["agentx-sessions", "agentx-pressure", "closed-sessions", "trace-sessions", "agentx-cap"],
)
def test_the_count_is_what_a_run_sends(trace: Trace, sim: SimServer, tmp_path: Path, flat: dict[str, Any]) -> None:
    options = replay_options(url=sim.url, model=sim.model, out_dir=tmp_path, delay_scale=0.0, **flat)
    prepared = prepare_trace(trace, options)
    planned = planned_requests(prepared, options)
    result = asyncio.run(agentx.replay(prepared, options))
    counts = result.summary.counts
    assert counts.profiling == planned and counts.errors == 0
    if flat["mode"] == "agentx":
        assert counts.warmup_excluded > 0  # the primers (and pressure requests) are not in the count
