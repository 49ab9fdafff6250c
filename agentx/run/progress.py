"""A run's progress on standard logging, so that a library run is never silent: what ends it as it starts, then every
`PROGRESS_INTERVAL_S` the requests recorded and failed, then how it ended. Logged at INFO on `agentx.run.progress`,
which a caller turns on as it turns on any library's logging (`logging.basicConfig(level=logging.INFO)`); nothing
is counted when the logger would drop the lines. The command line shows its own live display instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import msgspec
import pyarrow as pa

from agentx.records.record import RunInfo
from agentx.replayer.options.replay import ReplayOptions, Scenario
from agentx.replayer.schedule.clock import DispatchClock
from agentx.replayer.schedule.hooks import RunHooks

PROGRESS_INTERVAL_S: Final = 10.0
"""How often a running replay logs its progress."""
_log = logging.getLogger(__name__)


def end_line(scenario: Scenario, trace_sessions: int) -> str:
    """What ends the run, said as it starts: its stops (a mode's default duration among them), or one pass."""
    stops = []
    if scenario.duration_s is not None:
        stops.append(f"after {scenario.duration_s:,g} s (--duration)")
    if scenario.sessions is not None:
        stops.append(f"after {scenario.sessions:,} session trees (--sessions)")
    if scenario.num_requests is not None:
        stops.append(f"after {scenario.num_requests:,} profiling requests (--num-requests)")
    if not stops:
        return (
            f"the run ends after one pass of the trace's {trace_sessions:,} sessions (--duration, --sessions or "
            "--num-requests set another end); Ctrl-C stops it sooner"
        )
    first = ", whichever comes first" if len(stops) > 1 else ""
    return f"the run ends {', or '.join(stops)}{first}; Ctrl-C stops it sooner"


class ProgressLog:
    """Counts the records a run writes and logs them every `interval_s` while it runs (`hooks` wraps a run's hooks;
    `close` ends it with the last line). Inert when `agentx.run.progress` does not log INFO."""

    def __init__(self, options: ReplayOptions, trace_sessions: int, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.options = options
        self.trace_sessions = trace_sessions
        self.interval_s = interval_s
        self.active = _log.isEnabledFor(logging.INFO)
        self.recorded = 0
        self.failed = 0
        self._start_s: float | None = None
        self._profiling_s: float | None = None
        self._ticker: asyncio.Task[None] | None = None

    def hooks(self, hooks: RunHooks) -> RunHooks:
        """`hooks` that also count for the log (unchanged when the log is off)."""
        if not self.active:
            return hooks
        import pyarrow.compute as pc  # only a logged run counts: a replay starts without it

        started, profiling, batch = hooks.on_start, hooks.on_profiling, hooks.on_batch

        def on_start(info: RunInfo, start_ns: int, clock: DispatchClock | None) -> None:
            self.start()
            if started is not None:
                started(info, start_ns, clock)

        def on_profiling() -> None:
            self._profiling_s = time.monotonic()
            _log.info("agentx: %s", self._counts("profiling starts", warmup=True))
            if profiling is not None:
                profiling()

        def on_batch(records: pa.RecordBatch) -> None:
            self.recorded += records.num_rows
            self.failed += records.num_rows - pc.sum(pc.equal(records.column("status"), "ok")).as_py()
            if batch is not None:
                batch(records)

        return msgspec.structs.replace(hooks, on_start=on_start, on_profiling=on_profiling, on_batch=on_batch)

    def start(self, *, ticking: bool = True) -> None:
        """Log what ends the run and, with `ticking`, the counts every `interval_s` from now (a run over processes
        has no counts before its end)."""
        if not self.active:
            return
        self._start_s = time.monotonic()
        _log.info(
            "agentx: replaying against %s into %s; %s",
            self.options.server.url,
            self.options.out_dir,
            end_line(self.options.scenario, self.trace_sessions).removesuffix("; Ctrl-C stops it sooner"),
        )
        if ticking:
            self._ticker = asyncio.ensure_future(self._tick())

    def close(self, ended: str, counts: tuple[int, int] | None = None) -> None:
        """Stop the periodic lines and log the last one (`ended`: how the run ended; `counts`: the requests recorded
        and failed, when not counted as they were written)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if counts is not None:
            self.recorded, self.failed = counts
        if self.active and self._start_s is not None:
            _log.info("agentx: %s", self._counts(ended))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            _log.info("agentx: %s", self._counts("running"))

    def _counts(self, what: str, *, warmup: bool = False) -> str:
        """`what` at the run's time, with the counts so far (`warmup`: those are the warmup's)."""
        now = time.monotonic()
        elapsed = f"{now - self._start_s:,.0f} s" if self._start_s is not None else "?"
        profiling = ""
        if self._profiling_s is not None and not warmup:
            profiling = f" ({now - self._profiling_s:,.0f} s of profiling)"
        done = "requests of the warmup recorded" if warmup else "requests recorded"
        return f"{what} at {elapsed}{profiling}: {self.recorded:,} {done}, {self.failed:,} failed"
