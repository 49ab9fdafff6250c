"""One sequence of the simulated engine: what a request asks for (`GenerationRequest`), what the server holds
(`SequenceHandle`) and the scheduling state behind it (`EngineSequence`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from agentx.sim.engine.kvcache import block_hash, root_hash

FinishReason = Literal["length", "stop"]
OnOutput = Callable[[list[int], "FinishReason | None"], None]


class GenerationRequest(msgspec.Struct, kw_only=True):
    prompt_ids: Sequence[int]
    """A list, or (as the server passes it) a compact `array("i")`: not copied, never modified."""
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    cache_salt: str | None = None


class SequenceHandle:
    """One submitted sequence, as the server sees it.

    `request_id` is "sim-<submission number>". `num_output_tokens` counts the tokens produced so far
    (up to a step ahead of those delivered; final at the last call). `finished` turns true just before
    the final `on_output` call, or on `abort`.
    """

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    finished: bool


WAITING, PREFILLING, DECODING, DONE, ABORTED = range(5)
"""Sequence states: DONE has produced its last token (the final delivery may be pending)."""


class EngineSequence(SequenceHandle):
    """A sequence's scheduling state; the engine hands it out as its `SequenceHandle`."""

    __slots__ = (
        "admission",
        "block_hashes",
        "blocks",
        "finish_reason",
        "kv_capacity_tokens",
        "next_cache_at_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_tokens",
        "on_output",
        "output",
        "pending",
        "prompt",
        "random",
        "root_hash",
        "state",
        "steps_since_output",
        "submitted_s",
        "target_output_tokens",
    )

    def __init__(
        self,
        number: int,
        request: GenerationRequest,
        on_output: OnOutput,
        rng: random.Random,
        target_output_tokens: int,
        finish_reason: FinishReason,
    ) -> None:
        self.request_id = f"sim-{number}"
        self.submitted_s = time.perf_counter()
        """When the engine got it: the zero of its time to first token (vllm:time_to_first_token_seconds)."""
        self.num_prompt_tokens = len(request.prompt_ids)
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.finished = False
        self.on_output = on_output
        self.prompt = request.prompt_ids
        """Not copied: the caller must not modify it afterwards."""
        self.output: list[int] = []
        self.pending: list[int] = []
        """Produced, not yet delivered."""
        self.random = rng.random
        self.target_output_tokens = target_output_tokens
        self.finish_reason = finish_reason
        self.root_hash = root_hash(request.cache_salt)
        self.state = WAITING
        self.admission = -1
        """Order of the latest admission: the most recent is preempted first."""
        self.num_tokens = self.num_prompt_tokens
        """Prompt + output tokens: what a (re)admission must prefill."""
        self.num_computed_tokens = 0
        """Tokens whose KV is computed, kept while prefilling (a decoding sequence has num_tokens - 1)."""
        self.blocks: list[int] = []
        self.kv_capacity_tokens = 0
        self.block_hashes: list[int] = []
        """Chained hashes of the leading full blocks of prompt + output, computed as needed."""
        self.num_cached_blocks = 0
        """Leading blocks registered in (or taken from) the prefix cache."""
        self.next_cache_at_tokens = 0
        self.steps_since_output = 0

    def hashes_up_to(self, num_blocks: int, block_size: int) -> list[int]:
        """`block_hashes`, extended to at least `num_blocks` entries."""
        hashes = self.block_hashes
        parent = hashes[-1] if hashes else self.root_hash
        split = len(self.prompt)
        for index in range(len(hashes), num_blocks):
            start = index * block_size
            end = start + block_size
            if end <= split:
                tokens = self.prompt[start:end]
            elif start >= split:
                tokens = self.output[start - split : end - split]
            else:
                tokens = [*self.prompt[start:], *self.output[: end - split]]
            parent = block_hash(parent, tokens)
            hashes.append(parent)
        return hashes


def ignore_output(token_ids: list[int], finish_reason: FinishReason | None) -> None:
    """Stands in for a finished sequence's consumer: dropping the server's callback breaks the
    stream ↔ sequence reference cycle, so finished requests are freed at once, not by a GC pause
    in the middle of a step."""
