"""What a run returns: `RunResult`, as run.json stores it under "run"."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agentx.replayer.http.identity import ServerIdentity
from agentx.replayer.schedule.warmup import LaneStart


class CalibrationSummary(msgspec.Struct, kw_only=True):
    """`--api chat`: what the calibration found (agentx.replayer.prompts.calibrate.ChatCalibration, the words left
    out)."""

    words: int
    """Words of one token each."""
    separator_tokens: int
    base_tokens: int
    """Template tokens of a conversation with no message."""
    role_tokens: dict[str, int]
    """Template tokens each message of a role adds."""
    source: str
    """What counted the tokens: "server" or the tokenizer file's name."""
    checks: list[tuple[int, int]]
    """(predicted, counted) on the sample conversations."""


class ShardInfo(msgspec.Struct, kw_only=True):
    """One shard of a `--ray` run: where it ran, its clock against the driver's, and whether it was lost."""

    index: int
    node_id: str
    """The Ray node id (what the shard's records say in `node`)."""
    node_ip: str
    hostname: str
    clock_offset_ns: int
    """The shard's `perf_counter_ns` minus the driver's at the same instant, measured before the start (midpoint of
    the quickest of several round trips); its records are converted to the driver's timeline with it."""
    clock_error_ns: int
    """The bound on that offset's error: half the quickest round trip."""
    clock_drift_ns: int | None = None
    """The offset measured again after the run, minus the first (None: the shard was lost first)."""
    wall_clock_offset_ns: int | None = None
    """The shard host's wall clock minus the driver's at the agreed start: what NTP leaves between the hosts (records
    are aligned by the measured offset above, never by wall clocks)."""
    start_late_s: float | None = None
    """How long after the agreed instant the shard started (its probes took longer than the lead time)."""
    cpu_s: float | None = None
    """CPU time its process used from its start (probes and run, Ray's own threads in it included), as last
    reported."""
    lost: bool = False
    """The actor or its node died during the run."""
    lost_reason: str | None = None
    lost_at_s: float | None = None
    """When the driver saw it lost, on the run's timeline."""
    lost_in_flight: int = 0
    """Requests it had in flight, recorded cancelled for `worker_lost`."""


class RunResult(msgspec.Struct, kw_only=True):
    run_id: str
    records_path: Path
    requests: int
    """Records written (every request sent, cancelled ones included)."""
    errors: int
    """Records with status "error" (cancelled ones included)."""
    trees_started: int
    trees_finished: int
    interrupted: bool
    elapsed_s: float
    cancelled: int = 0
    """Requests cancelled after the grace period (also counted in `errors`)."""
    skipped: int = 0
    """Steps of started trees never sent because the run stopped first."""
    loop_lag_s: list[float] = []
    """Event-loop lag samples: how late a timer due every `LOOP_LAG_TICK_S` fired, through the run
    (agentx.replayer.schedule.parts)."""
    stream_usage: str = ""
    """What the run's bodies asked for: "continuous", "final" or "none" (after the `auto` probe)."""
    calibration: CalibrationSummary | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start."""
    cancel_reason: str | None = None
    """Why the run stopped early: "interrupted" (Ctrl-C, cancellation), "failure_threshold", "stalled",
    "server_lost", "worker_lost" or "write_failed" (its records could not be written); None otherwise."""
    records_kept: int | None = None
    """With a records file whose writes failed (`cancel_reason` "write_failed"): the rows it holds, fewer than the
    summary counts; None when every record reached it."""
    server_lost_at_s: float | None = None
    """With `cancel_reason` "server_lost": when the server stopped answering (the first of the refusals in a row that
    lost it), s after the run's start (agentx.replayer.schedule.server_loss)."""
    skipped_context_overflow: int = 0
    """Steps not sent because their session had ended on a context overflow (docs/agentx.md §5)."""
    warmup_requests: int = 0
    """Warmup primers sent (their records have `phase = "warmup"`)."""
    tstar: list[LaneStart] = []
    """agentx mode: each lane's first tree at its t* (session, t*, live and skipped agents, primers, waiting)."""
    dropped_sessions: int = 0
    """Sessions left out by `max_context_length`."""
    flattened_chains: int = 0
    """Agents split out of the flattened request lists of the sessions played (`split_flattened_agents`)."""
    flattened_by_session: dict[str, int] = {}
    """The same per session played (0: nothing flattened); sessions never played are not split."""
    server: ServerIdentity = ServerIdentity()
    """The engine serving the run, as the server says itself (agentx.replayer.http.identity)."""
    idle_jumps: int = 0
    """Times an idle cap moved timers earlier."""
    idle_skipped_s: float = 0.0
    """Idle time the system cap removed in all (the per-tree cap's shifts are not summed here)."""
    warmup_expected_s: float = 0.0
    """agentx mode: how long the primers' spread schedule was expected to take, idle caps applied."""
    notices: list[str] = []
    """What the run announced as it went (e.g. a warmup of many minutes), as logged."""
    request_cap_reached: bool = False
    """The run stopped because it had sent `num_requests` profiling requests (`Scenario.num_requests`)."""
    trace_path: str | None = None
    """The trace file (or folder) replayed, as an absolute path; None for a trace made in memory."""
    trace_digest: str | None = None
    """The trace's content digest (agentx.trace.digest): equal for two runs of the same trace, whatever its file."""
    agentx_version: str = ""
    """The agentx that ran it (`installed_version`)."""
    profiling_start_ns: int | None = None
    """When profiling started, ns after the run start on the records' clock (None: it never did); the start of the
    window the harness's coverage rule measures (agentx.results.summary.checks.validity)."""
    shards: list[ShardInfo] = []
    """A `--ray` run: each shard's node, clock offset and fate (a `--workers` run on one host needs none)."""


def combined(results: list[RunResult], *, run_id: str, records_path: Path, interrupted: bool) -> RunResult:
    """The result of one run sharded over `results` (`--workers`, `--ray`), whose records are merged at
    `records_path`: counts summed, the lanes' snapshots and samples joined, what the shards agree on from the first."""
    chains = {session: count for r in results for session, count in r.flattened_by_session.items()}
    first = results[0]
    return RunResult(
        run_id=run_id,
        records_path=records_path,
        requests=sum(r.requests for r in results),
        errors=sum(r.errors for r in results),
        trees_started=sum(r.trees_started for r in results),
        trees_finished=sum(r.trees_finished for r in results),
        interrupted=interrupted or any(r.interrupted for r in results),
        elapsed_s=max(r.elapsed_s for r in results),
        cancelled=sum(r.cancelled for r in results),
        skipped=sum(r.skipped for r in results),
        loop_lag_s=[lag for r in results for lag in r.loop_lag_s],
        stream_usage=first.stream_usage,
        calibration=first.calibration,
        cancel_reason=next((r.cancel_reason for r in results if r.cancel_reason), None),
        server_lost_at_s=min((r.server_lost_at_s for r in results if r.server_lost_at_s is not None), default=None),
        skipped_context_overflow=sum(r.skipped_context_overflow for r in results),
        warmup_requests=sum(r.warmup_requests for r in results),
        tstar=sorted((entry for r in results for entry in r.tstar), key=lambda entry: entry.lane),
        dropped_sessions=first.dropped_sessions,
        flattened_chains=sum(chains.values()),
        flattened_by_session=chains,
        server=first.server,
        idle_jumps=sum(r.idle_jumps for r in results),
        idle_skipped_s=max(r.idle_skipped_s for r in results),
        warmup_expected_s=max(r.warmup_expected_s for r in results),
        notices=list(dict.fromkeys(notice for r in results for notice in r.notices)),
        request_cap_reached=all(r.request_cap_reached for r in results),  # each shard sent its share
        profiling_start_ns=min(
            (r.profiling_start_ns for r in results if r.profiling_start_ns is not None), default=None
        ),
        trace_digest=first.trace_digest,
        agentx_version=first.agentx_version,
    )
