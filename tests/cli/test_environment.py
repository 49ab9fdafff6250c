"""The environment's conventions a run honours or says it does not: OPENAI_BASE_URL is never taken for `--url` (the
simulator starts, and stderr says how to use it), OPENAI_API_KEY is (tests/replayer/http/test_api_key.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import SAMPLE_TRACE

import agentx

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def test_openai_base_url_is_said_and_not_used(tmp_path: Path) -> None:
    # An address nothing listens on: a run that used it would fail.
    environ = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--mode", "closed", "--sessions", "1",
        "--sim-time-scale", "0.02", "--delay-scale", "0", "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no --url: replaying against the built-in simulator" in done.stderr
    assert 'OPENAI_BASE_URL is set but not used: pass --url "$OPENAI_BASE_URL"' in done.stderr
    assert agentx.read_records(tmp_path / "run" / "records.arrow").num_rows > 0
