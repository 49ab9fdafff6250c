"""Telling a dead server from a slow one: a run stops when its server stopped answering.

A request refused or reset before its first byte (a connection failure with no response, or a connect timeout) is a
*loss*; an answer that ends as the server meant it (whole, an HTTP error, even a malformed one) is a sign of life,
and the other failures (a stream cut mid-answer, as every stream in flight is when a server dies, a cancellation,
a timeout after the headers) say neither.

`ServerLossWatch` counts the losses in a row. It also asks the server itself (`GET /v1/models`: any HTTP answer is a
sign of life, none within `PROBE_TIMEOUT_S` a loss) every `PROBE_EVERY_S` while a streak counts or after a cut
stream, and, with no request in flight, whenever the server has given no sign of life for half the window, so that a
run whose lanes are all thinking learns as soon as a busy one. (Not with requests in flight: a server slow under
load may answer a probe late, and a dying one cuts the streams in flight, which starts the probes.) When the streak
holds at least `failures` losses spanning at least `window_s`, the server is lost: `on_lost` is called once, with
when the streak began. A sign of life before that resets the streak: a server restarted within the window is ridden
out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

from agentx.errors import ServerUnreachable
from agentx.records.record import RequestRecord
from agentx.replayer.http.client import Client

PROBE_EVERY_S: Final = 1.0
"""How often the watch may ask the server whether it answers."""
PROBE_TIMEOUT_S: Final = 2.0
"""A probe not answered within this is a loss (a server that accepts and never answers)."""
MODELS_PATH: Final = "/v1/models"
_NEITHER: Final = ("connection", "timeout", "cancelled")
"""Answers that ended so say nothing of the server now: cut, stalled or cancelled after their headers."""


def is_loss(record: RequestRecord) -> bool:
    """The request never reached an answer: refused, reset or timed out while connecting, before any response."""
    if record.response_ns is not None:
        return False
    return record.error_kind == "connection" or (record.error_kind == "timeout" and record.timeout_kind == "connect")


class ServerLossWatch:
    """Losses in a row, and the verdict once they hold `failures` spanning `window_s` (see the module)."""

    def __init__(
        self,
        client: Client,
        *,
        failures: int,
        window_s: float,
        on_lost: Callable[[int, int, float], None],
        in_flight: Callable[[], int] = lambda: 0,
    ) -> None:
        """`on_lost(first_loss_ns, losses, span_s)`, `first_loss_ns` on the perf_counter clock; `client` is whom the
        watch probes; `in_flight()` the run's requests in flight."""
        self.client = client
        self.in_flight = in_flight
        self.failures = failures
        self.window_ns = int(window_s * 1e9)
        self.quiet_ns = max(int(PROBE_EVERY_S * 1e9), self.window_ns // 2)
        self.on_lost = on_lost
        self.losses = 0
        self.first_loss_ns = 0
        self.alive_ns = time.perf_counter_ns()
        """The server's last sign of life."""
        self.suspect = False
        """A stream was cut since that sign: the probes ask whether the server is still there."""
        self.lost = False
        self.probes = 0

    def observe(self, record: RequestRecord) -> None:
        """Count a finished request: a loss lengthens the streak, an answer ends it."""
        if is_loss(record):
            self._loss()
        elif record.response_ns is None:
            return
        elif record.error_kind not in _NEITHER:
            self._alive()
        elif record.error_kind == "connection":
            self.suspect = True

    def _loss(self) -> None:
        if self.lost:
            return
        now_ns = time.perf_counter_ns()
        if self.losses == 0:
            self.first_loss_ns = now_ns
        self.losses += 1
        span_ns = now_ns - self.first_loss_ns
        if self.losses >= self.failures and span_ns >= self.window_ns:
            self.lost = True
            self.on_lost(self.first_loss_ns, self.losses, span_ns / 1e9)

    def _alive(self) -> None:
        self.losses = 0
        self.suspect = False
        self.alive_ns = time.perf_counter_ns()

    def _probe_due(self) -> bool:
        if self.losses > 0 or self.suspect:
            return True
        return time.perf_counter_ns() - self.alive_ns >= self.quiet_ns and self.in_flight() == 0

    async def watch(self) -> None:
        """Probe the server when due (see the module) until the verdict; run it as a task, cancel it to end."""
        while not self.lost:
            await asyncio.sleep(PROBE_EVERY_S)
            if not self._probe_due():
                continue
            self.probes += 1
            try:
                await self.client.request_json("GET", MODELS_PATH, timeout_s=PROBE_TIMEOUT_S)
            except ServerUnreachable:
                self._loss()
            else:
                self._alive()
