"""The agentx mode end to end against the simulator: t* and warmup, cache-bust markers, errors (docs/agentx.md §2e,
§4d, §5)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from builders import growing_chain, make_agent, make_session, make_trace
from flat import replay_options
from paths import SAMPLE_TRACE

from agentx.errors import WarmupFailed
from agentx.records.record import RequestRecord, read_records, to_records
from agentx.replayer.options.replay import AgentxLoad, ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.plan.steps import plan_session
from agentx.replayer.plan.tstar import snapshot, t_star
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.results.summary.summarize import summarize
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK) as server:
        yield server


def _chain(session_id: str, n: int, *, gap_s: float = 1.0, base: int = 0) -> Session:
    """`n` root turns `gap_s` apart, each 0.5 s long, the context growing by ~2 blocks a turn."""
    return make_session(session_id, growing_chain(n, gap_s=gap_s, base=base, block_size=BLOCK))


def _run(trace: Trace, options: ReplayOptions) -> tuple[RunResult, list[RequestRecord]]:
    result = asyncio.run(run_replay(trace, options))
    return result, to_records(read_records(result.records_path))


def _options(sim: SimServer, out_dir: Path, **fields: object) -> ReplayOptions:
    base: dict[str, object] = {"delay_scale": 0.02, "grace_s": 5.0, "seed": 3}
    base.update(fields)
    return replay_options(url=sim.url, model=sim.model, out_dir=out_dir, **base)


def test_warmup_primes_the_turn_before_t_star_and_every_lane_resumes_together(sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(*(_chain(f"s{i}", 12, base=1000 * i) for i in range(3)), block_size=BLOCK)
    options = _options(sim, tmp_path, concurrency=3, sessions=3)
    assert isinstance(options.load, AgentxLoad)
    window = options.load.tstar_window
    result, records = _run(trace, options)
    warmup = [r for r in records if r.phase == "warmup"]
    profiling = [r for r in records if r.phase == "profiling"]
    assert result.warmup_requests == len(warmup) == 3
    for lane, session in enumerate(trace.sessions):
        plan = plan_session(session)
        at = t_star(3, session.session_id, lane, plan, window)
        state = snapshot(plan, at)
        (primer,) = state.primers
        (first,) = state.first_live
        mine = [r for r in warmup if r.session_id == session.session_id]
        assert [r.turn for r in mine] == [plan.steps[primer].turn]
        assert mine[0].osl_server_tokens == 1  # a primer asks for one token
        # Profiling sends exactly the turns from t* on, once each.
        sent = sorted(r.turn for r in profiling if r.session_id == session.session_id)
        assert sent == list(range(plan.steps[first].turn, 12))
    # No profiling request starts before the last primer returned: every lane's t* is the same instant.
    assert min(r.sent_ns for r in profiling) >= max(r.end_ns for r in warmup)
    # The spread: a primer with lead L goes out (max lead − L) × delay_scale after the warmup starts.
    leads = {}
    for lane, session in enumerate(trace.sessions):
        plan = plan_session(session)
        (lead,) = snapshot(plan, t_star(3, session.session_id, lane, plan, window)).primers.values()
        leads[session.session_id] = lead
    start = min(r.scheduled_ns for r in warmup)
    for record in warmup:
        expected_ns = (max(leads.values()) - leads[record.session_id]) * options.scenario.delay_scale * 1e9
        assert record.scheduled_ns - start == pytest.approx(expected_ns, abs=2e6)
    # The summary leaves the warmup out of every figure.
    summary = summarize(read_records(result.records_path))
    assert summary.counts.warmup_excluded == 3
    assert summary.counts.kept == len(profiling)


def test_a_recycled_tree_gets_a_new_marker_and_no_cache_from_its_previous_play(sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(_chain("only", 4), block_size=BLOCK)
    _, records = _run(trace, _options(sim, tmp_path, mode="agentx", sessions=3, tstar_window=(0.0, 0.0)))
    plays = sorted({r.play for r in records})
    assert len(plays) == 3
    for play in plays:
        mine = sorted((r for r in records if r.play == play and r.phase == "profiling"), key=lambda r: r.turn)
        assert mine[0].cache_bust_tokens == 8 and mine[0].isl_sent_tokens == mine[0].isl_recorded_tokens + 8
        assert mine[0].isl_server_tokens == mine[0].isl_sent_tokens
        # Within a play the prefix cache works; a new play's marker makes its first turn miss entirely.
        assert (mine[0].cached_tokens or 0) == 0
        assert all((r.cached_tokens or 0) > 0 for r in mine[1:])


def test_markers_are_identical_across_runs_with_one_benchmark_id(sim: SimServer, tmp_path: Path) -> None:
    """Same seed and benchmark id: the second run's first turns hit the cache the first run left."""
    trace = make_trace(_chain("again", 3, base=777), block_size=BLOCK)
    fields = {"sessions": 1, "tstar_window": (0.0, 0.0), "benchmark_id": "fixed"}
    _, first = _run(trace, _options(sim, tmp_path / "a", **fields))
    _, second = _run(trace, _options(sim, tmp_path / "b", **fields))
    assert (min(first, key=lambda r: r.turn).cached_tokens or 0) == 0
    assert (min(second, key=lambda r: r.turn).cached_tokens or 0) > 0
    _, third = _run(trace, _options(sim, tmp_path / "c", sessions=1, tstar_window=(0.0, 0.0)))
    assert (min(third, key=lambda r: r.turn).cached_tokens or 0) == 0  # a fresh run id: a fresh marker


def test_same_seed_same_t_star_other_seed_other(sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(_chain("x", 30), block_size=BLOCK)

    def first_profiled_turn(seed: int, name: str) -> int:
        _, records = _run(trace, _options(sim, tmp_path / name, seed=seed, sessions=1, delay_scale=0.0))
        return min(r.turn for r in records if r.phase == "profiling")

    assert first_profiled_turn(1, "a") == first_profiled_turn(1, "b")
    assert len({first_profiled_turn(seed, f"s{seed}") for seed in range(2, 8)}) > 1


def test_chat_markers_count_exactly(sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(_chain("c", 5), block_size=BLOCK)
    _, records = _run(trace, _options(sim, tmp_path, api="chat", sessions=2, tstar_window=(0.5, 0.5)))
    for record in records:
        assert record.cache_bust_tokens == 4
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens + 4


def test_a_failed_root_primer_stops_the_run_before_profiling(tmp_path: Path) -> None:
    with SimServer(time_scale=0.01, block_size=BLOCK, max_model_len=200) as small:
        trace = make_trace(_chain("big", 12), block_size=BLOCK)  # later turns exceed 200 tokens
        options = ReplayOptions(
            server=Server(url=small.url, model=small.model),
            out_dir=tmp_path,
            load=AgentxLoad(tstar_window=(0.9, 0.9)),
            scenario=Scenario(sessions=1, delay_scale=0),
        )
        with pytest.raises(WarmupFailed, match="warmup primer"):
            asyncio.run(run_replay(trace, options))
    records = to_records(read_records(tmp_path / "records.arrow"))
    assert records and all(r.phase == "warmup" for r in records)


def test_a_context_overflow_ends_the_session_and_a_generic_error_does_not(tmp_path: Path) -> None:
    with SimServer(time_scale=0.01, block_size=BLOCK, max_model_len=200) as small:
        trace = make_trace(_chain("grows", 10), block_size=BLOCK)
        options = ReplayOptions(
            server=Server(url=small.url, model=small.model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(sessions=1, delay_scale=0),
        )
        result, records = _run(trace, options)
    overflows = [r for r in records if r.error_kind == "context_overflow"]
    assert len(overflows) == 1  # the first too-long turn; the session ended there
    assert max(r.turn for r in records) == overflows[0].turn
    assert result.skipped_context_overflow == 10 - len(records)


def test_generic_errors_never_end_a_session(tmp_path: Path) -> None:
    with SimServer(time_scale=0.01, block_size=BLOCK, faults=FaultConfig(error_500_rate=0.5, seed=1)) as flaky:
        trace = make_trace(_chain("flaky", 10), block_size=BLOCK)
        options = ReplayOptions(
            server=Server(url=flaky.url, model=flaky.model, stream_usage="final"),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(sessions=1, delay_scale=0),
        )
        result, records = _run(trace, options)
    assert sorted(r.turn for r in records) == list(range(10))  # every turn sent, failed ones included
    assert 0 < result.errors < 10 and result.skipped_context_overflow == 0


def test_the_failure_threshold_cancels_the_run(tmp_path: Path) -> None:
    with SimServer(time_scale=0.001, block_size=BLOCK, faults=FaultConfig(error_500_rate=1.0)) as failing:
        trace = make_trace(*(_chain(f"f{i}", 5, base=100 * i) for i in range(20)), block_size=BLOCK)
        options = ReplayOptions(
            server=Server(url=failing.url, model=failing.model, stream_usage="final"),
            out_dir=tmp_path,
            load=ClosedLoad(concurrency=2),
            scenario=Scenario(delay_scale=0, failed_request_threshold=0.1),
        )
        result, records = _run(trace, options)
    assert result.cancel_reason == "failure_threshold"
    assert len(records) < trace.request_count
    assert msgspec.structs.asdict(result)["interrupted"] is False


def test_broken_locks_make_the_run_an_invalid_submission(sim: SimServer, tmp_path: Path) -> None:
    from agentx.replayer.options.locks import locks_broken
    from agentx.run.replay import replay

    faithful = ReplayOptions(server=Server(url="u", model="m"), out_dir=tmp_path, scenario=Scenario(duration_s=1800.0))
    assert locks_broken(faithful) == []
    assert locks_broken(msgspec.structs.replace(faithful, load=ClosedLoad())) == [
        "mode closed: the AgentX rules apply to --mode agentx only"
    ]
    assert locks_broken(msgspec.structs.replace(faithful, scenario=Scenario(duration_s=60.0, delay_scale=0.5))) == [
        "duration 60 s, below the rules' 900 s minimum (--duration)",
        "recorded delays scaled by 0.5 (--delay-scale); the rules replay them as recorded",
    ]
    trace = make_trace(_chain("v", 6), block_size=BLOCK)
    result = asyncio.run(replay(trace, _options(sim, tmp_path / "run", sessions=1)))
    validity = result.summary.validity
    assert validity is not None and not validity.valid and validity.reasons == ["unsafe_override"]


def test_the_run_reports_each_lanes_snapshot_at_t_star(sim: SimServer, tmp_path: Path) -> None:
    trace = make_trace(*(_chain(f"r{i}", 10, base=100 * i) for i in range(2)), block_size=BLOCK)
    result, records = _run(trace, _options(sim, tmp_path, concurrency=2, sessions=2))
    assert [entry.lane for entry in result.tstar] == [0, 1]
    for entry in result.tstar:
        plan = plan_session(next(s for s in trace.sessions if s.session_id == entry.session_id))
        assert entry.t_star_s == t_star(3, entry.session_id, entry.lane, plan)
        assert entry.live_agents == [""] and entry.primers == 1
        first = min(r.turn for r in records if r.session_id == entry.session_id and r.phase == "profiling")
        assert entry.done_steps == first


def test_cli_flags_reach_the_options(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    sample = SAMPLE_TRACE
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(sample), "--sessions", "1", "--delay-scale", "0",
        "--sim-time-scale", "0.01", "--tstar-window", "0.5,0.5", "--warmup", "burst", "--warmup-max-tokens", "2",
        "--cache-bust", "salt", "--system-idle-cap", "off", "--tree-idle-cap", "30", "--chain-rule",
        "aux_isl_floor=8192", "--context-overflow-substring", "too long", "--out", str(tmp_path / "run"), "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    options = json.loads((tmp_path / "run" / "run.json").read_text())["options"]
    assert options["tstar_window"] == [0.5, 0.5] and options["warmup"] == "burst"
    assert options["warmup_max_tokens"] == 2 and options["cache_bust"] == "salt"
    assert options["system_idle_cap_s"] is None and options["tree_idle_cap_s"] == 30.0
    assert options["chain_rules"]["aux_isl_floor"] == 8192 and options["context_overflow_substrings"] == ["too long"]
    bad = subprocess.run([*command[:9], "--chain-rule", "nonsense=1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "nonsense" in bad.stderr


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_cache_pressure_stage_sends_its_budget_then_hands_over(sim: SimServer, tmp_path: Path, api: str) -> None:
    trace = make_trace(*(_chain(f"p{i}", 14, base=100 * i) for i in range(2)), block_size=BLOCK)
    options = _options(
        sim, tmp_path, concurrency=2, sessions=2, warmup_requests_per_lane=3, tstar_window=(0.2, 0.2), api=api
    )
    result, records = _run(trace, options)
    assert result.errors == 0
    warmup = [r for r in records if r.phase == "warmup"]
    profiling = [r for r in records if r.phase == "profiling"]
    # 2 primers, then 3 × 2 lanes of pressure requests, all with warmup-sized outputs.
    assert len(warmup) == 2 + 6 and all(r.osl_server_tokens == 1 for r in warmup)
    # Nothing profiled before the pressure stage drained; each turn sent once, in either phase.
    assert min(r.sent_ns for r in profiling) >= max(r.end_ns for r in warmup)
    for session in trace.sessions:
        turns = sorted(r.turn for r in records if r.session_id == session.session_id)
        assert turns == sorted(set(turns)) and turns == list(range(turns[0], 14))
    if api == "chat":
        assert all(r.isl_server_tokens == r.isl_sent_tokens for r in records)


def test_the_weka_sample_replays_in_agentx_mode_without_client_errors(
    weka_sample_files: list[Path], tmp_path: Path
) -> None:
    """The held-out real traces through the whole scenario: split chains, t*, primers, pressure, idle caps."""
    from agentx.trace.chains import split_trace
    from agentx.trace.io import load_trace
    from agentx.trace.stats import prefix_cache_hits

    trace = load_trace(weka_sample_files[0])
    for path in weka_sample_files[1:]:
        trace.sessions.extend(load_trace(path).sessions)
    with SimServer(time_scale=0.0005, block_size=trace.block_size) as server:
        options = ReplayOptions(
            server=Server(url=server.url, model=server.model),
            out_dir=tmp_path,
            load=AgentxLoad(concurrency=len(trace.sessions), warmup_requests_per_lane=2),
            scenario=Scenario(delay_scale=0.0002, tree_idle_cap_s=300.0),
        )
        result, records = _run(trace, options)
    assert result.errors == 0 and result.cancel_reason is None
    assert len(result.tstar) == len(trace.sessions) and result.warmup_requests > len(trace.sessions)
    # Each record carries its turn's theoretical hit from the (split) trace, as `agentx inspect` computes it.
    split, _ = split_trace(trace)
    hits, totals = prefix_cache_hits(split)
    row = 0
    expected: dict[tuple[str, str, int], tuple[int, int]] = {}
    for session in split.sessions:
        for agent, _, _ in session.agents():
            for turn in range(len(agent.requests)):
                expected[(session.session_id, agent.agent_id, turn)] = (int(hits[row]), int(totals[row]))
                row += 1
    for record in records:
        key = (record.session_id, record.agent_id, record.turn)
        assert (record.theoretical_hit_blocks, record.theoretical_total_blocks) == expected[key]
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens + 8


@pytest.mark.parametrize("rules", ["agentx-harness-1.0.12", "aiperf-0.13.0"])
@pytest.mark.parametrize("warmup", ["spread", "burst"])
def test_burst_also_starts_each_lanes_earliest_live_turn_at_the_profiling_start(
    sim: SimServer, tmp_path: Path, warmup: str, rules: str
) -> None:
    """Turns 10 s apart, t* at the middle of the span (45 s): under AIPerf 0.13.0's rules the first live turn (50 s)
    is due 5 s × 0.1 after the profiling start in spread; the reference's `--burst-phase-starts` sends it at the
    start. The harness's one phase-wide start sends the earliest live turn over every lane at the start in both
    (§4d)."""
    trace = make_trace(_chain("s", 10, gap_s=10.0), block_size=BLOCK)
    options = _options(sim, tmp_path, sessions=1, tstar_window=(0.5, 0.5), delay_scale=0.1, warmup=warmup, rules=rules)
    _, records = _run(trace, options)
    (primer,) = [r for r in records if r.phase == "warmup"]
    first = min((r for r in records if r.phase == "profiling"), key=lambda r: r.sent_ns)
    assert (primer.turn, first.turn) == (4, 5)
    gap_s = (first.scheduled_ns - primer.end_ns) / 1e9
    if warmup == "spread" and rules == "aiperf-0.13.0":
        assert 0.45 <= gap_s <= 0.6
    else:
        assert gap_s < 0.05


@pytest.mark.parametrize("quota", [4, 6])
def test_a_subagent_spawned_in_the_pressure_stage_takes_the_quota_first_but_goes_out_after_its_parents_turn(
    sim: SimServer, tmp_path: Path, quota: int
) -> None:
    """agentx-harness 1.0.12 (§4d): root turns 0–2 go out as cache-pressure requests; the return of turn 2 spawns a
    subagent and releases the root's turn 3. The subagent takes the lane's quota first (with one slot left it goes
    in warmup and turn 3 waits for profiling), but when both go, turn 3 reaches the server first."""
    root = growing_chain(8, block_size=BLOCK)
    sub = make_agent("sub", growing_chain(2, start=2.5, base=500, block_size=BLOCK), spawn_after=3, t=2.5)
    trace = make_trace(make_session("spawning", root, subagents=[sub]), block_size=BLOCK)
    options = _options(sim, tmp_path, sessions=1, tstar_window=(0.0, 0.0), warmup_requests_per_lane=quota)
    _, records = _run(trace, options)
    by_key = {(r.agent_id, r.turn): r for r in records}
    parent_next, sub_first = by_key[("", 3)], by_key[("sub", 0)]
    assert [by_key[("", turn)].phase for turn in range(3)] == ["warmup"] * 3
    assert sub_first.phase == "warmup"
    if quota == 4:
        assert parent_next.phase == "profiling"
    else:
        assert parent_next.phase == "warmup"
        assert parent_next.sent_ns < sub_first.sent_ns


def test_the_harness_presses_each_lane_to_its_quota_and_hands_the_rest_over_at_their_recorded_offsets(
    sim: SimServer, tmp_path: Path
) -> None:
    """agentx-harness 1.0.12 (§4d): each lane sends `warmup_requests_per_lane` cache-pressure requests beside its
    primers, its further turns wait; profiling then sends each stream's next turn at its recorded offset from its
    tree's t* less the earliest such offset over every lane (one phase-wide start), with no residual delay."""
    trace = make_trace(_chain("long", 40, gap_s=2.0), _chain("longer", 60, gap_s=3.0, base=1000), block_size=BLOCK)
    options = _options(
        sim, tmp_path, concurrency=2, sessions=2, warmup_requests_per_lane=4, delay_scale=0.01, tstar_window=(0.2, 0.3)
    )
    result, records = _run(trace, options)
    warmup = [r for r in records if r.phase == "warmup"]
    profiling = sorted((r for r in records if r.phase == "profiling"), key=lambda r: r.sent_ns)
    by_lane: dict[int, list[RequestRecord]] = {}
    for record in warmup:
        by_lane.setdefault(record.lane, []).append(record)
    starts = {start.lane: start.t_star_s for start in result.tstar}
    for sent in by_lane.values():
        assert len(sent) == 1 + 4  # the primer, then the lane's quota
        turns = sorted(r.turn for r in sent)
        assert turns == list(range(turns[0], turns[0] + 5))  # the primer and the next four turns, back to back
    assert result.profiling_start_ns is not None
    start_ns = result.profiling_start_ns
    # Each lane's first profiling turn: the one after its last pressure request, due at its offset from t* less the
    # earliest of the two offsets, after the profiling start.
    firsts = {lane: min((r for r in profiling if r.lane == lane), key=lambda r: r.sent_ns) for lane in by_lane}
    plans = {s.session_id: s for s in trace.sessions}
    offsets = {}
    for lane, first in firsts.items():
        assert first.turn == max(r.turn for r in by_lane[lane]) + 1
        request = plans[first.session_id].root.requests[first.turn]
        offsets[lane] = request.t - starts[lane]
    cut = min(offsets.values())
    for lane, first in firsts.items():
        expected_ns = start_ns + (offsets[lane] - cut) * 0.01 * 1e9
        assert first.scheduled_ns == pytest.approx(expected_ns, abs=3e6)
