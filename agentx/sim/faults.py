"""Injected faults: what to break, drawn per request from a seeded RNG so a run is reproducible.

The server applies a plan; this module only decides. Every generation request (completions and chat)
draws the same five uniforms in the same order whatever the settings, so request k meets the same luck
in every run with the same seed and arrival order.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    import asyncio

StatusFault = Literal[500, 429, 503]


class FaultConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fault settings; rates are fractions of generation requests (0..1), durations wall seconds."""

    error_500_rate: float = 0.0
    error_429_rate: float = 0.0
    retry_after_s: int = 1
    """The 429's Retry-After header."""
    error_503_rate: float = 0.0
    reset_rate: float = 0.0
    """Streams whose TCP connection is reset (RST) after `reset_after_chunks` chunks."""
    reset_after_chunks: int = 1
    stall_rate: float = 0.0
    """Streams that go silent for `stall_s` after `stall_after_chunks` chunks (output is held, then sent)."""
    stall_s: float = 1.0
    stall_after_chunks: int = 1
    malformed_rate: float = 0.0
    """Streams that get one extra event that is not `data: <json>` after `malformed_after_chunks` chunks."""
    malformed_after_chunks: int = 1
    slow_first_byte_rate: float = 0.0
    """Requests whose response headers are held back for `slow_first_byte_s`."""
    slow_first_byte_s: float = 1.0
    refuse_connections_s: float = 0.0
    """For this long from when the setting is applied, every request (except to /sim/faults) gets its
    connection reset instead of a response: the server looks down."""
    seed: int | None = None
    """Reseeds the fault RNG when the setting is applied (default: the server's --seed)."""

    def __post_init__(self) -> None:
        for name in _RATES:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.error_500_rate + self.error_429_rate + self.error_503_rate > 1.0 + 1e-9:
            raise ValueError("error_500_rate + error_429_rate + error_503_rate must not exceed 1")
        for name in ("retry_after_s", "reset_after_chunks", "stall_after_chunks", "malformed_after_chunks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("stall_s", "slow_first_byte_s", "refuse_connections_s"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


_RATES = (
    "error_500_rate",
    "error_429_rate",
    "error_503_rate",
    "reset_rate",
    "stall_rate",
    "malformed_rate",
    "slow_first_byte_rate",
)


class FaultPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one request meets; `None` means the fault does not happen to it."""

    status: StatusFault | None = None
    slow_first_byte_s: float = 0.0
    reset_after_chunks: int | None = None
    stall_after_chunks: int | None = None
    stall_s: float = 0.0
    malformed_after_chunks: int | None = None


NO_FAULTS = FaultPlan()


class FaultInjector:
    """The live settings, the refusal window, the RNG and how many of each fault were injected."""

    def __init__(self, config: FaultConfig, *, seed: int) -> None:
        self.counts: dict[str, int] = dict.fromkeys(
            ("error_500", "error_429", "error_503", "reset", "stall", "malformed", "slow_first_byte", "refused"), 0
        )
        self._refuse_until = 0.0
        self.config = config
        # A string seed hashes the same in every process (unlike hash()-salted objects).
        self._rng = random.Random(f"agentx-sim-faults:{seed}")
        self.apply(config)

    def apply(self, config: FaultConfig) -> None:
        """Replace the settings; a refusal window or a seed in them starts now."""
        self.config = config
        if config.seed is not None:
            self._rng.seed(f"agentx-sim-faults:{config.seed}")
        self._refuse_until = time.monotonic() + config.refuse_connections_s if config.refuse_connections_s else 0.0

    def current(self) -> FaultConfig:
        """The settings, with `refuse_connections_s` the time left in the refusal window."""
        left = max(0.0, self._refuse_until - time.monotonic())
        return msgspec.structs.replace(self.config, refuse_connections_s=round(left, 3))

    def refusing(self) -> bool:
        return self._refuse_until > 0.0 and time.monotonic() < self._refuse_until

    def plan(self, *, stream: bool) -> FaultPlan:
        """Draw one generation request's faults (stream faults only apply to streams)."""
        draw = self._rng.random
        u_status, u_slow, u_reset, u_stall, u_malformed = draw(), draw(), draw(), draw(), draw()
        c = self.config
        status: StatusFault | None = None
        if u_status < c.error_500_rate:
            status = 500
        elif u_status < c.error_500_rate + c.error_429_rate:
            status = 429
        elif u_status < c.error_500_rate + c.error_429_rate + c.error_503_rate:
            status = 503
        slow = u_slow < c.slow_first_byte_rate
        reset = stream and u_reset < c.reset_rate
        stall = stream and u_stall < c.stall_rate
        malformed = stream and u_malformed < c.malformed_rate
        if status is None and not (slow or reset or stall or malformed):
            return NO_FAULTS
        return FaultPlan(
            status=status,
            slow_first_byte_s=c.slow_first_byte_s if slow else 0.0,
            reset_after_chunks=c.reset_after_chunks if reset else None,
            stall_after_chunks=c.stall_after_chunks if stall else None,
            stall_s=c.stall_s,
            malformed_after_chunks=c.malformed_after_chunks if malformed else None,
        )

    def count(self, fault: str) -> None:
        self.counts[fault] += 1


def reset_connection(transport: asyncio.Transport) -> None:
    """Close with a TCP RST, as a crashed peer or a middlebox would (SO_LINGER 0, then abort)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone: nothing left to reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
