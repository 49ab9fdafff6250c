"""The statistical session model: what `generate` samples and `fit` estimates.

A session is a root agent running a tool loop: its first prompt is a system prompt plus a user
message; each later prompt keeps every full block of the previous one and appends new tokens (the
previous output and a tool result), until the context passes a compaction threshold and restarts
from the system prompt plus a summary; a turn may also rewrite history (the prompt keeps only its
system blocks yet stays as long), as real harnesses sometimes do. The gap before a request is a tool-loop gap after a
`tool_use` response and a human think time after an `end_turn` one. After a request the root may
spawn a group of subagents (its next request joins them) or a single background subagent (nothing
waits for it). The server time of a request is a linear model of new prompt tokens and output.
"""

from __future__ import annotations

import msgspec

from agentx.synth.dist import Dist


class ApiTime(msgspec.Struct, frozen=True, kw_only=True):
    """api_time_s = base_s + new_tokens / prefill_tokens_per_s + in_tokens / context_tokens_per_s
    + out_tokens / decode_tokens_per_s (a None rate drops its term)."""

    base_s: float = 1.0
    prefill_tokens_per_s: float | None = 10_000.0
    """Prompt tokens past the kept prefix (what a prefix cache cannot serve)."""
    context_tokens_per_s: float | None = None
    """Every prompt token (attention over the whole context, or a server without prefix caching)."""
    decode_tokens_per_s: float | None = 60.0

    def seconds(self, new_tokens: int, in_tokens: int, out_tokens: int) -> float:
        total = self.base_s
        for count, rate in (
            (new_tokens, self.prefill_tokens_per_s),
            (in_tokens, self.context_tokens_per_s),
            (out_tokens, self.decode_tokens_per_s),
        ):
            if rate:
                total += count / rate
        return total


class AgentShape(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of agent (the root, or subagents): its prompts, outputs and length."""

    model: str
    requests: Dist
    """Requests per agent."""
    system_tokens: int
    """The system prompt and tools, shared by every request (and, for subagents, by siblings)."""
    first_user_tokens: Dist
    added_tokens: Dist
    """Tokens appended per turn (previous output + tool result)."""
    mean_added_tokens: float = 0.0
    """When set, each agent's draws of `added_tokens` are scaled to this mean (a fitted session's
    slope: its context grows as far as the recorded one did)."""
    context_tokens: Dist | None = None
    """When set (fits), prompt sizes are drawn from this and sorted (contexts grow), instead of
    accumulating `added_tokens`; `edit_share` then also stands for compactions (cache breaks)."""
    edit_share: float = 0.0
    """Share of turns that rewrite history: the prompt keeps only the system blocks but not shrink."""
    out_tokens: Dist
    tool_gap_s: Dist
    """Gap before a request that follows a tool_use response (the tool's run time)."""
    human_gap_s: Dist
    """Gap before a request that follows an end_turn response (a person reading and typing)."""
    end_turn_share: float = 0.0
    """Share of responses before the last that end the turn (hand back to the person)."""
    compact_at_tokens: int = 0
    """Compact once a prompt passes this size (0: never)."""
    summary_tokens: Dist = msgspec.field(default_factory=lambda: Dist.constant(8000))


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of session: its root, its subagents and how often it spawns them."""

    weight: float = 1.0
    root: AgentShape
    sub: AgentShape | None = None
    spawn_share: float = 0.0
    """Share of root requests (before the last) followed by a spawn."""
    fan_out: Dist = msgspec.field(default_factory=lambda: Dist.constant(1))
    background_share: float = 0.0
    """Share of spawns that are a single background subagent instead of a joined group."""


class SessionModel(msgspec.Struct, frozen=True, kw_only=True):
    """Everything `generate` needs: a mixture of session profiles and the server time model."""

    name: str
    source: str
    """Where the numbers come from (a preset's corpus, or the trace a fit was made on)."""
    block_size: int = 64
    profiles: tuple[Profile, ...]
    api: ApiTime = msgspec.field(default_factory=ApiTime)
    session_rate_per_s: float = 0.0
    """Session arrivals per second (Poisson) on the trace clock; 0 starts every session at once."""
