"""Running a replay: lanes of session trees over one client, records streamed to disk.

INTERFACE (fixed; the CLI and the public API are written against it):

- `ReplayOptions`: one immutable options object for a run.
- `await run_replay(trace, options, *, on_record=None) -> RunResult`: drives the server with the
  trace's sessions and returns where the records went; `on_record(record)` (optional) is called for
  every finished request (progress displays, harnesses). Raises `ServerUnreachable` / `ModelNotServed`
  (from agentx.replay.client) before any request when the probe fails.
- `RunResult`: the run id, the records file, counts, and whether the run was interrupted.

How a run goes (agentx-replay-semantics.md §4d–§4e, §8):

- `GET /v1/models` first; nothing is created on disk if it fails.
- `concurrency` lanes draw session indices from one shared `session_order(...)` stream. A lane plans its
  session (cached per session index, with every step's full hash ids), then runs one task per step inside a
  TaskGroup: a step waits for its anchor and joins, sleeps `delay_s × delay_scale` (an `asyncio` timer that
  the stop event wakes early), and POSTs a streamed `/v1/completions` with `max_tokens = min_tokens = out`
  (at least 1) and `ignore_eos`. Its body is built while its anchor is still in flight. The lane recycles only
  when every step of the tree, background subagents included, has settled; the next tree starts at turn 0.
- End: after `sessions` trees have started (default with no duration: one pass, `len(trace.sessions)` trees)
  the lanes drain and stop. At `duration_s` (or on cancellation of `run_replay`) no new tree or step starts,
  in-flight requests get `grace_s`, then are cancelled and recorded as errors of kind `cancelled`; steps never
  sent are counted in `RunResult.skipped`, not recorded.
- A failed request still completes its step: its dependents go on (the error is in its record).
- Records stream to `out_dir/records.arrow`; a ticker lets the writer flush at least once a second, and
  the writer is closed on every exit path. Prompts are the same on every play of a session (no cache-bust
  marker yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from agentx.replay.client import Client, Exchange
from agentx.replay.plan import SessionPlan, Step, plan_session, session_order
from agentx.replay.prompts import BlockTokens, TokenSpace, completions_body, prompt_token_ids
from agentx.replay.records import RecordWriter, RequestRecord, RunInfo, redact
from agentx.trace.model import Trace

SessionOrder = Literal["sequential", "shuffle", "random"]

RECORDS_FILE = "records.arrow"
AFFINITY_HEADERS = ("X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID")
"""Headers a router may key session affinity on; `ReplayOptions.affinity_headers` picks among them."""
FLUSH_TICK_S = 0.5
"""How often the ticker lets the writer flush (it writes at most once per its own interval)."""


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000."""
    model: str
    """The served model every request names."""
    out_dir: Path | str
    """Where records.arrow (and run metadata) are written."""
    api: Literal["completions"] = "completions"
    concurrency: int = 1
    """Lanes: each runs one whole session tree at a time (background subagents included)."""
    duration_s: float | None = None
    """Stop starting new requests after this long; None: until `sessions` trees are done."""
    sessions: int | None = None
    """Stop after this many session trees have been started (None with no duration: one pass)."""
    grace_s: float = 30.0
    """After the deadline, in-flight requests may finish within this; then they are cancelled."""
    session_order: SessionOrder = "sequential"
    seed: int = 0
    child_offset: Literal["branch_start", "anchor_end"] = "branch_start"
    api_key: str | None = msgspec.field(default=None)
    """Bearer token; never written to records, logs or reports."""
    headers: tuple[tuple[str, str], ...] = ()
    extra_body: dict[str, object] | None = None
    token_low: int = 1000
    token_high: int = 30000
    """Token ids of synthetic prompts are drawn from [token_low, token_high)."""
    max_connections: int | None = None
    """Connection pool size (default: 2 × concurrency)."""
    delay_scale: float = 1.0
    """Multiplies every planned delay (think times, subagent offsets): 1.0 replays the recorded timing,
    0.01 runs a trace's idle gaps 100x faster (tests, demos, a simulator with a fast `time_scale`), 0 sends
    each request as soon as its dependencies complete. Joins and anchors are always honoured."""
    affinity_headers: tuple[str, ...] = ()
    """Extra headers (names from `AFFINITY_HEADERS`) that carry the play's X-Correlation-ID value too,
    for routers that keep a session on one worker by another header."""


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


OnRecord = Callable[[RequestRecord], None]


class _PreparedPlan(msgspec.Struct, frozen=True):
    """A session's plan plus each step's full hash ids (computed once per session, reused on recycling)."""

    plan: SessionPlan
    hash_ids: tuple[tuple[int, ...], ...]


def _prepare(trace: Trace, index: int, child_offset: Literal["branch_start", "anchor_end"]) -> _PreparedPlan:
    session = trace.sessions[index]
    plan = plan_session(session, child_offset=child_offset)
    by_agent = {agent.agent_id: list(agent.iter_hash_ids()) for agent, _, _ in session.agents()}
    hash_ids = tuple(by_agent[step.agent_id][step.turn] for step in plan.steps)
    return _PreparedPlan(plan, hash_ids)


def _options_metadata(options: ReplayOptions) -> dict[str, Any]:
    raw = msgspec.to_builtins(options, enc_hook=str)
    assert isinstance(raw, dict)
    raw.pop("api_key", None)
    result: dict[str, Any] = redact(raw)
    return result


def _validate(options: ReplayOptions) -> None:
    if options.concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {options.concurrency}")
    if options.duration_s is not None and options.duration_s < 0:
        raise ValueError(f"duration_s must be non-negative, got {options.duration_s}")
    if options.sessions is not None and options.sessions < 0:
        raise ValueError(f"sessions must be non-negative, got {options.sessions}")
    if options.grace_s < 0:
        raise ValueError(f"grace_s must be non-negative, got {options.grace_s}")
    if options.delay_scale < 0:
        raise ValueError(f"delay_scale must be non-negative, got {options.delay_scale}")
    if options.api != "completions":
        raise ValueError(f"unsupported api {options.api!r}")
    for name in options.affinity_headers:
        if name not in AFFINITY_HEADERS:
            raise ValueError(f"unsupported affinity header {name!r} (allowed: {', '.join(AFFINITY_HEADERS)})")


async def run_replay(trace: Trace, options: ReplayOptions, *, on_record: OnRecord | None = None) -> RunResult:
    """Replay `trace` against `options.url` (see the module docstring and semantics §4d–§4e, §8).

    Cancelling the calling task (Ctrl-C under `asyncio.run`) acts like reaching the deadline: no new
    request starts, in-flight ones get `grace_s`, the records are flushed, and the result says
    `interrupted=True`. A second cancellation during that drain cancels everything at once and propagates.
    """
    _validate(options)
    space = TokenSpace(options.token_low, options.token_high)  # validates the range before any I/O
    limit = options.max_connections or 2 * options.concurrency
    async with Client(options.url, api_key=options.api_key, headers=dict(options.headers), limit=limit) as client:
        await client.probe_models(require=options.model)
        out_dir = Path(options.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        run_id = uuid.uuid4().hex
        start_ns = time.perf_counter_ns()
        info = RunInfo(run_id=run_id, wall_epoch_ns=time.time_ns(), options=_options_metadata(options))
        records_path = out_dir / RECORDS_FILE
        with RecordWriter(records_path, info) as writer:
            runner = _Runner(trace, options, client, writer, space, run_id, start_ns, on_record)
            main = asyncio.create_task(runner.run())
            interrupted = False
            try:
                await asyncio.shield(main)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if main.done() or current is None:
                    raise
                interrupted = True
                current.uncancel()
                runner.stop()
                try:
                    await asyncio.shield(main)
                except asyncio.CancelledError:
                    main.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await main
                    raise
            elapsed_s = (time.perf_counter_ns() - start_ns) / 1e9
    return RunResult(
        run_id=run_id,
        records_path=records_path,
        requests=runner.requests,
        errors=runner.errors,
        trees_started=runner.trees_started,
        trees_finished=runner.trees_finished,
        interrupted=interrupted,
        elapsed_s=elapsed_s,
        cancelled=runner.cancelled,
        skipped=runner.skipped,
    )


class _Tree:
    """The state of one play of a session tree: completion events and times of its steps."""

    def __init__(
        self, prepared: _PreparedPlan, lane: int, play: int, start_ns: int, affinity_headers: tuple[str, ...] = ()
    ) -> None:
        self.prepared = prepared
        self.lane = lane
        self.play = play
        self.start_ns = start_ns
        n = len(prepared.plan.steps)
        self.done = [asyncio.Event() for _ in range(n)]
        self.sent = [asyncio.Event() for _ in range(n)]
        """Set when a step's request goes out (or the step is settled without one)."""
        self.completed_ns = [0] * n
        # One id per play of a tree: its requests share prefixes, so a router keeping them together helps.
        correlation_id = uuid.uuid4().hex
        self.headers = {"X-Correlation-ID": correlation_id}
        self.headers.update((name, correlation_id) for name in affinity_headers)


class _Runner:
    def __init__(
        self,
        trace: Trace,
        options: ReplayOptions,
        client: Client,
        writer: RecordWriter,
        space: TokenSpace,
        run_id: str,
        start_ns: int,
        on_record: OnRecord | None,
    ) -> None:
        self.trace = trace
        self.options = options
        self.client = client
        self.writer = writer
        self.run_id = run_id
        self.start_ns = start_ns
        self.on_record = on_record
        self.blocks = BlockTokens(options.seed, trace.block_size, space)
        self.session_scope = trace.hash_id_scope == "session"
        self.order = session_order(len(trace.sessions), options.session_order, options.seed)
        self.plans: dict[int, _PreparedPlan] = {}
        if trace.request_count == 0:
            self.tree_limit: int | None = 0
        elif options.sessions is not None:
            self.tree_limit = options.sessions
        elif options.duration_s is None:
            self.tree_limit = len(trace.sessions)
        else:
            self.tree_limit = None
        self.extra_body = options.extra_body
        self._stop = asyncio.Event()
        self._hard_stopped = False
        self._in_flight: set[asyncio.Timeout] = set()
        self.requests = 0
        self.errors = 0
        self.cancelled = 0
        self.skipped = 0
        self.trees_started = 0
        self.trees_finished = 0

    # -- run control

    def stop(self) -> None:
        """No new tree or request starts from now on; in-flight requests get the grace period."""
        self._stop.set()

    def _hard_stop(self) -> None:
        """Cancel every in-flight request (the grace period is over)."""
        self._hard_stopped = True
        now = asyncio.get_running_loop().time()
        for timeout in self._in_flight:
            timeout.reschedule(now)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as services:
            ticker = services.create_task(self._tick())
            stopper = services.create_task(self._stopper())
            try:
                async with asyncio.TaskGroup() as lanes:
                    for lane in range(self.options.concurrency):
                        lanes.create_task(self._lane(lane))
            finally:
                ticker.cancel()
                stopper.cancel()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            self.writer.maybe_flush()

    async def _stopper(self) -> None:
        duration = self.options.duration_s
        if duration is None:
            await self._stop.wait()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(duration):
                    await self._stop.wait()
            self._stop.set()
        await asyncio.sleep(self.options.grace_s)
        self._hard_stop()

    # -- lanes and trees

    def _next_tree(self) -> int | None:
        if self._stop.is_set():
            return None
        if self.tree_limit is not None and self.trees_started >= self.tree_limit:
            return None
        return next(self.order, None)

    async def _lane(self, lane: int) -> None:
        while (index := self._next_tree()) is not None:
            prepared = self.plans.get(index)
            if prepared is None:
                prepared = self.plans[index] = _prepare(self.trace, index, self.options.child_offset)
            play = self.trees_started
            self.trees_started += 1
            tree = _Tree(prepared, lane, play, time.perf_counter_ns(), self.options.affinity_headers)
            async with asyncio.TaskGroup() as steps:
                for step in prepared.plan.steps:
                    steps.create_task(self._step(tree, step))
            self.trees_finished += 1
            await asyncio.sleep(0)  # a tree without steps must not starve the loop

    async def _step(self, tree: _Tree, step: Step) -> None:
        try:
            # Build the body while the anchor is in flight (it needs nothing from the server), so a
            # step due right at its anchor's completion does not pay for it then; waiting for the
            # anchor's dispatch keeps at most ~2 bodies per agent alive.
            if step.anchor is not None:
                await tree.sent[step.anchor].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            prompt, body = self._build(tree, step)
            for dependency in step.depends_on:
                await tree.done[dependency].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            base_ns = tree.completed_ns[step.anchor] if step.anchor is not None else tree.start_ns
            due_ns = base_ns + int(step.delay_s * self.options.delay_scale * 1e9)
            for joined in step.joins:
                due_ns = max(due_ns, tree.completed_ns[joined])
            remaining_s = (due_ns - time.perf_counter_ns()) / 1e9
            if remaining_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining_s):
                        await self._stop.wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            await self._send(tree, step, due_ns, len(prompt), body)
        finally:
            if not tree.completed_ns[step.index]:
                tree.completed_ns[step.index] = time.perf_counter_ns()
            tree.sent[step.index].set()
            tree.done[step.index].set()

    def _build(self, tree: _Tree, step: Step) -> tuple[list[int], bytes]:
        session_id = tree.prepared.plan.session_id
        prompt = prompt_token_ids(
            step.request,
            tree.prepared.hash_ids[step.index],
            self.trace.block_size,
            self.blocks,
            session_id,
            f"{step.agent_id}:{step.turn}",
            session_id if self.session_scope else "",
        )
        out = max(1, step.request.out_tokens)
        body = completions_body(self.options.model, prompt, out, min_tokens=out, extra_body=self.extra_body)
        return prompt, body

    async def _send(self, tree: _Tree, step: Step, scheduled_ns: int, sent_tokens: int, body: bytes) -> None:
        tree.sent[step.index].set()
        sent_ns = time.perf_counter_ns()
        exchange: Exchange | None = None
        if not self._hard_stopped:
            try:
                async with asyncio.timeout(None) as timeout:
                    self._in_flight.add(timeout)
                    try:
                        exchange = await self.client.stream("/v1/completions", body, extra_headers=tree.headers)
                    finally:
                        self._in_flight.discard(timeout)
            except TimeoutError:
                exchange = None
        end_ns = exchange.end_ns if exchange is not None and exchange.end_ns else time.perf_counter_ns()
        tree.completed_ns[step.index] = end_ns
        self._record(tree, step, scheduled_ns, sent_ns, end_ns, sent_tokens, exchange)

    def _record(
        self,
        tree: _Tree,
        step: Step,
        scheduled_ns: int,
        sent_ns: int,
        end_ns: int,
        sent_tokens: int,
        exchange: Exchange | None,
    ) -> None:
        origin = self.start_ns
        request = step.request

        def offset(ns: int) -> int | None:
            return ns - origin if ns else None

        common: dict[str, Any] = {
            "run_id": self.run_id,
            "phase": "profiling",
            "lane": tree.lane,
            "play": tree.play,
            "session_id": tree.prepared.plan.session_id,
            "agent_id": step.agent_id,
            "depth": step.depth,
            "turn": step.turn,
            "model": self.options.model,
            "scheduled_ns": scheduled_ns - origin,
            "isl_recorded_tokens": request.in_tokens,
            "isl_sent_tokens": sent_tokens,
            "osl_recorded_tokens": request.out_tokens,
        }
        if exchange is None:
            self.cancelled += 1
            record = RequestRecord(
                **common,
                sent_ns=sent_ns - origin,
                end_ns=end_ns - origin,
                status="error",
                error_kind="cancelled",
                error_message=f"cancelled after the {self.options.grace_s:g} s grace period",
            )
        else:
            record = RequestRecord(
                **common,
                sent_ns=(exchange.sent_ns or sent_ns) - origin,
                first_token_ns=offset(exchange.first_token_ns),
                last_token_ns=offset(exchange.last_token_ns),
                end_ns=end_ns - origin,
                chunk_times_ns=[ns - origin for ns in exchange.chunk_ns],
                chunk_tokens=list(exchange.chunk_tokens),
                isl_server_tokens=exchange.prompt_tokens,
                osl_server_tokens=exchange.completion_tokens,
                osl_streamed_tokens=sum(exchange.chunk_tokens),
                tokens_estimated=exchange.tokens_estimated,
                cached_tokens=exchange.cached_tokens,
                status="ok" if exchange.ok else "error",
                error_kind=exchange.error_kind,
                error_message=exchange.error_message,
                http_status=exchange.status or None,
            )
        self.requests += 1
        if record.status == "error":
            self.errors += 1
        self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)
