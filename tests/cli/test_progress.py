"""The progress of `agentx replay` (agentx/cli/display/progress.py): phases, counts, rates and time left on a fake
clock; the live line on a terminal; plain lines on a pipe, from the command line against the simulator."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from paths import SAMPLE_TRACE
from rich.console import Console
from strategies import record_identity

from agentx.cli.display.progress import INTERVAL_ENV, ReplayProgress, clock_text, line_interval_s
from agentx.errors import ConfigError
from agentx.records.record import Phase, RequestRecord

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(out: int, status: str = "ok", *, phase: Phase = "profiling", kind: str = "http") -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(run_id="r", phase=phase),
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
        values["error_kind"] = kind
    return RequestRecord(**values)


def _text(progress: ReplayProgress, width: int = 200) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(progress.render())
    return console.export_text()


def test_counts_errors_cancellations_in_flight_and_the_recent_output_rate() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, window_s=5.0, interval_s=0)
    assert progress.state().in_flight is None  # nothing reports sends yet: unknown, not zero
    assert progress.state().phase == "starting"
    for _ in range(5):
        progress.on_sent()
    progress.on_record(record(100))  # at t = 0: out of the window by t = 6
    clock.now += 4
    progress.on_record(record(200))
    progress.on_record(record(0, status="error"))
    progress.on_record(record(0, status="error", kind="cancelled"))
    clock.now += 2
    state = progress.state()
    assert (state.done, state.errors, state.cancelled, state.in_flight) == (4, 1, 1, 1)
    assert state.output_tps == pytest.approx(200 / 5)
    assert state.fraction is None and state.time_left_s is None  # neither duration nor planned requests
    text = _text(progress)
    assert "profiling" in text and "4 done" in text and "1 in flight" in text and "40 out tok/s" in text
    assert "1 errors" in text and "0:06 elapsed" in text


def test_agentx_by_duration_warmup_then_the_profiling_window_then_draining() -> None:
    """The window is `duration_s` from the profiling start the engine reports, not from the run's start: a long
    warmup no longer eats into it (once it read "8:11 left" during the warmup)."""
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, duration_s=600, grace_s=30, interval_s=0)
    progress.start()
    state = progress.state()
    assert (state.phase, state.fraction, state.time_left_s, state.left_bound) == ("starting", None, 600, "at least")
    clock.now += 5
    for _ in range(8):
        progress.on_sent()  # the primers
    for _ in range(8):
        clock.now += 20
        progress.on_record(record(1, phase="warmup"))
    state = progress.state()
    assert state.phase == "warmup" and state.elapsed_s == pytest.approx(165)
    assert state.fraction is None  # the bar waits for the window
    assert state.left_text() == "10:00+ left"  # the whole window is still to come, whatever the warmup took
    progress.on_profiling()
    clock.now += 90
    state = progress.state()
    assert state.phase == "profiling" and state.profiling_done == 0
    assert state.fraction == pytest.approx(0.15) and state.left_text() == "8:30 left"
    assert "profiling" in _text(progress) and "8:30 left" in _text(progress)
    clock.now += 510  # the deadline: in-flight requests get the grace period
    state = progress.state()
    assert (state.phase, state.fraction, state.left_text()) == ("draining", 1.0, "up to 0:30 left")
    clock.now += 12
    assert progress.state().left_text() == "up to 0:18 left"
    clock.now += 100
    assert progress.state().time_left_s == 0
    progress.close()
    state = progress.state()
    assert state.phase == "ended" and state.time_left_s == 0
    clock.now += 50
    assert progress.state().elapsed_s == state.elapsed_s  # frozen at the end


def test_by_sessions_the_bar_counts_profiling_requests_only_at_the_pace_since_the_profiling_start() -> None:
    """A tree-bounded run: `planned` counts the profiling requests (agentx.cli.display.planned), so the warmup's primers
    neither move the bar nor the pace, and the bar reaches 100% as the last request ends (once it stuck at 60%)."""
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, planned=40, interval_s=0)
    for _ in range(4):
        progress.on_sent()
        progress.on_record(record(1, phase="warmup"))
    clock.now += 30
    state = progress.state()
    assert state.phase == "warmup" and state.fraction is None and state.time_left_s is None
    progress.on_profiling()
    clock.now += 10
    assert progress.state().fraction == 0 and progress.state().time_left_s is None  # no pace yet
    for _ in range(10):
        progress.on_record(record(5))
    clock.now += 20
    state = progress.state()
    assert state.done == 14 and state.profiling_done == 10
    assert state.fraction == pytest.approx(0.25)
    assert state.time_left_s == pytest.approx(90)  # 30 s for 10 requests, 30 to go
    for _ in range(30):
        progress.on_record(record(5))
    state = progress.state()
    assert (state.fraction, state.time_left_s) == (1.0, 0)


def test_closed_mode_by_sessions_starts_its_window_at_once_and_the_sooner_end_wins() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, planned=40, duration_s=50, interval_s=0)
    progress.on_profiling()  # closed, trace and rate modes: as the runner starts
    assert progress.state().phase == "profiling"
    clock.now += 20
    for _ in range(10):
        progress.on_record(record(5))
    state = progress.state()
    assert state.time_left_s == pytest.approx(30)  # the duration's 30 s, before the requests' 60 s
    assert state.fraction == pytest.approx(0.4)  # the further of 20/50 and 10/40
    nothing = ReplayProgress(clock=clock, planned=0, interval_s=0)
    nothing.on_profiling()
    assert (nothing.state().fraction, nothing.state().time_left_s) == (1.0, 0)


def test_a_caller_that_does_not_report_the_profiling_start_gets_it_from_the_first_profiling_record() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, duration_s=60, interval_s=0)
    progress.on_sent()
    clock.now += 7
    progress.on_record(record(3))
    clock.now += 6
    state = progress.state()
    assert state.phase == "profiling" and state.time_left_s == pytest.approx(54)


def test_the_plain_line_is_ascii_and_names_every_field() -> None:
    clock = FakeClock()
    progress = ReplayProgress(clock=clock, duration_s=3600, interval_s=0)
    progress.on_profiling()
    for _ in range(1502):
        progress.on_sent()
    for _ in range(1500):
        progress.on_record(record(20))
    progress.on_record(record(0, status="error"))
    clock.now += 900
    line = progress.state().line()
    assert line == "[15:00] profiling 25%: 1,501 done, 1 in flight, 0 out tok/s, 1 errors, 45:00 left"
    assert clock_text(3725) == "1:02:05" and clock_text(59.6) == "1:00"
    progress.close()
    assert progress.state().line() == "[15:00] ended: 1,501 done, 1 errors"


def test_the_line_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert line_interval_s() == 10
    monkeypatch.setenv(INTERVAL_ENV, "0.25")
    assert line_interval_s() == 0.25
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        with pytest.raises(ConfigError, match=INTERVAL_ENV):
            line_interval_s()


def test_a_terminal_console_draws_live_and_a_pipe_gets_plain_lines() -> None:
    drawn, silent, lines = io.StringIO(), io.StringIO(), io.StringIO()
    terminal = Console(file=drawn, force_terminal=True, width=120)
    with ReplayProgress(console=terminal, interval_s=0.01) as progress:
        progress.on_record(record(3))
    assert "1 done" in drawn.getvalue()
    quiet = Console(file=silent, force_terminal=False)
    with ReplayProgress(console=quiet, interval_s=60) as progress:
        progress.on_record(record(3))
    assert silent.getvalue() == ""  # shorter than one interval: no line
    piped = Console(file=lines, force_terminal=False)
    with ReplayProgress(console=piped, interval_s=0.01) as progress:
        progress.on_sent()
        progress.on_record(record(3))
        deadline = time.monotonic() + 10
        while lines.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    output = lines.getvalue()
    assert "\x1b" not in output
    *periodic, last = output.splitlines()
    assert len(periodic) >= 2 and all(line.endswith("time left unknown") for line in periodic)
    assert periodic[0].startswith("[0:00] profiling: 1 done, 0 in flight") and last.endswith("ended: 1 done, 0 errors")


def test_plain_lines_stop_before_the_state_ends() -> None:
    # A tick between the state ending and the thread stopping would print the ended state twice.
    closing, ticking_at_end = False, []

    def clock() -> float:
        if closing:
            ticking_at_end.append(any(thread.name == "agentx-progress" for thread in threading.enumerate()))
        return time.monotonic()

    lines = io.StringIO()
    with ReplayProgress(console=Console(file=lines, force_terminal=False), interval_s=0.001, clock=clock) as progress:
        progress.on_record(record(3))
        deadline = time.monotonic() + 10
        while not lines.getvalue() and time.monotonic() < deadline:
            time.sleep(0.001)
        closing = True
    assert ticking_at_end and not any(ticking_at_end)
    assert lines.getvalue().count("ended:") == 1


LINE = re.compile(
    r"\[\d+:\d\d\] (starting|warmup|profiling|draining)( \d+%)?: [\d,]+ done, [\d,?]+ in flight, "
    r"[\d,]+ out tok/s, [\d,]+ errors, (time left unknown|(up to )?\d+:\d\d\+? left)"
)


def test_a_replay_on_a_pipe_prints_plain_progress_lines(tmp_path: Path) -> None:
    """The command line against the built-in simulator, stderr a pipe: a line every interval with every field,
    plain ASCII, then a last one; stdout still holds only the JSON summary."""
    args = ["replay", str(SAMPLE_TRACE), "--mode", "closed", "--concurrency", "2", "--duration", "2.5", "--grace", "5"]
    args += ["--delay-scale", "0", "--sim-time-scale", "0.05", "--out", str(tmp_path / "run"), "--json"]
    env = {**os.environ, INTERVAL_ENV: "0.4"}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    done = subprocess.run(
        [sys.executable, "-m", "agentx.cli", *args], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert done.stderr.isascii() and "\x1b" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    periodic, last = lines[:-1], lines[-1]
    assert len(periodic) >= 3, done.stderr
    assert all(LINE.fullmatch(line) for line in periodic), periodic
    assert any(" profiling " in line and line.endswith(" left") for line in periodic), periodic
    assert last.endswith(f"ended: {summary['counts']['rows']:,} done, 0 errors"), last
