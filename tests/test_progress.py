"""The live progress of `agentx replay` (agentx/cli/progress.py): its counts, rates and time left."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import pytest
from flat import replay_options
from rich.console import Console
from strategies import record_identity

from agentx.cli.progress import ReplayProgress, planned_requests
from agentx.replayer.options import ReplayOptions
from agentx.replayer.plan import session_order
from agentx.replayer.records import RequestRecord
from agentx.trace.io import load_trace

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "sample.arrow"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(out: int, status: str = "ok") -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(run_id="r"),
        "scheduled_ns": 0,
        "sent_ns": 0,
        "end_ns": 1,
        "isl_recorded_tokens": 10,
        "isl_sent_tokens": 10,
        "osl_recorded_tokens": out,
        "osl_streamed_tokens": out,
        "status": status,
    }
    if status != "ok":
        values["error_kind"] = "http"
    return RequestRecord(**values)


def _text(progress: ReplayProgress, width: int = 200) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(progress.render())
    return console.export_text()


def test_counts_errors_in_flight_and_recent_output_rate() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, window_s=5.0)
    assert progress.state().in_flight is None  # nothing reports sends yet: unknown, not zero
    for _ in range(4):
        progress.on_sent()
    progress.on_record(record(100))  # at t = 0: out of the window by t = 6
    clock.now += 4
    progress.on_record(record(200))
    progress.on_record(record(0, status="error"))
    clock.now += 2
    state = progress.state()
    assert (state.done, state.errors, state.in_flight) == (3, 1, 1)
    assert state.output_tps == pytest.approx(200 / 5)
    assert state.fraction is None and state.time_left_s is None  # neither duration nor planned requests
    text = _text(progress)
    assert "3 done" in text and "1 in flight" in text and "40 out tok/s" in text and "1 errors" in text
    assert "0:06 elapsed" in text


def test_time_left_from_the_duration() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, duration_s=600)
    progress.start()  # no console: counts only, nothing drawn
    clock.now += 90
    state = progress.state()
    assert state.time_left_s == pytest.approx(510)
    assert state.fraction == pytest.approx(0.15)
    assert "8:30 left" in _text(progress)
    clock.now += 1000
    assert progress.state().time_left_s == 0 and progress.state().fraction == 1.0


def test_time_left_from_the_requests_still_to_go_at_the_pace_so_far() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, planned=40)
    clock.now += 30
    assert progress.state().time_left_s is None  # no pace yet
    for _ in range(10):
        progress.on_record(record(5))
    state = progress.state()
    assert state.fraction == pytest.approx(0.25)
    assert state.time_left_s == pytest.approx(90)  # 30 s for 10 requests, 30 to go
    # a duration that ends sooner wins
    both = ReplayProgress(clock=clock, planned=40, duration_s=50)
    clock.now += 20
    for _ in range(10):
        both.on_record(record(5))
    assert both.state().time_left_s == pytest.approx(30)


def test_planned_requests_follow_the_engines_session_order(tmp_path: Path) -> None:
    trace = load_trace(SAMPLE)

    def options(**kwargs: Any) -> ReplayOptions:
        return replay_options(url="http://x", model="m", out_dir=tmp_path, **kwargs)

    assert planned_requests(trace, options()) == trace.request_count  # one pass
    assert planned_requests(trace, options(sessions=3)) == sum(s.request_count for s in trace.sessions[:3])
    assert planned_requests(trace, options(duration_s=60)) is None
    order = list(itertools.islice(session_order(len(trace.sessions), "shuffle", 7), 30))
    expected = sum(trace.sessions[i].request_count for i in order)
    assert planned_requests(trace, options(sessions=30, session_order="shuffle", seed=7)) == expected
    assert expected != sum(s.request_count for s in (trace.sessions * 2)[:30])  # the order matters here


def test_a_terminal_console_draws_live_and_a_pipe_does_not() -> None:
    piped = Console(file=io.StringIO(), force_terminal=False)
    with ReplayProgress(console=piped) as progress:
        progress.on_record(record(3))
    assert piped.file.getvalue() == ""  # type: ignore[attr-defined]
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120)
    with ReplayProgress(console=terminal) as progress:
        progress.on_record(record(3))
    assert "1 done" in terminal.file.getvalue()  # type: ignore[attr-defined]
