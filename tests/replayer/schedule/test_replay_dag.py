"""Property tests of `run_replay` against the simulator: every request once, dependencies honoured, exact ISL.

Plus the affinity headers (`ReplayOptions.affinity_headers`, `agentx replay --affinity-header`).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from flat import replay_options
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopback import serve
from strategies import WEKA_TRACE, examples, names, sessions, write_json

from agentx.cli import main
from agentx.errors import WarmupFailed
from agentx.records.record import RequestRecord, read_records, to_records
from agentx.replayer.http.client import ServerUnreachable
from agentx.replayer.options.replay import (
    AFFINITY_HEADERS,
    AgentxLoad,
    ClosedLoad,
    Connection,
    RateLoad,
    ReplayOptions,
    Runtime,
    Scenario,
    Server,
)
from agentx.replayer.options.rules import RulesName
from agentx.replayer.plan.steps import plan_session
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
FAILING_TOKENS = 7
"""`_stand_in` answers a request for this many output tokens with an HTTP 500."""
MAX_IN = 300
MAX_OUT = 16


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, block_size=BLOCK) as server:
        yield server


def _small(request: Request) -> Request:
    """Keep the drawn lengths when already small (most are exact for their hash ids), else fold them down."""
    in_tokens = request.in_tokens if 1 <= request.in_tokens <= MAX_IN else 1 + request.in_tokens % MAX_IN
    out_tokens = request.out_tokens if 1 <= request.out_tokens <= MAX_OUT else 1 + request.out_tokens % MAX_OUT
    return msgspec.structs.replace(request, in_tokens=in_tokens, out_tokens=out_tokens)


def _shrink(session: Session) -> Session:
    agent: Agent
    for agent, _, _ in session.agents():
        agent.requests = [_small(request) for request in agent.requests]
    return session


@st.composite
def small_traces(draw: st.DrawFn) -> Trace:
    """Valid traces at the simulator's block size, with small prompts and outputs so a replay is quick."""
    ids = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    drawn = [_shrink(draw(sessions(session_id, block_size=BLOCK))) for session_id in ids]
    return Trace(sessions=drawn, block_size=BLOCK, hash_id_scope=draw(st.sampled_from(["session", "global"])))


Key = tuple[str, str, int]


def _key(session_id: str, agent_id: str, turn: int) -> Key:
    return (session_id, agent_id, turn)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=small_traces(), concurrency=st.integers(1, 3))
def test_replay_honours_the_dag(sim: SimServer, trace: Trace, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as out_dir:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model),
            out_dir=Path(out_dir),
            load=ClosedLoad(concurrency=concurrency),
            scenario=Scenario(delay_scale=0, split_flattened_agents=False),
            runtime=Runtime(grace_s=30.0),
        )
        result = asyncio.run(run_replay(trace, options))
        records = to_records(read_records(result.records_path))
    assert result.requests == len(records) == trace.request_count
    assert result.errors == 0 and not result.interrupted, [r.error_message for r in records if r.error_message]
    if trace.request_count:
        assert result.trees_started == result.trees_finished == len(trace.sessions)

    # Every request of every session exactly once (one pass: each session is played once).
    expected = Counter(
        _key(session.session_id, agent.agent_id, turn)
        for session in trace.sessions
        for agent, _, _ in session.agents()
        for turn in range(len(agent.requests))
    )
    assert Counter(_key(r.session_id, r.agent_id, r.turn) for r in records) == expected

    by_play: dict[int, dict[Key, RequestRecord]] = {}
    for record in records:
        play = by_play.setdefault(record.play, {})
        play[_key(record.session_id, record.agent_id, record.turn)] = record
    for play in by_play.values():
        assert len({session_id for session_id, _, _ in play}) == 1  # a play is one session tree

    # The records' DAG is the trace's, and nothing was sent before its anchor and joins had ended.
    play_of = {r.session_id: r.play for r in records}
    for session in trace.sessions:
        plan = plan_session(session)
        if not plan.steps:
            continue
        play = by_play[play_of[session.session_id]]
        assert len(play) == len(plan.steps)
        for step in plan.steps:
            record = play[_key(session.session_id, step.agent_id, step.turn)]
            for dependency in step.depends_on:
                before = plan.steps[dependency]
                before_record = play.get(_key(session.session_id, before.agent_id, before.turn))
                assert before_record is not None, (step, before)
                assert record.sent_ns >= before_record.end_ns, (step, before)

    for record in records:
        assert record.status == "ok", record.error_message
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens
        assert record.osl_server_tokens == max(1, record.osl_recorded_tokens)


# -- affinity headers


@asynccontextmanager
async def _stand_in(seen: list[dict[str, str]] | None = None) -> AsyncIterator[str]:
    """A stand-in server that records every completion request's headers in `seen` and answers after
    `max_tokens` × 10 ms (so a test sets how long each turn runs), or with an HTTP 500 for `FAILING_TOKENS`;
    yields its base URL."""
    from aiohttp import web

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append(dict(request.headers))
        body = await request.json()
        if int(body["max_tokens"]) == FAILING_TOKENS:
            return web.json_response({"error": {"message": "engine died"}}, status=500)
        await asyncio.sleep(int(body["max_tokens"]) * 0.01)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = b'{"choices":[{"index":0,"text":" x","finish_reason":"length"}],'
        chunk += b'"usage":{"prompt_tokens":1,"completion_tokens":1}}'
        await response.write(b"data: " + chunk + b"\n\ndata: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    async with serve(app) as url:
        yield url


def _flat(session_id: str, n: int) -> Session:
    requests = [Request(t=float(i), model="m", in_tokens=20, out_tokens=2) for i in range(n)]
    return Session(session_id=session_id, root=Agent(requests=requests))


def _header_run(
    tmp_path: Path,
    affinity: tuple[str, ...],
    trace: Trace | None = None,
    mode: str = "closed",
    rules: RulesName = "agentx-harness-1.0.12",
) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []
    trace = trace or Trace(sessions=[_flat("a", 3), _flat("b", 2)], block_size=BLOCK)

    async def go() -> None:
        async with _stand_in(seen) as url:
            options = replay_options(
                mode=mode,
                url=url,
                model="m",
                out_dir=tmp_path,
                delay_scale=0,
                affinity_headers=affinity,
                stream_usage="final",
                rules=rules,
            )
            await run_replay(trace, options)

    asyncio.run(go())
    return seen


def test_affinity_headers_carry_the_correlation_id(tmp_path: Path) -> None:
    seen = _header_run(tmp_path, ("X-Session-ID", "X-Dynamo-Session-ID"))
    assert len(seen) == 5
    for headers in seen:
        correlation = headers["X-Correlation-ID"]
        assert correlation and headers["X-Session-ID"] == headers["X-Dynamo-Session-ID"] == correlation
        assert "X-SMG-Routing-Key" not in headers
    ids = [headers["X-Session-ID"] for headers in seen]
    assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1 and ids[0] != ids[3]  # one per play


@pytest.mark.parametrize("rules", ["agentx-harness-1.0.12", "aiperf-0.13.0"])
def test_each_agent_session_has_its_own_correlation_id_and_each_request_its_own_id(
    tmp_path: Path, rules: RulesName
) -> None:
    """As the references' transport (docs/agentx.md §2d): X-Request-ID per request; X-Correlation-ID per agent
    session, each subagent its own, and under AIPerf 0.13.0 X-Session-Affinity with it (the harness sends none);
    the records carry the same ids, with the root's as `root_correlation_id` and the parent's as
    `parent_correlation_id`."""
    requests = [Request(t=float(i), model="m", in_tokens=20, out_tokens=2) for i in range(3)]
    subs = [
        Agent(agent_id=name, spawn_after=1, t=0.5, requests=[Request(t=0.5 + i, model="m", in_tokens=20, out_tokens=2)])
        for i, name in enumerate(("x", "y"))
    ]
    trace = Trace(
        sessions=[Session(session_id="tree", root=Agent(requests=requests, subagents=subs))], block_size=BLOCK
    )
    seen = _header_run(tmp_path, ("X-Dynamo-Session-ID",), trace, rules=rules)
    assert len(seen) == 5
    assert len({headers["X-Request-ID"] for headers in seen}) == 5
    for headers in seen:
        assert headers["X-Correlation-ID"] == headers["X-Dynamo-Session-ID"]
        affinity = headers.get("X-Session-Affinity")
        assert affinity == (headers["X-Correlation-ID"] if rules == "aiperf-0.13.0" else None)
    records = to_records(read_records(tmp_path / "records.arrow"))
    by_request = {record.request_id: record for record in records}
    assert set(by_request) == {headers["X-Request-ID"] for headers in seen}
    for headers in seen:
        record = by_request[headers["X-Request-ID"]]
        assert record.correlation_id == headers["X-Correlation-ID"]
        assert headers.get("X-Dynamo-Parent-Session-ID", "") == record.parent_correlation_id
    by_agent = {record.agent_id: record.correlation_id for record in records}
    assert len(set(by_agent.values())) == 3  # root, x and y: one id each
    assert {record.correlation_id for record in records if record.agent_id == ""} == {by_agent[""]}
    for record in records:
        assert record.root_correlation_id == by_agent[""]
        assert record.parent_correlation_id == ("" if record.agent_id == "" else by_agent[""])


def test_no_affinity_headers_by_default(tmp_path: Path) -> None:
    seen = _header_run(tmp_path, ())
    assert len(seen) == 5
    for headers in seen:
        assert headers["X-Correlation-ID"]
        assert not any(name in headers for name in AFFINITY_HEADERS)


def test_unknown_affinity_header_is_rejected() -> None:
    """Options read from a harness's configuration are checked on the way in; the CLI's flag refuses it too."""
    fields = {"url": "http://127.0.0.1:9", "model": "m", "affinity_headers": ["X-Whatever"]}
    with pytest.raises(msgspec.ValidationError, match=r"affinity_headers"):
        msgspec.convert(fields, Server)


def test_cli_affinity_header_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentx.run.replay

    captured: list[ReplayOptions] = []

    async def fake_replay(_trace: Trace, options: ReplayOptions, *_args: object, **_kwargs: object) -> None:
        captured.append(options)
        raise ServerUnreachable("stand-in")

    monkeypatch.setattr(agentx.run.replay, "replay", fake_replay)
    trace_file = write_json(tmp_path / "trace.jsonl", WEKA_TRACE)
    args = ["replay", str(trace_file), "--url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "run")]
    args += ["--affinity-header", "X-Session-ID", "--affinity-header", "x-smg-routing-key"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "unreachable" in result.output
    assert [options.server.affinity_headers for options in captured] == [("X-Session-ID", "X-SMG-Routing-Key")]

    bad = CliRunner().invoke(main, [*args[:8], "--affinity-header", "X-Nope"])
    assert bad.exit_code == 2 and "X-Nope" in bad.output
    assert len(captured) == 1


def test_the_first_failed_root_primer_ends_the_run_at_once(tmp_path: Path) -> None:
    """Two lanes' primers go out together (burst, recorded output lengths): one fails at once, the other would
    take 5 s. The run stops there, as the reference does, cancelling the slow primer (docs/agentx.md §5)."""

    def two_turns(session_id: str, out_tokens: int) -> Session:
        requests = [Request(t=float(i), model="m", in_tokens=20, out_tokens=out_tokens) for i in range(2)]
        return Session(session_id=session_id, root=Agent(requests=requests))

    trace = Trace(sessions=[two_turns("fails", FAILING_TOKENS), two_turns("slow", 500)], block_size=BLOCK)

    async def go() -> float:
        async with _stand_in() as url:
            options = ReplayOptions(
                server=Server(url=url, model="m", stream_usage="final"),
                out_dir=tmp_path,
                load=AgentxLoad(concurrency=2, tstar_window=(0.9, 0.9), warmup="burst", warmup_max_tokens=None),
                scenario=Scenario(sessions=2),
                runtime=Runtime(grace_s=30.0),
            )
            started = time.perf_counter()
            with pytest.raises(WarmupFailed, match="'fails'"):
                await run_replay(trace, options)
            return time.perf_counter() - started  # the stand-in's own shutdown waits out the slow handler

    assert asyncio.run(go()) < 4.0  # not the slow primer's 5 s, nor the 30 s grace
    records = {r.session_id: r for r in to_records(read_records(tmp_path / "records.arrow"))}
    assert records["fails"].phase == records["slow"].phase == "warmup"
    assert records["fails"].http_status == 500 and records["slow"].error_kind == "cancelled"
    assert records["slow"].error_message == "cancelled: a root agent's warmup primer failed"


def _join_gap_s(
    tmp_path: Path, root_outs: list[int], sub_out: int, rules: RulesName = "aiperf-0.13.0", *, from_turn: bool = False
) -> float:
    """Root turns at 0, 1 and 10 s (api 0.5 s each); one subagent spawned after turn 0 whose single turn (1.5 s
    recorded) is joined by the root's turn at 10 s. Returns the gap between the later of (the root's turn 1, the
    subagent) ending (`from_turn`: the root's turn 1 ending) and the join turn going out, at delay scale 0.1."""
    root = Agent(
        requests=[
            Request(t=t, model="m", in_tokens=20, out_tokens=out, api_time=0.5)
            for t, out in zip((0.0, 1.0, 10.0), root_outs, strict=True)
        ],
        subagents=[
            Agent(
                agent_id="sub",
                spawn_after=1,
                t=0.6,
                requests=[Request(t=0.6, model="m", in_tokens=20, out_tokens=sub_out, api_time=1.5)],
            )
        ],
    )
    trace = Trace(sessions=[Session(session_id="j", root=root)], block_size=BLOCK)

    async def go() -> None:
        async with _stand_in() as url:
            options = ReplayOptions(
                server=Server(url=url, model="m", stream_usage="final"),
                out_dir=tmp_path,
                load=ClosedLoad(),
                scenario=Scenario(delay_scale=0.1, rules=rules),
            )
            await run_replay(trace, options)

    asyncio.run(go())
    records = {(r.agent_id, r.turn): r for r in to_records(read_records(tmp_path / "records.arrow"))}
    join = records[("", 2)]
    previous_end = records[("", 1)].end_ns if from_turn else max(records[("", 1)].end_ns, records[("sub", 0)].end_ns)
    return (join.sent_ns - previous_end) / 1e9


def test_a_join_turn_goes_out_when_its_last_subagent_ends_after_the_previous_turn(tmp_path: Path) -> None:
    """AIPerf 0.13.0: the subagent (0.5 s) ends after the root's turn 1 (0.1 s) but before turn 1's end + the
    recorded 8.5 s × 0.1 end-to-start delay: the join turn goes out at once (docs/agentx.md §3a; reference
    `_resolve_think_ms`)."""
    assert _join_gap_s(tmp_path, [10, 10, 1], 50) < 0.2


def test_a_join_turn_waits_out_its_recorded_delay_under_the_harness(tmp_path: Path) -> None:
    """agentx-harness 1.0.12: the same join goes out at max(turn 1's end + 8.5 s × 0.1, the subagent's end), the
    subagent having ended first (§3a; reference `_arm_join_replay_deadline`)."""
    assert 0.8 <= _join_gap_s(tmp_path, [10, 10, 1], 50, "agentx-harness-1.0.12", from_turn=True) < 1.2


@pytest.mark.parametrize("rules", ["agentx-harness-1.0.12", "aiperf-0.13.0"])
def test_a_join_turn_whose_subagents_ended_first_keeps_its_delay(tmp_path: Path, rules: RulesName) -> None:
    """The subagent (0.1 s) ends before the root's turn 1 (1 s): the join turn waits the ordinary end-to-start
    delay after turn 1, 8.5 s × 0.1, under either rule set."""
    assert 0.8 <= _join_gap_s(tmp_path, [10, 100, 1], 10, rules) < 1.2


def test_a_join_turn_whose_subagent_ends_after_its_deadline_goes_out_at_once(tmp_path: Path) -> None:
    """agentx-harness 1.0.12: a subagent (3 s) that ends after turn 1's end + 0.85 s: the join goes out as it ends,
    with no think time added (§3a)."""
    assert _join_gap_s(tmp_path, [10, 10, 1], 300, "agentx-harness-1.0.12") < 0.2


def test_a_run_that_falls_behind_its_schedule_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three sessions arriving 10 ms apart through one connection to a server that takes 1.5 s a request: the
    later ones leave more than 1 s late. The run says so once, on the "agentx" logger and in its notices."""
    trace = Trace(
        sessions=[
            Session(session_id=f"s{i}", root=Agent(requests=[Request(t=0.0, model="m", in_tokens=20, out_tokens=150)]))
            for i in range(3)
        ],
        block_size=BLOCK,
    )

    async def go() -> RunResult:
        async with _stand_in() as url:
            options = ReplayOptions(
                server=Server(url=url, model="m", stream_usage="final"),
                out_dir=tmp_path,
                load=RateLoad(rate=100.0),
                connection=Connection(max_connections=1),
            )
            return await run_replay(trace, options)

    with caplog.at_level("WARNING", logger="agentx"):
        result = asyncio.run(go())
    late = [r for r in to_records(read_records(result.records_path)) if r.dispatch_lag_s > 1.0]
    assert late
    behind = [notice for notice in result.notices if "fell behind" in notice]
    assert len(behind) == 1 and "fell behind its schedule" in behind[0]
    assert [m for m in caplog.messages if "fell behind" in m] == behind


def test_a_stalled_server_stops_the_run(tmp_path: Path) -> None:
    """A server that takes requests and never answers: with requests in flight and no byte back for
    `stall_timeout_s`, the run stops, cancels what is in flight and says why (`cancel_reason` "stalled", exit 3
    in one line); a server streaming slowly but steadily, a chunk every 0.1 s for 1.5 s, is not stalled."""
    from aiohttp import web

    from agentx.cli.commands.replay import run_failure
    from agentx.results.summary.summarize import summarize

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def silent(_request: web.Request) -> web.Response:
        await asyncio.sleep(4.0)  # long past the stall timeout, short enough for the server's own shutdown
        return web.Response(status=503)

    async def steady(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(15):
            await asyncio.sleep(0.1)
            await response.write(b'data: {"choices":[{"index":0,"text":" x","finish_reason":null}]}\n\n')
        usage = b'"usage":{"prompt_tokens":1,"completion_tokens":15}'
        await response.write(b'data: {"choices":[],' + usage + b"}\n\ndata: [DONE]\n\n")
        return response

    trace = Trace(sessions=[_flat("a", 3), _flat("b", 2)], block_size=BLOCK)

    async def go(handler: object, out_dir: Path) -> tuple[RunResult, float]:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", handler)  # type: ignore[arg-type]
        async with serve(app) as url:
            options = replay_options(
                mode="closed",
                concurrency=2,
                url=url,
                model="m",
                out_dir=out_dir,
                stream_usage="final",
                stall_timeout_s=1.0,
                grace_s=30.0,
                delay_scale=0.0,
            )
            started = time.monotonic()
            result = await run_replay(trace, options)
            return result, time.monotonic() - started

    result, elapsed_s = asyncio.run(go(silent, tmp_path / "silent"))
    assert result.cancel_reason == "stalled" and elapsed_s < 5.0  # not the 30 s grace: a stall cancels at once
    assert any("made no progress" in notice for notice in result.notices)
    table = read_records(result.records_path)
    records = to_records(table)
    assert len(records) == 2 and all(r.error_kind == "cancelled" for r in records)
    assert all("no progress for 1 s" in (r.error_message or "") for r in records)
    message = run_failure(summarize(table), result, None)
    assert message is not None and "stopped making progress" in message and "--stall-timeout" in message

    steady_result, _ = asyncio.run(go(steady, tmp_path / "steady"))
    assert steady_result.cancel_reason is None and steady_result.errors == 0 and steady_result.requests == 5


@pytest.mark.parametrize("rules", ["agentx-harness-1.0.12", "aiperf-0.13.0"])
def test_a_failed_root_cache_pressure_request_ends_the_run_before_profiling(tmp_path: Path, rules: RulesName) -> None:
    """Turns 0–4 answer, turns 5 on fail: t* in the middle makes turn 4 the primer (it succeeds) and turn 5 the
    first cache-pressure request (it fails). Both references abort on any failed root request of their warmup
    (`credit/callback_handler.py`, `_handle_warmup_failure`): the run stops before profiling (docs/agentx.md §5)."""
    outs = [3] * 5 + [FAILING_TOKENS] * 5
    requests = [Request(t=float(i), model="m", in_tokens=20, out_tokens=out) for i, out in enumerate(outs)]
    trace = Trace(sessions=[Session(session_id="presses", root=Agent(requests=requests))], block_size=BLOCK)

    async def go() -> None:
        async with _stand_in() as url:
            options = replay_options(
                url=url,
                model="m",
                out_dir=tmp_path,
                stream_usage="final",
                tstar_window=(0.5, 0.5),
                warmup_max_tokens=None,
                warmup_requests_per_lane=3,
                rules=rules,
                delay_scale=0.0,
            )
            await run_replay(trace, options)

    with pytest.raises(WarmupFailed, match="cache-pressure request of session 'presses' \\(turn 5\\)"):
        asyncio.run(go())
    records = to_records(read_records(tmp_path / "records.arrow"))
    assert [(r.turn, r.phase, r.status) for r in records] == [(4, "warmup", "ok"), (5, "warmup", "error")]
