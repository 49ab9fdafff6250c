"""The public agentic sources end to end: TraceLab rounds, a Codex CLI rollout and an OpenTelemetry GenAI export each
load, validate, convert to Arrow and replay against the built-in simulator in AgentX and closed modes (the shared
examples skipped cleanly where ../shared/data is absent), and their prefix reuse reaches the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from otlp_export import write_agent_session
from paths import SHARED_DATA

from agentx.cli import main
from agentx.records.record import read_records, to_records
from agentx.trace.io import load_trace
from agentx.trace.stats import prefix_cache_hits

pytestmark = pytest.mark.slow  # starts simulators (tests/project/test_tiers.py)

TRACELAB = SHARED_DATA / "tracelab"
SOURCES = ("tracelab-sanitized", "tracelab-derived", "codex-rollout", "otlp-export")


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _needs(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"TraceLab's public examples not found at {path} (they are not part of the repository)")
    return path


def _arrow(source: str, tmp_path: Path) -> Path:
    """The source converted to the native file, the way a user would."""
    out = tmp_path / f"{source}.arrow"
    if source.startswith("tracelab-"):
        _cli("convert", str(_needs(TRACELAB / source.removeprefix("tracelab-") / "round_trace.jsonl")), str(out))
    elif source == "codex-rollout":
        _cli(
            "synth", "from-logs", "--format", "codex", str(_needs(TRACELAB / "codex" / "trace.json")), "--out", str(out)
        )
    else:
        _cli("convert", str(write_agent_session(tmp_path / "export.json")), str(out))
    return out


@pytest.mark.parametrize("source", SOURCES)
def test_each_source_replays_in_agentx_and_closed_modes(source: str, tmp_path: Path) -> None:
    arrow = _arrow(source, tmp_path)
    trace = load_trace(arrow)
    assert trace.request_count > 0 and trace.hash_id_scope == "global"
    _, totals = prefix_cache_hits(trace)
    assert totals.sum() > 0
    scale = ("--sim-time-scale", "0.01", "--delay-scale", "0.01")
    runs = {
        # AgentX mode resumes each lane mid-session after a warmup: enough trees to reach profiling turns.
        "agentx": ("--sessions", str(max(16, 8 * len(trace.sessions))), "--concurrency", "2"),
        "closed": ("--mode", "closed", "--concurrency", "2", "--sessions", str(len(trace.sessions))),
    }
    for mode, flags in runs.items():
        out = tmp_path / mode
        printed = _cli("replay", str(arrow), *flags, *scale, "--out", str(out))
        records = to_records(read_records(out / "records.arrow"))
        profiling = [r for r in records if r.phase == "profiling"]
        assert profiling, printed
        assert all(r.status == "ok" for r in records), [r.error_message for r in records if r.status != "ok"]
        # Each request carried its recorded prompt (the cache-bust marker aside) and asked for its recorded answer.
        assert all(r.isl_sent_tokens - r.cache_bust_tokens == r.isl_recorded_tokens for r in records)
        if mode == "closed":
            # Whole sessions from their first turn: every later turn finds its agent's previous prompt at the server.
            later = [r for r in profiling if r.turn > 0]
            assert later and all((r.cached_tokens or 0) > 0 for r in later), mode
