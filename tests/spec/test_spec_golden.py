"""Golden acceptance lengths: the shipped JSON equals its YAML sources, lookups, and `agentx spec golden`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.spec.golden import find_curve, golden_al, golden_models, load_golden_table
from scripts.golden_al_to_json import SOURCE_DIR, convert, parse_golden_yaml

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SHIPPED = resources.files("agentx.spec").joinpath("golden_al.json")

SAMPLE = """\
# Source GitHub Actions run: https://example.com/runs/1
# dataset: coding | output_len: 4096
# Measured on m (H100, vLLM MTP), per num_speculative_tokens.
#
# key = num_speculative_tokens (MTP level); value = golden AL
my-model:
  thinking_on:
    1: 1.50
    2: 2.00
  thinking_off:
    1: 1.25
"""


@pytest.fixture(scope="module")
def source_dir() -> Path:
    if not SOURCE_DIR.is_dir() or not any(SOURCE_DIR.glob("*.yaml")):
        pytest.skip(f"golden AL YAML files not found at {SOURCE_DIR} (they are not part of the repository)")
    return SOURCE_DIR


def test_the_shipped_json_is_what_the_script_makes_from_the_yaml(source_dir: Path) -> None:
    assert SHIPPED.read_text(encoding="utf-8") == convert(source_dir), "run: python -m scripts.golden_al_to_json"


def test_every_value_equals_the_yaml_as_pyyaml_reads_it(source_dir: Path) -> None:
    yaml: Any = pytest.importorskip("yaml")
    table = load_golden_table()
    files = sorted(source_dir.glob("*.yaml"))
    assert len(table.curves) == len(files)
    for path in files:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        ((model, modes),) = document.items()
        curve = find_curve(model, path.stem)
        assert curve.model == model and curve.source_file == path.name
        for mode in ("thinking_on", "thinking_off"):
            expected = {int(k): float(v) for k, v in (modes.get(mode) or {}).items()}
            assert curve.curve(mode == "thinking_on") == expected, (path.name, mode)
            for k, value in expected.items():
                assert golden_al(model, k, mode == "thinking_on", path.stem).acceptance_length == value


def test_the_issue_example_kimi_k3_at_k7() -> None:
    golden = golden_al("kimi-k3", 7)
    assert golden.acceptance_length == 3.78
    assert golden.variant == "kimik3_dspark"
    assert golden.source_url == "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/30304797750"
    assert golden.hardware == "B300" and golden.method == "DSpark"
    assert golden.dataset.startswith("dataset: coding")


def test_the_reader_parses_the_fixed_shape_and_provenance(tmp_path: Path) -> None:
    parsed = parse_golden_yaml(SAMPLE)
    assert parsed.model == "my-model"
    assert parsed.curves == {"thinking_on": {1: 1.5, 2: 2.0}, "thinking_off": {1: 1.25}}
    (tmp_path / "mine_mtp.yaml").write_text(SAMPLE)
    (tmp_path / "mine_mtp_variant.yaml").write_text(SAMPLE.replace("1.50", "1.60"))
    document = json.loads(convert(tmp_path))
    plain, variant = document["curves"]
    assert (plain["variant"], plain["default"]) == ("mine_mtp", True)
    assert (variant["variant"], variant["default"]) == ("mine_mtp_variant", False)
    assert plain["source_url"] == "https://example.com/runs/1"
    assert (plain["hardware"], plain["method"]) == ("H100", "MTP")
    assert plain["thinking_on"] == {"1": 1.5, "2": 2.0}


@pytest.mark.parametrize(
    "text", ["model:\n  thinking_maybe:\n    1: 2\n", "model:\n  thinking_on:\n    one: 2\n", "# only comments\n"]
)
def test_the_reader_refuses_other_shapes(text: str) -> None:
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        parse_golden_yaml(text, "bad.yaml")


@pytest.mark.parametrize(
    ("alias", "model"),
    [
        ("kimi-k3", "kimi-k3"),
        ("KIMI_K3", "kimi-k3"),
        ("kimik3", "kimi-k3"),
        ("kimi-k2.5", "kimi-k2.5-nvfp4"),
        ("Kimi K2.5", "kimi-k2.5-nvfp4"),
        ("qwen3.5", "qwen3.5-397b-a17b-nvfp4"),
        ("glm-5.2", "glm-5.2-fp8"),
        ("glm5.2_mtp", "glm-5.2-fp8"),
        ("minimax-m3", "minimax-m3"),
        ("deepseek-v4-pro", "deepseek-v4-pro"),
        ("deepseek_v4_pro_0813", "deepseek-v4-pro-0813"),
    ],
)
def test_lookup_tolerates_case_separators_and_prefixes(alias: str, model: str) -> None:
    assert find_curve(alias).model == model


def test_the_default_variant_is_the_plain_recipe_and_others_are_reachable() -> None:
    assert find_curve("kimi-k3").variant == "kimik3_dspark"
    block = find_curve("kimi-k3", "block")
    assert block.variant == "kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method"
    assert golden_al("kimi-k3", 7, variant="block").acceptance_length == 3.84
    assert find_curve("minimax-m3").variant == "minimaxm3_eagle3"
    assert find_curve("minimax-m3", "gqa").variant == "minimaxm3_eagle3_gqa"
    assert find_curve("minimaxm3_eagle3_gqa").variant == "minimaxm3_eagle3_gqa"
    assert find_curve("minimaxm3_eagle3_g").variant == "minimaxm3_eagle3_gqa"
    assert sum(curve.default for curve in load_golden_table().curves) == len(golden_models())


def test_unknown_and_ambiguous_models_list_what_exists() -> None:
    with pytest.raises(ValueError, match=r"no golden AL for model 'llama'; known: .*kimi-k3 .*K 1\.\.8"):
        find_curve("llama")
    with pytest.raises(ValueError, match=r"'kimi' is ambiguous \(kimi-k2.5-nvfp4, kimi-k3\)"):
        find_curve("kimi")
    with pytest.raises(ValueError, match="has no K=9; published K: 1, 2, 3, 4, 5, 6, 7, 8"):
        golden_al("kimi-k3", 9)
    with pytest.raises(ValueError, match="no thinking_off curve; published: thinking_on only"):
        golden_al("kimi-k3", 7, thinking=False)
    with pytest.raises(ValueError, match="variant 'zzz' matches none"):
        find_curve("kimi-k3", "zzz")


def test_thinking_off_values() -> None:
    assert golden_al("qwen3.5", 8, thinking=False).acceptance_length == 4.71
    assert golden_al("qwen3.5", 8).acceptance_length == 5.21


def test_golden_models_are_the_yaml_model_keys() -> None:
    assert golden_models() == [
        "deepseek-v4-pro",
        "deepseek-v4-pro-0813",
        "glm-5.2-fp8",
        "kimi-k2.5-nvfp4",
        "kimi-k3",
        "minimax-m3",
        "qwen3.5-397b-a17b-nvfp4",
    ]


# The command line.


def test_cli_prints_the_number_alone_on_stdout() -> None:
    result = CliRunner().invoke(main, ["spec", "golden", "--model", "kimi-k3", "--k", "7"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "3.78\n"
    assert "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/30304797750" in result.stderr


def test_cli_json_value_and_curve_parse() -> None:
    result = CliRunner().invoke(main, ["spec", "golden", "--model", "qwen3.5", "--k", "3", "--no-thinking", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["acceptance_length"], document["thinking"], document["spec_k"]) == (3.33, False, 3)
    result = CliRunner().invoke(main, ["spec", "golden", "--model", "minimax-m3", "--variant", "gqa", "--json"])
    assert result.exit_code == 0, result.output
    curve = msgspec.json.decode(result.stdout)
    assert curve["variant"] == "minimaxm3_eagle3_gqa"
    assert curve["thinking_off"]["5"] == 3.72


def test_cli_prints_the_whole_curve_with_its_source() -> None:
    result = CliRunner().invoke(main, ["spec", "golden", "--model", "kimi-k3"])
    assert result.exit_code == 0, result.output
    assert "kimi-k3 thinking_on (variant kimik3_dspark, the default)" in result.stdout
    assert "7  3.78" in result.stdout
    assert "source: https://github.com/SemiAnalysisAI/InferenceX/actions/runs/30304797750" in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "kimi"], "is ambiguous"),
        (["--model", "kimi-k3", "--k", "12"], "has no K=12"),
        (["--model", "kimi-k3", "--no-thinking"], "no thinking_off curve"),
    ],
)
def test_cli_errors_exit_2_without_a_traceback(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["spec", "golden", *argv])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
