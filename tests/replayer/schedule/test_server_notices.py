"""Numbers the server gets wrong are noticed: each answer checked against its request (agentx.replayer.schedule.sanity),
marked in its record, announced once per kind as the run goes, and counted in the summary.

Real replays over loopback HTTP: the simulator made to generate twice `max_tokens` and to report half the prompt
(`output_scale`, `prompt_tokens_scale`), the same simulator honest as the control, and a stand-in server answering
every stream with an HTML page.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from builders import make_request, make_session, make_trace
from hypothesis import given
from hypothesis import strategies as st
from loopback import serve

from agentx.records.record import read_records, to_records
from agentx.replayer.http.exchange import Exchange
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult
from agentx.replayer.schedule.sanity import PROMPT_SLACK_TOKENS, PROMPT_TOLERANCE, server_notices
from agentx.results.summary.checks.audit import audit
from agentx.results.summary.summarize import summarize
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
OUT_TOKENS = 12


def _trace(sessions: int = 2, turns: int = 3) -> Trace:
    chain = [make_request(float(i), 64 + 32 * i, OUT_TOKENS, api_time=0.1) for i in range(turns)]
    return make_trace(*(make_session(f"s{i}", chain) for i in range(sessions)), block_size=BLOCK)


def _replay(url: str, model: str, out_dir: Path, **server: object) -> RunResult:
    options = ReplayOptions(
        server=Server(url=url, model=model, **server),  # type: ignore[arg-type]
        out_dir=out_dir,
        load=ClosedLoad(concurrency=2),
        scenario=Scenario(delay_scale=0.0),
        runtime=Runtime(grace_s=5.0, metrics_interval_s=None),
    )
    return asyncio.run(run_replay(_trace(), options))


@given(
    completion=st.one_of(st.none(), st.integers(0, 5000)),
    streamed=st.integers(0, 5000),
    estimated=st.booleans(),
    max_tokens=st.integers(1, 4000),
)
def test_output_over_max_tokens_is_what_the_server_counted_or_streamed_past_the_cap(
    completion: int | None, streamed: int, estimated: bool, max_tokens: int
) -> None:
    exchange = Exchange(completion_tokens=completion, tokens_estimated=estimated)
    flagged = "output_over_max_tokens" in server_notices(exchange, max_tokens, 10, streamed)
    counted = [completion or 0] + ([] if estimated else [streamed])  # an estimated stream counts chunks, not tokens
    assert flagged == (max(counted) > max_tokens)
    assert "output_over_max_tokens" not in server_notices(exchange, None, 10, streamed)  # the cap not known


@given(sent=st.integers(1, 200_000), server=st.integers(0, 400_000))
def test_a_prompt_count_differs_beyond_both_tolerances(sent: int, server: int) -> None:
    flagged = "prompt_count_differs" in server_notices(Exchange(prompt_tokens=server), None, sent, 0)
    assert flagged == (abs(server - sent) > max(PROMPT_SLACK_TOKENS, PROMPT_TOLERANCE * sent))
    assert server_notices(Exchange(), None, sent, 0) == []  # no usage: nothing to compare


def test_a_server_that_ignores_max_tokens_and_miscounts_prompts_is_noticed(tmp_path: Path) -> None:
    faults = FaultConfig(output_scale=2.0, prompt_tokens_scale=0.5)
    with SimServer(time_scale=0.01, block_size=BLOCK, faults=faults) as sim:
        result = _replay(sim.url, sim.model, tmp_path / "wrong")
    records = to_records(read_records(result.records_path))
    assert records and all(r.status == "ok" for r in records)
    for record in records:
        assert record.osl_server_tokens == 2 * OUT_TOKENS
        assert record.server_notices == ["output_over_max_tokens", "prompt_count_differs"]
    said = [notice for notice in result.notices if "marked in the records" in notice]
    assert len(said) == 2  # the first of each kind, once
    assert f"more output tokens than max_tokens {OUT_TOKENS}" in said[0] and "usage 24" in said[0]
    assert "prompt tokens where" in said[1] and "session 's" in said[1]
    table = read_records(result.records_path)
    summary = summarize(table)
    every = summary.counts.profiling
    assert summary.counts.server_notices == {"output_over_max_tokens": every, "prompt_count_differs": every}
    found = {finding.code: finding for finding in audit(table, summary).findings}
    assert found["output_over_max_tokens"].requests == every and "prompt_tokens_differ" in found


def test_an_honest_server_is_not_noticed(tmp_path: Path) -> None:
    with SimServer(time_scale=0.01, block_size=BLOCK) as sim:
        result = _replay(sim.url, sim.model, tmp_path / "honest")
    records = to_records(read_records(result.records_path))
    assert records and all(r.status == "ok" and r.server_notices == [] for r in records)
    assert not [notice for notice in result.notices if "marked in the records" in notice]
    table = read_records(result.records_path)
    summary = summarize(table)
    assert summary.counts.server_notices == {}
    assert not {"output_over_max_tokens", "prompt_tokens_differ"} & {f.code for f in audit(table, summary).findings}


def test_an_html_page_for_a_stream_is_marked_not_event_stream(tmp_path: Path) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>Sign in</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", page)

    async def go() -> RunResult:
        async with serve(app) as url:
            options = ReplayOptions(
                server=Server(url=url, model="m", stream_usage="final"),
                out_dir=tmp_path / "html",
                load=ClosedLoad(concurrency=1),
                scenario=Scenario(delay_scale=0.0, failed_request_threshold=None),
                runtime=Runtime(grace_s=2.0, metrics_interval_s=None),
            )
            return await run_replay(_trace(sessions=1, turns=2), options)

    result = asyncio.run(go())
    records = to_records(read_records(result.records_path))
    assert records and all(r.error_kind == "protocol" and r.server_notices == ["not_event_stream"] for r in records)
    said = [notice for notice in result.notices if "marked in the records" in notice]
    assert len(said) == 1 and "Content-Type 'text/html; charset=utf-8'" in said[0]
    counted = summarize(read_records(result.records_path)).counts
    assert counted.server_notices == {"not_event_stream": counted.profiling} and counted.profiling == 2


@pytest.mark.parametrize("extra_body", [{"max_tokens": 5}, {"max_completion_tokens": 5}])
def test_a_cap_set_by_the_users_extra_body_is_not_judged(tmp_path: Path, extra_body: dict[str, int]) -> None:
    faults = FaultConfig(output_scale=2.0)
    with SimServer(time_scale=0.01, block_size=BLOCK, faults=faults) as sim:
        result = _replay(sim.url, sim.model, tmp_path / "extra", extra_body=extra_body)
    records = to_records(read_records(result.records_path))
    assert records and all("output_over_max_tokens" not in r.server_notices for r in records)
