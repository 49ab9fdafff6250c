"""Hidden-agent (flattened chain) detection: explicit trees survive flattening, one test per rule, real data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import examples
from strategies import traces as trace_strategy

from agentx.replayer.plan.steps import plan_session
from agentx.trace.chains import ChainRules, split_flattened_agents, split_trace
from agentx.trace.io import load_trace
from agentx.trace.model import Agent, Request, Session, Trace, delta_encode
from agentx.trace.validation import validate

Key = tuple[float, str, int, int, float | None, tuple[int, ...]]
"""What a request must keep when it moves: (t, model, in, out, api_time, full hash ids)."""


def req(
    t: float,
    ids: list[int] | range,
    *,
    api: float = 1.0,
    model: str = "m",
    in_tokens: int | None = None,
    out: int = 100,
) -> Request:
    """A request holding its full ids (kept=0 is a valid encoding; `encode` makes real deltas)."""
    return Request(
        t=t,
        model=model,
        in_tokens=in_tokens if in_tokens is not None else 64 * len(ids),
        out_tokens=out,
        api_time=api,
        hash_ids_added=tuple(ids),
    )


def encode(requests: list[Request]) -> list[Request]:
    """The same requests delta-encoded against their predecessor, as readers store them."""
    out: list[Request] = []
    previous: tuple[int, ...] = ()
    for request in requests:
        ids = request.hash_ids_added if request.hash_ids_kept == 0 else ()
        assert request.hash_ids_kept == 0
        kept, added = delta_encode(previous, ids)
        out.append(msgspec.structs.replace(request, hash_ids_kept=kept, hash_ids_added=added))
        previous = ids
    return out


def session(*requests: Request, subagents: list[Agent] | None = None, tool_tokens: int = 0) -> Session:
    root = Agent(requests=encode(list(requests)), subagents=subagents or [], tool_tokens=tool_tokens)
    return Session(session_id="s", root=root)


def key(request: Request, ids: tuple[int, ...]) -> Key:
    return (request.t, request.model, request.in_tokens, request.out_tokens, request.api_time, ids)


def keys(agent: Agent) -> list[Key]:
    return [key(r, ids) for r, ids in zip(agent.requests, agent.iter_hash_ids(), strict=True)]


def all_keys(s: Session) -> Counter[Key]:
    return Counter(k for agent, _, _ in s.agents() for k in keys(agent))


def by_id(s: Session) -> dict[str, Agent]:
    return {agent.agent_id: agent for agent, _, _ in s.agents()}


def split(s: Session, **rules: object) -> Session:
    result = split_flattened_agents(s, ChainRules(**rules))  # type: ignore[arg-type]
    assert not [f for f in validate(Trace(sessions=[result], block_size=64)) if f.severity == "error"]
    assert all_keys(result) == all_keys(s)  # requests only move
    return result


def shape(s: Session) -> set[tuple[tuple[Key, ...], tuple[Key, ...] | None, int]]:
    """Each agent as (its requests, its parent's requests, spawn_after): agent ids left out."""
    out = set()
    for agent, parent, _ in s.agents():
        parent_keys = tuple(keys(parent)) if parent is not None else None
        out.add((tuple(keys(agent)), parent_keys, agent.spawn_after))
    return out


def plan_shape(s: Session) -> set[tuple[Key, Key | None, float, frozenset[Key]]]:
    """Each step as (request, anchor request, delay, joined requests): the plan without agent ids, and without
    docs/agentx.md §3c's barriers (edges that exist only between split-out chains, so never in an explicit tree)."""
    plan = plan_session(s, barriers=False)
    step_key = {step.index: key(step.request, ids) for step, ids in zip(plan.steps, _step_ids(s), strict=True)}
    return {
        (
            step_key[step.index],
            step_key[step.anchor] if step.anchor is not None else None,
            round(step.delay_s, 9),
            frozenset(step_key[j] for j in step.joins),
        )
        for step in plan.steps
    }


def _step_ids(s: Session) -> list[tuple[int, ...]]:
    """Full ids in plan step order (agents depth first, then turn order)."""
    return [ids for agent, _, _ in s.agents() for ids in agent.iter_hash_ids()]


def flatten(s: Session) -> Session:
    """Every depth-1 subagent's requests merged into the root by time, re-encoded: the flattened form."""
    root = s.root
    merged = list(zip(root.requests, root.iter_hash_ids(), strict=True))
    for sub in root.subagents:
        merged.extend(zip(sub.requests, sub.iter_hash_ids(), strict=True))
    merged.sort(key=lambda item: item[0].t)
    requests = encode([msgspec.structs.replace(r, hash_ids_kept=0, hash_ids_added=ids) for r, ids in merged])
    return Session(session_id=s.session_id, root=Agent(requests=requests))


def sub(agent_id: str, spawn_after: int, *requests: Request) -> Agent:
    return Agent(agent_id=agent_id, spawn_after=spawn_after, t=requests[0].t, requests=encode(list(requests)))


# ---------------------------------------------------------------------------------------------
# flattened ↔ explicit


def test_a_flattened_trace_yields_the_same_tree_as_its_explicit_form() -> None:
    # root: ids 1.. growing; A (after r0) overlaps r1 and ends before r2 → joined at r2; B (after r1)
    # outlives the root → background. Every agent has its own first id, as real subagents do.
    explicit = session(
        req(0, range(1, 5), api=2),
        req(3, range(1, 7), api=1),
        req(20, range(1, 9), api=1),
        subagents=[
            sub("A", 1, req(2.5, [100, 101], api=3), req(6, [100, 101, 102], api=4)),
            sub("B", 2, req(5, [200], api=1), req(7, [200, 201], api=1), req(30, [200, 201, 202], api=1)),
        ],
    )
    flat = flatten(explicit)
    assert len(flat.root.requests) == 8 and not flat.root.subagents
    result = split(flat)
    assert shape(result) == shape(explicit)
    assert plan_shape(result) == plan_shape(explicit)
    agents = by_id(result)
    assert sorted(agents) == ["", "fa:000", "fa:001"]
    assert (agents["fa:000"].spawn_after, agents["fa:001"].spawn_after) == (1, 2)
    assert agents["fa:000"].t == 2.5 and agents["fa:000"].duration_ms is None


@st.composite
def explicit_sessions(draw: st.DrawFn) -> Session:
    """A root (≥ 2 requests) and depth-1 subagents, each with its own id prefix and model, its requests
    one after another (each starts after the previous ends), contexts that grow or get compacted, and each
    subagent spawned after the last root request before its first one. All start times are distinct."""
    times = iter(draw(st.lists(st.integers(0, 10**6), min_size=40, max_size=40, unique=True).map(sorted)))
    next_id = iter(range(1_000_000, 2_000_000))

    def conversation(prefix: int, count: int, start: float, model: str) -> list[Request]:
        requests: list[Request] = []
        ids = [prefix, next(next_id)]
        t = start
        for k in range(count):
            if k:
                step = draw(st.sampled_from(["grow", "grow", "grow", "compact"]))
                if step == "compact":
                    ids = ids[: draw(st.integers(1, len(ids)))]  # keeps the agent's own first id
                ids = ids + [next(next_id) for _ in range(draw(st.integers(1, 3)))]
                t = requests[-1].end + draw(st.integers(0, 50_000)) / 1000
            api = draw(st.integers(0, 20_000)) / 1000
            in_tokens = draw(st.integers(20_000, 200_000))  # large: no chain is an aux sidecar
            out = draw(st.integers(4_000, 8_000))  # and none is a reduction
            requests.append(req(t, ids, api=api, model=model, in_tokens=in_tokens, out=out))
        return requests

    root = conversation(1, draw(st.integers(2, 5)), 0.0, "main")
    subagents: list[Agent] = []
    for n in range(draw(st.integers(0, 3))):
        start = root[0].t + 0.001 + next(times) / 1000
        requests = conversation(10 + n, draw(st.integers(2, 4)), start, "main")
        spawn_after = sum(1 for r in root if r.t < start)
        subagents.append(sub(f"x{n}", spawn_after, *requests))
    subagents.sort(key=lambda a: (a.spawn_after, a.t or 0.0))
    all_t = [r.t for r in root] + [r.t for a in subagents for r in a.requests]
    assume(len(set(all_t)) == len(all_t))
    return session(*root, subagents=subagents)


@given(explicit_sessions())
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_flattened_explicit_tree_splits_back_to_itself(explicit: Session) -> None:
    result = split(flatten(explicit))
    assert shape(result) == shape(explicit)
    assert plan_shape(result) == plan_shape(explicit)
    assert len(result.root.subagents) == len(explicit.root.subagents)


@given(trace_strategy(max_sessions=2))
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_splitting_any_valid_trace_only_moves_requests(trace: Trace) -> None:
    result, report = split_trace(trace)
    assert [f for f in validate(result) if f.severity == "error"] == []
    for before, after in zip(trace.sessions, result.sessions, strict=True):
        assert all_keys(after) == all_keys(before)
        counts = report.sessions[before.session_id]
        assert sum(1 for _ in after.agents()) == sum(1 for _ in before.agents()) + counts.chains
        if not counts.chains:
            assert after is before
        for agent, _, _ in after.agents():
            assert [s.spawn_after for s in agent.subagents] == sorted(s.spawn_after for s in agent.subagents)


def test_a_single_chain_is_returned_unchanged() -> None:
    s = session(req(0, [1, 2]), req(2, [1, 2, 3]), req(4, [1, 2, 3, 4]))
    assert split_flattened_agents(s) is s


# ---------------------------------------------------------------------------------------------
# classification


def main_chain(n: int = 3, *, in_tokens: int = 100_000) -> list[Request]:
    """A main conversation at t = 0, 10, 20, …, ids 1.. growing, 1 s each."""
    return [req(10.0 * k, range(1, 4 + k), in_tokens=in_tokens + k) for k in range(n)]


def test_a_one_shot_with_a_small_first_input_is_an_aux_sidecar() -> None:
    # threshold = max(16384, 0.10 × 100002) = 16384: in 1000 is below it.
    result = split(session(*main_chain(), req(5, [900, 901], in_tokens=1000)))
    assert sorted(by_id(result)) == ["", "aux:000"]
    assert by_id(result)["aux:000"].subagent_type == "aux"
    # The ratio arm: a main peak of 500k makes the threshold 50k, so in = 40k is still aux.
    result = split(session(*main_chain(in_tokens=500_000), req(5, [900], in_tokens=40_000)))
    assert sorted(by_id(result)) == ["", "aux:000"]


def test_a_one_shot_on_another_model_is_an_aux_sidecar_whatever_its_size() -> None:
    result = split(session(*main_chain(), req(5, [900], model="haiku", in_tokens=90_000)))
    assert sorted(by_id(result)) == ["", "aux:000"]
    # Without the cross-model arm, a large one with out >= 4000 (no reduction) is an agent.
    result = split(
        session(*main_chain(), req(5, [900], model="haiku", in_tokens=90_000, out=5000)), aux_cross_model=False
    )
    assert sorted(by_id(result)) == ["", "fa:000"]


def test_a_same_model_large_in_short_out_one_shot_is_a_reduction() -> None:
    result = split(session(*main_chain(), req(5, [900], in_tokens=50_000, out=500)))
    assert sorted(by_id(result)) == ["", "aux:red:000"]
    # out >= 4000, or in/out <= 20: an agent.
    result = split(session(*main_chain(), req(5, [900], in_tokens=50_000, out=4000)))
    assert sorted(by_id(result)) == ["", "fa:000"]
    result = split(session(*main_chain(), req(5, [900], in_tokens=50_000, out=2500)))
    assert sorted(by_id(result)) == ["", "fa:000"]


def test_three_overlapping_forks_from_one_point_are_a_worker_group() -> None:
    # Main m0 holds ids 1..10; three workers fork at depth 3 from it and run concurrently, with tails shorter
    # than m0's so each forks from m0 (not from a sibling), then main goes on (so m0 is not dead: no seam).
    def worker(n: int, t: float) -> list[Request]:
        base = [1, 2, 3, 500 + 10 * n]
        return [req(t, base, api=5, in_tokens=50_000), req(t + 6, [*base, 501 + 10 * n], api=5, in_tokens=50_000)]

    workers = [r for n, t in enumerate((2.0, 2.5, 3.0)) for r in worker(n, t)]
    main = [req(0, range(1, 11), api=1), req(30, range(1, 12), api=1)]
    result = split(session(*main, *workers))
    agents = by_id(result)
    assert sorted(agents) == ["", "wg:000_000", "wg:000_001", "wg:000_002"]
    assert [r.t for r in agents["wg:000_001"].requests] == [2.5, 8.5]
    assert {a.spawn_after for a in agents.values() if a.agent_id} == {1}
    # Two such workers are no group: solo agents, numbered by first request.
    result = split(session(*main, *workers[:4]))
    assert sorted(by_id(result)) == ["", "fa:000", "fa:001"]
    # Three that never overlap are no group either.
    apart = [r for n, t in enumerate((2.0, 14.0, 26.0)) for r in worker(n, t)]
    result = split(session(req(0, range(1, 11), api=1), req(40, range(1, 12), api=1), *apart))
    assert sorted(by_id(result)) == ["", "fa:000", "fa:001", "fa:002"]


def test_a_multi_request_chain_with_its_own_prefix_is_an_agent() -> None:
    flat = session(*main_chain(4), req(5, [900], in_tokens=1000), req(7, [900, 901], in_tokens=1100))
    result = split(flat)
    agents = by_id(result)
    assert sorted(agents) == ["", "fa:000"]
    assert [r.t for r in agents["fa:000"].requests] == [5, 7]
    assert agents["fa:000"].spawn_after == 1  # after m0 (t=0), the last main request before t=5
    assert [r.t for r in agents[""].requests] == [0, 10, 20, 30]
    # Moved requests are re-encoded against their new predecessor.
    assert [(r.hash_ids_kept, r.hash_ids_added) for r in agents["fa:000"].requests] == [(0, (900,)), (1, (901,))]


def test_chains_are_numbered_by_first_request_across_kinds() -> None:
    flat = session(
        *main_chain(4),
        req(3, [700], in_tokens=1000),  # aux, first
        req(5, [800], in_tokens=50_000, out=6000),  # fa, second
        req(7, [900], in_tokens=50_000, out=500),  # aux:red, third
    )
    assert sorted(by_id(split(flat))) == ["", "aux:000", "aux:red:002", "fa:001"]


# ---------------------------------------------------------------------------------------------
# preamble, seams, continuation, ids


def test_a_small_prefix_disjoint_first_request_is_a_preamble_kept_on_main() -> None:
    conversation = [req(1, [1, 2]), req(3, [1, 2, 3]), req(5, [1, 2, 3, 4])]
    s = session(req(0, [900, 901], out=10), *conversation)
    assert split_flattened_agents(s) is s  # without the rule the title call would found the main chain
    # A large one whose blocks appear nowhere else is a preamble too.
    s = session(req(0, [900, 901], out=500), *conversation)
    assert split_flattened_agents(s) is s
    # A large one whose blocks reappear (not as a prefix) is a real first turn: it founds the main chain.
    s = session(req(0, [900, 901], out=500), req(1, [1, 2]), req(3, [1, 2, 901]), req(5, [1, 2, 901, 4]))
    result = split(s)
    assert [r.t for r in result.root.requests] == [0]
    assert [r.t for r in by_id(result)["fa:000"].requests] == [1, 3, 5]
    # A preamble sharing a prefix with anyone is no preamble (and is the main chain's first request).
    s = session(req(0, [1, 9], out=10), *conversation)
    assert split_flattened_agents(s) is s  # [1, 2] forks from [1, 9] and, dead tail, seams onto it


def test_a_compaction_continues_its_chain_when_the_longer_state_is_never_reused() -> None:
    s = session(req(0, range(1, 7), api=0.5), req(2, [1, 2, 90, 91]), req(4, [1, 2, 90, 91, 92]))
    assert split_flattened_agents(s) is s
    # Pulled back to later: the shrunk request was another agent reading the shared prefix.
    s = session(req(0, range(1, 7), api=0.5), req(2, [1, 2, 90, 91]), req(4, range(1, 8)))
    result = split(s)
    assert [r.t for r in result.root.requests] == [0, 4]
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[2]]


def test_a_far_low_overlap_resume_spawns_but_a_far_high_overlap_one_continues() -> None:
    # Gap 4000 s > 3600 s and kept 2 of 6 ids (0.33 < 0.5): a new conversation on the same base prefix.
    far_low = session(req(0, range(1, 7), api=0.5), req(4000, [1, 2, 90]))
    result = split(far_low)
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[4000]]
    # Kept 4 of 6 (0.67): a verbatim-ish resume, the same conversation.
    far_high = session(req(0, range(1, 7), api=0.5), req(4000, [1, 2, 3, 4, 90]))
    assert split_flattened_agents(far_high) is far_high
    # A near low-overlap one is a compaction.
    near_low = session(req(0, range(1, 7), api=0.5), req(3000, [1, 2, 90]))
    assert split_flattened_agents(near_low) is near_low
    # The guard is configurable.
    assert split_flattened_agents(far_low, ChainRules(seam_max_gap_seconds=5000)) is far_low
    assert split_flattened_agents(far_low, ChainRules(seam_min_overlap_ratio=0.3)) is far_low


def test_a_chain_continues_only_on_the_same_model_after_its_tail_ends() -> None:
    # Same-prefix growth on another model: a separate chain (here a cross-model aux sidecar).
    result = split(session(req(0, [1, 2]), req(2, [1, 2, 3], model="haiku"), req(4, [1, 2, 3, 4])))
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[2]]
    # Growth that starts while the tail is still in flight: a parallel reader, not a continuation.
    result = split(session(req(0, [1, 2], api=10), req(5, [1, 2, 3], api=1), req(12, [1, 2, 4])))
    assert [r.t for r in result.root.requests] == [0, 12]
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[5]]


def test_requests_without_ids_stay_on_the_main_chain() -> None:
    s = session(req(0, [1]), req(1, []), req(2, [900], in_tokens=1000), req(4, []), req(6, [1, 2]))
    result = split(s)
    assert [r.t for r in result.root.requests] == [0, 1, 4, 6]
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[2]]
    assert split_trace(Trace(sessions=[s], block_size=64))[1].sessions["s"].without_ids == 2


# ---------------------------------------------------------------------------------------------
# placement


def test_explicit_subagents_keep_their_spawn_point_among_the_remaining_requests() -> None:
    # Root r0 (0), flat chain c (2, 3), r1 (5), explicit X after r1 (index 3 of the flat list), r2 (9).
    x = sub("X", 4, req(6, [500]))
    s = session(
        req(0, [1]), req(2, [900], in_tokens=50_000, out=6000), req(3, [900, 901]), req(5, [1, 2]), req(9, [1, 2, 3])
    )
    s.root.subagents = [msgspec.structs.replace(x, spawn_after=4)]
    result = split(s)
    agents = by_id(result)
    assert [r.t for r in agents[""].requests] == [0, 5, 9]
    assert agents["X"].spawn_after == 2  # still right after r1
    assert agents["fa:000"].spawn_after == 1
    assert [a.agent_id for a in result.root.subagents] == ["fa:000", "X"]


def test_chains_inside_a_subagent_join_its_branch_as_siblings() -> None:
    # X (after r0, spawn 1.0, 20 s) holds two interleaved conversations; the root joins it at r1 (t=30).
    inner = [req(1, [500]), req(2, [600], in_tokens=50_000, out=6000), req(4, [500, 501]), req(5, [600, 601])]
    x = Agent(agent_id="X", spawn_after=1, t=1.0, duration_ms=20_000, subagent_type="Explore", requests=encode(inner))
    s = session(req(0, [1]), req(30, [1, 2]), subagents=[x])
    result = split(s)
    agents = by_id(result)
    assert [a.agent_id for a in result.root.subagents] == ["X", "X:fa:000"]
    sibling = agents["X:fa:000"]
    assert [r.t for r in sibling.requests] == [2, 5]
    assert (sibling.spawn_after, sibling.t, sibling.duration_ms, sibling.subagent_type) == (1, 1.0, 20_000, "Explore")
    assert [r.t for r in agents["X"].requests] == [1, 4]
    plan = plan_session(result, barriers=False)
    r1 = next(step for step in plan.steps if step.agent_id == "" and step.turn == 1)
    lasts = {plan.steps[j].agent_id for j in r1.joins}
    assert lasts == {"X", "X:fa:000"}  # the root waits for the whole branch, as for the recorded subagent
    # "child" puts it under X instead, spawned after X's last request before it.
    result = split(s, subagent_chains="child")
    agents = by_id(result)
    assert [a.agent_id for a in agents["X"].subagents] == ["X:fa:000"]
    assert agents["X:fa:000"].spawn_after == 1


def test_a_derived_chain_gets_the_declared_prefix_only_if_it_starts_with_its_blocks() -> None:
    # tool 100 tokens at block size 64: 2 declared blocks, ids [7, 8] on the main chain.
    s = session(
        req(0, [7, 8, 1]),
        req(2, [7, 8, 50], api=5, in_tokens=50_000, out=6000),  # shares [7, 8]
        req(3, [9, 8, 60], in_tokens=50_000, out=6000),  # does not
        req(10, [7, 8, 1, 2]),
        tool_tokens=100,
    )
    result = split(s)
    agents = by_id(result)
    assert (agents["fa:000"].tool_tokens, agents["fa:001"].tool_tokens, agents[""].tool_tokens) == (100, 0, 100)


def test_agent_ids_stay_unique_when_a_name_is_taken() -> None:
    taken = sub("fa:000", 1, req(1, [300]))
    s = session(req(0, [1]), req(2, [900], in_tokens=50_000, out=6000), req(4, [1, 2]), subagents=[taken])
    result = split(s)
    assert sorted(by_id(result)) == ["", "fa:000", "fa:000~2"]


# ---------------------------------------------------------------------------------------------
# real data


def test_weka_samples_split_without_losing_requests(weka_sample_files: list[Path]) -> None:
    for path in weka_sample_files:
        trace = load_trace(path)
        result, report = split_trace(trace)
        assert result.request_count == trace.request_count
        assert [f for f in validate(result) if f.severity == "error"] == []
        for before, after in zip(trace.sessions, result.sessions, strict=True):
            assert all_keys(after) == all_keys(before)
            assert before.session_id in report.sessions
        assert report.sessions_split == sum(1 for c in report.sessions.values() if c.chains)


def test_the_report_counts_chains_per_kind() -> None:
    s = session(
        *main_chain(4),
        req(3, [700], in_tokens=1000),
        req(5, [800], in_tokens=50_000, out=6000),
        req(7, [900], in_tokens=50_000, out=500),
    )
    trace = Trace(sessions=[s, session(req(0, [1]))], block_size=64)
    trace.sessions[1].session_id = "t"
    result, report = split_trace(trace)
    counts = report.sessions["s"]
    assert (counts.aux, counts.fa, counts.aux_red, counts.wg, counts.chains) == (1, 1, 1, 0, 3)
    assert report.sessions["t"].chains == 0 and result.sessions[1] is trace.sessions[1]
    assert report.sessions_split == 1 and report.total.chains == 3


def test_chained_compactions_collapse_into_one_chain_and_a_worker_absorbs_its_own() -> None:
    # Three compactions in a row, each a shorter prefix plus new ids: one conversation.
    s = session(
        req(0, range(1, 7), api=0.5), req(2, [1, 2, 70, 71, 72, 73]), req(4, [1, 2, 70, 80, 81]), req(6, [1, 2, 70, 90])
    )
    assert split_flattened_agents(s) is s
    # A worker forks at depth 2, grows, and compacts itself while main goes on: the compaction stays its own.
    s = session(
        req(0, [1, 2, 3], api=0.5),
        req(2, [1, 2, 50, 51, 52, 53], api=0.5, in_tokens=50_000, out=6000),
        req(3, [1, 2, 50, 51, 52, 53, 54], api=0.5),
        req(5, [1, 2, 3, 4, 5], api=0.5),
        req(6, [1, 2, 70, 71], api=0.5),
    )
    result = split(s)
    assert [r.t for r in result.root.requests] == [0, 5]
    assert [[r.t for r in a.requests] for a in result.root.subagents] == [[2, 3, 6]]


@settings(max_examples=examples(300), deadline=None)
@given(
    tails=st.lists(st.lists(st.integers(min_value=-2, max_value=3), max_size=6).map(tuple), max_size=12),
    h=st.lists(st.integers(min_value=-2, max_value=3), min_size=1, max_size=7).map(tuple),
)
def test_the_fork_search_finds_what_a_scan_of_every_tail_finds(
    tails: list[tuple[int, ...]], h: tuple[int, ...]
) -> None:
    """The neighbours-in-sorted-order search equals the plain rule: the deepest common prefix (first id at
    least), then the longest tail, then the lowest chain."""
    from agentx.trace.chain_detection import common_prefix_len, deepest_fork, sort_key

    best, expected = (0, 0), None
    for c, tail in enumerate(tails):
        if tail and tail[0] == h[0]:
            key = (common_prefix_len(tail, h), len(tail))
            if key > best:
                expected, best = c, key
    by_ids = sorted((sort_key(tail), c) for c, tail in enumerate(tails) if tail)
    assert deepest_fork(by_ids, sort_key(h)) == (expected, best[0])
