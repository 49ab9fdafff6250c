"""The live progress of `agentx replay` on stderr: done, in flight, output tok/s, errors, time left.

rich loads when a terminal draws it, not before: a replay's first request goes out without it (bench/startup.py).
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

import msgspec

from agentx.cli.common import LazyConsole

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from agentx.replayer.options import ReplayOptions
    from agentx.replayer.records import RequestRecord
    from agentx.trace.model import Trace


def planned_requests(trace: Trace, options: ReplayOptions) -> int | None:
    """Requests a run will send when it ends by tree count (`sessions`, or one pass); None for a duration-only run.

    The trees are the first `sessions` of the run's session order (same seed, same order as the engine).
    """
    from agentx.replayer.plan import session_order

    if options.scenario.sessions is None and options.scenario.duration_s is not None:
        return None
    trees = options.scenario.sessions if options.scenario.sessions is not None else len(trace.sessions)
    if trace.request_count == 0:
        return 0
    order = session_order(len(trace.sessions), options.scenario.session_order, options.scenario.seed)
    return sum(trace.sessions[i].request_count for i in itertools.islice(order, trees))


class ProgressState(msgspec.Struct, kw_only=True):
    """One reading of a run's progress."""

    elapsed_s: float
    done: int
    """Requests finished (ok or not)."""
    errors: int
    in_flight: int | None
    """Sent − finished; None while nothing reports sends."""
    output_tps: float
    """Output tokens of the requests finished over the last `window_s` seconds, per second."""
    fraction: float | None
    """0..1 of the run, by time (duration) or by requests (tree count); None when unknown."""
    time_left_s: float | None


def _clock_text(seconds: float) -> str:
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ReplayProgress:
    """Counts a replay's requests from its callbacks; with a terminal console, shows them live.

    Pass `on_record` and `on_sent` to the run. Time left comes from
    `duration_s` (what is left of it) or, for a run that ends by tree count, from the requests still to go
    (`planned_requests`) at the pace so far; both given: the sooner. Drawing happens on rich's refresh thread
    at 4 Hz; the callbacks only count, so the event loop pays a few hundred nanoseconds a request.
    """

    def __init__(
        self,
        *,
        console: Console | LazyConsole | None = None,
        duration_s: float | None = None,
        planned: int | None = None,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.duration_s = duration_s
        self.planned = planned
        self.window_s = window_s
        self._clock = clock
        self.started = clock()
        self.done = 0
        self.errors = 0
        self.sent = 0
        self._sends_reported = False
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._live: Live | None = None

    # -- callbacks

    def on_record(self, record: RequestRecord) -> None:
        now = self._clock()
        self.done += 1
        self.errors += record.status != "ok"
        self._recent.append((now, record.osl_tokens))
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    __call__ = on_record

    def on_sent(self) -> None:
        self._sends_reported = True
        self.sent += 1

    # -- reading and drawing

    def state(self) -> ProgressState:
        now = self._clock()
        elapsed = max(now - self.started, 0.0)
        recent = list(self._recent)  # the refresh thread reads while the loop appends: copy first
        tokens = sum(n for t, n in recent if t >= now - self.window_s)
        span = min(self.window_s, elapsed)
        fractions: list[float] = []
        lefts: list[float] = []
        if self.duration_s is not None and self.duration_s > 0:
            fractions.append(min(elapsed / self.duration_s, 1.0))
            lefts.append(max(self.duration_s - elapsed, 0.0))
        if self.planned is not None and self.planned > 0:
            fractions.append(min(self.done / self.planned, 1.0))
            if self.done:
                lefts.append(elapsed * max(self.planned - self.done, 0) / self.done)
        elif self.planned == 0:
            fractions.append(1.0)
            lefts.append(0.0)
        return ProgressState(
            elapsed_s=elapsed,
            done=self.done,
            errors=self.errors,
            in_flight=max(self.sent - self.done, 0) if self._sends_reported else None,
            output_tps=tokens / span if span > 0 else 0.0,
            fraction=max(fractions) if fractions else None,
            time_left_s=min(lefts) if lefts else None,
        )

    def render(self) -> Table:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        state = self.state()
        # The counts first, the bar in what room is left (up to 30 columns): a narrow terminal loses the bar.
        bar = ProgressBar(total=None if state.fraction is None else 1.0, completed=state.fraction or 0.0)
        parts = [f"{state.done:,} done"]
        parts.append(f"{state.in_flight:,} in flight" if state.in_flight is not None else "– in flight")
        parts.append(f"{state.output_tps:,.0f} out tok/s")
        parts.append(f"{state.errors:,} errors")
        if state.time_left_s is not None:
            parts.append(f"{_clock_text(state.time_left_s)} left")
        else:
            parts.append(f"{_clock_text(state.elapsed_s)} elapsed")
        text = Text(" · ".join(parts))
        if state.errors:
            text.highlight_words([f"{state.errors:,} errors"], style="red")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, min_width=text.cell_len)
        grid.add_column(no_wrap=True, max_width=30)
        grid.add_row(text, bar)
        return grid

    def start(self) -> None:
        """Restart the clock; draw live when the console is a terminal."""
        self.started = self._clock()
        if self.console is not None and self.console.is_terminal and self._live is None:
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

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
