"""`agentx spec flags`: each engine's setting names and formulas for a forced acceptance length."""

from __future__ import annotations

import itertools
import json
import math
import shlex

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from agentx.cli import main
from agentx.engines import ENGINES
from agentx.spec.flags import engine_settings, number_text, shell_lines

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def _vllm_config(al: float, k: int, method: str | None = None, as_rates: bool = False) -> dict[str, object]:
    args = engine_settings("vllm", al, k, method, as_rates=as_rates).args
    assert args[0] == "--speculative-config" and len(args) == 2
    config = json.loads(args[1])
    assert isinstance(config, dict)
    return config


def test_vllm_config_is_json_with_the_synthetic_length() -> None:
    assert _vllm_config(3.78, 7, "mtp") == {
        "method": "mtp",
        "num_speculative_tokens": 7,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 3.78,
    }


def test_vllm_rates_replace_the_length_and_follow_the_schedule() -> None:
    config = _vllm_config(3.78, 7, as_rates=True)
    assert "synthetic_acceptance_length" not in config
    assert "method" not in config
    assert config["synthetic_acceptance_rates"] == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]


def test_settings_carry_the_schedule_of_the_simulator() -> None:
    settings = engine_settings("atom", 3.78, 7)
    assert settings.schedule == (1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0)
    assert (settings.engine, settings.acceptance_length, settings.spec_k) == ("atom", 3.78, 7)


def test_sglang_sets_the_three_variables_and_a_k_step_chain() -> None:
    settings = engine_settings("sglang", 3.78, 7, "mtp")
    assert settings.env == {
        "SGLANG_SIMULATE_ACC_LEN": "3.78",
        "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
        "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
    }
    assert settings.args == [
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "7",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "8",
    ]
    assert any("stall" in note for note in settings.notes)


def test_sglang_dspark_takes_a_block_size_instead_of_steps() -> None:
    args = engine_settings("sglang", 3.51, 5, "dspark").args
    assert args == ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", "5"]


@pytest.mark.parametrize(("al", "expected"), [(3.78, "2.78"), (3.0, "2"), (8.0, "7"), (1.5, "0.5")])
def test_trtllm_forces_al_minus_one_draft_tokens(al: float, expected: str) -> None:
    settings = engine_settings("trtllm", al, 7)
    assert settings.env == {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": expected}
    assert settings.args == []


def test_trtllm_warns_about_fractional_values_only_when_fractional() -> None:
    assert any("fractional" in note for note in engine_settings("trtllm", 3.78, 7).notes)
    assert not any("fractional" in note for note in engine_settings("trtllm", 3.0, 7).notes)


def test_trtllm_refuses_al_one_which_it_reads_as_off() -> None:
    with pytest.raises(ValueError, match="cannot force AL 1"):
        engine_settings("trtllm", 1.0, 7)


def test_atom_length_and_rate() -> None:
    assert engine_settings("atom", 3.78, 7, "mtp").args == [
        "--method",
        "mtp",
        "--num-speculative-tokens",
        "7",
        "--spec-decode-acceptance-length",
        "3.78",
    ]
    args = engine_settings("atom", 3.78, 7, as_rates=True).args
    assert args[:2] == ["--num-speculative-tokens", "7"]
    assert args[2] == "--spec-decode-acceptance-rate"
    assert float(args[3]) == pytest.approx((3.78 - 1) / 7, abs=1e-9)
    assert "--spec-decode-acceptance-length" not in args


def test_llamacpp_length_and_rates() -> None:
    assert engine_settings("llamacpp", 3.78, 7, "mtp").args == [
        "--spec-type",
        "draft-mtp",
        "--spec-draft-n-max",
        "7",
        "--spec-synth-len",
        "3.78",
    ]
    assert engine_settings("llamacpp", 3.78, 7, as_rates=True).args == [
        "--spec-draft-n-max",
        "7",
        "--spec-synth-rates",
        "1,1,0.78,0,0,0,0",
    ]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("al", "k"), [(0.99, 7), (8.01, 7), (math.nan, 3), (2.5, 1)])
def test_al_outside_one_to_k_plus_one_is_refused(engine: str, al: float, k: int) -> None:
    with pytest.raises(ValueError, match=rf"\[1, K\+1\] = \[1, {k + 1}\]"):
        engine_settings(engine, al, k)


def test_k_below_one_and_unknown_engines_are_refused() -> None:
    with pytest.raises(ValueError, match=r"K .* must be >= 1, got 0"):
        engine_settings("vllm", 1.0, 0)
    with pytest.raises(ValueError, match="unknown engine 'tgi'; choose one of: vllm, sglang, trtllm, atom, llamacpp"):
        engine_settings("tgi", 2.0, 3)


def test_the_bounds_themselves_are_allowed() -> None:
    assert engine_settings("vllm", 1.0, 3).schedule == (0.0, 0.0, 0.0)
    assert engine_settings("sglang", 4.0, 3).schedule == (1.0, 1.0, 1.0)


def test_number_text_drops_float_noise() -> None:
    assert number_text(3.78 - 1) == "2.78"
    assert number_text(2.0) == "2"
    assert number_text(0.1 + 0.2) == "0.3"


def test_shell_lines_export_the_env_and_quote_the_args() -> None:
    lines = shell_lines(engine_settings("vllm", 3.78, 7, "mtp"))
    command = next(line for line in lines if line.startswith("--speculative-config"))
    assert shlex.split(command)[1] == engine_settings("vllm", 3.78, 7, "mtp").args[1]
    assert "# per-position acceptance schedule: 1 1 0.78 0 0 0 0" in lines
    assert "export SGLANG_SIMULATE_ACC_LEN=3.78" in shell_lines(engine_settings("sglang", 3.78, 7))


@given(
    k=st.integers(min_value=1, max_value=8),
    fraction=st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
def test_vllm_rates_are_a_valid_schedule_summing_to_al_minus_one(k: int, fraction: float) -> None:
    al = 1.0 + fraction * k
    rates = _vllm_config(al, k, as_rates=True)["synthetic_acceptance_rates"]
    assert isinstance(rates, list) and len(rates) == k
    assert all(0.0 <= rate <= 1.0 for rate in rates)
    assert all(later <= earlier for earlier, later in itertools.pairwise(rates))
    assert abs(sum(rates) - (al - 1.0)) <= 1e-9


# The command line.


def test_cli_prints_shell_lines_and_the_schedule() -> None:
    result = CliRunner().invoke(main, ["spec", "flags", "--engine", "sglang", "--al", "3.78", "--k", "7"])
    assert result.exit_code == 0, result.output
    assert "export SGLANG_SIMULATE_ACC_TOKEN_MODE=real-draft-token" in result.output
    assert "# per-position acceptance schedule: 1 1 0.78 0 0 0 0" in result.output


def test_cli_json_parses_and_takes_the_al_from_the_golden_table() -> None:
    result = CliRunner().invoke(
        main, ["spec", "flags", "--engine", "vllm", "--golden", "kimi-k3", "--k", "7", "--method", "dspark", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["acceptance_length"] == 3.78
    assert document["schedule"] == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    assert json.loads(document["args"][1])["synthetic_acceptance_length"] == 3.78
    assert document["golden"]["variant"] == "kimik3_dspark"
    assert document["golden"]["source_url"].startswith("https://github.com/")


def test_cli_golden_text_names_its_source() -> None:
    result = CliRunner().invoke(main, ["spec", "flags", "--engine", "trtllm", "--golden", "kimi-k3", "--k", "7"])
    assert result.exit_code == 0, result.output
    assert "export TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=2.78" in result.output
    assert "# golden: kimi-k3 (kimik3_dspark) thinking_on K=7" in result.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "--al", "9", "--k", "7"], "[1, K+1] = [1, 8]"),
        (["--engine", "nope", "--al", "2", "--k", "7"], "unknown engine 'nope'"),
        (["--engine", "vllm", "--k", "7"], "exactly one of --al"),
        (["--engine", "vllm", "--al", "2", "--golden", "kimi-k3", "--k", "7"], "exactly one of --al"),
        (["--engine", "vllm", "--golden", "kimi-k3", "--no-thinking", "--k", "7"], "no thinking_off curve"),
        (["--engine", "vllm", "--golden", "nobody", "--k", "7"], "no golden AL for model 'nobody'"),
    ],
)
def test_cli_errors_are_one_message_and_exit_2(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["spec", "flags", *argv])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, ValueError)
