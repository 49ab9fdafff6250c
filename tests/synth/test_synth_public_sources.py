"""`synth generate --like` on each public source (TraceLab rounds, a Codex rollout's trace, an OTLP export), and
`synth compare` of a TraceLab-derived corpus beside the public Weka sample (both skipped cleanly where ../shared/data is
absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from otlp_export import write_agent_session
from paths import SHARED_DATA

from agentx.cli import main
from agentx.synth.fidelity import compare, ks_critical
from agentx.synth.fitting import fit
from agentx.synth.generation import generate
from agentx.trace.io import load_trace
from agentx.trace.validation import validate

pytestmark = pytest.mark.slow  # CliRunner commands (tests/project/test_tiers.py)

TRACELAB = SHARED_DATA / "tracelab"


def _source(name: str, tmp_path: Path) -> Path:
    if name == "otlp-export":
        return write_agent_session(tmp_path / "export.json")
    path = TRACELAB / ("sanitized/round_trace.jsonl" if name == "tracelab" else "codex/trace.json")
    if not path.exists():
        pytest.skip(f"TraceLab's public examples not found at {path} (they are not part of the repository)")
    if name == "tracelab":
        return path
    out = tmp_path / "codex.arrow"
    result = CliRunner().invoke(main, ["synth", "from-logs", "--format", "codex", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("name", ["tracelab", "codex-rollout", "otlp-export"])
def test_generate_like_fits_each_source(name: str, tmp_path: Path) -> None:
    path = _source(name, tmp_path)
    source = load_trace(path)
    generated = generate(fit(source), sessions=40, seed=0)
    assert validate(generated) == []
    fidelity = compare(source, generated)
    rounds = source.request_count
    for distance in fidelity.distances:
        if distance.quantity in ("in", "out"):
            # The examples are a few rounds: the two-sample test's critical value is the bound that means anything.
            assert distance.ks < ks_critical(rounds, generated.request_count), fidelity.verdict
    out = tmp_path / "like.arrow"
    result = CliRunner().invoke(main, ["synth", "generate", "--like", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert load_trace(out).hash_id_scope == source.hash_id_scope == "global"


def test_compare_puts_a_tracelab_derived_corpus_beside_the_weka_sample(weka_sample_dir: Path, tmp_path: Path) -> None:
    derived = tmp_path / "tracelab_like.arrow"
    generated = CliRunner().invoke(
        main,
        ["synth", "generate", "--like", str(_source("tracelab", tmp_path)), "--sessions", "200", "--out", str(derived)],
    )
    assert generated.exit_code == 0, generated.output
    result = CliRunner().invoke(main, ["synth", "compare", str(derived), str(weka_sample_dir), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["verdict"].startswith("different")
    ks = {d["quantity"]: d for d in document["distances"]}
    # The examples' Claude Code and Codex sessions run at about half the Weka sessions' context (32k against 67k tokens
    # at the median) and never spawn subagents, where the Weka sample's do.
    assert ks["in"]["median_a"] < ks["in"]["median_b"] and ks["in"]["ks"] > ks["in"]["limit"]
    assert "in" in document["verdict"]
