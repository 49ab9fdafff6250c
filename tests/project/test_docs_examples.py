"""The Python examples of README.md and docs/api.md run as written, against the simulator, on a sample trace in
place of "corpus.jsonl", with a faster simulated clock and the recorded think times left out (as written they replay
the trace's timing, minutes long): a renamed public name breaks this test, not a reader."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SAMPLE = REPO / "traces" / "sample.weka.jsonl"


def _first_python_block(document: Path) -> str:
    found = re.search(r"```python\n(.*?)```", document.read_text(encoding="utf-8"), re.DOTALL)
    assert found is not None, f"{document} has no Python example"
    return found.group(1)


@pytest.mark.parametrize("document", ["README.md", "docs/api.md"])
def test_the_python_example_runs(document: str, tmp_path: Path) -> None:
    code = _first_python_block(REPO / document)
    swaps = {
        '"corpus.jsonl"': repr(str(SAMPLE)),
        "time_scale=0.05": "time_scale=0.002",
        "Scenario(sessions=8)": "Scenario(sessions=2, delay_scale=0)",
    }
    for written, faster in swaps.items():
        assert written in code  # the example still says it
        code = code.replace(written, faster)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "x" / "records.arrow").is_file() and (tmp_path / "runs" / "x" / "run.json").is_file()
