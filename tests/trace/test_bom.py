"""A UTF-8 byte-order mark (what Windows editors write first) is read past in every text format, never an error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from paths import TRACES

from agentx.cli import main
from agentx.trace.io import detect_format, load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("compress", [False, True])
def test_a_weka_trace_with_a_bom_reads_as_without(weka_trace: dict[str, Any], tmp_path: Path, compress: bool) -> None:
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    text = json.dumps(weka_trace, indent=2).encode()
    plain.write_bytes(text)
    marked.write_bytes(gzip.compress(BOM + text) if compress else BOM + text)
    assert detect_format(marked) == "weka"
    assert load_trace(marked).sessions == load_trace(plain).sessions
    assert load_trace(marked, format="weka").sessions == load_trace(plain).sessions


@pytest.mark.parametrize(("name", "fmt"), [("sample.weka.jsonl", "weka"), ("sample.mooncake.jsonl", "mooncake")])
def test_jsonl_traces_with_a_bom_read_as_without(tmp_path: Path, name: str, fmt: str) -> None:
    marked = tmp_path / name
    marked.write_bytes(BOM + (TRACES / name).read_bytes())
    assert detect_format(marked) == fmt
    assert load_trace(marked).sessions == load_trace(TRACES / name).sessions


def test_the_cli_validates_a_trace_with_a_bom(weka_trace: dict[str, Any], tmp_path: Path) -> None:
    marked = tmp_path / "marked.json"
    marked.write_bytes(BOM + json.dumps(weka_trace).encode())
    result = CliRunner().invoke(main, ["validate", str(marked)])
    assert result.exit_code == 0, result.output
    assert "BOM" not in result.output and "malformed" not in result.output
