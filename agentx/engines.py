"""The inference engines agentx knows by name, one table for all: their speculative-decoding flags (agentx.spec),
their `/metrics` names (agentx.replayer.telemetry.series) and which of them count acceptance
(agentx.results.summary.checks.acceptance)."""

from __future__ import annotations

from typing import Final, Literal

Engine = Literal["vllm", "sglang", "trtllm", "atom", "llamacpp"]
ENGINES: Final[tuple[Engine, ...]] = ("vllm", "sglang", "trtllm", "atom", "llamacpp")
"""In this order: `agentx spec flags --engine` lists them so, and telemetry detection prefers the first at a tie."""
