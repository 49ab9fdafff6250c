"""agentx against a server nobody on this project wrote: llama.cpp's `llama-server` with Gemma 3 270M.

Traces are tiny (a 270M model decodes ~60 tokens/s on two cores here): short contexts, a few output
tokens, the sample trace's shape (turns that grow a shared prefix, a subagent) rather than its size.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from llama import LlamaServer, model_path
from tiny_traces import tiny_trace

from agentx.records.record import read_records, to_records
from agentx.records.run_folder import RUN_FILE
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server, Speculative
from agentx.replayer.telemetry.metrics import LLAMACPP_ACCEPTED, LLAMACPP_DRAFTS, parse_counters
from agentx.run.replay import ReplayResult, replay
from agentx.trace.io import save_trace
from agentx.trace.model import Trace

SPEC_K = 3
"""Draft tokens per step on the speculating server."""
SPEC_AL = 2.5
"""The synthetic acceptance length it is forced to (`--spec-synth-len`)."""


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    """A plain server: two slots of 4,096 tokens. A server that cannot start fails the test (never a skip)."""
    with LlamaServer(parallel=2, ctx_size=8192) as server:
        yield server


@pytest.fixture(scope="module")
def llama_spec() -> Iterator[LlamaServer]:
    """A server speculating with the model as its own draft model and synthetic acceptance at `SPEC_AL`."""
    extra = (
        "--spec-type", "draft-simple", "--spec-draft-model", str(model_path()),
        "--spec-draft-n-max", str(SPEC_K), "--spec-draft-n-min", str(SPEC_K), "--spec-synth-len", str(SPEC_AL),
    )  # fmt: skip
    with LlamaServer(parallel=1, ctx_size=4096, extra_args=extra) as server:
        yield server


def _replay(
    server: LlamaServer,
    out_dir: Path,
    trace: Trace,
    *,
    concurrency: int = 1,
    api: Literal["completions", "chat"] = "completions",
    seed: int = 0,
    speculative: Speculative | None = None,
) -> ReplayResult:
    options = ReplayOptions(
        server=Server(url=server.url, model=server.model, api=api),
        out_dir=out_dir,
        load=ClosedLoad(concurrency=concurrency),
        scenario=Scenario(delay_scale=0.0, seed=seed),
        speculative=speculative or Speculative(),
    )
    return asyncio.run(replay(trace, options))


def _scrape(server: LlamaServer) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        return parse_counters(response.read().decode(), (LLAMACPP_DRAFTS, LLAMACPP_ACCEPTED))


def test_completions_replay_is_exact(llama: LlamaServer, tmp_path: Path) -> None:
    trace = tiny_trace()
    result = _replay(llama, tmp_path, trace, concurrency=2)
    records = to_records(read_records(result.run.records_path))
    assert result.run.errors == 0, [r.error_message for r in records if r.error_message]
    assert len(records) == trace.request_count
    for record in records:
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens, record
        assert record.osl_server_tokens == record.osl_recorded_tokens
        assert record.ttft_s is not None and record.e2el_s is not None
    # The replay's structure is the trace's: every agent's turns, in order.
    by_agent: dict[tuple[str, str], list[int]] = {}
    for record in sorted(records, key=lambda r: r.sent_ns):
        by_agent.setdefault((record.session_id, record.agent_id), []).append(record.turn)
    assert by_agent == {(f"s{s}", a): list(range(n)) for s in range(2) for a, n in (("", 4), ("sub", 2))}
    assert result.summary.counts.kept == trace.request_count
    assert result.run.server.engine == "llama.cpp", result.run.server  # owned_by "llamacpp" in /v1/models


def test_chat_replay_is_calibrated_through_the_servers_tokenizer(llama: LlamaServer, tmp_path: Path) -> None:
    trace = tiny_trace(sessions=1, turns=3)
    result = _replay(llama, tmp_path, trace, api="chat")
    records = to_records(read_records(result.run.records_path))
    assert result.run.errors == 0, [r.error_message for r in records if r.error_message]
    assert result.run.calibration is not None
    for record in records:
        assert record.isl_server_tokens is not None
        drift = abs(record.isl_server_tokens - record.isl_recorded_tokens) / record.isl_recorded_tokens
        assert drift <= 0.01, record


def test_prefix_reuse_is_real(llama: LlamaServer, tmp_path: Path) -> None:
    trace = tiny_trace(sessions=1, turns=4)
    # A seed of its own: block contents no earlier test sent, so the server's cache starts cold for them.
    result = _replay(llama, tmp_path, trace, seed=4242)
    records = sorted(to_records(read_records(result.run.records_path)), key=lambda r: r.sent_ns)
    root = [r for r in records if r.agent_id == ""]
    assert all((r.cached_tokens or 0) > 0 for r in root[1:]), [(r.turn, r.cached_tokens) for r in root]
    cache = result.summary.cache
    assert cache.server_hit_rate is not None and cache.theoretical_hit_rate is not None
    # The server reuses what the trace shares (tokens within a block boundary aside).
    assert cache.server_hit_rate == pytest.approx(cache.theoretical_hit_rate, abs=0.1)
    assert cache.usage_hit_rate == pytest.approx(cache.server_hit_rate, abs=0.1)


def test_synthetic_acceptance_is_measured_both_ways(llama_spec: LlamaServer, tmp_path: Path) -> None:
    trace = tiny_trace(sessions=2, turns=4, out=48)
    before = _scrape(llama_spec)
    result = _replay(llama_spec, tmp_path, trace, speculative=Speculative(al=SPEC_AL, k=SPEC_K, al_tolerance=0.25))
    after = _scrape(llama_spec)
    assert result.run.errors == 0
    found = result.summary.acceptance
    assert found is not None and found.counters is not None and found.stream is not None
    assert found.counters.engine == "llamacpp"
    accepted = after[LLAMACPP_ACCEPTED] - before[LLAMACPP_ACCEPTED]
    own = 1 + accepted / (after[LLAMACPP_DRAFTS] - before[LLAMACPP_DRAFTS])
    assert found.counters.acceptance_length == pytest.approx(own, abs=1e-9)  # the server's own counters
    assert found.stream.grouped_by_gap  # one-token events, told apart by time
    # The stream leaves out each request's first and last step (the prefill's token; a step cut by max_tokens):
    # ~200 of ~230 random steps, so the two agree to within their sampling noise (σ ≈ 0.06), not exactly.
    assert found.stream.tokens_per_step == pytest.approx(found.counters.acceptance_length, abs=0.15)
    assert found.counters.acceptance_length == pytest.approx(SPEC_AL, abs=0.3)  # a few hundred random steps


def test_ctrl_c_leaves_records_and_a_partial_summary(llama: LlamaServer, tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    trace = tiny_trace(sessions=2, turns=12, out=24)
    save_trace(trace, trace_path)
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(trace_path), "--url", llama.url, "--model", llama.model,
        "--mode", "closed", "--concurrency", "1", "--delay-scale", "0", "--out", str(out),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    records = out / "records.arrow"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if records.exists() and read_records(records).num_rows >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr.decode()
    table = read_records(records)
    # One pass over both sessions plans every request of the trace; the interrupt stopped the run before the end.
    assert 2 <= table.num_rows < trace.request_count
    run = json.loads((out / RUN_FILE).read_text())
    assert run["run"]["interrupted"] is True and run["run"]["cancel_reason"] == "interrupted"
    assert run["run"]["requests"] == table.num_rows
    assert run["summary"]["counts"]["kept"] >= 2
