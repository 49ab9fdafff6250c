"""Injected faults: what to break, drawn per request from a seeded RNG so a run is reproducible.

The server applies a plan; this module only decides. Every generation request (completions and chat)
draws the same seven uniforms in the same order whatever the settings, so request k meets the same luck
in every run with the same seed and arrival order: five from the fault RNG (status, slow first byte,
reset, stall, malformed), then two from a timing RNG of their own (bundle, early first token), which
leaves the first five exactly the draws they were before the timing faults existed.
"""

from __future__ import annotations

import contextlib
import math
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
    bundle_rate: float = 0.0
    """Streams whose chunks are all held back and written at once when the sequence finishes, as by a server
    whose tool-call or reasoning parser buffers the output."""
    early_first_token_rate: float = 0.0
    """Streams that get their first token as a chunk at once, before the prompt's prefill; the engine then
    generates one token fewer. Requests for a single token are spared."""
    output_scale: float = 1.0
    """Generate this many times each request's `max_tokens` (and `min_tokens`), as a server that ignores the cap."""
    prompt_tokens_scale: float = 1.0
    """Report `usage.prompt_tokens` as this many times the prompt's tokens, as a server that counts otherwise."""
    drop_cached_tokens: bool = False
    """Usage objects without `prompt_tokens_details` (so without `cached_tokens`), as vLLM's without
    `--enable-prompt-tokens-details`."""
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
        for name in ("output_scale", "prompt_tokens_scale"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0.0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
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
    "bundle_rate",
    "early_first_token_rate",
)


class FaultPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one request meets; `None` means the fault does not happen to it."""

    status: StatusFault | None = None
    slow_first_byte_s: float = 0.0
    reset_after_chunks: int | None = None
    stall_after_chunks: int | None = None
    stall_s: float = 0.0
    malformed_after_chunks: int | None = None
    bundle: bool = False
    early_first_token: bool = False
    drop_cached_tokens: bool = False
    output_scale: float = 1.0
    prompt_tokens_scale: float = 1.0


NO_FAULTS = FaultPlan()


class FaultInjector:
    """The live settings, the refusal window, the RNG and how many of each fault were injected."""

    def __init__(self, config: FaultConfig, *, seed: int) -> None:
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "error_500",
                "error_429",
                "error_503",
                "reset",
                "stall",
                "malformed",
                "slow_first_byte",
                "bundle",
                "early_first_token",
                "refused",
            ),
            0,
        )
        self._refuse_until = 0.0
        self.config = config
        # A string seed hashes the same in every process (unlike hash()-salted objects).
        self._rng = random.Random(_fault_seed(seed))
        self._timing_rng = random.Random(_timing_seed(seed))
        self.apply(config)

    def apply(self, config: FaultConfig) -> None:
        """Replace the settings; a refusal window or a seed in them starts now."""
        self.config = config
        if config.seed is not None:
            self._rng.seed(_fault_seed(config.seed))
            self._timing_rng.seed(_timing_seed(config.seed))
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
        draw_timing = self._timing_rng.random
        u_bundle, u_early = draw_timing(), draw_timing()
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
        bundle = stream and u_bundle < c.bundle_rate
        early = stream and u_early < c.early_first_token_rate
        miscounts = c.drop_cached_tokens or c.output_scale != 1.0 or c.prompt_tokens_scale != 1.0
        if status is None and not (slow or reset or stall or malformed or bundle or early or miscounts):
            return NO_FAULTS
        return FaultPlan(
            status=status,
            slow_first_byte_s=c.slow_first_byte_s if slow else 0.0,
            reset_after_chunks=c.reset_after_chunks if reset else None,
            stall_after_chunks=c.stall_after_chunks if stall else None,
            stall_s=c.stall_s,
            malformed_after_chunks=c.malformed_after_chunks if malformed else None,
            bundle=bundle,
            early_first_token=early,
            drop_cached_tokens=c.drop_cached_tokens,
            output_scale=c.output_scale,
            prompt_tokens_scale=c.prompt_tokens_scale,
        )

    def count(self, fault: str) -> None:
        self.counts[fault] += 1


def _fault_seed(seed: int) -> str:
    return f"agentx-sim-faults:{seed}"


def _timing_seed(seed: int) -> str:
    return f"agentx-sim-faults-timing:{seed}"


def reset_connection(transport: asyncio.Transport) -> None:
    """Close with a TCP RST, as a crashed peer or a middlebox would (SO_LINGER 0, then abort)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone: nothing left to reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
