"""What an OpenTelemetry span's GenAI attributes say: its role (an LLM call, an agent, a tool) and the call it
describes, read from the `gen_ai.*` semantic conventions and the names other instrumentations use (each list below,
first name present wins). agentx.trace.formats.otlp reads the spans and builds the trace."""

from __future__ import annotations

import math
import re
from typing import Final, Literal

import msgspec

from agentx.trace.validation import MAX_TOKENS_PER_REQUEST

_WHOLE: Final = re.compile(r"\s*-?\d+\s*")

OPERATION: Final = "gen_ai.operation.name"
OPENINFERENCE_KIND: Final = "openinference.span.kind"
LLM_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})
OTHER_OPERATIONS: Final = frozenset({"create_agent", "invoke_workflow", "embeddings", "retrieval"})
"""Operations that are no LLM call even where the span carries token counts (an agent's or a workflow's sums)."""

INPUT: Final = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT: Final = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
CACHE_READ: Final = (
    "gen_ai.usage.cache_read.input_tokens",  # semantic conventions 1.40+
    "gen_ai.usage.cache_read_input_tokens",  # OpenLLMetry, Strands
    "gen_ai.usage.input_tokens.cached",  # Sentry
    "gen_ai.usage.details.cache_read_tokens",  # Pydantic AI (OpenAI-style usage)
    "gen_ai.usage.details.cache_read_input_tokens",  # Pydantic AI (Anthropic-style usage)
    "llm.token_count.prompt_details.cache_read",  # OpenInference
    "ai.usage.cachedInputTokens",  # Vercel AI SDK
)
CACHE_WRITE: Final = (
    "gen_ai.usage.cache_creation.input_tokens",  # semantic conventions 1.40+
    "gen_ai.usage.cache_creation_input_tokens",  # OpenLLMetry
    "gen_ai.usage.cache_write_input_tokens",  # Strands
    "gen_ai.usage.input_tokens.cache_write",  # Sentry
    "gen_ai.usage.details.cache_write_tokens",  # Pydantic AI
    "gen_ai.usage.details.cache_creation_input_tokens",  # Pydantic AI
    "llm.token_count.prompt_details.cache_write",  # OpenInference
)
TOTAL: Final = ("gen_ai.usage.total_tokens", "llm.usage.total_tokens", "llm.token_count.total")
MODEL: Final = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
AGENT_NAME: Final = ("gen_ai.agent.name", "agent.name")
AGENT_ID: Final = "gen_ai.agent.id"
CONVERSATION: Final = ("gen_ai.conversation.id", "session.id")
STREAM: Final = ("gen_ai.request.stream", "llm.is_streaming")
TTFT: Final = "gen_ai.response.time_to_first_chunk"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"


READ: Final = frozenset(
    {OPERATION, OPENINFERENCE_KIND, AGENT_ID, TTFT, FINISH_REASONS}.union(
        INPUT, OUTPUT, CACHE_READ, CACHE_WRITE, TOTAL, MODEL, AGENT_NAME, CONVERSATION, STREAM
    )
)

Role = Literal["llm", "agent", "tool", "other"]
_OPENINFERENCE_ROLES: Final[dict[str, Role]] = {"LLM": "llm", "AGENT": "agent", "TOOL": "tool"}


class ArrayValue(msgspec.Struct):
    values: list[AnyValue] = []


class AnyValue(msgspec.Struct, rename="camel"):
    string_value: str | None = None
    int_value: int | float | str | None = None  # a string in OTLP JSON; some exporters write a number
    double_value: float | int | str | None = None  # "NaN", "Infinity" as strings
    bool_value: bool | None = None
    array_value: ArrayValue | None = None


class Call(msgspec.Struct, kw_only=True):
    """An LLM span's request, its input as the span reports it (before the rule on the cached part)."""

    model: str
    input: int
    output: int
    cache_read: int | None
    cache_write: int
    total: int | None
    ttft: float | None
    streamed: bool
    stop: str

    def proof(self) -> bool | None:
        """True where the span shows its input excludes the cached part, False where it shows it includes it, None
        where it shows neither."""
        cached = (self.cache_read or 0) + self.cache_write
        if not cached:
            return None
        if cached > self.input:
            return True
        if self.total is not None and self.total != self.input + self.output:
            return self.total == self.input + cached + self.output or None
        return False if self.total is not None else None


def role(values: dict[str, AnyValue]) -> Role:
    operation = as_text(values.get(OPERATION))
    counted = any(name in values for name in (*INPUT, *OUTPUT))
    if operation is not None:
        if operation in LLM_OPERATIONS:
            return "llm"
        if operation == "invoke_agent":
            return "agent"
        if operation == "execute_tool":
            return "tool"
        return "llm" if counted and operation not in OTHER_OPERATIONS else "other"
    kind = as_text(values.get(OPENINFERENCE_KIND))
    if kind is not None:
        return _OPENINFERENCE_ROLES.get(kind.upper(), "other")
    return "llm" if counted else "other"


def call(values: dict[str, AnyValue], problems: list[str]) -> Call | None:
    """The request an LLM span describes; None without an input count or with problems (added to `problems`)."""
    counts: dict[str, int | None] = {}
    for label, names in (
        ("input", INPUT),
        ("output", OUTPUT),
        ("cache_read", CACHE_READ),
        ("cache_write", CACHE_WRITE),
        ("total", TOTAL),
    ):
        counts[label] = None
        for name in names:
            if name in values:
                count = as_whole(values[name])
                if count is None:
                    problems.append(f"{name} is not a whole number of tokens")
                elif count < 0:
                    problems.append(f"{name}={count} is negative")
                elif count > MAX_TOKENS_PER_REQUEST and label != "total":
                    problems.append(f"{name}={count} is absurdly large (limit {MAX_TOKENS_PER_REQUEST:,})")
                counts[label] = count
                break
    ttft = as_number(values.get(TTFT))
    if TTFT in values and (ttft is None or not math.isfinite(ttft) or ttft < 0):
        problems.append(f"{TTFT} is not a time in seconds >= 0")
    if problems or counts["input"] is None:
        return None
    finish = as_texts(values.get(FINISH_REASONS))
    return Call(
        model=first_text(values, MODEL) or "",
        input=counts["input"],
        output=counts["output"] or 0,
        cache_read=counts["cache_read"],
        cache_write=counts["cache_write"] or 0,
        total=counts["total"],
        ttft=ttft,
        streamed=any(as_flag(values.get(name)) for name in STREAM),
        stop=finish[0] if finish else "",
    )


def agent_name(values: dict[str, AnyValue], span_name: str) -> str:
    named = first_text(values, AGENT_NAME)
    if named:
        return named
    # The conventions name the span "invoke_agent {gen_ai.agent.name}".
    return span_name.removeprefix("invoke_agent").strip()


def as_whole(value: AnyValue) -> int | None:
    """An integer attribute (`intValue` is a string in OTLP JSON), or None where the value is not one."""
    for raw in (value.int_value, value.double_value, value.string_value):
        if isinstance(raw, bool) or raw is None:
            continue
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float):
            return int(raw) if math.isfinite(raw) and raw.is_integer() else None
        return int(raw) if _WHOLE.fullmatch(raw) else None
    return None


def as_number(value: AnyValue | None) -> float | None:
    if value is None:
        return None
    for raw in (value.double_value, value.int_value):
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                return None
    return None


def as_text(value: AnyValue | None) -> str | None:
    if value is None:
        return None
    if value.string_value is not None:
        return value.string_value
    if value.int_value is not None:
        return str(value.int_value)
    return None


def first_text(values: dict[str, AnyValue], names: tuple[str, ...]) -> str | None:
    for name in names:
        text = as_text(values.get(name))
        if text:
            return text
    return None


def as_texts(value: AnyValue | None) -> list[str]:
    if value is None:
        return []
    if value.array_value is not None:
        return [text for item in value.array_value.values if (text := as_text(item))]
    text = as_text(value)
    return [text] if text else []


def as_flag(value: AnyValue | None) -> bool:
    return value is not None and (value.bool_value is True or value.string_value in ("true", "True"))
