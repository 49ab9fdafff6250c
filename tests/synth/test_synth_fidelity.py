"""compare (fidelity) and generate --like: KS distances, hit-rate curves, and fits to real corpora."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.synth.fidelity import compare, ks_distance
from agentx.synth.fitting import fit
from agentx.synth.generation import generate
from agentx.synth.presets import preset
from agentx.trace.io import load_trace
from agentx.trace.model import Trace
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

samples = st.lists(st.integers(0, 20).map(float), min_size=1, max_size=40)


@given(samples, samples)
def test_ks_distance_is_the_largest_cdf_gap(a: list[float], b: list[float]) -> None:
    brute = max(abs(np.mean(np.asarray(a) <= x) - np.mean(np.asarray(b) <= x)) for x in a + b)
    assert ks_distance(a, b) == pytest.approx(brute)
    assert ks_distance(a, b) == pytest.approx(ks_distance(b, a))
    assert ks_distance(a, a) == 0.0


def test_a_trace_is_alike_to_itself_and_not_to_a_preset() -> None:
    sample = load_trace(SAMPLE_TRACE)
    same = compare(sample, sample)
    assert same.alike and same.max_hit_gap_points == 0.0 and all(d.ks == 0.0 for d in same.distances)
    other = compare(sample, generate(preset("agentic-coding"), sessions=40, seed=0))
    assert not other.alike and other.verdict.startswith("different")


def _assert_like(source: Trace, multiple: int) -> None:
    generated = generate(fit(source), sessions=multiple * len(source.sessions), seed=0)
    assert validate(generated) == []
    fidelity = compare(source, generated)
    ks = {d.quantity: d.ks for d in fidelity.distances}
    assert ks["in"] < 0.1 and ks["out"] < 0.1, fidelity.verdict
    assert fidelity.max_hit_gap_points < 5, fidelity.hit_curve


def test_like_the_sample_corpus() -> None:
    _assert_like(load_trace(SAMPLE_TRACE), 3)


def test_like_the_public_weka_sample(weka_sample_dir: Path) -> None:
    _assert_like(load_trace(weka_sample_dir), 5)


def test_like_generates_more_sessions_without_compressing_time(tmp_path: Path) -> None:
    out = tmp_path / "like.arrow"
    result = CliRunner().invoke(
        main, ["synth", "generate", "--like", str(SAMPLE_TRACE), "--sessions", "60", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    source, generated = load_trace(SAMPLE_TRACE), load_trace(out)
    assert len(generated.sessions) == 60
    durations = [max(r.end for a, _, _ in s.agents() for r in a.requests) for s in generated.sessions]
    originals = [max(r.end for a, _, _ in s.agents() for r in a.requests) for s in source.sessions]
    assert 0.6 < np.median(durations) / np.median(originals) < 1.6


def test_cli_compare_prints_a_verdict_and_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["synth", "compare", str(SAMPLE_TRACE), str(SAMPLE_TRACE)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("alike: largest KS 0.000")
    result = CliRunner().invoke(main, ["synth", "compare", str(SAMPLE_TRACE), str(SAMPLE_TRACE), "--json"])
    document = json.loads(result.output)
    assert document["alike"] is True
    assert {d["quantity"] for d in document["distances"]} == {
        "in",
        "out",
        "think_time_s",
        "requests_per_session",
        "fan_out",
    }
    assert document["hit_curve"][-1]["capacity_tokens_per_session"] is None
    result = CliRunner().invoke(main, ["synth", "compare", str(SAMPLE_TRACE), str(tmp_path / "none.arrow")])
    assert result.exit_code == 2 and "no such file" in result.output and "Traceback" not in result.output
