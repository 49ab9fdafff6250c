"""The progress of `agentx replay` and each `agentx sweep` level on stderr: phase, done, in flight, output tok/s,
errors, time left (docs/replay.md, "Progress").

On a terminal it is one live line with a bar, redrawn at 4 Hz; otherwise (a pipe, a CI log, nohup) one plain line
every `AGENTX_PROGRESS_INTERVAL_S` seconds (10 by default; 0: none), and a last one at the end when any was printed.
rich loads only to draw on a terminal: a replay's first request goes out without it (bench/startup.py).

Phases: `starting` (probes, calibration), `warmup` (the AgentX primers and cache-pressure stage), `profiling`
(from the profiling start the engine reports; at once in the other modes), `draining` (the deadline passed: the
requests in flight get the grace period), `ended`. The time left is the profiling window's rest (`duration_s`
counts from the profiling start, the warmup not included, docs/agentx.md §4e), or the profiling requests still
to go (`planned`, agentx.cli.display.planned) at the pace since the profiling start, the sooner of the two; during the
warmup it is at least the whole window, while draining at most what is left of the grace period.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, TYPE_CHECKING, Final, Literal, Self

import msgspec

from agentx.cli.common import LazyConsole
from agentx.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from agentx.records.record import RequestRecord
    from agentx.replayer.schedule.hooks import RunHooks

INTERVAL_ENV: Final = "AGENTX_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S: Final = 10.0

ProgressPhase = Literal["starting", "warmup", "profiling", "draining", "ended"]
LeftBound = Literal["about", "at least", "at most"]


class ProgressState(msgspec.Struct, kw_only=True):
    """One reading of a run's progress."""

    phase: ProgressPhase
    elapsed_s: float
    """Since the progress started (the run's start, probes included)."""
    done: int
    """Requests finished (ok or not), warmup included."""
    profiling_done: int
    errors: int
    """Failed requests of either phase, cancellations excluded."""
    cancelled: int
    in_flight: int | None
    """Sent − finished; None while nothing reports sends."""
    output_tps: float
    """Output tokens of the requests finished over the last `window_s` seconds, per second."""
    fraction: float | None
    """0..1 of the profiling part, by time or by requests (the further); None before it starts or when unknown."""
    time_left_s: float | None
    left_bound: LeftBound = "about"
    """`at least` during the warmup (the whole window is still to come), `at most` while draining."""

    def left_text(self) -> str | None:
        """The time left as words: `8:37 left`, `10:00+ left`, `up to 0:25 left`; None when unknown."""
        if self.time_left_s is None:
            return None
        clock = clock_text(self.time_left_s)
        if self.left_bound == "at least":
            return f"{clock}+ left"
        return f"up to {clock} left" if self.left_bound == "at most" else f"{clock} left"

    def line(self) -> str:
        """The plain line: ASCII, no markup, every field named."""
        head = f"[{clock_text(self.elapsed_s)}] {self.phase}"
        if self.phase == "ended":
            cancelled = f", {self.cancelled:,} cancelled" if self.cancelled else ""
            return f"{head}: {self.done:,} done, {self.errors:,} errors{cancelled}"
        if self.fraction is not None:
            head += f" {self.fraction:.0%}"
        in_flight = "?" if self.in_flight is None else f"{self.in_flight:,}"
        left = self.left_text() or "time left unknown"
        return (
            f"{head}: {self.done:,} done, {in_flight} in flight, {self.output_tps:,.0f} out tok/s, "
            f"{self.errors:,} errors, {left}"
        )


def clock_text(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def line_interval_s() -> float:
    """Seconds between plain lines: `AGENTX_PROGRESS_INTERVAL_S`, else 10; 0 turns them off."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{INTERVAL_ENV}={text!r}: want seconds between progress lines (0 for none)")
    return value


class ReplayProgress:
    """Counts a replay's requests from its callbacks and shows them: live on a terminal console, as plain lines
    on any other (module docstring).

    Pass `hooks()` to the run. The callbacks only count (a few hundred nanoseconds a request on the event loop);
    drawing and printing happen on a thread of their own.
    """

    def __init__(
        self,
        *,
        console: Console | LazyConsole | None = None,
        duration_s: float | None = None,
        planned: int | None = None,
        grace_s: float = 0.0,
        window_s: float = 10.0,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`duration_s`: the profiling window; `planned`: the profiling requests the run will send; `grace_s`: the
        allowance after the deadline; `interval_s`: between plain lines (None: `line_interval_s()`)."""
        self.console = console
        self.duration_s = duration_s
        self.planned = planned
        self.grace_s = grace_s
        self.window_s = window_s
        self.interval_s = line_interval_s() if interval_s is None else interval_s
        self._clock = clock
        self.started = clock()
        self.profiling_started: float | None = None
        self.ended: float | None = None
        self.done = 0
        self.profiling_done = 0
        self.errors = 0
        self.cancelled = 0
        self.sent = 0
        self._sends_reported = False
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._live: Live | None = None
        self._lines: _Lines | None = None

    # -- callbacks (on the event loop)

    def on_record(self, record: RequestRecord) -> None:
        now = self._clock()
        self.done += 1
        if record.phase == "profiling":
            self.profiling_done += 1
            if self.profiling_started is None:  # a caller that does not report the profiling start
                self.profiling_started = now
        if record.error_kind == "cancelled":
            self.cancelled += 1
        elif record.status != "ok":
            self.errors += 1
        self._recent.append((now, record.osl_tokens))
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    __call__ = on_record

    def on_sent(self) -> None:
        self._sends_reported = True
        self.sent += 1

    def on_profiling(self) -> None:
        """The profiling phase starts (after the warmup): the window's clock starts now."""
        if self.profiling_started is None:
            self.profiling_started = self._clock()

    def hooks(self) -> RunHooks:
        """The run's hooks that feed this progress."""
        from agentx.replayer.schedule.hooks import RunHooks

        return RunHooks(on_record=self.on_record, on_sent=self.on_sent, on_profiling=self.on_profiling)

    # -- reading

    def state(self) -> ProgressState:
        now = self._clock() if self.ended is None else self.ended
        elapsed = max(now - self.started, 0.0)
        recent = list(self._recent)  # the drawing thread reads while the loop appends: copy first
        tokens = sum(n for t, n in recent if t >= now - self.window_s)
        span = min(self.window_s, elapsed)
        phase: ProgressPhase
        fraction: float | None = None
        left: float | None = None
        bound: LeftBound = "about"
        if self.profiling_started is None:
            phase = "warmup" if self._sends_reported or self.done else "starting"
            if self.duration_s is not None and self.planned is None:
                left, bound = self.duration_s, "at least"
        else:
            window = max(now - self.profiling_started, 0.0)
            phase = "profiling"
            fractions: list[float] = []
            lefts: list[float] = []
            if self.duration_s is not None:
                fractions.append(min(window / self.duration_s, 1.0))
                lefts.append(max(self.duration_s - window, 0.0))
            if self.planned is not None:
                go = max(self.planned - self.profiling_done, 0)
                fractions.append(min(self.profiling_done / self.planned, 1.0) if self.planned else 1.0)
                if self.profiling_done or not go:
                    lefts.append(window * go / self.profiling_done if go else 0.0)
            fraction = max(fractions) if fractions else None
            left = min(lefts) if lefts else None
            if self.duration_s is not None and window >= self.duration_s:
                phase, bound = "draining", "at most"
                left = max(self.grace_s - (window - self.duration_s), 0.0)
        if self.ended is not None:
            phase, left, bound = "ended", 0.0, "about"
        return ProgressState(
            phase=phase,
            elapsed_s=elapsed,
            done=self.done,
            profiling_done=self.profiling_done,
            errors=self.errors,
            cancelled=self.cancelled,
            in_flight=max(self.sent - self.done, 0) if self._sends_reported else None,
            output_tps=tokens / span if span > 0 else 0.0,
            fraction=fraction,
            time_left_s=left,
            left_bound=bound,
        )

    # -- showing

    def render(self) -> Table:
        """The live line: the counts first, then the bar in what room is left (a narrow terminal loses the bar)."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        state = self.state()
        bar = ProgressBar(total=None if state.fraction is None else 1.0, completed=state.fraction or 0.0)
        parts = [state.phase, f"{state.done:,} done"]
        parts.append(f"{state.in_flight:,} in flight" if state.in_flight is not None else "– in flight")
        parts.append(f"{state.output_tps:,.0f} out tok/s")
        parts.append(f"{state.errors:,} errors")
        parts.append(state.left_text() or f"{clock_text(state.elapsed_s)} elapsed")
        text = Text(" · ".join(parts))
        if state.errors:
            text.highlight_words([f"{state.errors:,} errors"], style="red")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, min_width=text.cell_len)
        grid.add_column(no_wrap=True, max_width=30)
        grid.add_row(text, bar)
        return grid

    def start(self) -> None:
        """Restart the clock; draw live when the console is a terminal, else start the plain lines."""
        self.started = self._clock()
        if self.console is None or self._live is not None or self._lines is not None:
            return
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(
                console=self.console.console if isinstance(self.console, LazyConsole) else self.console,
                get_renderable=self.render,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        elif self.interval_s > 0:
            # The CLI's progress console is stderr; a rich Console (a test's) names its file.
            stream = sys.stderr if isinstance(self.console, LazyConsole) else self.console.file
            self._lines = _Lines(self, stream, self.interval_s)

    def close(self) -> None:
        """Stop showing; the state reads `ended` from now on, and the plain lines end with a last one."""
        # The lines' thread stops before the state ends, so a tick cannot print an "ended" line before the last one.
        lines, self._lines = self._lines, None
        if lines is not None:
            lines.stop()
        if self.ended is None:
            self.ended = self._clock()
        if self._live is not None:
            self._live.stop()
            self._live = None
        if lines is not None:
            lines.finish()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def current_progress_hooks(current: Callable[[], ReplayProgress]) -> RunHooks:
    """Hooks that feed whichever progress `current()` returns as each request goes (each level of a sweep and each
    repeat has a progress of its own)."""
    from agentx.replayer.schedule.hooks import RunHooks

    return RunHooks(
        on_record=lambda record: current().on_record(record),
        on_sent=lambda: current().on_sent(),
        on_profiling=lambda: current().on_profiling(),
    )


class _Lines:
    """Plain progress lines on `stream` every `interval_s` from a daemon thread: the event loop never waits on a
    full pipe. A stream that fails (closed, a broken pipe) ends them quietly."""

    def __init__(self, progress: ReplayProgress, stream: IO[str], interval_s: float) -> None:
        self.progress = progress
        self.stream = stream
        self.interval_s = interval_s
        self.printed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentx-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write(self.progress.state().line())

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()
        else:
            self.printed += 1

    def stop(self) -> None:
        """Stop the thread: no periodic line after this returns."""
        self._stop.set()
        self._thread.join()

    def finish(self) -> None:
        """A last line when any was printed (a run shorter than one interval stays quiet)."""
        if self.printed:
            self._write(self.progress.state().line())
