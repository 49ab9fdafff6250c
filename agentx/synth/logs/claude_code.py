"""Claude Code session folders: `<session>.jsonl` transcripts and `<session>/subagents/agent-<id>.jsonl`.

A transcript holds one line per message; an API response is the run of assistant lines sharing a
`message.id` (one line per content block). Its prompt is every message before it; the system
prompt and tool definitions are not recorded, so a stand-in of the right length (the first
response's recorded input minus its messages) takes their place, the same text for every agent of
a kind, so their blocks are shared as the real ones would be. A request starts at the line before
its response and ends at the response's last line. Subagent files are linked to the Task (Agent)
tool call whose result names their `agentId`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from agentx.errors import PromptError, TraceError
from agentx.synth.logs.exchange import Exchange, parse_time
from agentx.synth.logs.render import render_anthropic
from agentx.synth.logs.response import Response, read_anthropic
from agentx.synth.logs.tokenize import ApproxTokenizer
from agentx.trace.formats.textfile import jsonl_lines

_AGENT_ID = re.compile(r"agentId[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9_-]+)")
_SPAWN_TOOLS = ("Task", "Agent")
_STAND_IN_WORD = " sys"  # one token for the built-in tokenizer


class _Line(msgspec.Struct, kw_only=True):
    number: int
    kind: str
    time_s: float
    message: dict[str, Any]
    result: Any = None


def _lines(path: Path, main: bool) -> list[_Line]:
    lines = []
    for number, text in jsonl_lines(path):
        try:
            obj = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise TraceError.at(f"not a JSON object ({exc})", file=str(path), line=number) from None
        if not isinstance(obj, dict) or obj.get("type") not in ("user", "assistant"):
            continue  # summaries, system notices, snapshots: not messages
        if main and obj.get("isSidechain") is True:
            continue  # old layouts kept subagent messages inline; subagent files hold them now
        message = obj.get("message")
        if not isinstance(message, dict) or "timestamp" not in obj:
            raise TraceError.at(
                "a user/assistant line needs a message object and a timestamp", file=str(path), line=number
            )
        try:
            time_s = parse_time(obj["timestamp"])
        except ValueError as exc:
            raise TraceError.at(f"timestamp: {exc}", file=str(path), line=number) from None
        lines.append(
            _Line(number=number, kind=obj["type"], time_s=time_s, message=message, result=obj.get("toolUseResult"))
        )
    return lines


def read_claude_code(path: Path) -> Iterator[Exchange]:
    """Every request in a folder of sessions (or one transcript file) with explicit agent links."""
    sessions = [path] if path.is_file() else sorted(p for p in path.glob("*.jsonl") if not p.name.startswith("agent-"))
    for transcript in sessions:
        key = transcript.stem
        files: list[tuple[Path, str]] = [(transcript, "main")]
        for folder in (transcript.parent / key / "subagents", transcript.parent / "subagents"):
            if folder.is_dir():
                files.extend((sub, sub.stem.removeprefix("agent-")) for sub in sorted(folder.glob("agent-*.jsonl")))
        parsed = {agent: _lines(file, agent == "main") for file, agent in files}
        parents, types = _spawns(parsed)
        stand_ins: dict[str, str] = {}
        for file, agent in files:
            if agent != "main" and agent not in parents:
                continue  # a subagent file of another session in a shared folder
            kind = "main" if agent == "main" else types.get(agent, "")
            yield from _exchanges(file, parsed[agent], key, agent, parents.get(agent), kind, types, stand_ins)


def _spawns(parsed: dict[str, list[_Line]]) -> tuple[dict[str, str], dict[str, str]]:
    """agentId → the agent whose Task call spawned it, and → its subagent_type."""
    parents: dict[str, str] = {}
    types: dict[str, str] = {}
    for agent, lines in parsed.items():
        calls: dict[str, str] = {}
        for line in lines:
            content = line.message.get("content")
            for block in content if isinstance(content, list) else ():
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use" and block.get("name") in _SPAWN_TOOLS:
                    given = block.get("input")
                    calls[str(block.get("id"))] = str(given.get("subagent_type", "")) if isinstance(given, dict) else ""
                elif block.get("type") == "tool_result" and str(block.get("tool_use_id")) in calls:
                    text = msgspec.json.encode([block.get("content"), line.result]).decode()
                    for found in _AGENT_ID.findall(text):
                        if found in parsed and found != agent:
                            parents.setdefault(found, agent)
                            types.setdefault(found, calls[str(block.get("tool_use_id"))])
    return parents, types


def _exchanges(
    file: Path,
    lines: list[_Line],
    session: str,
    agent: str,
    parent: str | None,
    kind: str,
    types: dict[str, str],
    stand_ins: dict[str, str],
) -> Iterator[Exchange]:
    messages: list[dict[str, Any]] = []
    index = 0
    tokenizer = ApproxTokenizer()
    while index < len(lines):
        line = lines[index]
        if line.kind == "user":
            messages.append({"role": "user", "content": line.message.get("content")})
            index += 1
            continue
        # One response: consecutive assistant lines with the same message id.
        message_id = line.message.get("id")
        group = [line]
        while index + len(group) < len(lines):
            following = lines[index + len(group)]
            if following.kind != "assistant" or following.message.get("id") != message_id:
                break
            group.append(following)
        start_s = lines[index - 1].time_s if index else line.time_s
        index += len(group)
        content = [block for g in group for block in (g.message.get("content") or [])]
        final = group[-1].message
        if not messages:
            messages.append({"role": "user", "content": ""})
        try:
            prompt = render_anthropic({"messages": messages})
        except PromptError as exc:
            raise TraceError.at(f"claude-code transcript: {exc}", file=str(file), line=line.number) from None
        response: Response = read_anthropic(
            {"content": content, "stop_reason": final.get("stop_reason"), "usage": final.get("usage")}
        )
        if kind not in stand_ins and response.in_tokens is not None:
            counted = sum(len(tokenizer.encode(segment)) for segment in prompt.segments)
            stand_ins[kind] = _STAND_IN_WORD * max(0, response.in_tokens - counted)
        prompt.segments.insert(0, stand_ins.get(kind, ""))
        yield Exchange(
            file=str(file),
            line=line.number,
            session_key=session,
            start_s=min(start_s, group[-1].time_s),
            end_s=group[-1].time_s,
            model=str(final.get("model", "")),
            prompt=prompt,
            response=response,
            agent_key=agent,
            parent_key=parent,
            subagent_type=types.get(agent, ""),
        )
        messages.append({"role": "assistant", "content": content})
