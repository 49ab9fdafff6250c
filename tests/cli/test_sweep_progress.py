"""`agentx sweep` on stderr: each level's progress lines, then its headline numbers in two lines of 80 columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.cli.commands.sweep import level_lines, sweep_line
from agentx.cli.display.progress import INTERVAL_ENV
from agentx.records.run_folder import RUN_FILE
from agentx.results.folders.sweep_index import LevelEntry, LevelStatus
from agentx.results.summary.summarize import Summary
from agentx.run.sweep import LevelResult, SweepResult

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

HEAD = re.compile(r"  c(\d+): ok in \d+\.\d s, ([\d,]+) requests, 0 errors, ([\d,]+) out tok/s")
FIGURES = re.compile(
    r"    TTFT p50 [\d.]+ (us|ms|s) p99 [\d.]+ (us|ms|s), [\d,.]+ tok/s/user p90, dispatch lag p99 [\d.]+ (us|ms|s)"
)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """A tiny sweep through the command line against the built-in simulator: its stderr lines, its folder."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    args = ["sweep", str(SAMPLE_TRACE), "--mode", "closed", "--concurrency", "1,2", "--duration", "1.5", "--grace", "5"]
    args += ["--delay-scale", "0", "--sim-time-scale", "0.05", "--out", str(out)]
    result = CliRunner().invoke(main, args, env={INTERVAL_ENV: "0.3", "FORCE_COLOR": None, "TTY_COMPATIBLE": None})
    assert result.exit_code == 0, result.output
    return result.stderr.splitlines(), out


def _summary(out: Path, level: int) -> Summary:
    return msgspec.convert(json.loads((out / f"c{level}" / RUN_FILE).read_text())["summary"], Summary)


def test_each_level_prints_its_progress_then_its_headline_numbers(swept: tuple[list[str], Path]) -> None:
    lines, out = swept
    for level, position in ((1, 1), (2, 2)):
        start = lines.index(f"level {position}/2: concurrency {level}")
        head = next(i for i in range(start, len(lines)) if lines[i].startswith(f"  c{level}: "))
        progress = lines[start + 1 : head]
        assert any(" profiling " in line for line in progress), progress  # the level's plain progress lines
        assert progress[-1].startswith("[") and " ended: " in progress[-1], progress
        found = HEAD.fullmatch(lines[head])
        assert found is not None, lines[head]
        assert FIGURES.fullmatch(lines[head + 1]), lines[head + 1]
        assert len(lines[head]) <= 80 and len(lines[head + 1]) <= 80
        summary = _summary(out, level)
        assert summary.throughput is not None
        assert found[2] == f"{summary.counts.profiling:,}" and found[3] == f"{summary.throughput.output_tps:,.0f}"


def test_level_lines_fit_80_columns_at_their_widest_and_name_a_failure(
    swept: tuple[list[str], Path], tmp_path: Path
) -> None:
    failed = LevelResult(
        entry=LevelEntry(concurrency=8, dir="c8", status="failed", error="the server is unreachable", elapsed_s=0.46),
        run_dir=tmp_path,
    )
    assert level_lines(failed) == ["  c8: failed in 0.5 s: the server is unreachable"]
    summary = _summary(swept[1], 1)
    summary.counts.profiling, summary.counts.errors = 1_234_567, 12_345
    assert summary.throughput is not None and summary.latency.ttft_s is not None
    assert summary.latency.interactivity_tps is not None and summary.dispatch_lag is not None
    summary.throughput.output_tps = 1_234_567.0
    summary.latency.ttft_s.p50, summary.latency.ttft_s.p99 = 12.345, 1234.5
    summary.latency.interactivity_tps.p90 = 1_234.5
    summary.dispatch_lag.p99_s = 0.0123
    entry = LevelEntry(concurrency=256, dir="c256", status="kept", elapsed_s=3725.0)
    first, second = level_lines(LevelResult(entry=entry, run_dir=tmp_path, summary=summary))
    assert first == "  c256: kept in 1:02:05, 1,234,567 requests, 12,345 errors, 1,234,567 out tok/s"
    assert second == "    TTFT p50 12.3 s p99 1,234 s, 1,234 tok/s/user p90, dispatch lag p99 12.3 ms"
    assert len(first) <= 80 and len(second) <= 80


def test_the_last_line_says_how_each_level_ended_and_where_an_interrupted_sweep_stopped(tmp_path: Path) -> None:
    def result(statuses: list[tuple[int, LevelStatus]], interrupted: bool) -> SweepResult:
        levels = [
            LevelResult(entry=LevelEntry(concurrency=c, dir=f"c{c}", status=s), run_dir=tmp_path) for c, s in statuses
        ]
        return SweepResult(out_dir=tmp_path, levels=levels, interrupted=interrupted)

    stopped = result([(1, "kept"), (2, "ok"), (4, "interrupted")], interrupted=True)
    assert sweep_line(stopped, 5) == (
        f"sweep interrupted at c4: 3 of 5 level(s) in {tmp_path} (1 ok, 1 kept, 1 interrupted); the rest were not run"
    )
    done = result([(1, "ok"), (2, "failed")], interrupted=False)
    assert sweep_line(done, 2) == (
        f"sweep: 2 of 2 level(s) in {tmp_path} (1 ok, 1 failed); `agentx report {tmp_path}` for the frontier and costs"
    )
