"""The scripts under examples/ run as a user would run them, against the built-in simulator."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

from agentx.trace.io import load_trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

FAST = ["--sessions", "2", "--time-scale", "0.01", "--delay-scale", "0"]


def _run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def test_embed_in_harness_prints_a_line_per_record_then_the_summary(tmp_path: Path) -> None:
    out = _run("embed_in_harness.py", *FAST, "--concurrency", "2", "--out", str(tmp_path / "run"))
    expected = sum(s.request_count for s in load_trace(REPO / "traces" / "sample.arrow").sessions[:2])
    lines = [line for line in out.splitlines() if line.startswith("record ")]
    assert len(lines) == expected
    assert all("status=ok" in line for line in lines)
    assert f"requests: {expected} ok, 0 errors" in out
    throughput = re.search(r"throughput: ([\d,.]+) output tok/s", out)
    assert throughput is not None and float(throughput.group(1).replace(",", "")) > 0
    assert "p90 interactivity:" in out
    assert (tmp_path / "run" / "records.arrow").exists() and (tmp_path / "run" / "run.json").exists()


def test_sweep_by_hand_prints_one_row_per_level(tmp_path: Path) -> None:
    out = _run("sweep_by_hand.py", *FAST, "--levels", "1,3", "--out", str(tmp_path))
    expected = sum(s.request_count for s in load_trace(REPO / "traces" / "sample.arrow").sessions[:2])
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+\s", line)]
    assert [row[0] for row in rows] == ["1", "3"]
    for row in rows:
        assert int(row[1]) == expected  # every request of the two trees, at each level
        assert float(row[2].replace(",", "")) > 0 and float(row[4].replace(",", "")) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1", "c3"]
