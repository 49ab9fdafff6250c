"""The output format of `convert` (and `save_trace`) is the destination's suffix or `--to`, never a guess: an
unknown suffix is refused naming the known ones, and a name containing "mooncake" means nothing. An existing
destination is replaced only with `--overwrite`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.errors import ConfigError
from agentx.trace.io import detect_format, load_trace, save_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

TRACE = {
    "id": "abc",
    "models": ["m"],
    "block_size": 64,
    "hash_id_scope": "local",
    "requests": [{"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 10, "hash_ids": [0, 1, 2], "api_time": 1.0}],
}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(TRACE) + "\n")
    return path


@pytest.mark.parametrize("name", ["out.csv", "out", "out.jsonl.gz", "trace.arrow.bak"])
def test_convert_refuses_a_suffix_that_names_no_format(source: Path, tmp_path: Path, name: str) -> None:
    destination = tmp_path / name
    result = CliRunner().invoke(main, ["convert", str(source), str(destination)])
    assert result.exit_code == 2, result.output
    assert "names no trace format (known: .arrow, .ipc, .feather (Arrow), .parquet (Parquet)" in result.output
    assert "pass --to arrow, parquet, weka or mooncake" in result.output and "Traceback" not in result.output
    assert not destination.exists()


@pytest.mark.parametrize(
    ("name", "written"),
    [("out.arrow", "arrow"), ("OUT.Parquet", "parquet"), ("t.feather", "arrow"), ("out.json", "weka")],
)
def test_a_known_suffix_names_the_format(source: Path, tmp_path: Path, name: str, written: str) -> None:
    result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    assert detect_format(tmp_path / name) == written


def test_a_name_containing_mooncake_is_weka_jsonl_unless_to_says_mooncake(source: Path, tmp_path: Path) -> None:
    named = tmp_path / "mooncake.jsonl"
    assert CliRunner().invoke(main, ["convert", str(source), str(named)]).exit_code == 0
    assert detect_format(named) == "weka"
    asked = tmp_path / "rows.txt"  # --to decides, whatever the name
    assert CliRunner().invoke(main, ["convert", str(source), str(asked), "--to", "mooncake"]).exit_code == 0
    assert detect_format(asked) == "mooncake"


def test_save_trace_refuses_an_unknown_suffix_with_a_config_error(source: Path, tmp_path: Path) -> None:
    trace = load_trace(source)
    with pytest.raises(ConfigError, match=r"out\.csv: its suffix '\.csv' names no trace format .* format= \(arrow"):
        save_trace(trace, tmp_path / "out.csv")
    save_trace(trace, tmp_path / "out.csv", format="weka")  # named: written as asked
    assert detect_format(tmp_path / "out.csv") == "weka"


@pytest.mark.parametrize("to", [[], ["--to", "mooncake"]])
def test_convert_refuses_an_existing_destination_unless_overwrite(source: Path, tmp_path: Path, to: list[str]) -> None:
    destination = tmp_path / "kept.jsonl"
    destination.write_text("a user's file\n")
    result = subprocess.run(
        [sys.executable, "-m", "agentx.cli", "convert", str(source), str(destination), *to],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {destination} already exists; pass --overwrite to replace it, or choose another DESTINATION"
    ]
    assert result.stdout == "" and destination.read_text() == "a user's file\n"
    replaced = CliRunner().invoke(main, ["convert", str(source), str(destination), *to, "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert f"wrote {destination}" in replaced.output
    assert load_trace(destination).request_count == 1 and detect_format(destination) == (to[-1] if to else "weka")
