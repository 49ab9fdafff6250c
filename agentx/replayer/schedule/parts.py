"""What a run's `Runner` (agentx.replayer.schedule.runner) is made of: the settings it derives once from its options
(`RunSettings`), what it counts as it goes (`RunTally`, read into the run's result), and the pieces it composes,
each built from the options here: the records' `Recorder`, the `Sender` and the server-loss watch."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from agentx.records.writer import RecordWriter
from agentx.replayer.http.client import Client
from agentx.replayer.options.limits import shard_share, tree_limit
from agentx.replayer.options.replay import ReplayOptions, TraceLoad, lanes
from agentx.replayer.options.rules import RuleSet
from agentx.replayer.plan.bodies import BodyBuilder
from agentx.replayer.plan.sent_blocks import SentBlocks
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.idle import IdleCaps
from agentx.replayer.schedule.recorder import Recorder
from agentx.replayer.schedule.sending import Sender
from agentx.replayer.schedule.server_loss import ServerLossWatch
from agentx.trace.model import Trace

if TYPE_CHECKING:
    from agentx.replayer.schedule.warmup import LaneStart


class RunSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What one shard of a run derives from its options and trace before it starts."""

    lanes: range
    """The lanes this shard plays (every `shard_count`-th from its index)."""
    tree_limit: int | None
    """How many trees this shard starts (agentx.replayer.options.limits); None: until the deadline or the cap."""
    delay_scale: float
    """The recorded delays' factor: the scenario's, over a trace load's speed-up."""
    rules: RuleSet
    affinity_headers: tuple[str, ...]
    """The headers that carry a tree's affinity key: the rule set's `X-Session-Affinity` and the server's own."""
    runtime_tree_cap_s: float | None
    """The tree idle cap applied on the live schedule (None: off, or already applied to the trace's gaps)."""


def run_settings(trace: Trace, options: ReplayOptions) -> RunSettings:
    """`options` read once for the run of `trace`."""
    shard_index, shard_count = options.runtime.shard
    limit = 0 if trace.request_count == 0 else tree_limit(options.scenario, len(trace.sessions))
    load = options.load
    rules = options.scenario.rule_set
    return RunSettings(
        lanes=range(shard_index, lanes(load), shard_count),
        tree_limit=None if limit is None else shard_share(limit, options.runtime.shard),
        delay_scale=options.scenario.delay_scale / (load.speedup if isinstance(load, TraceLoad) else 1.0),
        rules=rules,
        affinity_headers=(("X-Session-Affinity",) if rules.session_affinity_header else ())
        + options.server.affinity_headers,
        # The load-time cap already cut the gaps; the runtime one acts on the live schedule (§4c).
        runtime_tree_cap_s=options.scenario.tree_idle_cap_s if options.scenario.tree_cap_mode == "runtime" else None,
    )


LOOP_LAG_TICK_S: Final = 0.1
"""How often a run samples its event-loop lag (`RunTally.loop_lag_s`). A stall of the client that began just after a
sample shows in the samples up to this much shorter than it was."""


class RunTally(msgspec.Struct, kw_only=True):
    """What a run counted as it went: its result reads them when it ends."""

    played: set[int] = msgspec.field(default_factory=set)
    """Sessions this run has drawn (a shared `PreparedTrace` may hold others, from earlier runs)."""
    trees_started: int = 0
    trees_finished: int = 0
    skipped: int = 0
    """Steps of started trees never sent because the run stopped first."""
    skipped_context_overflow: int = 0
    passes: dict[int, int] = msgspec.field(default_factory=dict)
    """Per session index: plays so far (the marker's recycle pass)."""
    tstar: list[LaneStart] = msgspec.field(default_factory=list)
    warmup_expected_s: float = 0.0
    loop_lag_s: list[float] = msgspec.field(default_factory=list)
    server_lost_at_s: float | None = None
    """When the streak of refusals that lost the server began, s after the run's start (None: not lost)."""
    notices: list[str] = msgspec.field(default_factory=list)


def _caps_output(extra_body: Mapping[str, Any] | None) -> bool:
    """Whether the user's extra body sets the output cap itself (then what each request's cap was is not known)."""
    return extra_body is not None and any(key in extra_body for key in ("max_tokens", "max_completion_tokens"))


def server_loss_watch(
    client: Client, options: ReplayOptions, on_lost: Callable[[int, int, float], None], in_flight: Callable[[], int]
) -> ServerLossWatch | None:
    """The watch that stops the run when the server is lost (None: `--on-server-loss` is not "stop")."""
    runtime = options.runtime
    if runtime.on_server_loss != "stop":
        return None
    return ServerLossWatch(
        client,
        failures=runtime.server_loss_failures,
        window_s=runtime.server_loss_window_s,
        on_lost=on_lost,
        in_flight=in_flight,
    )


def recorder(
    writer: RecordWriter,
    options: ReplayOptions,
    bodies: BodyBuilder,
    hooks: RunHooks,
    *,
    run_id: str,
    start_ns: int,
    notice: Callable[[str], None],
    fail_run: Callable[[], None],
    server_loss: ServerLossWatch | None,
    route: str,
) -> Recorder:
    """The run's records and counters, written through `writer`; `route`: how the requests reach the server
    (`Client.route`)."""
    return Recorder(
        writer,
        run_id=run_id,
        start_ns=start_ns,
        marker_tokens=bodies.marker_tokens,
        failed_request_threshold=options.scenario.failed_request_threshold,
        lanes=lanes(options.load),
        on_record=hooks.on_record,
        notice=notice,
        fail_run=fail_run,
        server_loss=server_loss,
        max_tokens=None if _caps_output(options.server.extra_body) else bodies.max_tokens,
        slo=options.scenario.slo,
        worker=options.runtime.shard[0],
        node=options.runtime.node or socket.gethostname(),
        route=route,
    )


def sender(
    client: Client,
    options: ReplayOptions,
    bodies: BodyBuilder,
    hooks: RunHooks,
    *,
    idle: IdleCaps,
    recorder: Recorder,
    lru_blocks: int | None,
    on_cap: Callable[[], None],
) -> Sender:
    """What sends the run's requests: `on_cap` when this shard's share of `--num-requests` has gone out."""
    cap = options.scenario.num_requests
    return Sender(
        client,
        bodies.path,
        idle,
        recorder,
        options.runtime.grace_s,
        SentBlocks(bodies.session_scope, lru_blocks),
        request_cap=None if cap is None else shard_share(cap, options.runtime.shard),
        on_cap=on_cap,
        on_sent=hooks.on_sent,
        on_in_flight=hooks.on_in_flight,
    )
