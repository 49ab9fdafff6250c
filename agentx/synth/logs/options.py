"""How to turn logs into a trace (`agentx synth from-logs`): the options every log source reads, and the model names
they give the trace."""

from __future__ import annotations

from typing import Literal

import msgspec

from agentx.trace.model import HashScope

LogFormat = Literal["anthropic-proxy", "openai-proxy", "claude-code", "codex"]
"""Codex rollouts hold token counts, not prompts: their ids come from the cached counts (agentx.synth.logs.codex),
with no tokenizer and no salt, in a global scope."""


class FromLogsOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How to turn logs into a trace. The salt is passed separately: it must never be stored."""

    format: LogFormat
    block_size: int = 64
    scope: HashScope = "session"
    tokenizer_path: str | None = None
    relabel_models: bool = False
    """Replace model names by model-1, model-2, ... in first-seen order."""
    model_map: tuple[tuple[str, str], ...] = ()
    """Explicit renames (applied before relabelling, whose numbering skips mapped names)."""


class ModelNames:
    """The model names a trace gets: `model_map`'s renames, then (with `relabel_models`) model-1, model-2, ... in
    first-seen order."""

    def __init__(self, options: FromLogsOptions) -> None:
        self.mapping = dict(options.model_map)
        self.relabel = options.relabel_models
        self.seen: dict[str, str] = {}

    def __call__(self, model: str) -> str:
        if model in self.mapping:
            return self.mapping[model]
        if not self.relabel:
            return model
        return self.seen.setdefault(model, f"model-{len(self.seen) + 1}")
