"""Sampling sessions from a `SessionModel` (see agentx.synth.session_model for the model itself).

Hash ids follow the growing-context convention of agentx's sample corpus: a prompt of `in` tokens
has ceil(in / block_size) ids; a continuing request keeps its predecessor's full blocks; a
compaction keeps only the system-prompt blocks; subagents of a session share their own system
prompt's blocks. With global scope, sessions of one profile also share their system prompts.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator

import numpy as np

from agentx.errors import ConfigError
from agentx.synth.dist import BatchedDraws, Dist
from agentx.synth.session_model import AgentShape, ApiTime, Profile, SessionModel
from agentx.trace.model import Agent, HashScope, Provenance, Request, Session, Trace

SPAWN_DELAY_S = 0.05
"""From a parent's response to its subagents' first requests."""

_TOOL_RESULT = ("tool_result",)
_TEXT = ("text",)
_OUTPUT = {"tool_use": ("text", "tool_use"), "end_turn": ("text",)}


class _Draws:
    """Batched draws for one agent shape (one generator stream per quantity, for speed)."""

    def __init__(self, shape: AgentShape, rng: np.random.Generator) -> None:
        streams = rng.spawn(8)
        self.context = BatchedDraws(shape.context_tokens, streams[7]) if shape.context_tokens is not None else None
        self.requests = BatchedDraws(shape.requests, streams[0], 1024)
        self.first_user = BatchedDraws(shape.first_user_tokens, streams[1])
        self.added = BatchedDraws(shape.added_tokens, streams[2])
        self.out = BatchedDraws(shape.out_tokens, streams[3])
        self.tool_gap = BatchedDraws(shape.tool_gap_s, streams[4])
        self.human_gap = BatchedDraws(shape.human_gap_s, streams[5])
        self.summary = BatchedDraws(shape.summary_tokens, streams[6], 256)


class _Ids:
    """Fresh ids, and the shared system-prompt ids (per session, or per profile in global scope)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.next = 0
        self.systems: dict[tuple[int, str], tuple[int, ...]] = {}

    def fresh(self, count: int) -> tuple[int, ...]:
        start = self.next
        self.next += count
        return tuple(range(start, self.next))

    def system(self, profile: int, kind: str, tokens: int) -> tuple[int, ...]:
        key = (profile, kind)
        if key not in self.systems:
            self.systems[key] = self.fresh(tokens // self.block_size)
        return self.systems[key]


class _Row:
    """A request before its think time is known."""

    __slots__ = ("added", "api", "inputs", "kept", "n_in", "out", "start", "stop")

    def __init__(
        self,
        start: float,
        api: float,
        n_in: int,
        out: int,
        kept: int,
        added: tuple[int, ...],
        stop: str,
        inputs: tuple[str, ...],
    ) -> None:
        self.start, self.api, self.n_in, self.out = start, api, n_in, out
        self.kept, self.added, self.stop, self.inputs = kept, added, stop, inputs


class _Sub:
    def __init__(self, rows: list[_Row], spawn_after: int, spawn_s: float, kind: str) -> None:
        self.rows, self.spawn_after, self.spawn_s, self.kind = rows, spawn_after, spawn_s, kind


Spawn = Callable[[int, float, float], float]
"""Called after a root request (index, its end, the planned next start); returns the next start."""


def _run(
    shape: AgentShape,
    draws: _Draws,
    system_ids: tuple[int, ...],
    ids: _Ids,
    api: ApiTime,
    start_s: float,
    chance: BatchedDraws,
    spawn: Spawn | None = None,
) -> list[_Row]:
    """One agent's requests from `start_s`."""
    size = ids.block_size
    count = max(1, round(draws.requests()))
    sizes: list[int] = []
    if draws.context is not None:
        sizes = sorted(round(value) for value in draws.context.take(count))
        sizes[0] = max(sizes[0], shape.system_tokens + 16)
        for i in range(1, count):
            sizes[i] = max(sizes[i], sizes[i - 1] + 32)
    growth = [] if sizes else draws.added.take(count - 1)
    if shape.mean_added_tokens and growth:
        factor = shape.mean_added_tokens / (sum(growth) / len(growth))
        growth = [value * factor for value in growth]
    # Per-token seconds, hoisted out of the loop (generation speed is a target).
    base_s = api.base_s
    rates = (api.prefill_tokens_per_s, api.context_tokens_per_s, api.decode_tokens_per_s)
    per_new, per_in, per_out = (1.0 / rate if rate else 0.0 for rate in rates)
    outs, gaps, coins = draws.out.take(count), draws.tool_gap.take(count), chance.take(2 * count)
    n_in = sizes[0] if sizes else shape.system_tokens + max(16, round(draws.first_user()))
    kept = 0
    added = system_ids + ids.fresh(-(-n_in // size) - len(system_ids))
    new_tokens = n_in
    inputs = _TEXT
    t = start_s
    rows: list[_Row] = []
    for index in range(count):
        out = max(1, round(outs[index]))
        last = index == count - 1
        stop = "end_turn" if last or coins[index] < shape.end_turn_share else "tool_use"
        api_s = base_s + new_tokens * per_new + n_in * per_in + out * per_out
        rows.append(_Row(t, api_s, n_in, out, kept, added, stop, inputs))
        if last:
            break
        end = t + api_s
        gap = gaps[index] if stop == "tool_use" else draws.human_gap()
        t = end + gap if spawn is None else spawn(index, end, end + gap)
        grow = sizes[index + 1] - n_in if sizes else max(32, round(growth[index]))
        if not sizes and shape.compact_at_tokens and n_in + grow > shape.compact_at_tokens:
            kept = len(system_ids)
            n_in = shape.system_tokens + max(16, round(draws.summary()))
            inputs = _TEXT
        elif shape.edit_share and coins[count + index] < shape.edit_share:
            kept = len(system_ids)
            n_in += grow
            inputs = _TOOL_RESULT if stop == "tool_use" else _TEXT
        else:
            kept = n_in // size
            n_in += grow
            inputs = _TOOL_RESULT if stop == "tool_use" else _TEXT
        first = ids.next
        ids.next += -(-n_in // size) - kept
        added = tuple(range(first, ids.next))
        new_tokens = n_in - kept * size
    return rows


def _session(
    number: int,
    profile_index: int,
    profile: Profile,
    draws: tuple[_Draws, _Draws | None, BatchedDraws],
    ids: _Ids,
    api: ApiTime,
    chance: BatchedDraws,
    start_s: float,
) -> Session:
    subs: list[_Sub] = []
    sub_shape, sub_draws = profile.sub, draws[1]

    def spawn(index: int, end: float, planned: float) -> float:
        if sub_shape is None or sub_draws is None or chance() >= profile.spawn_share:
            return planned
        sub_system = ids.system(profile_index, "sub", sub_shape.system_tokens)
        if chance() < profile.background_share:
            rows = _run(sub_shape, sub_draws, sub_system, ids, api, end + SPAWN_DELAY_S, chance)
            subs.append(_Sub(rows, index + 1, end, "general-purpose"))
            return planned
        fan_out = max(1, round(draws[2]()))
        joined = planned
        for member in range(fan_out):
            rows = _run(sub_shape, sub_draws, sub_system, ids, api, end + SPAWN_DELAY_S * (member + 1), chance)
            subs.append(_Sub(rows, index + 1, end, "Explore"))
            joined = max(joined, rows[-1].start + rows[-1].api + draws[0].tool_gap())
        return joined

    root_system = ids.system(profile_index, "root", profile.root.system_tokens)
    root_rows = _run(profile.root, draws[0], root_system, ids, api, 0.0, chance, spawn)
    # think_time: the gap from the previous request's end, across the whole session in start order.
    every = sorted([*root_rows, *(row for sub in subs for row in sub.rows)], key=lambda row: row.start)
    think: dict[int, float | None] = {}
    previous_end: float | None = None
    for row in every:
        think[id(row)] = None if previous_end is None else max(0.0, row.start - previous_end)
        previous_end = row.start + row.api

    def requests(rows: list[_Row], model: str) -> list[Request]:
        return [
            Request(
                t=row.start,
                model=model,
                in_tokens=row.n_in,
                out_tokens=row.out,
                hash_ids_kept=row.kept,
                hash_ids_added=row.added,
                think_time=think[id(row)],
                api_time=row.api,
                input_types=row.inputs,
                output_types=_OUTPUT[row.stop],
                stop=row.stop,
            )
            for row in rows
        ]

    root = Agent(requests=requests(root_rows, profile.root.model), models=[profile.root.model])
    for number_in_session, sub in enumerate(subs, start=1):
        assert sub_shape is not None  # subs exist only when the profile has a subagent shape
        end = max(row.start + row.api for row in sub.rows)
        root.subagents.append(
            Agent(
                agent_id=f"a{number_in_session}",
                requests=requests(sub.rows, sub_shape.model),
                spawn_after=sub.spawn_after,
                t=sub.spawn_s,
                subagent_type=sub.kind,
                status="completed",
                duration_ms=math.ceil((end - sub.spawn_s) * 1000),
                models=[sub_shape.model],
            )
        )
    models = [profile.root.model] + (
        [sub_shape.model] if subs and sub_shape and sub_shape.model != profile.root.model else []
    )
    return Session(session_id=f"g{number:06d}", root=root, start_s=start_s, models=models)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Millions of small acyclic objects: the cyclic collector would rescan them over and over
    (half of the generation time), so it waits until they are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def generate(model: SessionModel, *, sessions: int, seed: int = 0, scope: HashScope = "session") -> Trace:
    """`sessions` sessions sampled from `model`, reproducibly for a given seed."""
    if sessions < 1:
        raise ConfigError(f"--sessions must be at least 1, not {sessions}")
    with _collector_paused():
        return _generate(model, sessions, seed, scope)


def _generate(model: SessionModel, sessions: int, seed: int, scope: HashScope) -> Trace:
    rng = np.random.default_rng(seed)
    weights = np.asarray([p.weight for p in model.profiles], dtype=np.float64)
    # Systematic sampling: each profile gets its share of sessions within one, in shuffled order,
    # so a small run still mirrors the mixture (a fit to a 7-session corpus has 7 profiles).
    edges = np.cumsum(weights / weights.sum())
    positions = (rng.random() + np.arange(sessions)) / sessions
    choices = np.minimum(np.searchsorted(edges, positions, side="right"), len(weights) - 1)
    rng.shuffle(choices)
    choices = choices.tolist()
    starts = [0.0] * sessions
    if model.session_rate_per_s > 0:
        starts = np.cumsum(rng.exponential(1.0 / model.session_rate_per_s, sessions)).tolist()
    draws = [
        (
            _Draws(p.root, rng.spawn(1)[0]),
            _Draws(p.sub, rng.spawn(1)[0]) if p.sub is not None else None,
            BatchedDraws(p.fan_out, rng.spawn(1)[0], 256),
        )
        for p in model.profiles
    ]
    uniform = BatchedDraws(Dist(quantiles=(0.0, 1.0), log=False), rng.spawn(1)[0])
    shared = _Ids(model.block_size)
    out: list[Session] = []
    for number, (choice, start) in enumerate(zip(choices, starts, strict=True)):
        ids = shared if scope == "global" else _Ids(model.block_size)
        out.append(_session(number, choice, model.profiles[choice], draws[choice], ids, model.api, uniform, start))
    return Trace(
        sessions=out,
        block_size=model.block_size,
        hash_id_scope=scope,
        provenance=Provenance(
            source_format=f"synth:generate:{model.name}",
            notes=[f"generated by agentx synth generate: {sessions} sessions, seed {seed}", f"model: {model.source}"],
        ),
    )
