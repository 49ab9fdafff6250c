"""The per-tree idle cap's load-time version (docs/agentx.md §4c): recorded idle gaps cut before the run."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Literal

import pytest
from builders import make_agent, make_request, make_session, make_trace
from hypothesis import given
from hypothesis import strategies as st

from agentx.records.record import read_records, to_records
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.sim.process import SimServer
from agentx.trace.model import Request
from agentx.trace.warp import IdleWarp, warp_idle_gaps

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

times = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(starts=st.lists(times, min_size=1, max_size=30), cap_s=st.floats(min_value=0, max_value=500))
def test_every_gap_between_starts_is_cut_to_the_cap(starts: list[float], cap_s: float) -> None:
    warp = IdleWarp(starts, cap_s)
    ordered = sorted(starts)
    warped = [warp.warp(t) for t in ordered]
    for (a, b), (wa, wb) in zip(itertools.pairwise(ordered), itertools.pairwise(warped), strict=True):
        assert wb - wa == pytest.approx(min(b - a, cap_s), abs=1e-6)
    removed = sum(max(0.0, b - a - cap_s) for a, b in itertools.pairwise(ordered))
    assert warp.removed_s == pytest.approx(removed, abs=1e-6)
    assert warped[0] == ordered[0]


@given(
    starts=st.lists(times, min_size=2, max_size=20),
    cap_s=st.floats(min_value=0, max_value=500),
    probes=st.lists(times, max_size=20),
)
def test_the_map_is_monotone_and_never_later(starts: list[float], cap_s: float, probes: list[float]) -> None:
    warp = IdleWarp(starts, cap_s)
    ordered = sorted(probes)
    mapped = [warp.warp(t) for t in ordered]
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(mapped))
    assert all(m <= t + 1e-9 for m, t in zip(mapped, ordered, strict=True))


def test_times_inside_a_gap() -> None:
    warp = IdleWarp([0.0, 1000.0, 1010.0], 300.0)
    assert warp.warp(100.0) == 100.0  # within the first cap seconds: kept
    assert warp.warp(500.0) == 300.0  # in the removed part: gap start + cap
    assert warp.warp(1000.0) == 300.0
    assert warp.warp(1005.0) == 305.0  # later: shifted by the 700 s removed
    with pytest.raises(ValueError, match="non-negative"):
        IdleWarp([0.0], -1.0)


def _req(t: float, api_time: float = 0.05, think_time: float | None = None) -> Request:
    return make_request(t, 32, 4, api_time=api_time, think_time=think_time)


def test_a_session_tree_is_warped_as_one_with_durations_kept() -> None:
    sub = make_agent("sub", [_req(500.0), _req(900.0, 2.0, 398.0)], spawn_after=1, t=500.0)
    session = warp_idle_gaps(make_session("s", [_req(0.0), _req(2000.0, 1.0, 1999.95)], subagents=[sub]), 60.0)
    warped_root, warped_sub = session.root, session.root.subagents[0]
    # Starts 0, 500, 900, 2000: gaps 500, 400, 1100 each cut to 60.
    assert [r.t for r in warped_root.requests] == [0.0, 180.0]
    assert warped_sub.t == 60.0 and [r.t for r in warped_sub.requests] == [60.0, 120.0]
    assert [r.api_time for r in warped_sub.requests] == [0.05, 2.0]
    assert warped_sub.requests[1].think_time == pytest.approx(120.0 - 60.05)
    assert warped_root.requests[1].think_time == pytest.approx(180.0 - 0.05)
    unchanged = make_session("s", [_req(0.0), _req(30.0)])
    assert warp_idle_gaps(unchanged, 60.0) is unchanged


@pytest.mark.parametrize("mode", ["warp", "runtime"])
def test_a_replay_with_the_load_time_cap(tmp_path: Path, mode: Literal["runtime", "warp"]) -> None:
    """A 100 s recorded gap under a 0.3 s cap: `warp` cuts the recorded start-to-start gap to 0.3 s (the end-to-
    start delay becomes 0.3 − api_time); `runtime` waits the cap after the tree went idle."""
    trace = make_trace(make_session("gap", [_req(0.0, api_time=0.1), _req(100.0)]))
    with SimServer(time_scale=0.01, block_size=16) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(sessions=1, system_idle_cap_s=None, tree_idle_cap_s=0.3, tree_idle_cap_mode=mode),
        )
        result = asyncio.run(run_replay(trace, options))
    first, second = sorted(to_records(read_records(result.records_path)), key=lambda r: r.sent_ns)
    # When the schedule made the second request due, from the first one's end: what the cap decides. (When it went out
    # adds the client's dispatch lag, which a loaded machine makes 100 ms or more.)
    gap_s = (second.scheduled_ns - first.end_ns) / 1e9
    expected_s = 0.3 - 0.1 if mode == "warp" else 0.3
    assert expected_s - 0.01 <= gap_s < expected_s + 0.06
    assert (result.idle_jumps > 0) == (mode == "runtime")
