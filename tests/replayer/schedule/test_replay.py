"""End-to-end tests of `run_replay` over real HTTP against the simulator (agentx.sim)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import growing_chain, make_agent, make_request, make_session, make_trace
from flat import replay_options
from paths import SAMPLE_TRACE

from agentx.records.record import RequestRecord, read_records, run_info, to_records
from agentx.replayer.http.client import ModelNotServed
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.plan.steps import plan_session
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import RunStops
from agentx.results.summary.summarize import summarize
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace
from agentx.trace.model import Request, Session, Trace
from agentx.trace.stats import prefix_cache_hits

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK) as server:
        yield server


def _chain(start: float, n: int, *, out: int = 8, base: int = 0) -> list[Request]:
    """`n` growing-context requests 1 s apart, each 0.5 s long (ids extend the previous request's)."""
    return growing_chain(n, start=start, out=out, base=base, block_size=BLOCK)


def _flat_session(session_id: str, n: int) -> Session:
    return make_session(session_id, _chain(0.0, n))


def _joined_session(session_id: str) -> Session:
    """Root r0 → subagent (3 long requests) → root r1 joins it; r1's own delay is far shorter than the subagent."""
    sub = make_agent("sub", _chain(1.0, 3, out=400, base=1000), spawn_after=1, t=1.0)
    root = [
        make_request(0.0, 50, 4, api_time=0.5, added=(0, 1, 2, 3)),
        make_request(3.6, 90, 4, api_time=0.5, kept=4, added=(4, 5)),
    ]
    return make_session(session_id, root, subagents=[sub])


def _background_session(session_id: str) -> Session:
    """The root ends quickly; its subagent (nobody joins it) runs on long after."""
    sub = make_agent("bg", _chain(0.6, 3, out=150, base=500), spawn_after=1, t=0.6)
    root = [
        make_request(0.0, 33, 2, api_time=0.5, added=(0, 1, 2)),
        make_request(0.7, 70, 2, api_time=0.1, kept=2, added=(2, 3, 4)),
    ]
    # The last subagent request ends at 0.6 + 2 + 0.5 > the root's end, so join_index is None.
    return make_session(session_id, root, subagents=[sub])


def _trace(*sessions: Session) -> Trace:
    return make_trace(*sessions, block_size=BLOCK)


def _options(server: SimServer, out_dir: Path, **kwargs: object) -> ReplayOptions:
    fields: dict[str, object] = {"delay_scale": 0.01, "grace_s": 5.0}
    fields.update(kwargs)
    return replay_options(mode="closed", url=server.url, model=server.model, out_dir=out_dir, **fields)


def _replay(trace: Trace, options: ReplayOptions) -> tuple[RunResult, list[RequestRecord]]:
    result = asyncio.run(run_replay(trace, options))
    table = read_records(result.records_path)
    assert run_info(table).run_id == result.run_id
    return result, to_records(table)


def _assert_exact(records: list[RequestRecord]) -> None:
    for record in records:
        assert record.status == "ok", record.error_message
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens
        assert record.osl_server_tokens == max(1, record.osl_recorded_tokens)
        assert record.osl_streamed_tokens == record.osl_server_tokens
        assert record.first_token_ns is not None and record.sent_ns <= record.first_token_ns <= record.end_ns


def test_every_request_once_with_exact_lengths(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(_flat_session("a", 4), _joined_session("b"), _background_session("c"))
    seen: list[RequestRecord] = []
    result = asyncio.run(run_replay(trace, _options(sim, tmp_path, concurrency=2), RunHooks(on_record=seen.append)))
    records = to_records(read_records(result.records_path))
    assert result.requests == len(records) == len(seen) == trace.request_count
    assert result.errors == 0 and not result.interrupted
    assert result.trees_started == result.trees_finished == 3
    keys = sorted((r.session_id, r.agent_id, r.turn) for r in records)
    assert len(set(keys)) == len(keys)
    _assert_exact(records)
    assert {r.phase for r in records} == {"profiling"}
    assert {r.run_id for r in records} == {result.run_id}
    info = run_info(read_records(result.records_path))
    assert "api_key" not in info.options and info.options["model"] == sim.model


def test_api_key_never_stored(sim: SimServer, tmp_path: Path) -> None:
    options = _options(sim, tmp_path, api_key="sk-secretsecret123", headers=(("X-Auth", "hidden-value"),))
    result, _ = _replay(_trace(_flat_session("a", 1)), options)
    raw = result.records_path.read_bytes()
    assert b"secretsecret" not in raw and b"hidden-value" not in raw


def test_join_waits_for_subagent(sim: SimServer, tmp_path: Path) -> None:
    _, records = _replay(_trace(_joined_session("j")), _options(sim, tmp_path))
    _assert_exact(records)
    sub_end = max(r.end_ns for r in records if r.agent_id == "sub")
    parent = next(r for r in records if r.agent_id == "" and r.turn == 1)
    assert parent.sent_ns >= parent.scheduled_ns >= sub_end
    first = next(r for r in records if r.agent_id == "" and r.turn == 0)
    assert first.end_ns + 31_000_000 < sub_end  # the join, not r1's own 3.1 s x 0.01 delay, held r1 back
    sub_first = next(r for r in records if r.agent_id == "sub" and r.turn == 0)
    assert sub_first.sent_ns >= first.end_ns


def test_background_subagent_holds_the_lane(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(_background_session("s1"), _flat_session("s2", 2))
    _, records = _replay(trace, _options(sim, tmp_path, concurrency=1))
    _assert_exact(records)
    root_end = max(r.end_ns for r in records if r.session_id == "s1" and r.agent_id == "")
    bg_end = max(r.end_ns for r in records if r.session_id == "s1" and r.agent_id == "bg")
    assert bg_end > root_end  # it really ran in the background
    s2_start = min(r.sent_ns for r in records if r.session_id == "s2")
    assert s2_start >= bg_end
    assert {r.play for r in records if r.session_id == "s2"} == {1}


def test_sessions_budget_recycles(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(_flat_session("a", 2), _flat_session("b", 3))
    result, records = _replay(trace, _options(sim, tmp_path, concurrency=2, sessions=5))
    assert result.trees_started == result.trees_finished == 5
    assert len({r.play for r in records}) == 5
    assert {r.lane for r in records} == {0, 1}
    counts = {play: sum(1 for r in records if r.play == play) for play in range(5)}
    by_play = {r.play: r.session_id for r in records}
    assert [by_play[p] for p in range(5)] == ["a", "b", "a", "b", "a"]  # sequential order, wrapping
    assert all(counts[p] == (2 if by_play[p] == "a" else 3) for p in range(5))
    assert result.requests == 2 + 3 + 2 + 3 + 2
    _assert_exact(records)


def test_a_recycled_play_hits_what_its_first_play_sent(sim: SimServer, tmp_path: Path) -> None:
    """The trace's theoretical hit is fixed per turn; a session played again without a cache-bust marker resends
    content the server has cached. The replay's own bound (`replayed_hit_blocks`) sees that, and so does the
    server's cache; on the first plays the two agree with the trace."""
    trace = _trace(
        make_session("a", _chain(0.0, 3)),
        make_session("b", _chain(0.0, 3, base=100)),
    )
    result, records = _replay(trace, _options(sim, tmp_path, concurrency=1, sessions=4))
    assert [r.session_id for r in sorted(records, key=lambda r: r.sent_ns)] == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + [
        "b"
    ] * 3
    _assert_exact(records)
    for record in records:
        if record.play < 2:
            assert record.replayed_hit_blocks == record.theoretical_hit_blocks, record
        else:
            assert record.replayed_hit_blocks == record.theoretical_total_blocks, record  # every block sent before
    again = [r for r in records if r.play >= 2 and r.turn == 0]
    assert all(r.theoretical_hit_blocks == 0 and (r.cached_tokens or 0) > 0 for r in again)
    summary = summarize(read_records(result.records_path))
    blocks = sum(r.theoretical_total_blocks or 0 for r in records)
    assert summary.cache.replayed_hit_rate == pytest.approx(sum(r.replayed_hit_blocks or 0 for r in records) / blocks)
    assert summary.cache.theoretical_hit_rate is not None and summary.cache.replayed_hit_rate is not None
    assert summary.cache.replayed_hit_rate > summary.cache.theoretical_hit_rate


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_an_output_past_the_context_gets_what_the_context_leaves(tmp_path: Path, api: str) -> None:
    """vLLM 0.32 clamps `max_tokens` to the context's room and refuses a `min_tokens` above it; the references send
    no `min_tokens` and get the room's tokens. agentx holds `min_tokens` to the room the server's `/v1/models`
    gives, so it gets the same answer; a prompt past the context stays a context overflow."""
    near = make_request(0.0, 900, 400, api_time=0.5, added=tuple(range(900 // BLOCK + 1)))
    over = make_request(1.0, 1100, 8, api_time=0.5, added=tuple(range(1000, 1000 + 1100 // BLOCK + 1)))
    trace = _trace(make_session("near", [near]), _flat_session("over", 1))
    trace.sessions[1].root.requests[0] = over
    with SimServer(time_scale=0.001, block_size=BLOCK, max_model_len=1024) as server:
        _, records = _replay(trace, _options(server, tmp_path, concurrency=2, api=api))
    by_session = {r.session_id: r for r in records}
    fits = by_session["near"]
    assert fits.status == "ok", fits.error_message
    assert fits.isl_server_tokens is not None
    assert fits.osl_server_tokens == 1024 - fits.isl_server_tokens < fits.osl_recorded_tokens
    assert by_session["over"].error_kind == "context_overflow"


def test_deadline_cancels_in_flight_after_grace(slow_sim: SimServer, tmp_path: Path) -> None:
    long = make_session("long", [make_request(0.0, 64, 5000, api_time=60.0), make_request(61.0, 80, 4, api_time=1.0)])
    options = _options(slow_sim, tmp_path, concurrency=2, duration_s=0.3, grace_s=0.3)
    result, records = _replay(_trace(long), options)
    assert result.elapsed_s < 5
    assert result.requests == 2 and result.cancelled == 2 and result.errors == 2  # one per lane
    assert {r.error_kind for r in records} == {"cancelled"}
    assert {r.status for r in records} == {"error"}
    assert result.skipped == 2  # the second turns never went out
    for record in records:  # what arrived before the cancellation is kept
        assert record.http_status == 200 and record.response_ns is not None
        assert record.first_token_ns is not None and record.chunk_times_ns and record.osl_streamed_tokens > 0
        assert record.response_ns <= record.first_token_ns <= record.chunk_times_ns[-1] <= record.end_ns
        assert record.ttft_s is not None and record.timeout_kind is None


def test_request_and_idle_timeouts_fail_requests_with_their_kind(tmp_path: Path) -> None:
    from agentx.sim.faults import FaultConfig

    with SimServer(time_scale=1.0, block_size=BLOCK) as server:
        long = make_session("long", [make_request(0.0, 64, 5000, api_time=60.0)])
        options = _options(server, tmp_path / "request", request_timeout_s=0.5, sessions=1)
        _, [record] = _replay(_trace(long), options)
        assert (record.status, record.error_kind, record.timeout_kind) == ("error", "timeout", "request")
        assert record.queued_ns is not None and 0.5 <= (record.end_ns - record.queued_ns) / 1e9 < 2.0
        assert record.http_status == 200 and record.osl_streamed_tokens > 0  # what arrived is kept
        assert record.error_message is not None and "request timeout" in record.error_message

        server.set_faults(FaultConfig(stall_rate=1.0, stall_s=5.0, stall_after_chunks=2))
        short = make_session("short", [make_request(0.0, 64, 40, api_time=1.0)])
        _, [record] = _replay(_trace(short), _options(server, tmp_path / "idle", idle_timeout_s=0.4, sessions=1))
        assert (record.error_kind, record.timeout_kind) == ("timeout", "idle")
        assert record.error_message is not None and "no bytes from the server for 0.4 s" in record.error_message
        assert (record.end_ns - record.last_token_ns) / 1e9 < 2.0 if record.last_token_ns else True


@pytest.mark.parametrize("name", ["request_timeout_s", "idle_timeout_s", "connect_timeout_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_timeouts_must_be_positive(sim: SimServer, tmp_path: Path, name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"> 0(\.0)? - at `\$\.connection\.{name}`"):
        asyncio.run(run_replay(_trace(_flat_session("a", 1)), _options(sim, tmp_path / "out", **{name: value})))
    assert not (tmp_path / "out").exists()


def test_a_stop_drains_and_flushes(slow_sim: SimServer, tmp_path: Path) -> None:
    long = make_session("long", [make_request(0.0, 64, 5000, api_time=60.0)])
    options = _options(slow_sim, tmp_path, grace_s=0.2, sessions=1)

    stops = RunStops()

    async def main() -> RunResult:
        task = asyncio.create_task(run_replay(_trace(long), options, RunHooks(stops=stops)))
        await asyncio.sleep(0.5)
        stops.stop()
        return await task

    result = asyncio.run(main())
    assert result.interrupted
    records = to_records(read_records(result.records_path))
    assert [r.error_kind for r in records] == ["cancelled"]


def test_a_second_stop_ends_the_grace_period_and_still_records(slow_sim: SimServer, tmp_path: Path) -> None:
    long = make_session("long", [make_request(0.0, 64, 5000, api_time=60.0)])
    options = _options(slow_sim, tmp_path, grace_s=60.0, sessions=2, concurrency=2)

    stops = RunStops()

    async def main() -> RunResult:
        task = asyncio.create_task(run_replay(_trace(long), options, RunHooks(stops=stops)))
        await asyncio.sleep(0.5)
        stops.stop()
        await asyncio.sleep(0.3)
        assert not task.done()  # in the grace period
        stops.stop()
        async with asyncio.timeout(5):
            return await task

    result = asyncio.run(main())
    assert result.interrupted and result.cancel_reason == "interrupted"
    records = to_records(read_records(result.records_path))
    assert [r.error_kind for r in records] == ["cancelled", "cancelled"]
    assert all(r.http_status == 200 and r.osl_streamed_tokens > 0 for r in records)
    assert {r.error_message for r in records} == {"cancelled: a second interrupt ended the grace period"}


def test_a_run_folder_holding_a_run_is_refused_unless_overwrite(sim: SimServer, tmp_path: Path) -> None:
    from agentx.errors import RunExists

    trace = _trace(_flat_session("a", 2))
    first, _ = _replay(trace, _options(sim, tmp_path, sessions=1))
    before = (tmp_path / "records.arrow").read_bytes()
    with pytest.raises(RunExists, match="already holds a run"):
        asyncio.run(run_replay(trace, _options(sim, tmp_path, sessions=1)))
    assert (tmp_path / "records.arrow").read_bytes() == before  # untouched
    second, records = _replay(trace, _options(sim, tmp_path, sessions=1, overwrite=True))
    assert second.run_id != first.run_id and {r.run_id for r in records} == {second.run_id}
    # run.json alone holds a run too (the command line's rule, now the library's): its summary is a user's data.
    (tmp_path / "records.arrow").unlink()
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(RunExists, match=r"already holds a run \(run.json\)"):
        asyncio.run(run_replay(trace, _options(sim, tmp_path, sessions=1)))


def test_unknown_model_raises(sim: SimServer, tmp_path: Path) -> None:
    options = ReplayOptions(
        server=Server(url=sim.url, model="no-such-model"), out_dir=tmp_path / "out", load=ClosedLoad()
    )
    with pytest.raises(ModelNotServed):
        asyncio.run(run_replay(_trace(_flat_session("a", 1)), options))
    assert not (tmp_path / "out").exists()


def test_same_seed_same_order(sim: SimServer, tmp_path: Path) -> None:
    trace = _trace(*(_flat_session(f"s{i}", 1) for i in range(6)))

    def order(seed: int, name: str) -> list[str]:
        options = _options(sim, tmp_path / name, session_order="shuffle", seed=seed, sessions=12)
        _, records = _replay(trace, options)
        return [r.session_id for r in sorted(records, key=lambda r: r.play)]

    first, again, other = order(7, "a"), order(7, "b"), order(8, "c")
    assert first == again
    assert sorted(first[:6]) == sorted(s.session_id for s in trace.sessions)  # a permutation per pass
    assert first != other


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_weka_sample_isl_exact(weka_sample_files: list[Path], tmp_path: Path, api: str) -> None:
    trace = load_trace(weka_sample_files[0])
    for path in weka_sample_files[1:]:
        trace.sessions.extend(load_trace(path).sessions)
    # Recorded gaps run to minutes: scale them (and the simulated clock) down hard.
    with SimServer(time_scale=0.0005, block_size=trace.block_size) as server:
        options = _options(
            server,
            tmp_path,
            concurrency=len(trace.sessions),
            delay_scale=0.0002,
            grace_s=30.0,
            api=api,
            split_flattened_agents=False,  # the checks below walk the file's own agent tree
        )
        result, records = _replay(trace, options)
    assert result.requests == len(records) == trace.request_count
    assert result.errors == 0
    assert result.trees_finished == len(trace.sessions)
    for record in records:
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens
        assert record.osl_server_tokens == max(1, record.osl_recorded_tokens)
    # Each record carries its theoretical hit; per trace they add up to what `agentx inspect` reports.
    hits, totals = prefix_cache_hits(trace)
    first = 0
    for session in trace.sessions:
        mine = [r for r in records if r.session_id == session.session_id]
        assert sum(r.theoretical_hit_blocks or 0 for r in mine) == hits[first : first + len(mine)].sum()
        assert sum(r.theoretical_total_blocks or 0 for r in mine) == totals[first : first + len(mine)].sum()
        first += len(mine)
    if api == "chat":
        # Resending the recorded history keeps the server's prefix cache warm, turn after turn.
        later = [r for r in records if r.turn > 0]
        assert sum(r.cached_tokens or 0 for r in later) > 0.5 * sum(r.isl_recorded_tokens for r in later)
    # Joins and anchors hold on real data too: no step goes out before what it depends on has ended.
    by_key = {(r.session_id, r.agent_id, r.turn): r for r in records}
    joins = 0
    for session in trace.sessions:
        plan = plan_session(session)
        for step in plan.steps:
            record = by_key[(session.session_id, step.agent_id, step.turn)]
            for dependency in step.depends_on:
                before = plan.steps[dependency]
                assert record.sent_ns >= by_key[(session.session_id, before.agent_id, before.turn)].end_ns
            joins += len(step.joins)
    assert joins > 0


def test_each_play_of_a_tree_carries_one_correlation_id(tmp_path: Path) -> None:
    """A stand-in server records the X-Correlation-ID of every request: one id per tree, a new one per play."""
    from aiohttp import web

    seen: list[str] = []

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("X-Correlation-ID", ""))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = b'{"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
        chunk += b'"usage":{"prompt_tokens":1,"completion_tokens":1}}'
        await response.write(b"data: " + chunk + b"\n\ndata: [DONE]\n\n")
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            trace = _trace(_flat_session("a", 3), _flat_session("b", 2))
            options = ReplayOptions(
                server=Server(url=f"http://127.0.0.1:{port}", model="m", stream_usage="final"),
                out_dir=tmp_path,
                load=ClosedLoad(),
                scenario=Scenario(delay_scale=0),
            )
            await run_replay(trace, options)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert len(seen) == 5 and all(seen)
    assert len(set(seen[:3])) == 1 and len(set(seen[3:])) == 1 and seen[0] != seen[3]


def test_chat_replay_of_the_sample_corpus_is_exact(tmp_path: Path) -> None:
    """`--api chat` against the simulator: calibrated text lands on the trace's `in`, token for token."""
    trace = load_trace(SAMPLE_TRACE)
    trace.sessions = trace.sessions[:6]
    with SimServer(time_scale=0.0005, block_size=trace.block_size) as server:
        options = _options(server, tmp_path, concurrency=3, delay_scale=0.0002, api="chat")
        result, records = _replay(trace, options)
    assert result.errors == 0 and result.requests == trace.request_count
    assert result.calibration is not None and result.stream_usage == "continuous"
    assert all(predicted == counted for predicted, counted in result.calibration.checks)
    for record in records:
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens
        assert record.osl_server_tokens == record.osl_streamed_tokens == max(1, record.osl_recorded_tokens)
    later = [r for r in records if r.turn > 0]
    assert sum(r.cached_tokens or 0 for r in later) > 0.5 * sum(r.isl_recorded_tokens for r in later)


def test_the_collector_settings_come_back_after_a_run(sim: SimServer, tmp_path: Path) -> None:
    import gc

    gc.freeze()  # the host's frozen heap (an earlier in-process CLI test may have frozen one too)
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    result, _ = _replay(_trace(_flat_session("g", 2)), _options(sim, tmp_path))
    assert result.errors == 0
    assert gc.get_threshold() == before and gc.isenabled()
    # Neither frozen further nor unfrozen: only objects of the frozen heap freed meanwhile may have left it.
    assert 0 < gc.get_freeze_count() <= frozen
