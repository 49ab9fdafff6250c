"""Sending a step: `Sender.send` streams the body (agentx.replayer.http.client), keeps the idle caps informed, hands
the exchange to the recorder (agentx.replayer.schedule.recorder), and after the grace period (`hard_stop`) ends what
is in flight as cancelled, keeping what had arrived. `Sender.admit` counts the profiling requests against the request
cap (`Scenario.num_requests`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from agentx.records.record import Phase, RequestRecord
from agentx.replayer.http.client import Client, Exchange
from agentx.replayer.http.http1 import Body
from agentx.replayer.plan.play import Play
from agentx.replayer.plan.sent_blocks import BlockHits, SentBlocks
from agentx.replayer.plan.steps import Step
from agentx.replayer.schedule.idle import IdleCaps
from agentx.replayer.schedule.recorder import Recorder
from agentx.replayer.schedule.release import Release


class Sender:
    """Sends the steps of one run through `client` and records each (`recorder`)."""

    def __init__(
        self,
        client: Client,
        path: str,
        idle: IdleCaps,
        recorder: Recorder,
        grace_s: float,
        sent_blocks: SentBlocks,
        *,
        request_cap: int | None = None,
        on_cap: Callable[[], None] | None = None,
        on_sent: Callable[[], None] | None = None,
        on_in_flight: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.idle = idle
        self.recorder = recorder
        self.sent_blocks = sent_blocks
        self.on_sent = on_sent
        self._hard_stopped = False
        self._cancel_message = f"cancelled after the {grace_s:g} s grace period"
        self._in_flight: set[asyncio.Timeout] = set()
        self.request_cap = request_cap
        """Profiling requests this process may send (None: no cap)."""
        self.on_cap = on_cap
        """Called as the last request the cap allows is sent: no new request or tree starts from then on."""
        self.profiling_sent = 0
        self.cap_reached = False
        self.exchanges: dict[int, tuple[Exchange, int]] = {}
        """The exchanges in flight, by id, with when each went out: what the stall watchdog reads (`progress_ns`)."""
        self.ended_ns = time.perf_counter_ns()
        """When the last request ended (or the sender was made)."""
        self.on_in_flight = on_in_flight
        """Called as each request goes out with the record it keeps if its answer never arrives (`Recorder.stub`):
        a `--ray` shard tells the driver what is in flight."""

    def admit(self) -> bool:
        """Whether one more profiling request may go out now, counted if so (call it right before `send`)."""
        if self.request_cap is None:
            return True
        admitted = self.profiling_sent < self.request_cap
        self.profiling_sent += admitted
        if self.profiling_sent >= self.request_cap and not self.cap_reached:  # a shard's share may be 0
            self.cap_reached = True
            if self.on_cap is not None:
                self.on_cap()
        return admitted

    def progress_ns(self) -> int:
        """The last sign of progress: a request ending, or a byte of an answer in flight arriving (its headers, its
        latest chunk), or a request going out."""
        latest = self.ended_ns
        for exchange, sent_ns in self.exchanges.values():
            last_chunk = exchange.chunk_ns[-1] if exchange.chunk_ns else 0
            latest = max(latest, sent_ns, exchange.headers_ns, last_chunk)
        return latest

    def hard_stop(self, why: str | None = None) -> None:
        """Cancel every in-flight request: the grace period is over, or `why` it was cut short (said in records)."""
        if not self._hard_stopped and why is not None:
            self._cancel_message = f"cancelled: {why}"
        self._hard_stopped = True
        now = asyncio.get_running_loop().time()
        for timeout in self._in_flight:
            timeout.reschedule(now)

    async def send(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_tokens: int,
        body: Body,
        phase: Phase = "profiling",
        *,
        outside_caps: bool = False,
        release: Release | None = None,
    ) -> RequestRecord:
        """Send `step`'s body, due at `scheduled_ns`, and return its record (written already); `outside_caps`: its
        wait was slept outside the idle caps (agentx.replayer.schedule.idle); `release`: what set its due time (None
        for a warmup request, sent at once)."""
        counted: list[BlockHits] = []

        def count() -> None:
            # After the request's bytes, off its dispatch lag: callbacks run in the order they were queued, the
            # order the requests went out, so the caches see the prompts in send order all the same.
            if not counted:
                counted.append(self.sent_blocks.hit(tree, step))

        request_id = str(uuid.uuid4())
        tree.mark_sent(step.index, request_id)
        headers = {**tree.headers(step.agent_id), "X-Request-ID": request_id}
        if self.on_sent is not None:
            self.on_sent()
        sent_ns = time.perf_counter_ns()
        if self.on_in_flight is not None:
            count()  # the stub carries them from the start
            stub = self.recorder.stub(
                tree, step, scheduled_ns, sent_ns, sent_tokens, phase, request_id, counted[0], release
            )
            self.on_in_flight(stub)
        else:
            asyncio.get_running_loop().call_soon(count)
        # Filled by the client as the response arrives, so a request cancelled after the grace period keeps its
        # status, headers time and chunks.
        exchange = Exchange()
        if self._hard_stopped:
            self._cancelled(exchange)
        else:
            self.idle.started(tree, outside_caps)
            self.exchanges[id(exchange)] = (exchange, sent_ns)
            try:
                async with asyncio.timeout(None) as timeout:
                    self._in_flight.add(timeout)
                    try:
                        await self.client.stream(self.path, body, extra_headers=headers, into=exchange)
                    finally:
                        self._in_flight.discard(timeout)
            except TimeoutError:
                self._cancelled(exchange)
            finally:
                del self.exchanges[id(exchange)]
                self.ended_ns = time.perf_counter_ns()
                self.idle.finished(tree)
        end_ns = exchange.end_ns or time.perf_counter_ns()
        tree.complete(step.index, end_ns)
        if exchange.error_kind == "context_overflow" and phase == "profiling":
            tree.end_agent(step.agent_id)  # the root's ends the whole tree (the runner's `_ended`)
        count()  # done already, unless the request never left the loop (a hard stop)
        return self.recorder.record(
            tree, step, scheduled_ns, sent_ns, end_ns, sent_tokens, exchange, phase, request_id, counted[0], release
        )

    def _cancelled(self, exchange: Exchange) -> None:
        """End `exchange` as cancelled after the grace period, keeping whatever of the response had arrived."""
        exchange.cancel(self._cancel_message)
