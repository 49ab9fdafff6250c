"""OpenTelemetry GenAI spans in OTLP JSON, read only.

One OTLP JSON export (an ExportTraceServiceRequest: `resourceSpans` → `scopeSpans` → `spans`), pretty-printed or
on one line, or JSONL with one export per line (the Collector's file exporter); plain or gzip. Of a span only
`traceId`, `spanId`, `parentSpanId`, `name`, `startTimeUnixNano`, `endTimeUnixNano` and a few `attributes` are read.
How spans become the trace's:

- **Which spans.** An LLM span has `gen_ai.operation.name` `chat`, `text_completion` or `generate_content`
  (without that attribute: OpenInference's `openinference.span.kind` `LLM`), or carries input or output token counts
  and names no other known operation (an agent's, a workflow's or an embedding's counts are no call of their own). An
  agent span has `invoke_agent` (OpenInference: `AGENT`), a tool span `execute_tool` (`TOOL`). Other spans only link
  their children to their parents. An LLM span enclosing another (a call instrumented twice) is left out for the
  inner one, and one without an input count (a failed call) is left out; one warning for the file each.
- **Sessions.** A trace belongs to the session of its `gen_ai.conversation.id` (OpenInference: `session.id`), the
  value on the span nearest the trace's root, else to one of its own named by its `traceId`; traces of one
  conversation (one per turn, as many frameworks write them) form one session.
- **Agents.** An `invoke_agent` span inside another agent's span (directly or through tool spans) is a subagent:
  `agent_id` from `gen_ai.agent.id` (`#2`, `#3` on a repeat) else the span id, `subagent_type` from
  `gen_ai.agent.name` (OpenInference `agent.name`, else the span's name after `invoke_agent `), `t` its start,
  `duration_ms` its length, `spawn_after` how many of its parent's requests started before it, `tool_use_count` its
  `execute_tool` spans; subagents nest. The root agent holds every other LLM span. A subagent under which no LLM span
  ran is left out. An agent's requests are in start order.
- **Time.** `t` is a span's start after the session's earliest kept span (an LLM span or an agent span above one),
  `api_time` its length, `think_time` the gap from the agent's previous request's end (0 where they overlap).
  `ttft` is `gen_ai.response.time_to_first_chunk`, which also makes a request streamed ("s"), as does
  `gen_ai.request.stream` (OpenLLMetry: `llm.is_streaming`). A session's `start_s` is its start after the file's
  first session's. `stop` is the first of `gen_ai.response.finish_reasons`; `model` is `gen_ai.request.model`, else
  `gen_ai.response.model` (OpenInference: `llm.model_name`).
- **Tokens.** Input from `gen_ai.usage.input_tokens` (also the older `gen_ai.usage.prompt_tokens`, OpenInference
  `llm.token_count.prompt`), output from `gen_ai.usage.output_tokens` (`gen_ai.usage.completion_tokens`,
  `llm.token_count.completion`), cached input from the first of `CACHE_READ` (semconv 1.40+
  `gen_ai.usage.cache_read.input_tokens`, then the spellings of OpenLLMetry and Strands, Sentry, Pydantic AI,
  OpenInference and the Vercel AI SDK), cache writes from `CACHE_WRITE`, the total from `TOTAL`. A span without a
  cached-input attribute counts 0 cached tokens (no reuse claimed; one warning for the file).
- **Input and its cached part.** The semantic conventions (1.40 on) say `gen_ai.usage.input_tokens` SHOULD include
  all input tokens, cached ones too, and that the cache read and creation counts SHOULD be included in it; their
  Anthropic page says Anthropic's own `input_tokens` excludes both, which an instrumentation must add. So `in` is the
  input count as given, except where an instrumentation passed Anthropic's (or Bedrock's) uncached count through, as
  Strands and some hand-written instrumentations do. A span shows that when its cache read plus cache creation
  exceed its input, or when its total is input + cache read + cache creation + output rather than input + output;
  then it, and the spans of the same instrumentation scope and model that show neither, count `in` as input +
  cache read + cache creation (one warning for the file). The cached part is the cache read count.
- **Prefix reuse.** Hash ids by agentx.trace.formats.cached_prefix from each request's `in` and cached part: a
  request shares `cached // block_size` whole blocks with its agent's previous request (at most all of them), an
  agent's first request with the first requests of the same model and agent (the root of one agent name, or a
  subagent of one `subagent_type`); 64 tokens a block unless `block_size` says otherwise; scope "global".

Errors name the file, the line (JSONL; in a pretty-printed file the line of the span's `spanId`) and the span. Not
kept: tool spans (their time is in the think times), other spans, span status, events and links, resources, cache
writes as such, and message content.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import msgspec

from agentx.trace.findings import Findings
from agentx.trace.formats import genai_attributes as genai
from agentx.trace.formats.cached_prefix import CachedPrefixIds
from agentx.trace.formats.textfile import json_error, open_bytes, read_errors
from agentx.trace.links import ABSENT, IN_CYCLE, NO_PARENT, follow
from agentx.trace.model import Agent, Provenance, Request, RequestType, Session, Trace
from agentx.trace.validation import MAX_TOKENS_PER_REQUEST, check_session, check_trace_header

DEFAULT_BLOCK_SIZE: Final = 64

_NANOS: Final = 1_000_000_000
_WHOLE: Final = re.compile(r"\s*-?\d+\s*")
_SPAN_ID_KEY: Final = re.compile(rb'"spanId"\s*:\s*"([^"\\]*)"')
_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")


# ---------------------------------------------------------------------------------------------
# the wire: only what is read


class _KeyValue(msgspec.Struct):
    key: str = ""
    value: msgspec.Raw = msgspec.Raw(b"null")
    """Decoded only for the keys read: message content can be megabytes a span."""


_Nanos = int | float | str | None


class _Span(msgspec.Struct, rename="camel"):
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    name: str = ""
    start_time_unix_nano: _Nanos = None
    end_time_unix_nano: _Nanos = None
    attributes: list[_KeyValue] = []


class _Scope(msgspec.Struct):
    name: str = ""


class _ScopeSpans(msgspec.Struct):
    scope: _Scope | None = None
    spans: list[msgspec.Raw] = []
    """Decoded one at a time, so that a bad span is reported by its id."""


class _ResourceSpans(msgspec.Struct, rename="camel"):
    scope_spans: list[_ScopeSpans] = []


class _Export(msgspec.Struct, rename="camel"):
    resource_spans: list[_ResourceSpans]


_EXPORT: Final = msgspec.json.Decoder(_Export)
_SPAN: Final = msgspec.json.Decoder(_Span)
_VALUE: Final = msgspec.json.Decoder(genai.AnyValue | None)


# ---------------------------------------------------------------------------------------------
# what a span gives


class _Node(msgspec.Struct, kw_only=True):
    """One span, as the tree needs it."""

    trace_id: str
    span_id: str
    parent_id: str
    line: int | None
    role: genai.Role
    scope: str
    conversation: str | None
    start: int | None
    end: int | None
    name: str = ""
    agent_id: str = ""
    call: genai.Call | None = None
    usable: bool = True
    """False for an LLM or agent span with an error (reported) or, for an LLM span, without an input count."""


# ---------------------------------------------------------------------------------------------
# reading


def read_otlp(
    path: str | os.PathLike[str], *, block_size: int | None = None, findings: Findings | None = None
) -> Trace:
    """Read an OTLP JSON export (or JSONL of exports; plain or gzip-compressed) of GenAI spans: one session per
    conversation, subagents from the `invoke_agent` spans.

    `block_size` overrides the default of 64 tokens per hash id. Warnings go to `findings`; errors raise one
    TraceError after the whole file was read.
    """
    path = Path(path)
    sink = findings if findings is not None else Findings()
    sink.file = str(path)
    with read_errors(path), open_bytes(path) as stream:
        data = stream.read()
    reader = _Reader(data, sink)
    for line, export in _exports(data, sink):
        for resource in export.resource_spans:
            for scope_spans in resource.scope_spans:
                scope = scope_spans.scope.name if scope_spans.scope is not None else ""
                for raw in scope_spans.spans:
                    reader.add(raw, scope, line)
    size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    sessions = reader.sessions(CachedPrefixIds(max(1, size)), size)
    trace = Trace(
        sessions=sessions,
        block_size=size,
        hash_id_scope="global",
        provenance=Provenance(source_format="otlp", source_path=str(path)),
    )
    check_trace_header(trace, sink)
    sink.raise_if_errors()
    return trace


def _exports(data: bytes, sink: Findings) -> Iterator[tuple[int | None, _Export]]:
    """Each export of the file with its line (None for a file holding one export over many lines)."""
    lines = data.split(b"\n")
    first = next((text.strip() for text in lines if text.strip()), b"")
    if not first:
        sink.error("the file holds no OTLP export")
        return
    if first.startswith(b"{") and first.endswith(b"}"):  # JSONL: every export on a line of its own
        for number, text in enumerate(lines, start=1):
            if text.strip():
                try:
                    yield number, _EXPORT.decode(text)
                except (msgspec.DecodeError, RecursionError) as exc:
                    sink.error(json_error(exc, "file"), line=number)
        return
    try:
        export = _EXPORT.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        at = _AT_BYTE.search(str(exc))
        sink.error(json_error(exc, "file"), line=data.count(b"\n", 0, int(at.group(1))) + 1 if at else None)
        return
    yield None, export


class _Reader:
    """The spans of a file as they are read, then the sessions they make."""

    def __init__(self, data: bytes, sink: Findings) -> None:
        self.data = data
        self.sink = sink
        self.nodes: list[_Node] = []
        self.index: dict[tuple[str, str], int] = {}
        self._span_lines: dict[str, int] | None = None
        self.uncounted: list[int] = []
        """LLM spans without an input count."""

    # -- one span --------------------------------------------------------------------------

    def add(self, raw: msgspec.Raw, scope: str, line: int | None) -> None:
        try:
            span = _SPAN.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:
            span_id = _loose_span_id(raw)
            named = f"span {_shown(span_id)}" if span_id else "a span"
            self.sink.error(f"{named}: {json_error(exc, 'file')}", line=self.line_of_span(span_id, line))
            return
        values: dict[str, genai.AnyValue] = {}
        bad_values: dict[str, str] = {}
        for attribute in span.attributes:
            if attribute.key in genai.READ and attribute.key not in values:
                try:
                    value = _VALUE.decode(attribute.value)
                except (msgspec.DecodeError, RecursionError) as exc:
                    bad_values[attribute.key] = json_error(exc, "file")
                    continue
                if value is not None:
                    values[attribute.key] = value
        role = genai.role(values)
        node = _Node(
            trace_id=span.trace_id,
            span_id=span.span_id,
            parent_id=span.parent_span_id,
            line=line,
            role=role,
            scope=scope,
            conversation=genai.first_text(values, genai.CONVERSATION),
            start=_nanos(span.start_time_unix_nano),
            end=_nanos(span.end_time_unix_nano),
        )
        problems: list[str] = []
        if role in ("llm", "agent"):
            problems = [f"attribute {key}: {problem}" for key, problem in bad_values.items()]
            problems += self._check_span(span, node)
            if role == "llm":
                call = genai.call(values, problems)
                node.call = call
                node.usable = call is not None
            else:
                node.name = genai.agent_name(values, span.name)
                node.agent_id = genai.first_text(values, (genai.AGENT_ID,)) or ""
            if problems:
                node.usable = False
                where = self.line_of_span(span.span_id, line)
                for problem in problems:
                    self.sink.error(f"{_label(span)}: {problem}", line=where)
        if not node.trace_id or not node.span_id:
            return  # nothing can name it as a parent, and it cannot be a request (an error if it is a GenAI span)
        key = (node.trace_id, node.span_id)
        first = self.index.get(key)
        if first is not None:
            earlier = self.nodes[first].line
            said = f" (first on line {earlier})" if earlier is not None else ""
            self.sink.error(
                f"span {_shown(node.span_id)} of trace {_shown(node.trace_id)} appears again{said}",
                line=self.line_of_span(node.span_id, line),
            )
            return
        self.index[key] = len(self.nodes)
        if role == "llm" and node.call is None and not problems:
            self.uncounted.append(len(self.nodes))
        self.nodes.append(node)

    @staticmethod
    def _check_span(span: _Span, node: _Node) -> list[str]:
        problems = []
        if not span.span_id:
            problems.append("it has no spanId")
        if not span.trace_id:
            problems.append("it has no traceId")
        for name, raw, value in (
            ("startTimeUnixNano", span.start_time_unix_nano, node.start),
            ("endTimeUnixNano", span.end_time_unix_nano, node.end),
        ):
            if raw is None or raw == 0 or raw == "0":
                problems.append(f"{name} is missing")
            elif value is None:
                problems.append(f"{name} {raw!r} is not a time in nanoseconds")
        if node.start is not None and node.end is not None and node.end < node.start:
            problems.append(f"it ends before it starts (endTimeUnixNano {node.end} < startTimeUnixNano {node.start})")
        return problems

    def line_of_span(self, span_id: str, line: int | None) -> int | None:
        """The line of a span: its export's in JSONL, else the line its `spanId` is on."""
        if line is not None or not span_id:
            return line
        if self._span_lines is None:  # built once, on the first problem a one-export file has
            self._span_lines = {}
            number, position = 1, 0
            for match in _SPAN_ID_KEY.finditer(self.data):
                number += self.data.count(b"\n", position, match.start())
                position = match.start()
                self._span_lines.setdefault(match.group(1).decode("utf-8", "replace"), number)
        return self._span_lines.get(span_id)

    def line(self, index: int) -> int | None:
        node = self.nodes[index]
        return self.line_of_span(node.span_id, node.line)

    # -- the sessions ------------------------------------------------------------------------

    def sessions(self, ids: CachedPrefixIds, block_size: int) -> list[Session]:
        nodes, sink = self.nodes, self.sink
        parents = [
            NO_PARENT if not node.parent_id else self.index.get((node.trace_id, node.parent_id), ABSENT)
            for node in nodes
        ]
        links = follow(parents)
        for cycle in links.cycles:
            described = " -> ".join(_shown(nodes[i].span_id) for i in cycle)
            sink.error(f"parentSpanId links form a cycle: {described}", line=self.line(cycle[0]))
        placed = sorted((i for i in range(len(nodes)) if links.depths[i] != IN_CYCLE), key=links.depths.__getitem__)
        agent_up = [-1] * len(nodes)  # the nearest agent span above each span
        call_up = [-1] * len(nodes)  # the nearest LLM span above each span
        for index in placed:
            parent = parents[index]
            if parent >= 0:
                agent_up[index] = parent if nodes[parent].role == "agent" else agent_up[parent]
                call_up[index] = parent if nodes[parent].role == "llm" else call_up[parent]

        calls = [i for i in placed if nodes[i].role == "llm" and nodes[i].usable]
        enclosing = {call_up[i] for i in calls if call_up[i] >= 0}
        calls = [i for i in calls if i not in enclosing]
        self._warn(calls, len(enclosing))
        in_tokens = _input_rule(nodes, calls, sink, self.line)
        calls = [i for i in calls if i in in_tokens]
        if not calls:
            if not sink.errors:
                sink.error(
                    "the file holds no LLM span (gen_ai.operation.name chat, text_completion or generate_content, "
                    "or a span with gen_ai.usage token counts)"
                )
            return []

        def owner(index: int) -> int:
            """The subagent span whose agent a span belongs to, or -1 for the root agent."""
            agent = agent_up[index]
            return agent if agent >= 0 and agent_up[agent] >= 0 else -1

        conversation: dict[str, tuple[int, int, str]] = {}  # trace -> (depth, start, id) of the nearest to the root
        for index in placed:
            node = nodes[index]
            if node.conversation:
                candidate = (links.depths[index], node.start or 0, node.conversation)
                if node.trace_id not in conversation or candidate < conversation[node.trace_id]:
                    conversation[node.trace_id] = candidate
        groups: dict[str, list[int]] = {}
        for index in calls:
            trace_id = nodes[index].trace_id
            session_id = conversation[trace_id][2] if trace_id in conversation else trace_id
            groups.setdefault(session_id, []).append(index)
        tools: dict[int, int] = {}
        for index in placed:
            if nodes[index].role == "tool" and agent_up[index] >= 0:
                tools[agent_up[index]] = tools.get(agent_up[index], 0) + 1

        built = [
            _SessionBuilder(self, session_id, members, agent_up, owner, tools, in_tokens)
            for session_id, members in groups.items()
        ]
        built.sort(key=lambda b: (b.origin, b.session_id))
        file_origin = built[0].origin
        sessions: list[Session] = []
        for builder in built:
            session = builder.build(ids, (builder.origin - file_origin) / _NANOS)
            check_session(session, block_size, sink, line_of=builder.line_of)
            sessions.append(session)
        if ids.beyond_previous:
            sink.warning(
                f"{ids.beyond_previous} request(s) had a cached prefix longer than their agent's previous prompt (the "
                "provider cached its own answer too): they share the whole previous prompt"
            )
        return sessions

    def _warn(self, calls: list[int], enclosing: int) -> None:
        sink = self.sink
        if self.uncounted:
            sink.warning(
                f"{len(self.uncounted)} LLM span(s) carry no input token count (failed calls?): left out "
                f"(first: span {_shown(self.nodes[self.uncounted[0]].span_id)})",
                line=self.line(self.uncounted[0]),
            )
        if enclosing:
            sink.warning(
                f"{enclosing} LLM span(s) enclose another LLM span (one call instrumented twice?): only the innermost "
                "are kept"
            )
        uncached = [i for i in calls if (call := self.nodes[i].call) is not None and call.cache_read is None]
        if uncached:
            sink.warning(
                f"{len(uncached)} of {len(calls)} LLM span(s) carry no cached-input attribute (such as "
                f"{genai.CACHE_READ[0]}): taken as 0 cached tokens, no prefix reuse claimed for them "
                f"(first: span {_shown(self.nodes[uncached[0]].span_id)})",
                line=self.line(uncached[0]),
            )


def _input_rule(
    nodes: list[_Node], calls: list[int], sink: Findings, line: Callable[[int], int | None]
) -> dict[int, int]:
    """Each call's `in` by the module's rule on the cached part, one warning where spans report it apart; a call whose
    `in` is absurd is an error, and left out."""
    proofs: dict[int, bool | None] = {}
    apart_groups: set[tuple[str, str]] = set()
    for index in calls:
        call = nodes[index].call
        assert call is not None
        proofs[index] = proof = call.proof()
        if proof:
            apart_groups.add((nodes[index].scope, call.model))
    in_tokens: dict[int, int] = {}
    apart: list[int] = []
    for index in calls:
        call = nodes[index].call
        assert call is not None
        proof = proofs[index]
        made_whole = bool(proof or (proof is None and (nodes[index].scope, call.model) in apart_groups))
        count = call.input + (call.cache_read or 0) + call.cache_write if made_whole else call.input
        if count > MAX_TOKENS_PER_REQUEST:  # before any id is made for it: ids take memory by the token
            sink.error(
                f"span {_shown(nodes[index].span_id)}: input + cache read + cache creation = {count} is absurdly large "
                f"(limit {MAX_TOKENS_PER_REQUEST:,})",
                line=line(index),
            )
            continue
        in_tokens[index] = count
        if made_whole:
            apart.append(index)
    if apart:
        first = nodes[apart[0]]
        sink.warning(
            f"{len(apart)} LLM span(s) report input tokens without their cached part, as Anthropic's API does "
            f"(first: span {_shown(first.span_id)}, scope {first.scope!r}): their input is taken as input + cache "
            "read + cache creation"
        )
    return in_tokens


class _SessionBuilder:
    """One session's spans, then the session they make."""

    def __init__(
        self,
        reader: _Reader,
        session_id: str,
        calls: list[int],
        agent_up: list[int],
        owner: Callable[[int], int],
        tools: dict[int, int],
        in_tokens: dict[int, int],
    ) -> None:
        nodes = reader.nodes
        self.reader = reader
        self.session_id = session_id
        self.in_tokens = in_tokens
        self.tools = tools
        self.owner = owner
        self.calls: dict[int, list[int]] = {}  # agent span (-1: the root) -> its calls in start order
        used_agents: set[int] = set()
        for index in sorted(calls, key=lambda i: _order(nodes[i])):
            self.calls.setdefault(owner(index), []).append(index)
            agent = agent_up[index]
            while agent >= 0 and agent not in used_agents:  # every agent span above a call, outermost too
                used_agents.add(agent)
                agent = agent_up[agent]
        self.children: dict[int, list[int]] = {}  # agent span (-1: the root) -> its subagents in spawn order
        for agent in sorted((a for a in used_agents if agent_up[a] >= 0), key=lambda a: _order(nodes[a])):
            self.children.setdefault(owner(agent), []).append(agent)
        starts = [nodes[i].start for i in (*calls, *used_agents)]
        self.origin = min(start for start in starts if start is not None)
        root_calls = self.calls.get(-1, [])
        outermost = agent_up[root_calls[0]] if root_calls else -1
        while outermost >= 0 and agent_up[outermost] >= 0:
            outermost = agent_up[outermost]
        self.root_name = nodes[outermost].name if outermost >= 0 else ""
        self.lines: dict[int, list[int]] = {}  # id(agent) -> each request's span

    def build(self, ids: CachedPrefixIds, start_s: float) -> Session:
        root = Agent()
        self._fill(root, -1, ids, set())
        models: list[str] = []
        for agent, _, _ in root.walk():
            for model in agent.models or [r.model for r in agent.requests]:
                if model and model not in models:
                    models.append(model)
        return Session(session_id=self.session_id, root=root, start_s=start_s, models=models)

    def _fill(self, agent: Agent, span: int, ids: CachedPrefixIds, taken: set[str]) -> None:
        """Give `agent` (of agent span `span`, -1 for the root) its requests, then its subagents, depth first."""
        nodes = self.reader.nodes
        calls = self.calls.get(span, [])
        name = self.root_name if span < 0 else nodes[span].name
        first = nodes[calls[0]].call if calls else None
        preamble = f"{first.model if first is not None else ''}\n{'sub' if span >= 0 else 'root'}\n{name}"
        agent.requests = self._requests(calls, ids, preamble)
        self.lines[id(agent)] = calls
        starts = [nodes[i].start or 0 for i in calls]
        for child in self.children.get(span, []):
            node = nodes[child]
            start, end = node.start or 0, node.end or 0
            sub = Agent(
                agent_id=_unique(node.agent_id or node.span_id, taken),
                spawn_after=bisect.bisect_left(starts, start),
                t=(start - self.origin) / _NANOS,
                subagent_type=node.name,
                duration_ms=round((end - start) / 1_000_000),
                tool_use_count=self.tools.get(child, 0),
            )
            self._fill(sub, child, ids, taken)
            sub.models = list(dict.fromkeys(r.model for r in sub.requests if r.model))
            agent.subagents.append(sub)

    def _requests(self, calls: list[int], ids: CachedPrefixIds, preamble: str) -> list[Request]:
        nodes = self.reader.nodes
        requests: list[Request] = []
        previous: tuple[int, ...] = ()
        previous_end: int | None = None
        for index in calls:
            node = nodes[index]
            call = node.call
            assert call is not None and node.start is not None and node.end is not None
            in_tokens = self.in_tokens[index]
            cached = call.cache_read or 0
            if requests:
                kept, added = ids.next_round(previous, in_tokens, cached)
                previous = previous[:kept] + added
            else:
                added = ids.first_round(preamble, in_tokens, cached)
                kept, previous = 0, added
            kind: RequestType = "s" if call.streamed or call.ttft is not None else "n"
            requests.append(
                Request(
                    t=(node.start - self.origin) / _NANOS,
                    model=call.model,
                    in_tokens=in_tokens,
                    out_tokens=call.output,
                    hash_ids_kept=kept,
                    hash_ids_added=added,
                    think_time=None if previous_end is None else max(0, node.start - previous_end) / _NANOS,
                    api_time=(node.end - node.start) / _NANOS,
                    ttft=call.ttft,
                    type=kind,
                    stop=call.stop,
                )
            )
            previous_end = node.end
        return requests

    def line_of(self, agent: Agent, index: int) -> int | None:
        calls = self.lines.get(id(agent), [])
        return self.reader.line(calls[index]) if index < len(calls) else None


def _order(node: _Node) -> tuple[int, int, str]:
    return (node.start or 0, node.end or 0, node.span_id)


def _unique(agent_id: str, taken: set[str]) -> str:
    """`agent_id`, or `agent_id#2`, `#3`, ... where the session has it already (one agent invoked again)."""
    chosen, count = agent_id, 1
    while chosen in taken:
        count += 1
        chosen = f"{agent_id}#{count}"
    taken.add(chosen)
    return chosen


# ---------------------------------------------------------------------------------------------
# attribute values


def _nanos(raw: _Nanos) -> int | None:
    """A time in nanoseconds since the epoch (a string in OTLP JSON), or None where it is missing or no time."""
    if isinstance(raw, str):
        return int(raw) if _WHOLE.fullmatch(raw) and int(raw) > 0 else None
    if isinstance(raw, float):
        return int(raw) if math.isfinite(raw) and raw > 0 else None
    return raw if raw is not None and raw > 0 else None


def _label(span: _Span) -> str:
    return f"span {_shown(span.span_id)}" if span.span_id else f"a span named {span.name!r}"


def _shown(name: str) -> str:
    """An id from the file as a message shows it: on one line, whatever it holds."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _loose_span_id(raw: msgspec.Raw) -> str:
    """The `spanId` of a span that does not decode, where it can be found."""
    try:
        loose = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return ""
    span_id = loose.get("spanId") if isinstance(loose, dict) else None
    return span_id if isinstance(span_id, str) else ""
