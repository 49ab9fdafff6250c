"""How a generation's output reaches its client: `Stream` renders and writes each SSE chunk from the engine's
synchronous `on_output` callback, straight to the socket, and holds it back when the socket pushes back or a
fault stalls or bundles the stream; `Collector` gathers a response that is not streamed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentx.sim import protocol
from agentx.sim.engine.sequence import FinishReason, SequenceHandle
from agentx.sim.faults import FaultPlan, reset_connection
from agentx.sim.protocol import DONE
from agentx.sim.tokenizer import Tokenizer


class Collector:
    """A non-streaming request: gathers the output ids until the finish reason arrives."""

    __slots__ = ("done", "finish_reason", "token_ids")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.token_ids: list[int] = []
        self.finish_reason: FinishReason | None = None

    def on_output(self, token_ids: list[int], finish_reason: FinishReason | None) -> None:
        self.token_ids.extend(token_ids)
        if finish_reason is not None and not self.done.done():
            self.finish_reason = finish_reason
            self.done.set_result(None)


class Stream:
    """One SSE response. `on_output` renders and writes; `drive` (the handler) waits, drains, stalls."""

    __slots__ = (
        "_chunked",
        "_count_fault",
        "_delta_head",
        "_envelope",
        "_fast_tail",
        "_fault_at",
        "_faults",
        "_json_text",
        "_loop",
        "_protocol",
        "_tails",
        "_transport",
        "_waiter",
        "bundling",
        "chunks",
        "finish_reason",
        "gone",
        "handle",
        "held",
        "num_tokens",
        "plan",
        "reset",
        "stalling",
    )

    def __init__(
        self,
        plan: protocol.Plan,
        *,
        model_name: str,
        tokenizer: Tokenizer,
        transport: asyncio.Transport,
        http_protocol: Any,
        chunked: bool,
        faults: FaultPlan,
        count_fault: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self._envelope = protocol.envelope(plan, model_name)
        self._delta_head = self._envelope + protocol.DELTA_HEADS[plan.chat]
        self._tails = protocol.FINISH_TAILS[plan.chat]
        plain = not plan.return_token_ids and not plan.continuous_usage
        # Most chunks need nothing but the text between two constant parts.
        self._fast_tail = self._tails[None] + b"}]}\n\n" if plain else None
        self._json_text = tokenizer.json_text
        self._transport = transport
        self._protocol = http_protocol
        self._chunked = chunked
        self._faults = faults
        self._count_fault = count_fault
        self._fault_at = next_fault(faults, -1)
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self.handle: SequenceHandle | None = None
        self.chunks = 0
        self.num_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.gone = False
        """The client is gone or the connection was reset: write nothing more."""
        self.reset = False
        """A reset fault cut the stream (rather than the client leaving)."""
        self.held: list[bytes] | None = None
        """Framed output waiting for the socket to drain or a stall to end; None when writing through."""
        self.stalling = False
        self.bundling = False
        """A bundle fault holds every chunk until the last one."""

    # The engine's side: synchronous, at most one call per sequence per step.

    def on_output(self, token_ids: list[int], finish_reason: FinishReason | None) -> None:
        if self.gone:
            return
        if self._transport.is_closing():
            self.gone = True
            self._wake()
            return
        try:
            if finish_reason is None and self._fast_tail is not None and (self.chunks or not self.plan.chat):
                text = self._json_text(token_ids, continued=self.num_tokens > 0)
                payload = self._delta_head + text + self._fast_tail
                self.num_tokens += len(token_ids)
            else:
                payload = self._render(token_ids, finish_reason)
            self.chunks += 1
            self.send(payload)
            if finish_reason is not None:
                self.finish_reason = finish_reason
                self.bundling = False
                self._wake()
            elif self.chunks == self._fault_at:
                self.faults_due()
        except BaseException:
            # The engine logs the error and drops the sequence without another call: end the response.
            self.gone = True
            self._wake()
            raise

    def send(self, payload: bytes) -> None:
        """Write SSE bytes as one HTTP chunk, or hold them while the socket pushes back or a stall lasts."""
        if self._chunked:
            payload = b"%x\r\n%b\r\n" % (len(payload), payload)
        if self.held is not None:
            self.held.append(payload)
        elif self._protocol.writing_paused:
            self.held = [payload]
            self._wake()
        else:
            self._transport.write(payload)

    def _render(self, token_ids: list[int], finish_reason: FinishReason | None) -> bytes:
        plan = self.plan
        parts = [protocol.role_event(plan, self._envelope)] if plan.chat and self.chunks == 0 else []
        parts += (
            self._delta_head,
            self._json_text(token_ids, continued=self.num_tokens > 0),
            self._tails[finish_reason],
        )
        self.num_tokens += len(token_ids)
        prompt_tokens = round(len(plan.prompt_ids) * self._faults.prompt_tokens_scale)
        if plan.return_token_ids:
            if self.chunks == 0 and not plan.chat:
                parts += (b',"prompt_token_ids":', msgspec.json.encode(plan.prompt_ids.tolist()))
            parts += (b',"token_ids":', msgspec.json.encode(token_ids))
        parts.append(b"}]")
        if plan.continuous_usage:
            parts.append(protocol.usage_field(prompt_tokens, self.num_tokens))
        parts.append(b"}\n\n")
        if finish_reason is not None:
            if plan.include_usage:
                cached: int | None = None
                if not self._faults.drop_cached_tokens:
                    cached = self.handle.num_cached_tokens if self.handle is not None else 0
                parts += (self._envelope, b"]", protocol.usage_field(prompt_tokens, self.num_tokens, cached), b"}\n\n")
            parts.append(DONE)
        return b"".join(parts)

    def faults_due(self) -> None:
        """Apply the faults planned for after `chunks` chunks (never after the last one)."""
        faults, sent = self._faults, self.chunks
        if faults.malformed_after_chunks == sent:
            self._count_fault("malformed")
            self.send(protocol.malformed_event(self._envelope))
        if faults.stall_after_chunks == sent and faults.stall_s > 0:
            self._count_fault("stall")
            self.stalling = True
            if self.held is None:
                self.held = []
            self._wake()
        if faults.reset_after_chunks == sent:
            self._count_fault("reset")
            self.gone = self.reset = True
            reset_connection(self._transport)
            self._wake()
        self._fault_at = next_fault(faults, sent)

    def bundle(self) -> None:
        """Hold every chunk from now on, to write them all at once with the last one."""
        self._count_fault("bundle")
        self.bundling = True
        if self.held is None:
            self.held = []

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # The handler's side.

    async def drive(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Wait for the end of the stream, sending what was held back (slow reader, stall) meanwhile."""
        while not self.gone:
            if self.stalling:
                await asyncio.sleep(self._faults.stall_s)
                self.stalling = False
            if self.held is not None and not self.bundling:
                if self._protocol.writing_paused:
                    try:
                        await drain()
                    except OSError:  # the connection went away while we waited
                        self.gone = True
                        return
                held, self.held = self.held, None
                if self.gone or self._transport.is_closing():
                    self.gone = True
                    return
                self._transport.write(b"".join(held))
                continue
            if self.finish_reason is not None:
                return
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


def next_fault(plan: FaultPlan, after: int) -> int:
    due = [
        at
        for at in (plan.malformed_after_chunks, plan.stall_after_chunks, plan.reset_after_chunks)
        if at is not None and at > after
    ]
    return min(due) if due else -1
