"""`--api-key KEY`: sent as `Authorization: Bearer KEY` on every call, and written nowhere: no file of the run folder,
not stdout, not stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

KEY = "sk-cli-key-5f1e0c2a9b7d"


@pytest.fixture(scope="module")
def guarded() -> Iterator[SimServer]:
    """A server that answers 401 to any call (`/metrics` too) without `Authorization: Bearer KEY`."""
    with SimServer(time_scale=0.01, api_key=KEY) as sim:
        yield sim


def _replay(sim: SimServer, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--url", sim.url, "--mode", "closed"]
    command += ["--sessions", "2", "--concurrency", "2", "--delay-scale", "0", "--out", str(out), *args]
    env = {"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": ""}  # no key from the environment
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_key_reaches_the_server_and_is_written_nowhere(guarded: SimServer, tmp_path: Path, workers: str) -> None:
    out = tmp_path / "run"
    done = _replay(guarded, out, "--api-key", KEY, "--workers", workers)
    assert done.returncode == 0, done.stderr
    run_file = json.loads((out / "run.json").read_text())
    assert run_file["summary"]["cache"]["server_hit_rate"] is not None  # /metrics answered: the key went everywhere
    files = [path for path in out.rglob("*") if path.is_file()]
    assert {"records.arrow", "run.json"} <= {path.name for path in files}
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in done.stdout and KEY not in done.stderr


def test_without_the_key_the_same_server_refuses(guarded: SimServer, tmp_path: Path) -> None:
    done = _replay(guarded, tmp_path / "run")
    assert done.returncode == 2 and "401" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_key_and_an_authorization_header_together_are_refused_without_saying_either(tmp_path: Path) -> None:
    args = ["replay", str(SAMPLE_TRACE), "--api-key", KEY, "--header", "Authorization: Bearer other-secret-value"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "pass --api-key KEY or --header Authorization:..., not both" in result.output
    assert KEY not in result.output and "other-secret-value" not in result.output
    assert not (tmp_path / "run").exists()
