"""Codex CLI rollouts (`~/.codex/sessions/**/rollout-*.jsonl`): one request per model round, ids from cached counts.

A rollout holds one record a line, `{"timestamp", "type", "payload"}`, plain or gzip, or the expanded view that
TraceLab publishes (`#` comment lines, then pretty-printed records after `===== record NNNN =====` lines). Its
first `session_meta` names the thread that owns the file.

- A round is an `event_msg` `token_count` whose `info.last_token_usage` is set and whose `info.total_token_usage`
  differs from the previous `token_count`'s (Codex repeats them, for rate limits alone among others): in = its
  `input_tokens` (cached included), out = `output_tokens` (reasoning included), cached = `cached_input_tokens`.
- It starts at the last input record (a user message or a tool output) before its first output record (reasoning,
  an assistant message, a tool call), else at the previous round's end, and never before that end (tool outputs
  can land while the previous response still streams); it ends at the `token_count`. The first output record gives
  the time to first token. Output that no `token_count` closes (an aborted response) belongs to no round.
- Nothing is tokenized: hash ids come from the counts alone (`agentx.trace.formats.cached_prefix`), an agent's first
  round sharing its cached blocks with first rounds of the same model and kind of agent, in a global id scope.
- A thread whose `session_meta` names a parent (`parent_thread_id`, or `source.subagent.thread_spawn`) is that
  thread's subagent when the parent's rollout is among the inputs, else the root of a session of its own.
- A fork or a subagent starts with a copy of its parent's records, `token_count`s included. Records numbered below
  the `subagent_history_start_ordinal` that newer Codex writes are skipped; without ordinals, a round after a copied
  `session_meta` (another thread's) is dropped where the same usage (cumulative and last) is another rollout's.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from agentx.errors import TraceError
from agentx.synth.logs.exchange import parse_time
from agentx.synth.logs.options import FromLogsOptions, ModelNames
from agentx.synth.logs.tree import TIME_SLACK_S
from agentx.trace.formats.cached_prefix import CachedPrefixIds
from agentx.trace.formats.textfile import open_bytes, read_errors
from agentx.trace.model import Agent, Provenance, Request, Session, Trace
from agentx.trace.validation import MAX_TOKENS_PER_REQUEST

SUBAGENT_TYPES = frozenset({"review", "compact", "thread_spawn", "memory_consolidation"})
"""Codex's own kinds of subagent thread (`SubAgentSource`), kept verbatim; any other becomes "other"."""

_SEPARATOR = re.compile(rb"===== record (\d+) =====")
_INPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})
_TOOL_CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "web_search_call",
        "tool_search_call",
        "image_generation_call",
    }
)
_OUTPUT_EVENTS = {"agent_message": "text", "agent_reasoning": "thinking"}
_TURN_RESETS = frozenset({"task_started", "turn_aborted"})
"""Events after which output seen without a `token_count` (an aborted stream) belongs to no round."""

_Count = Annotated[int, msgspec.Meta(ge=0)]
_T = TypeVar("_T")


class _Record(msgspec.Struct):
    """One rollout record; its payload is decoded by its type, and only for the types read."""

    timestamp: str
    type: str
    payload: msgspec.Raw
    ordinal: int | None = None
    """The record's number in its thread (newer Codex), to tell copied history from the thread's own."""


class _Kind(msgspec.Struct):
    type: str = ""


class _SessionMeta(msgspec.Struct):
    id: str
    timestamp: str | None = None
    model: str | None = None
    parent_thread_id: str | None = None
    source: str | dict[str, Any] | None = None
    subagent_history_start_ordinal: int | None = None


class _TurnContext(msgspec.Struct):
    model: str | None = None


class _Part(msgspec.Struct):
    type: str = ""


class _Message(msgspec.Struct):
    role: str = ""
    content: list[_Part] | str | None = None


class _UserMessage(msgspec.Struct):
    images: list[Any] | None = None
    local_images: list[Any] | None = None


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: _Count = 0
    cached_input_tokens: _Count = 0
    output_tokens: _Count = 0
    reasoning_output_tokens: _Count = 0
    total_tokens: _Count = 0


class _Info(msgspec.Struct):
    total_token_usage: _Usage | None = None
    last_token_usage: _Usage | None = None


class _TokenCount(msgspec.Struct):
    info: _Info | None = None


class _Round(msgspec.Struct, kw_only=True):
    start_s: float
    end_s: float
    first_output_s: float | None
    model: str
    usage: _Usage
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    copied: bool
    """After another thread's `session_meta` in this file (without ordinals): possibly that thread's round."""
    identity: tuple[_Usage | None, _Usage]
    """(cumulative, last) usage: what a copy of this round in another rollout repeats."""


class _Thread(msgspec.Struct, kw_only=True):
    """A rollout's thread: its rounds, and where it sits in its session's tree."""

    id: str
    file: str
    parent: str | None
    kind: str
    """"" for a thread that names no parent, else its subagent type."""
    created_s: float
    rounds: list[_Round] = msgspec.field(default_factory=list)
    children: list[_Thread] = msgspec.field(default_factory=list)

    @property
    def start_s(self) -> float:
        return self.rounds[0].start_s

    @property
    def end_s(self) -> float:
        return max(r.end_s for r in self.rounds)


def read_codex(paths: Sequence[str | os.PathLike[str]], options: FromLogsOptions) -> Trace:
    """The anonymized trace of Codex rollouts (files, or folders searched for `*.jsonl*`), one session per root."""
    threads: dict[str, _Thread] = {}
    files: list[Path] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise TraceError.at("no such file or directory", file=str(path))
        for file in sorted(p for p in path.rglob("*.jsonl*") if p.is_file()) if path.is_dir() else [path]:
            if file.resolve() not in seen:  # a file named twice (itself and its folder) is read once
                seen.add(file.resolve())
                files.append(file)
    for file in files:
        thread = _read_file(file)
        if thread is None:
            continue
        if thread.id in threads:
            raise TraceError.at(
                f"holds thread {thread.id!r}, as {threads[thread.id].file} does: give each rollout once",
                file=str(file),
            )
        threads[thread.id] = thread
    dropped = _drop_copies(list(threads.values()))
    roots = _link(threads)
    if not roots:
        raise TraceError.at(
            "no Codex model rounds (token_count records with usage) found in the inputs",
            file=", ".join(map(str, paths)),
        )
    return _trace(roots, options, len(paths), dropped)


# Reading


def _records(path: Path) -> Iterator[tuple[int, str, bytes]]:
    """(line, label, text) of every record: JSONL lines, or the expanded view's records, labelled "record N: " and
    located at their first line. `#` comment lines at the top are skipped in both."""
    with read_errors(path), open_bytes(path) as stream:
        lines = ((number, text) for number, text in enumerate(stream, start=1) if text.strip())
        # The expanded view opens with `#` comment lines, then its first separator.
        first = next(((number, text) for number, text in lines if not text.lstrip().startswith(b"#")), None)
        if first is None:
            return
        found = _SEPARATOR.fullmatch(first[1].strip())
        if found is None:
            yield first[0], "", first[1]
            yield from ((number, "", text) for number, text in lines)
            return
        label, at = found.group(1).decode(), first[0]
        chunk: list[tuple[int, bytes]] = []  # (line, text) of the record's pretty-printed lines
        for number, text in lines:
            found = _SEPARATOR.fullmatch(text.strip())
            if found is None:
                chunk.append((number, text))
                continue
            yield (chunk[0][0] if chunk else at), f"record {label}: ", b"".join(t for _, t in chunk)
            label, chunk, at = found.group(1).decode(), [], number
        yield (chunk[0][0] if chunk else at), f"record {label}: ", b"".join(t for _, t in chunk)


class _Reader:
    """One rollout's records in order, folded into its thread and the thread's rounds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.thread: _Thread | None = None
        self.history_start: int | None = None
        self.model = ""
        self.copied = False
        self.previous_total: _Usage | None = None
        self.previous_end: float | None = None
        self.last_input: float | None = None
        self.late_input: float | None = None
        self.first_output: float | None = None
        self.in_kinds: set[str] = set()
        self.late_kinds: set[str] = set()
        self.out_kinds: set[str] = set()

    def error(self, message: str, line: int, label: str) -> TraceError:
        return TraceError.at(label + message, file=str(self.path), line=line)

    def decode(self, kind: type[_T], raw: msgspec.Raw, what: str, line: int, label: str) -> _T:
        try:
            return msgspec.json.decode(raw, type=kind)
        except msgspec.ValidationError as exc:
            raise self.error(f"{what}'s payload: {exc}", line, label) from None

    def time(self, value: str, line: int, label: str) -> float:
        try:
            return parse_time(value)
        except ValueError as exc:
            raise self.error(f"timestamp: {exc}", line, label) from None

    def add(self, line: int, label: str, text: bytes) -> None:
        try:
            record = msgspec.json.decode(text, type=_Record)
        except msgspec.ValidationError as exc:
            raise self.error(f"not a Codex rollout record ({exc})", line, label) from None
        except (msgspec.DecodeError, RecursionError) as exc:
            raise self.error(f"not a JSON object ({exc})", line, label) from None
        if self.thread is None:
            if record.type != "session_meta":
                raise self.error(f"a Codex rollout starts with a session_meta record, not {record.type!r}", line, label)
            self.open(self.decode(_SessionMeta, record.payload, "session_meta", line, label), record, line, label)
            return
        if self.history_start is not None and record.ordinal is not None and record.ordinal < self.history_start:
            return  # the parent's history, copied into a subagent's rollout
        kind = record.type
        if kind == "session_meta":
            meta = self.decode(_SessionMeta, record.payload, "session_meta", line, label)
            self.copied = self.copied or meta.id != self.thread.id
        elif kind == "turn_context":
            model = self.decode(_TurnContext, record.payload, "turn_context", line, label).model
            self.model = model or self.model
        elif kind == "response_item":
            self.item(record, line, label)
        elif kind == "event_msg":
            self.event(record, line, label)

    def open(self, meta: _SessionMeta, record: _Record, line: int, label: str) -> None:
        parent, kind = _lineage(meta)
        self.thread = _Thread(
            id=meta.id,
            file=str(self.path),
            parent=parent if parent != meta.id else None,
            kind=kind,
            created_s=self.time(meta.timestamp or record.timestamp, line, label),
        )
        self.history_start = meta.subagent_history_start_ordinal
        self.model = meta.model or ""

    def item(self, record: _Record, line: int, label: str) -> None:
        kind = self.decode(_Kind, record.payload, "response_item", line, label).type
        if kind in _INPUT_ITEMS:
            self.input("tool_result", self.time(record.timestamp, line, label))
        elif kind in _TOOL_CALLS:
            self.output("tool_use", self.time(record.timestamp, line, label))
        elif kind == "reasoning":
            self.output("thinking", self.time(record.timestamp, line, label))
        elif kind == "message":
            message = self.decode(_Message, record.payload, "response_item", line, label)
            if message.role == "assistant":
                self.output("text", self.time(record.timestamp, line, label))
            elif message.role == "user":
                parts = message.content if isinstance(message.content, list) else ()
                image = any(part.type == "input_image" for part in parts)
                self.input("image" if image else "text", self.time(record.timestamp, line, label))

    def event(self, record: _Record, line: int, label: str) -> None:
        kind = self.decode(_Kind, record.payload, "event_msg", line, label).type
        if kind == "token_count":
            self.token_count(self.decode(_TokenCount, record.payload, "token_count", line, label), record, line, label)
        elif kind == "user_message":
            message = self.decode(_UserMessage, record.payload, "user_message", line, label)
            self.input(
                "image" if message.images or message.local_images else "text", self.time(record.timestamp, line, label)
            )
        elif kind in _OUTPUT_EVENTS:
            self.output(_OUTPUT_EVENTS[kind], self.time(record.timestamp, line, label))
        elif kind in _TURN_RESETS:
            self.drop_stream()

    def input(self, kind: str, time_s: float) -> None:
        if self.first_output is None:
            self.last_input = time_s
            self.in_kinds.add(kind)
        else:  # a tool output while the response still streams: the next round's input
            self.late_input = time_s
            self.late_kinds.add(kind)

    def drop_stream(self) -> None:
        """Forget output that no `token_count` closed (an aborted response): it belongs to no round."""
        if self.late_input is not None:
            self.last_input = self.late_input
        self.in_kinds |= self.late_kinds
        self.late_input, self.late_kinds = None, set()
        self.first_output, self.out_kinds = None, set()

    def output(self, kind: str, time_s: float) -> None:
        if self.first_output is None:
            self.first_output = time_s
        self.out_kinds.add(kind)

    def token_count(self, event: _TokenCount, record: _Record, line: int, label: str) -> None:
        info = event.info
        if info is None:
            return  # rate limits alone
        total, last = info.total_token_usage, info.last_token_usage
        repeated = total is not None and total == self.previous_total
        self.previous_total = total
        if last is None or repeated:
            return
        assert self.thread is not None  # a token_count comes after the session_meta (checked in `add`)
        if max(last.input_tokens, last.output_tokens) > MAX_TOKENS_PER_REQUEST:
            raise self.error(f"a round of more than {MAX_TOKENS_PER_REQUEST:,} tokens", line, label)
        end = self.time(record.timestamp, line, label)
        start = self.last_input if self.last_input is not None else self.previous_end
        if start is None:
            start = self.first_output if self.first_output is not None else end
        if self.previous_end is not None:
            start = max(start, self.previous_end)
        start = min(start, end)
        self.thread.rounds.append(
            _Round(
                start_s=start,
                end_s=end,
                first_output_s=self.first_output,
                model=self.model,
                usage=last,
                input_types=_input_types(self.in_kinds),
                output_types=tuple(sorted(self.out_kinds)),
                copied=self.copied,
                identity=(total, last),
            )
        )
        self.previous_end = end
        self.last_input, self.in_kinds = self.late_input, self.late_kinds
        self.late_input, self.late_kinds = None, set()
        self.first_output, self.out_kinds = None, set()


def _read_file(path: Path) -> _Thread | None:
    """The thread a rollout holds (None for a file without records)."""
    reader = _Reader(path)
    for line, label, text in _records(path):
        reader.add(line, label, text)
    return reader.thread


def _lineage(meta: _SessionMeta) -> tuple[str | None, str]:
    """(the parent thread's id, the subagent type): (None, "") for a thread started by a user."""
    source = meta.source
    parent = meta.parent_thread_id
    if isinstance(source, dict) and "subagent" in source:
        sub = source["subagent"]
        if isinstance(sub, str):
            return parent, sub if sub in SUBAGENT_TYPES else "other"
        if isinstance(sub, dict) and isinstance(sub.get("thread_spawn"), dict):
            spawned = sub["thread_spawn"].get("parent_thread_id")
            return parent or (spawned if isinstance(spawned, str) else None), "thread_spawn"
        return parent, "other"
    return parent, "other" if parent else ""


def _input_types(kinds: set[str]) -> tuple[str, ...]:
    """The Weka convention the other from-logs sources follow: tool output wins, else text (with any image)."""
    if "tool_result" in kinds:
        return ("tool_result",)
    return ("text", "image") if "image" in kinds else ("text",)


# Building the trace


def _drop_copies(threads: list[_Thread]) -> int:
    """Drop the rounds a rollout copied from another (same cumulative and last usage); how many were dropped."""
    owners: dict[tuple[_Usage | None, _Usage], set[str]] = {}
    for thread in threads:
        for round_ in thread.rounds:
            owners.setdefault(round_.identity, set()).add(thread.id)
    dropped = 0
    for thread in threads:
        kept = [r for r in thread.rounds if not (r.copied and owners[r.identity] - {thread.id})]
        dropped += len(thread.rounds) - len(kept)
        thread.rounds = kept
    return dropped


def _link(threads: dict[str, _Thread]) -> list[_Thread]:
    """Hang each thread with rounds under its nearest ancestor with rounds; the roots, in start order."""
    roots: list[_Thread] = []
    for thread in threads.values():
        if not thread.rounds:
            continue
        parent, seen = threads.get(thread.parent or ""), {thread.id}
        while parent is not None and not parent.rounds and parent.id not in seen:
            seen.add(parent.id)
            parent = threads.get(parent.parent or "")
        if parent is None or parent.id in seen or _descends(parent, thread, threads):
            roots.append(thread)
        else:
            parent.children.append(thread)
    for thread in threads.values():
        order = {id(child): (_spawn_after(thread, child), child.start_s) for child in thread.children}
        thread.children.sort(key=lambda child: order[id(child)])
    return sorted(roots, key=lambda t: t.start_s)


def _spawn_after(parent: _Thread, child: _Thread) -> int:
    """How many of the parent's rounds ended before the child's first began."""
    return sum(1 for r in parent.rounds if r.end_s <= child.start_s + TIME_SLACK_S)


def _descends(thread: _Thread, ancestor: _Thread, threads: dict[str, _Thread]) -> bool:
    """Whether `ancestor` is above `thread` by the recorded links (threads in a cycle of links become roots)."""
    seen: set[str] = set()
    current: _Thread | None = thread
    while current is not None and current.id not in seen:
        if current is ancestor:
            return True
        seen.add(current.id)
        current = threads.get(current.parent or "")
    return False


def _walk(thread: _Thread) -> Iterator[_Thread]:
    """The thread and the threads below it, depth first (the order agents are named a1, a2, ... in)."""
    yield thread
    for child in thread.children:
        yield from _walk(child)


def _trace(roots: list[_Thread], options: FromLogsOptions, source_count: int, dropped: int) -> Trace:
    models = ModelNames(options)
    ids = CachedPrefixIds(options.block_size)
    trees = [list(_walk(root)) for root in roots]
    starts = [min(thread.start_s for thread in threads) for threads in trees]
    origin = min(starts)
    sessions: list[Session] = []
    for number, (root, threads, start) in enumerate(zip(roots, trees, starts, strict=True)):
        think = _think_times(threads)
        names = {id(thread): f"a{i}" for i, thread in enumerate(threads)}
        names[id(root)] = ""
        agent = _agent(root, names, think, start, ids, models)
        session_models = list(dict.fromkeys(r.model for a, _, _ in agent.walk() for r in a.requests))
        sessions.append(Session(session_id=f"s{number:06d}", root=agent, start_s=start - origin, models=session_models))
    notes = [
        f"synthesized by agentx synth from-logs from {source_count} input(s) (codex); "
        "no text, paths, session keys or raw digests are kept",
        f"hash ids from recorded token counts (no tokenizer): each round shares cached_input_tokens // "
        f"{options.block_size} blocks with its agent's previous round",
    ]
    if ids.beyond_previous:
        notes.append(f"{ids.beyond_previous} round(s) cached more than their previous prompt: capped at it")
    if dropped:
        notes.append(f"{dropped} round(s) copied from another rollout (a fork's history) left out")
    return Trace(
        sessions=sessions,
        block_size=options.block_size,
        hash_id_scope="global",
        provenance=Provenance(source_format="synth:codex", notes=notes),
    )


def _think_times(threads: list[_Thread]) -> dict[int, float | None]:
    """Each round's gap from the end of the session's previous round (by start), keyed by the round's id()."""
    ordered = sorted((r for thread in threads for r in thread.rounds), key=lambda r: r.start_s)
    think: dict[int, float | None] = {}
    previous_end: float | None = None
    for round_ in ordered:
        think[id(round_)] = None if previous_end is None else max(0.0, round_.start_s - previous_end)
        previous_end = round_.end_s
    return think


def _agent(
    thread: _Thread,
    names: dict[int, str],
    think: dict[int, float | None],
    start: float,
    ids: CachedPrefixIds,
    models: ModelNames,
) -> Agent:
    """`thread`'s agent and its subagents: ids from the cached counts, times on the session's clock (`start`)."""
    requests: list[Request] = []
    previous: tuple[int, ...] = ()
    for index, round_ in enumerate(thread.rounds):
        usage = round_.usage
        if index == 0:
            # Agents of one model and kind open with the same instructions and tools: they share cached blocks.
            key = f"{round_.model}\x00{thread.kind or 'root'}"
            kept, added = 0, ids.first_round(key, usage.input_tokens, usage.cached_input_tokens)
        else:
            kept, added = ids.next_round(previous, usage.input_tokens, usage.cached_input_tokens)
        previous = previous[:kept] + added
        api_time = round_.end_s - round_.start_s
        ttft = None
        if round_.first_output_s is not None:
            ttft = min(max(0.0, round_.first_output_s - round_.start_s), api_time)
        requests.append(
            Request(
                t=round_.start_s - start,
                model=models(round_.model),
                in_tokens=usage.input_tokens,
                out_tokens=usage.output_tokens,
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=think[id(round_)],
                api_time=api_time,
                ttft=ttft,
                type="s",  # Codex streams every response
                input_types=round_.input_types,
                output_types=round_.output_types,
            )
        )
    agent = Agent(agent_id=names[id(thread)], requests=requests, models=list(dict.fromkeys(r.model for r in requests)))
    for child in thread.children:
        sub = _agent(child, names, think, start, ids, models)
        sub.spawn_after = _spawn_after(thread, child)
        spawned = min(max(child.created_s, start), child.start_s)  # recorded: the child's session_meta
        sub.t = spawned - start
        sub.duration_ms = max(0, math.ceil((child.end_s - spawned) * 1000))
        sub.status = "completed"
        sub.subagent_type = child.kind
        agent.subagents.append(sub)
    return agent
