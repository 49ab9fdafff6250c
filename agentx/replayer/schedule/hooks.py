"""What a run calls as it goes: `RunHooks`, given once where the run is asked for (`agentx.replay`) and carried down
whole to the runner, whichever way the run executes.

A harness or a progress display sets `on_record`, `on_sent` and `on_profiling`, and a caller that stops runs early
(the command line's Ctrl-C) `stops`; the others are the run's own layers' (the run's start for its telemetry, a
`--ray` shard's batches and requests in flight, a `--workers` shard's start).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import pyarrow as pa

from agentx.records.record import RequestRecord, RunInfo
from agentx.replayer.schedule.clock import DispatchClock
from agentx.replayer.schedule.stops import RunStops

OnRecord = Callable[[RequestRecord], None]
"""Called with each record as its request finishes (written to the records file already)."""
OnEvent = Callable[[], None]
"""Called as something happens once (a request sent, the profiling phase started)."""
OnStart = Callable[[RunInfo, int, DispatchClock | None], None]
"""Called once as the run starts, its records file created: the run, its start (`perf_counter_ns`, the records' time
origin) and the clock of its due times, if it has one here (agentx.run.replay starts the server telemetry with them;
a `--ray` driver sends nothing itself)."""
OnBatch = Callable[[pa.RecordBatch], None]
"""Called with each batch of records as it is written."""


class RunHooks(msgspec.Struct, frozen=True, kw_only=True):
    """What a run calls as it goes: `on_record` with each record written, `on_sent` as each request that will be
    recorded goes out (before its record), `on_profiling` once, as the profiling phase starts (after the warmup; at
    once in the closed, trace and rate modes). `stops` (`RunStops`): the caller's early stops, heard while the run
    runs (its first ends the run as the deadline would, its second ends the grace period).

    The run's own layers add: `on_start` as the run starts; `on_batch` with each batch of records written and
    `on_in_flight` with the record a request keeps if its answer never arrives (a `--ray` shard tells its driver);
    `on_ready`, awaited once the run has built what it sends first, before its lanes or arrivals start, giving the
    instant (`perf_counter_ns`) they start at (the shards of a `--workers` run agree on one, so that lanes due
    together across them go together)."""

    on_record: OnRecord | None = None
    on_sent: OnEvent | None = None
    on_profiling: OnEvent | None = None
    stops: RunStops | None = None
    on_start: OnStart | None = None
    on_batch: OnBatch | None = None
    on_in_flight: OnRecord | None = None
    on_ready: Callable[[], Awaitable[int]] | None = None

    @property
    def per_request(self) -> bool:
        """Whether a caller asked to hear of each request (`on_record`, `on_sent`, `on_profiling`): that needs the
        run's records in this process as they happen."""
        return self.on_record is not None or self.on_sent is not None or self.on_profiling is not None


NO_HOOKS: RunHooks = RunHooks()
