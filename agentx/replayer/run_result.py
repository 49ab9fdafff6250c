"""What a run returns: `RunResult`, as run.json stores it under "run"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from agentx.replayer.identity import ServerIdentity
from agentx.replayer.warmup import LaneStart

OnSent = Callable[[], None]
"""Called once per request that will be recorded, as it goes out (before its record's `OnRecord`)."""


class CalibrationSummary(msgspec.Struct, kw_only=True):
    """`--api chat`: what the calibration found (agentx.replayer.calibrate.ChatCalibration, the words left out)."""

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
    """Event-loop lag samples: how late a 100 ms timer fired, every 100 ms of the run."""
    stream_usage: str = ""
    """What the run's bodies asked for: "continuous", "final" or "none" (after the `auto` probe)."""
    calibration: CalibrationSummary | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start."""
    cancel_reason: str | None = None
    """Why the run stopped early: "interrupted" (Ctrl-C, cancellation) or "failure_threshold"; None otherwise."""
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
    """The engine serving the run, as the server says itself (agentx.replayer.identity)."""
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
