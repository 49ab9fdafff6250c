"""The session generator and its presets: valid traces, reproducible, shaped as documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.cli import main
from agentx.synth.dist import Dist
from agentx.synth.generation import generate
from agentx.synth.presets import preset
from agentx.trace.io import load_trace
from agentx.trace.stats import tree_shape
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def test_a_preset_trace_validates_without_findings_and_is_reproducible() -> None:
    model = preset("agentic-coding")
    trace = generate(model, sessions=60, seed=7)
    assert validate(trace) == []
    again = generate(model, sessions=60, seed=7)
    assert [s.root.requests for s in trace.sessions] == [s.root.requests for s in again.sessions]
    assert generate(model, sessions=60, seed=8).sessions[0].root.requests != trace.sessions[0].root.requests


def test_the_agentic_coding_preset_holds_its_documented_medians() -> None:
    trace = generate(preset("agentic-coding"), sessions=400, seed=1)
    roots = [s.root.requests for s in trace.sessions]
    first_in = np.median([r[0].in_tokens for r in roots])
    out = np.median([r.out_tokens for r in (x for rs in roots for x in rs)])
    assert 15_100 < first_in < 20_000  # 17,869 in the Weka sample
    assert 200 < out < 340  # 270
    assert 8 < np.median([s.request_count for s in trace.sessions]) < 30  # sessions plus their subagents
    models = {r.model for s in trace.sessions for a, _, _ in s.agents() for r in a.requests}
    assert models == {"claude-opus-4-5", "claude-sonnet-4", "claude-haiku-4-5"}
    shape = tree_shape(trace.sessions)
    assert shape.subagents > 0 and shape.background > 0 and shape.max_fan_out >= 2
    assert shape.joined > shape.background


def test_contexts_grow_keep_their_prefix_and_compact() -> None:
    trace = generate(preset("agentic-coding"), sessions=200, seed=3)
    compactions = 0
    for session in trace.sessions:
        for agent, _, _ in session.agents():
            for previous, request in zip(agent.requests, agent.requests[1:], strict=False):
                if request.in_tokens < previous.in_tokens:
                    compactions += 1
                    assert request.hash_ids_kept == 15_100 // 64  # only the system prompt survives
                else:
                    assert request.hash_ids_kept == previous.in_tokens // 64
            for request in agent.requests:
                assert request.hash_ids_len == -(-request.in_tokens // 64)
    assert compactions > 0


def test_global_scope_shares_the_system_prompt_between_sessions() -> None:
    trace = generate(preset("agentic-coding"), sessions=5, seed=2, scope="global")
    firsts = [s.root.hash_ids(0) for s in trace.sessions]
    system_blocks = 15_100 // 64
    assert all(ids[:system_blocks] == firsts[0][:system_blocks] for ids in firsts)
    assert len({ids[system_blocks] for ids in firsts}) == len(firsts)
    assert validate(trace) == []


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.floats(0.1, 1e6), min_size=1, max_size=200), st.booleans())
def test_a_fitted_distribution_stays_within_the_data(values: list[float], log: bool) -> None:
    dist = Dist.fit(values, log=log)
    drawn = dist.sample(np.random.default_rng(0), 500)
    assert min(values) * (1 - 1e-9) <= drawn.min() and drawn.max() <= max(values) * (1 + 1e-9)


def test_a_discrete_distribution_draws_only_recorded_values_in_their_shares() -> None:
    dist = Dist.fit([1] * 50 + [2] * 30 + [3] * 20, discrete=True)
    drawn = dist.sample(np.random.default_rng(0), 20_000)
    assert set(drawn.tolist()) == {1.0, 2.0, 3.0}
    assert abs(np.mean(drawn == 1) - 0.5) < 0.03 and abs(np.mean(drawn == 3) - 0.2) < 0.03


def test_cli_generate_writes_a_valid_trace(tmp_path: Path) -> None:
    out = tmp_path / "g.arrow"
    result = CliRunner().invoke(
        main, ["synth", "generate", "--preset", "agentic-coding", "--sessions", "20", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(load_trace(out).sessions) == 20
    other = tmp_path / "other.arrow"
    result = CliRunner().invoke(main, ["synth", "generate", "--preset", "nope", "--out", str(other)])
    assert result.exit_code == 2 and "unknown preset 'nope'; presets: agentic-coding" in result.output
    result = CliRunner().invoke(
        main, ["synth", "generate", "--like", str(tmp_path / "missing.arrow"), "--out", str(other)]
    )
    assert result.exit_code == 2 and "no such file" in result.output
    assert not other.exists()


def test_cli_generate_replaces_a_trace_only_when_told(tmp_path: Path) -> None:
    out = tmp_path / "g.arrow"
    args = ["synth", "generate", "--preset", "agentic-coding", "--sessions", "3", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    written = out.read_bytes()
    result = CliRunner().invoke(main, [*args[:-3], "5", "--out", str(out)])
    assert result.exit_code == 2 and f"{out} already exists; pass --overwrite to replace it" in result.output
    assert out.read_bytes() == written
    result = CliRunner().invoke(main, [*args[:-3], "5", "--out", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert len(load_trace(out).sessions) == 5
