"""Terminal tables laid out for their width (agentx.cli.display.layout): a number is never cut, at any width."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples
from tables80 import BOX, WIDTHS, assert_fits, rendered

from agentx.cli import main
from agentx.cli.display.layout import Column, FittedTable, text_column
from agentx.cli.display.tables import stats_tables
from agentx.trace.io import load_trace
from agentx.trace.stats import trace_stats

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SAMPLE = "traces/sample.arrow"

numbers = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).map(lambda value: f"{value:,.2f}"),
    st.integers(0, 10**9).map(lambda value: f"{value:,}"),
    st.sampled_from(["–", "—", "0.0004", "12.5%", "$3.990", "1,234 · 5,678 · 9,012"]),
)
words = st.lists(
    st.sampled_from(["TTFT", "p50", "(ms)", "tok/s/user", "a", "requests", "server time"]), min_size=1, max_size=5
)


@st.composite
def tables(draw: st.DrawFn) -> FittedTable:
    numeric = draw(st.integers(1, 11))
    columns = [text_column(" ".join(draw(words)))] + [
        Column(" ".join(draw(words)), drop=draw(st.sampled_from([0, 0, 1, 2, 3]))) for _ in range(numeric)
    ]
    rows = [[" ".join(draw(words)), *(draw(numbers) for _ in range(numeric))] for _ in range(draw(st.integers(1, 6)))]
    return FittedTable(" ".join(draw(words)), columns, rows)


@settings(max_examples=examples(150), deadline=None)
@given(table=tables(), width=st.sampled_from([40, 60, 80, 100, 120, 200]))
def test_a_number_is_never_cut_at_any_width(table: FittedTable, width: int) -> None:
    assert_fits([table], width)


def test_a_table_that_fits_keeps_every_column_and_a_narrow_one_drops_the_optional_first() -> None:
    columns = [text_column("metric"), Column("p50"), Column("p95", drop=1), Column("std", drop=2)]
    table = FittedTable("t", columns, [["TTFT (ms)", "12,345.67", "23,456.78", "34,567.89"]])
    assert "std" in rendered([table], 80) and "p95" in rendered([table], 80)
    narrow = rendered([table], 36)
    assert "std" not in narrow and "p95" in narrow and "12,345.67" in narrow
    narrower = rendered([table], 27)
    assert "p95" not in narrower and "12,345.67" in narrower


def test_a_table_too_wide_for_its_columns_shows_each_row_as_a_table() -> None:
    columns = [text_column("level"), *(Column(f"figure {i}") for i in range(8))]
    table = FittedTable("levels", columns, [["c1", *(f"{10**i:,}.5" for i in range(8))]])
    text = assert_fits([table], 40)
    assert "levels: c1" in text and "figure 7" in text and "10,000,000.5" in text


def test_rows_need_a_cell_per_column() -> None:
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        FittedTable("t", [text_column("a"), Column("b")], [["x"]])


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_tables_fit(width: int) -> None:
    stats = trace_stats(load_trace(SAMPLE), cache_tokens=[1_000_000, 50_000_000])
    text = assert_fits(stats_tables(stats, title=SAMPLE), width)
    assert "33,772" in text  # the mean input length, cut to "33,7…" before
    assert msgspec.json.encode(stats)  # the figures the tables show are the JSON's


@pytest.mark.parametrize("width", WIDTHS)
def test_a_replays_output_fits_the_terminal(width: int, tmp_path: Path) -> None:
    """Through the command line, piped, with COLUMNS set as a terminal of that width would: every table line fits
    and no figure is cut (the summary, speculative acceptance, latency, slowdown and cache tables)."""
    command = [
        sys.executable, "-m", "agentx.cli", "replay", SAMPLE, "--mode", "closed", "--sessions", "3",
        "--concurrency", "3", "--delay-scale", "0", "--sim-time-scale", "0.01", "--gpus", "8",
        "--spec-al", "2.5", "--spec-k", "3", "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": str(width)}, check=False
    )
    assert done.returncode == 0, done.stderr
    tables = [line.rstrip() for line in done.stdout.splitlines() if BOX.search(line)]
    assert len(tables) > 30 and all(len(line) <= width for line in tables), done.stdout
    assert "…" not in done.stdout
    for name in ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2EL (ms)", "interactivity", "realized AL"):
        assert name in done.stdout
    assert f"server metrics: {tmp_path / 'run' / 'server_metrics.arrow'}" in done.stdout  # the simulator has /metrics


def test_the_percentiles_asked_for_are_the_tables_columns_and_in_run_json(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "agentx.cli", "replay", SAMPLE, "--mode", "closed", "--sessions", "2",
        "--concurrency", "2", "--delay-scale", "0", "--sim-time-scale", "0.01",
        "--percentiles", "50,90,99,99.9", "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"}, check=False
    )
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "metric" in line and "mean" in line)
    columns = [cell.strip() for cell in BOX.split(header)][1:-1]
    # The first and last percentiles asked for are kept at any width; those between go first when it is narrow.
    assert columns[:4] == ["metric", "n", "mean", "p50"] and "p99.9" in columns and "p95" not in columns
    summary = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]
    assert summary["percentiles"] == [50, 90, 99, 99.9]
    assert set(summary["latency"]["ttft_s"]["more"]) == {"p99.9"}


@pytest.mark.parametrize("value", ["101", "50,x", ""])
def test_percentiles_out_of_range_are_refused_before_anything_starts(value: str) -> None:
    result = CliRunner().invoke(main, ["replay", SAMPLE, "--percentiles", value, "--out", "unused"])
    assert result.exit_code == 2 and "--percentiles wants numbers in [0, 100]" in result.output
