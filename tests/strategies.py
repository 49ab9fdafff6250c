"""Hypothesis strategies for valid traces, kept small so property tests stay fast.

`traces()` draws traces that pass `validate.validate` without errors and that the Weka format can
hold apart from what it documents as dropped (`Session.start_s`, `Request.acceptance_length`):
subagents always have a spawn time, inner request times are absolute and not before the spawn
(or, for legacy `relative_times` agents, stored as spawn + a relative offset below the spawn),
and the root agent carries only what a Weka trace has (tool/system tokens).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import settings
from hypothesis import strategies as st

from agentx.trace.model import Agent, Request, RequestType, Session, Trace, delta_encode

REQUEST_TYPES: tuple[RequestType, ...] = ("n", "s")
MAX_DEPTH = 3
"""Deepest subagent nesting drawn (the root is depth 0)."""

names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
    min_size=1,
    max_size=8,
)
"""Non-empty ids and labels, including non-ASCII text."""

small_ints = st.integers(min_value=0, max_value=1_000_000)
hash_id_values = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1) | st.integers(0, 50)
"""Mostly small ids (so prefixes collide) plus the full int64 range."""

json_values: st.SearchStrategy[object] = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
"""JSON-native values: what an opaque `totals` dict may hold and still compare equal after a round trip."""


def millis(max_value: float) -> st.SearchStrategy[float]:
    """Non-negative times with millisecond resolution, like the recorded corpora."""
    return st.integers(min_value=0, max_value=round(max_value * 1000)).map(lambda ms: ms / 1000)


def durations() -> st.SearchStrategy[float | None]:
    return st.none() | millis(120.0) | st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def hash_id_lists(draw: st.DrawFn, count: int, start: list[int] | None = None) -> list[list[int]]:
    """`count` full hash-id lists for one agent's requests: contexts that mostly grow turn by turn,
    sometimes stay the same, and sometimes shrink (compaction keeps a prefix, then adds new ids)."""
    current = list(start if start is not None else draw(st.lists(hash_id_values, max_size=6)))
    lists: list[list[int]] = []
    for _ in range(count):
        lists.append(current)
        step = draw(st.sampled_from(["grow", "grow", "same", "shrink", "replace"]))
        new_ids = draw(st.lists(hash_id_values, max_size=5))
        if step == "grow":
            current = current + new_ids
        elif step == "shrink":
            current = current[: draw(st.integers(0, len(current)))] + new_ids
        elif step == "replace":
            current = new_ids
        else:
            current = list(current)
    return lists


@st.composite
def requests_for(
    draw: st.DrawFn,
    full_ids: list[list[int]],
    *,
    block_size: int,
    start_t: float,
    acceptance: bool,
) -> list[Request]:
    """Requests whose hash ids are `full_ids`, delta-encoded against the previous request, with
    non-decreasing start times from `start_t`."""
    requests: list[Request] = []
    previous: list[int] = []
    t = start_t
    for ids in full_ids:
        t += draw(millis(30.0))
        kept, added = delta_encode(previous, ids)
        previous = ids
        kind: RequestType = draw(st.sampled_from(REQUEST_TYPES))
        # `in` usually covers the ids exactly (the last block partial), sometimes not (a warning only).
        exact = max(0, (len(ids) - 1) * block_size) + draw(st.integers(1, block_size))
        in_tokens = draw(st.just(exact) | st.integers(0, 100_000_000))
        input_types = tuple(draw(st.lists(st.sampled_from(["text", "tool_result", "image"]), max_size=2)))
        output_types = tuple(draw(st.lists(st.sampled_from(["text", "thinking", "tool_use"]), max_size=3)))
        stop = draw(st.sampled_from(["", "tool_use", "end_turn", "max_tokens"]))
        # A Weka file may write any of these keys at its default value, or leave it out.
        at_default = [key for key, value in (("input_types", input_types), ("output_types", output_types)) if not value]
        at_default += ["stop"] if stop == "" else []
        requests.append(
            Request(
                t=t,
                model=draw(st.sampled_from(["claude-opus-4-5", "claude-haiku-4-5", "m"]) | names),
                in_tokens=in_tokens,
                out_tokens=draw(st.integers(1, 4096) | st.integers(0, 100_000_000)),
                hash_ids_kept=kept,
                hash_ids_added=added,
                think_time=None if not requests else draw(durations()),
                api_time=draw(durations()),
                ttft=draw(durations()) if kind == "s" else None,
                type=kind,
                input_types=input_types,
                output_types=output_types,
                stop=stop,
                explicit_defaults=frozenset(draw(st.sets(st.sampled_from(at_default)))) if at_default else frozenset(),
                acceptance_length=(
                    draw(st.none() | st.floats(min_value=1, max_value=16, allow_nan=False)) if acceptance else None
                ),
            )
        )
    return requests


@st.composite
def agents(
    draw: st.DrawFn,
    *,
    depth: int,
    block_size: int,
    spawn_t: float,
    ids: list[str],
    prefix: list[int],
    acceptance: bool,
    max_requests: int = 4,
) -> Agent:
    """An agent at `depth` (0 = root) with up to `max_requests` requests and a subtree below it.

    `ids` collects the agent ids drawn so far in the session, so that every subagent's is unique.
    """
    count = draw(st.integers(0, max_requests))
    start = prefix + draw(st.lists(hash_id_values, max_size=4)) if draw(st.booleans()) else None
    full_ids = draw(hash_id_lists(count, start))
    relative = depth > 0 and count > 0 and spawn_t > 1.0 and draw(st.booleans())
    if relative:
        # Legacy Weka subagent: offsets from the spawn, every one of them below the spawn time.
        offsets = draw(
            st.lists(st.integers(0, math.floor(spawn_t * 1000) - 2), min_size=count, max_size=count).map(sorted)
        )
        requests = draw(requests_for(full_ids, block_size=block_size, start_t=0.0, acceptance=acceptance))
        requests = [
            msgspec.structs.replace(request, t=spawn_t + offset / 1000)
            for request, offset in zip(requests, offsets, strict=True)
        ]
    else:
        requests = draw(requests_for(full_ids, block_size=block_size, start_t=spawn_t, acceptance=acceptance))
    agent = Agent(requests=requests, relative_times=relative)
    if depth > 0:
        agent_id = draw(names.filter(lambda name: name not in ids))
        ids.append(agent_id)
        agent.agent_id = agent_id
        agent.t = spawn_t
        agent.subagent_type = draw(st.sampled_from(["Explore", "Subagent", "general-purpose"]))
        agent.status = draw(st.sampled_from(["completed", "async_launched", ""]))
        agent.duration_ms = draw(st.none() | st.integers(0, 10_000_000))
        agent.total_tokens = draw(st.none() | small_ints)
        agent.tool_use_count = draw(st.none() | st.integers(0, 100))
        agent.models = draw(st.lists(st.sampled_from(["claude-opus-4-5", "claude-haiku-4-5"]), max_size=2))
    agent.tool_tokens = draw(st.integers(0, 20_000))
    agent.system_tokens = draw(st.integers(0, 5_000))
    if depth < MAX_DEPTH:
        spawn_points = draw(st.lists(st.integers(0, count), max_size=2 if depth == 0 else 1).map(sorted))
        for spawn_after in spawn_points:
            before = requests[spawn_after - 1].t if spawn_after > 0 else spawn_t
            sub = draw(
                agents(
                    depth=depth + 1,
                    block_size=block_size,
                    spawn_t=before + draw(millis(5.0)),
                    ids=ids,
                    prefix=prefix,
                    acceptance=acceptance,
                    max_requests=max(1, max_requests - 1),
                )
            )
            sub.spawn_after = spawn_after
            agent.subagents.append(sub)
    return agent


@st.composite
def sessions(
    draw: st.DrawFn, session_id: str, *, block_size: int, acceptance: bool = True, weka_start: bool = False
) -> Session:
    prefix = draw(st.lists(st.integers(0, 20), max_size=4))  # a system prompt shared by the session's agents
    root = draw(agents(depth=0, block_size=block_size, spawn_t=0.0, ids=[], prefix=prefix, acceptance=acceptance))
    return Session(
        session_id=session_id,
        root=root,
        start_s=0.0 if weka_start else draw(millis(10_000.0)),
        models=draw(st.lists(st.sampled_from(["claude-opus-4-5", "claude-haiku-4-5"]), max_size=2, unique=True)),
        totals=draw(st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=3)),
    )


@st.composite
def traces(draw: st.DrawFn, *, max_sessions: int = 3, acceptance: bool = True, weka_start: bool = False) -> Trace:
    """A valid trace of 1..`max_sessions` sessions with unique ids.

    `acceptance=False` and `weka_start=True` leave out what the Weka format drops, so a Weka
    round trip must reproduce the trace exactly (bar provenance).
    """
    block_size = draw(st.sampled_from([16, 64, 512]) | st.integers(1, 1024))
    ids = draw(st.lists(names, min_size=1, max_size=max_sessions, unique=True))
    return Trace(
        sessions=[
            draw(sessions(session_id, block_size=block_size, acceptance=acceptance, weka_start=weka_start))
            for session_id in ids
        ],
        block_size=block_size,
        hash_id_scope=draw(st.sampled_from(["session", "global"])),
    )


# ---------------------------------------------------------------------------------------------
# plain Weka documents for example-based tests

WEKA_TRACE: dict[str, Any] = {
    "id": "s1",
    "models": ["m"],
    "block_size": 64,
    "hash_id_scope": "local",
    "requests": [
        {"t": 0.0, "type": "n", "model": "m", "in": 100, "out": 5, "hash_ids": [1, 2], "api_time": 0.5},
        {
            "t": 1.0,
            "type": "s",
            "model": "m",
            "in": 200,
            "out": 7,
            "hash_ids": [1, 2, 3, 4],
            "api_time": 0.5,
            "ttft": 0.1,
            "think_time": 0.5,
        },
    ],
}
"""A small valid Weka trace: two requests of the root agent, hash ids matching `in` at block size 64."""

WEKA_SUBAGENT: dict[str, Any] = {
    "t": 2.0,
    "type": "subagent",
    "agent_id": "a1",
    "subagent_type": "Explore",
    "status": "completed",
    "duration_ms": 1500,
    "models": ["m"],
    "requests": [{"t": 2.0, "type": "n", "model": "m", "in": 64, "out": 3, "hash_ids": [9], "api_time": 1.0}],
}
"""A subagent entry with absolute inner times."""


def write_json(path: Path, *documents: dict[str, Any], indent: int | None = None) -> Path:
    """Write one document as JSON, or several as JSONL (one per line)."""
    if len(documents) == 1 and path.suffix == ".json":
        path.write_text(json.dumps(documents[0], indent=indent), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(doc) + "\n" for doc in documents), encoding="utf-8")
    return path


def record_identity(**overrides: object) -> dict[str, object]:
    """The identity fields of a hand-made `RequestRecord` (a root request of session "s", turn 0), for tests
    that build records field by field."""
    fields: dict[str, object] = {
        "run_id": "run-1",
        "phase": "profiling",
        "lane": 0,
        "play": 0,
        "session_id": "s",
        "agent_id": "",
        "depth": 0,
        "turn": 0,
        "model": "m",
    }
    fields.update(overrides)
    return fields


def examples(count: int) -> int:
    """A property test's own `max_examples`, scaled as the profile scales the default (100): a quarter under
    `--hypothesis-profile=fast`, twenty times under `thorough` (tests/conftest.py)."""
    profile = settings.default  # the loaded profile (the Hypothesis plugin loads it before tests are collected)
    return count if profile is None else max(1, count * profile.max_examples // 100)
