"""The Python examples of README.md and docs/api.md run as written, against the simulator, from a folder holding the
repository's traces/: README's as a newcomer runs it (well under a minute, its progress logged), docs/api.md's with
a faster simulated clock and fewer sessions: a renamed public name breaks this test, not a reader."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

README_MAX_S = 60.0
"""What "well under a minute" allows on a loaded two-core machine (about 10 s on a quiet one)."""


def _first_python_block(document: Path) -> str:
    found = re.search(r"```python\n(.*?)```", document.read_text(encoding="utf-8"), re.DOTALL)
    assert found is not None, f"{document} has no Python example"
    return found.group(1)


def _run(code: str, folder: Path) -> subprocess.CompletedProcess[str]:
    (folder / "traces").symlink_to(REPO / "traces", target_is_directory=True)
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=300)


def test_the_readme_example_runs_as_written_and_says_how_far_it_got(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _run(_first_python_block(REPO / "README.md"), tmp_path)
    elapsed_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "runs" / "python"
    assert (out / "records.arrow").is_file() and (out / "run.json").is_file()
    log = done.stderr
    assert "agentx: replaying against http://127.0.0.1:" in log and "the run ends after 4 session trees" in log
    assert re.search(r"agentx: done at \d+ s .*: \d+ requests recorded, 0 failed", log), log
    assert elapsed_s < README_MAX_S, f"the README example took {elapsed_s:.0f} s"


def test_the_api_example_runs(tmp_path: Path) -> None:
    code = _first_python_block(REPO / "docs" / "api.md")
    swaps = {
        "time_scale=0.05": "time_scale=0.002",
        "Scenario(sessions=8, delay_scale=0.05)": "Scenario(sessions=2, delay_scale=0)",
    }
    for written, faster in swaps.items():
        assert written in code  # the example still says it
        code = code.replace(written, faster)
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "x" / "records.arrow").is_file() and (tmp_path / "runs" / "x" / "run.json").is_file()
