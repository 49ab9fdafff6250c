"""Turning a step's exchange into a record and the run's live counters.

`Recorder.record`: the exchange as a `RequestRecord`, judged against the run's `--slo` targets
(agentx.replayer.options.slo), written (agentx.records.writer) and handed to `on_record` as its request ends. The
counters are what the run needs while it goes: requests and errors for `RunResult`, and the profiling error ratio that
`failed_request_threshold` judges (docs/agentx.md §5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from agentx.records.record import WORKER_LOST, Phase, RequestRecord
from agentx.records.writer import RecordWriter
from agentx.replayer.http.client import Exchange
from agentx.replayer.options.slo import Slos
from agentx.replayer.plan.play import Play
from agentx.replayer.plan.sent_blocks import BlockHits
from agentx.replayer.plan.steps import Step
from agentx.replayer.schedule.hooks import OnRecord
from agentx.replayer.schedule.release import Release
from agentx.replayer.schedule.sanity import SanityNotices, server_notices
from agentx.replayer.schedule.server_loss import ServerLossWatch

FAILURE_THRESHOLD_MIN_REQUESTS: Final = 10
"""The failure threshold is judged only once max(this, concurrency) profiling requests have ended, the reference's
grace floor (`aiperf/records/records_manager.py`): one early error must not cancel a run."""
LATE_NOTICE_S: Final = 1.0
"""The first profiling request sent more than this late is announced: the run fell behind its schedule."""


class Recorder:
    """Records of one run, and its counters. `notice(text)` announces; `fail_run()` stops the run when the failure
    threshold is crossed (`cancel_reason` says why); `server_loss` is shown every record; `max_tokens(tree, step,
    phase)` is the output cap a request sent (None: not known), against which its answer is checked
    (agentx.replayer.schedule.sanity)."""

    def __init__(
        self,
        writer: RecordWriter,
        *,
        run_id: str,
        start_ns: int,
        marker_tokens: int,
        failed_request_threshold: float | None,
        lanes: int,
        on_record: OnRecord | None,
        notice: Callable[[str], None],
        fail_run: Callable[[], None],
        server_loss: ServerLossWatch | None = None,
        max_tokens: Callable[[Play, Step, Phase], int | None] | None = None,
        slo: Slos | None = None,
        worker: int = 0,
        node: str = "",
        route: str = "",
    ) -> None:
        self.writer = writer
        self.worker = worker
        self.node = node
        self.route = route
        self.slo = slo or Slos()
        self.run_id = run_id
        self.start_ns = start_ns
        self.marker_tokens = marker_tokens
        self.threshold = failed_request_threshold
        self.threshold_floor = max(FAILURE_THRESHOLD_MIN_REQUESTS, lanes)
        self.on_record = on_record
        self.notice = notice
        self.fail_run = fail_run
        self.server_loss = server_loss
        self.max_tokens = max_tokens
        self.sanity = SanityNotices(notice)
        self.requests = 0
        self.errors = 0
        self.cancelled = 0
        self.warmup_requests = 0
        self.profiling_requests = 0
        self.profiling_errors = 0
        self.cancel_reason: str | None = None
        self.fell_behind = False
        self.rate_limited = False
        """A request was rate-limited (HTTP 429): said once."""

    def _identity(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_tokens: int,
        phase: Phase,
        request_id: str,
        hits: BlockHits,
        release: Release | None,
    ) -> dict[str, Any]:
        """What a record of `step` says before any of its response: who sent what, when it was due and why, what the
        run's caches held of its prompt."""
        request = step.request
        if release is None:
            released: dict[str, Any] = {}
        else:
            by = release.released_by
            released = {
                "released_by_request_id": "" if by is None else tree.request_ids[by],
                "think_s": release.think_ns / 1e9,
                "idle_cut_s": release.idle_cut_ns / 1e9,
                "join_wait_s": release.join_wait_ns / 1e9,
            }
        return {
            **released,
            "run_id": self.run_id,
            "worker": self.worker,
            "node": self.node,
            "route": self.route,
            "phase": phase,
            "lane": tree.lane,
            "play": tree.play,
            "session_id": tree.prepared.plan.session_id,
            "agent_id": step.agent_id,
            "depth": step.depth,
            "turn": step.turn,
            "model": tree.prepared.models[step.index],
            "correlation_id": tree.correlation_id(step.agent_id),
            "root_correlation_id": tree.root_correlation_id,
            "parent_correlation_id": tree.parent_correlation_id(step.agent_id),
            "request_id": request_id,
            "scheduled_ns": scheduled_ns - self.start_ns,
            "isl_recorded_tokens": request.in_tokens,
            "isl_sent_tokens": sent_tokens,
            "cache_bust_tokens": self.marker_tokens if tree.marker is not None else 0,
            "osl_recorded_tokens": request.out_tokens,
            "theoretical_hit_blocks": tree.prepared.hit_blocks[step.index],
            "theoretical_total_blocks": tree.prepared.total_blocks[step.index],
            "replayed_hit_blocks": hits.replayed,
            "seen_any_scope_blocks": hits.seen_any_scope,
            "lru_hit_blocks": hits.lru,
            "api_time_recorded_s": request.api_time,
            "ttft_recorded_s": request.ttft,
        }

    def stub(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_ns: int,
        sent_tokens: int,
        phase: Phase,
        request_id: str,
        hits: BlockHits,
        release: Release | None = None,
    ) -> RequestRecord:
        """The record `step` is left with if its answer never arrives because its shard is lost (`--ray`): cancelled
        for `WORKER_LOST`, ending as it was sent (the driver sets the end); neither written nor counted."""
        sent = sent_ns - self.start_ns
        return RequestRecord(
            **self._identity(tree, step, scheduled_ns, sent_tokens, phase, request_id, hits, release),
            sent_ns=sent,
            end_ns=sent,
            status="error",
            error_kind="cancelled",
            error_message=WORKER_LOST,
        )

    def record(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_ns: int,
        end_ns: int,
        sent_tokens: int,
        exchange: Exchange,
        phase: Phase,
        request_id: str,
        hits: BlockHits,
        release: Release | None = None,
    ) -> RequestRecord:
        """The record of `step`'s exchange, written and counted; times are kept relative to the run's start."""
        origin = self.start_ns

        def offset(ns: int) -> int | None:
            return ns - origin if ns else None

        common = self._identity(tree, step, scheduled_ns, sent_tokens, phase, request_id, hits, release)
        if exchange.error_kind == "cancelled":
            self.cancelled += 1
        streamed_tokens = sum(exchange.chunk_tokens)
        max_tokens = None if self.max_tokens is None else self.max_tokens(tree, step, phase)
        notices = server_notices(exchange, max_tokens, sent_tokens, streamed_tokens)
        if notices:
            agent = f" agent {step.agent_id!r}" if step.agent_id else ""
            where = f"session {common['session_id']!r}{agent} turn {step.turn}"
            self.sanity.first(notices, exchange, max_tokens, sent_tokens, where)
        record = RequestRecord(
            **common,
            queued_ns=offset(exchange.queued_ns),
            sent_ns=(exchange.sent_ns or sent_ns) - origin,
            response_ns=offset(exchange.headers_ns),
            first_token_ns=offset(exchange.first_token_ns),
            last_token_ns=offset(exchange.last_token_ns),
            end_ns=end_ns - origin,
            chunk_times_ns=[ns - origin for ns in exchange.chunk_ns],
            chunk_tokens=list(exchange.chunk_tokens),
            isl_server_tokens=exchange.prompt_tokens,
            osl_server_tokens=exchange.completion_tokens,
            osl_streamed_tokens=streamed_tokens,
            tokens_estimated=exchange.tokens_estimated,
            cached_tokens=exchange.cached_tokens,
            connection_retries=exchange.connection_retries,
            status="ok" if exchange.ok else "error",
            error_kind=exchange.error_kind,
            timeout_kind=exchange.timeout_kind,
            error_message=exchange.error_message,
            http_status=exchange.status or None,
            server_notices=list(notices),
        )
        record.slo_met = self.slo.met(record)  # judged on the derived latencies, before the record is written
        self.requests += 1
        if record.status == "error":
            self.errors += 1
        if record.error_kind == "rate_limited" and not self.rate_limited:
            self.rate_limited = True
            agent = f" agent {record.agent_id!r}" if record.agent_id else ""
            self.notice(
                f"the server rate-limited a request (session {record.session_id!r}{agent} turn {record.turn}: "
                f"{record.error_message}); the run does not wait for a Retry-After, which would lighten the load it "
                "offers: every such request is recorded with error kind rate_limited"
            )
        if phase == "warmup":
            self.warmup_requests += 1
        else:
            self._judge_failures(record)
            if record.dispatch_lag_s > LATE_NOTICE_S and not self.fell_behind:
                self.fell_behind = True
                self.notice(
                    f"the run fell behind its schedule: session {record.session_id!r} agent {record.agent_id!r} "
                    f"turn {record.turn} went out {record.dispatch_lag_s:.3f} s after it was due (the client, not "
                    "the server, set the pace; see the summary's dispatch lag)"
                )
        if self.server_loss is not None:
            self.server_loss.observe(record)
        self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def _judge_failures(self, record: RequestRecord) -> None:
        """Cancel the run once the profiling error ratio crosses `failed_request_threshold` (docs/agentx.md §5)."""
        self.profiling_requests += 1
        if record.status == "error" and record.error_kind not in ("cancelled", "context_overflow"):
            self.profiling_errors += 1
        threshold = self.threshold
        if (
            threshold is not None
            and self.cancel_reason is None
            and self.profiling_requests >= self.threshold_floor
            and self.profiling_errors > threshold * self.profiling_requests
        ):
            self.cancel_reason = "failure_threshold"
            self.fail_run()
