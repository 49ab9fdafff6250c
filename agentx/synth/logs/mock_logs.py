"""Rendering a trace back into synthetic proxy logs with random text: for tests and benchmarks.

The logs hold the conversations a trace describes, so that from-logs with the built-in tokenizer
recovers its lengths exactly, its hash-sharing pattern and its agent tree. The trace must follow
the growing-context convention (agentx's generator and sample corpus do): a request keeps every
full block of its agent's previous prompt and appends, or (a compaction) keeps only the agent's
system-prompt blocks; agents' first requests share only whole system prompts; each prompt is
at least the system prompt plus the markers of its new messages.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from agentx.synth.logs.render import MARK_ASSISTANT, MARK_SYSTEM, MARK_TOOL_RESULT, MARK_USER
from agentx.synth.logs.tokenize import ApproxTokenizer
from agentx.trace.model import Agent, Request, Session, Trace

MockFormat = Literal["anthropic-proxy", "openai-proxy"]
EPOCH_S = 1_750_000_000.0
_COST = {
    mark: len(ApproxTokenizer().encode(mark)) for mark in (MARK_SYSTEM, MARK_USER, MARK_ASSISTANT, MARK_TOOL_RESULT)
}


class _Words:
    """Random one-token words (a space and 1-4 letters), drawn from a fixed pool for speed."""

    def __init__(self, rng: random.Random) -> None:
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.rng = rng
        self.pool = [" " + "".join(rng.choices(letters, k=rng.randint(1, 4))) for _ in range(4096)]

    def __call__(self, tokens: int) -> str:
        if tokens < 0:
            raise ValueError(f"cannot render {tokens} tokens: the trace breaks the growing-context convention")
        return "".join(self.rng.choices(self.pool, k=tokens))


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def mock_logs(
    trace: Trace, *, fmt: MockFormat = "anthropic-proxy", seed: int = 0, usage_in: bool = False
) -> list[dict[str, Any]]:
    """One proxy-capture object per request; `usage_in` also records the prompt tokens in the usage."""
    words = _Words(random.Random(seed))
    lines: list[dict[str, Any]] = []
    for number, session in enumerate(trace.sessions):
        lines.extend(_session(trace.block_size, number, session, words, fmt, usage_in))
    lines.sort(key=lambda line: line["start"])
    return lines


def _session(
    block_size: int, number: int, session: Session, words: _Words, fmt: MockFormat, usage_in: bool
) -> list[dict[str, Any]]:
    systems: dict[tuple[int, ...], str] = {}
    agents = [agent for agent, _, _ in session.agents() if agent.requests]
    firsts = [agent.hash_ids(0) for agent in agents]
    lines: list[dict[str, Any]] = []
    for index, agent in enumerate(agents):
        ids = firsts[index]
        shared = max((_common(ids, first) for i, first in enumerate(firsts) if i != index), default=0)
        restarts = [
            r.hash_ids_kept
            for i, r in enumerate(agent.requests)
            if i and r.hash_ids_kept < agent.requests[i - 1].in_tokens // block_size
        ]
        prefix_blocks = max([shared, *restarts])
        system = ""
        if prefix_blocks:
            key = ids[:prefix_blocks]
            if key not in systems:
                systems[key] = words(prefix_blocks * block_size - _COST[MARK_SYSTEM])
            system = systems[key]
        name, start = f"k{number:06d}", session.start_s
        lines.extend(_agent(agent, block_size, name, start, system, prefix_blocks * block_size, words, fmt, usage_in))
    return lines


def _agent(
    agent: Agent,
    block_size: int,
    session_key: str,
    session_start_s: float,
    system: str,
    prefix_tokens: int,
    words: _Words,
    fmt: MockFormat,
    usage_in: bool,
) -> list[dict[str, Any]]:
    messages: list[tuple[str, str]] = []  # (role, text); role user | assistant | tool
    lines = []
    previous: Request | None = None
    for request in agent.requests:
        if previous is None or request.hash_ids_kept < previous.in_tokens // block_size:
            # The first request, or a restart from the system prompt: one user message.
            messages = [("user", words(request.in_tokens - prefix_tokens - _COST[MARK_USER]))]
        else:
            growth = request.in_tokens - previous.in_tokens
            tool = "tool_result" in request.input_types
            overhead = _COST[MARK_ASSISTANT] + (_COST[MARK_USER] if fmt == "anthropic-proxy" or not tool else 0)
            overhead += _COST[MARK_TOOL_RESULT] if tool else 0
            said = max(0, min(previous.out_tokens, growth - overhead))
            last = ("tool" if tool else "user", words(growth - overhead - said))
            messages = [*messages, ("assistant", words(said)), last]
        start = EPOCH_S + session_start_s + request.t
        lines.append(
            {
                "session": session_key,
                "start": start,
                "end": start + (request.api_time or 0.0),
                "request": _body(fmt, request.model, system, messages),
                "response": _response(fmt, request, words, usage_in),
            }
        )
        previous = request
    return lines


def _body(fmt: MockFormat, model: str, system: str, messages: list[tuple[str, str]]) -> dict[str, Any]:
    if fmt == "anthropic-proxy":
        rendered: list[dict[str, Any]] = []
        for role, text in messages:
            if role == "tool":
                content = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]
                rendered.append({"role": "user", "content": content})
            else:
                rendered.append({"role": role, "content": [{"type": "text", "text": text}]})
        body: dict[str, Any] = {"model": model, "max_tokens": 32000, "messages": rendered}
        if system:
            body["system"] = [{"type": "text", "text": system}]
        return body
    chat = [{"role": "system", "content": system}] if system else []
    for role, text in messages:
        chat.append({"role": role, "content": text, **({"tool_call_id": "call_1"} if role == "tool" else {})})
    return {"model": model, "messages": chat}


def _response(fmt: MockFormat, request: Request, words: _Words, usage_in: bool) -> dict[str, Any]:
    text = words(min(request.out_tokens, 40))  # the length comes from the usage; keep the logs small
    if fmt == "anthropic-proxy":
        usage: dict[str, int] = {"output_tokens": request.out_tokens}
        if usage_in:
            # Split like a cached conversation: the server's view adds the three back up.
            usage |= {
                "input_tokens": 3,
                "cache_read_input_tokens": request.in_tokens - 3,
                "cache_creation_input_tokens": 0,
            }
        return {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "stop_reason": request.stop or None,
            "usage": usage,
        }
    openai_usage = {"completion_tokens": request.out_tokens} | (
        {"prompt_tokens": request.in_tokens} if usage_in else {}
    )
    stop = {"tool_use": "tool_calls", "end_turn": "stop"}.get(request.stop, request.stop or None)
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": stop}],
        "usage": openai_usage,
    }
