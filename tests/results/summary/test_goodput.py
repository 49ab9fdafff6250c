"""Goodput: `--slo` parsing, the per-request verdict in the records, the summary's goodput, the
terminal summary and `agentx report`, against the simulator."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from paths import SAMPLE_TRACE
from strategies import record_identity

from agentx.cli import main
from agentx.errors import SloError
from agentx.records.record import SCHEMA, RequestRecord, RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.options.slo import METRIC_COLUMNS, Slos, parse_slo, parse_slos
from agentx.results.summary.summarize import summarize
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

MS = 1_000_000

# ---------------------------------------------------------------------------------------------
# parsing


@given(
    metric=st.sampled_from(["ttft", "tpot", "e2el", "TTFT", "Tpot"]),
    value=st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
    unit=st.sampled_from(["s", "ms", "MS", " ms", "S"]),
    separator=st.sampled_from(["=", ":", " = "]),
)
def test_a_target_is_its_value_in_its_unit(metric: str, value: float, unit: str, separator: str) -> None:
    name, seconds = parse_slo(f"{metric}{separator}{value!r}{unit}")
    assert name == metric.lower()
    assert seconds == value * (1e-3 if unit.strip().lower() == "ms" else 1.0)


@given(st.permutations(["ttft=2s", "tpot=50ms", "e2el=30s"]), st.booleans())
def test_targets_gather_from_repeated_or_comma_separated_flags(flags: list[str], joined: bool) -> None:
    given_flags = (",".join(flags),) if joined else tuple(flags)
    assert parse_slos(given_flags) == Slos(ttft_s=2.0, tpot_s=0.05, e2el_s=30.0)
    assert parse_slos(()) == Slos() and Slos().targets_s() == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ttft=2000", "--slo 'ttft=2000': give the value a unit, s or ms (e.g. ttft=2s or ttft=2000ms)"),
        ("ttft=2us", "--slo 'ttft=2us': the unit 'us' is not s or ms"),
        ("ttfb=2s", "--slo 'ttfb=2s': unknown metric 'ttfb' (known: ttft, tpot, e2el)"),
        ("itl=5ms", "--slo 'itl=5ms': ITL is a gap between streamed chunks, not one value per request; use tpot"),
        ("ttft=0s", "--slo 'ttft=0s': the target must be a positive, finite time"),
        ("tpot=-5ms", "--slo 'tpot=-5ms': the target must be a positive, finite time"),
        ("e2el=infs", "--slo 'e2el=infs': the target must be a positive, finite time"),
        ("ttft=fasts", "--slo 'ttft=fasts': 'fasts' is not a number and a unit (e.g. ttft=2s or ttft=2000ms)"),
        ("e2el=nanms", "--slo 'e2el=nanms': the target must be a positive, finite time"),
        ("ttft", "--slo 'ttft' is not METRIC=VALUE (e.g. ttft=2s or tpot=50ms)"),
    ],
)
def test_a_bad_target_is_refused_naming_the_value(value: str, message: str) -> None:
    with pytest.raises(SloError) as error:
        parse_slos((value,))
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("command", ["replay", "sweep"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slo", "ttft=2000"], "--slo 'ttft=2000': give the value a unit, s or ms"),
        (["--slo", "ttft=-1s"], "--slo 'ttft=-1s': the target must be a positive, finite time"),
        (["--slo", "p99=1s"], "--slo 'p99=1s': unknown metric 'p99'"),
        (["--slo", "ttft=1s", "--slo", "ttft=2s"], "--slo ttft is given twice; give each metric once"),
    ],
)
def test_the_commands_refuse_a_bad_slo_in_one_line(
    tmp_path: Path, command: str, flags: list[str], message: str
) -> None:
    out = tmp_path / "run"
    given_args = [command, str(SAMPLE_TRACE), "--url", "http://127.0.0.1:1", "--model", "m", "--out", str(out)]
    if command == "sweep":
        given_args += ["--concurrency", "1"]
    result = CliRunner().invoke(main, [*given_args, *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1, result.output
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# the verdict per request


def _record(ttft_ms: float, osl: int, e2el_ms: float, **overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(),
        "scheduled_ns": 0,
        "sent_ns": 0,
        "first_token_ns": round(ttft_ms * MS),
        "last_token_ns": round(e2el_ms * MS),
        "end_ns": round(e2el_ms * MS) + MS,
        "isl_recorded_tokens": 10,
        "isl_sent_tokens": 10,
        "osl_recorded_tokens": osl,
        "osl_streamed_tokens": osl,
        **overrides,
    }
    return RequestRecord(**values)


targets = st.none() | st.floats(min_value=0.001, max_value=2.0)


@given(
    ttft_ms=st.integers(1, 1000),
    extra_ms=st.integers(0, 2000),
    osl=st.integers(1, 200),
    ttft_s=targets,
    tpot_s=targets,
    e2el_s=targets,
)
def test_a_request_meets_the_slos_when_each_given_metric_is_at_most_its_target(
    ttft_ms: int, extra_ms: int, osl: int, ttft_s: float | None, tpot_s: float | None, e2el_s: float | None
) -> None:
    record = _record(ttft_ms, osl, ttft_ms + extra_ms)
    slos = Slos(ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s)
    expected = all(
        target is None or value is None or value <= target
        for value, target in ((record.ttft_s, ttft_s), (record.tpot_s, tpot_s), (record.e2el_s, e2el_s))
    )
    assert slos.met(record) == (None if not slos.targets_s() else expected)


def test_the_verdict_at_the_edges() -> None:
    slos = Slos(ttft_s=0.1, tpot_s=0.01)
    assert slos.met(_record(100, 11, 200)) is True  # exactly at both targets (inclusive, as vLLM bench)
    assert slos.met(_record(100, 1, 5000)) is True  # one output token: no TPOT to judge
    assert slos.met(_record(100, 11, 200, status="error", error_kind="http")) is False
    assert slos.met(_record(50, 11, 100, first_token_ns=None, last_token_ns=None, osl_streamed_tokens=0)) is False
    assert Slos().met(_record(1, 2, 2)) is None
    with pytest.raises(ValueError, match="the ttft SLO must be a finite number of seconds"):
        Slos(ttft_s=float("inf"))


def test_the_verdict_is_in_the_records_stream_while_the_run_writes_it(tmp_path: Path) -> None:
    """A killed run's stream carries `slo_met`: the column is written with the record."""
    path = tmp_path / "records.arrow"
    writer = RecordWriter(path, RunInfo(run_id="run-1", wall_epoch_ns=0, options={"slo": {"ttft_s": 0.1}}))
    try:
        writer.append(msgspec.structs.replace(_record(50, 11, 100), slo_met=True))
        writer.append(_record(500, 11, 600))  # made by hand: no verdict
        writer.flush()
        stream = read_records(path)  # the open stream, as a kill would leave it
    finally:
        writer.close()
    assert stream.column("slo_met").to_pylist() == [True, None]


def test_a_file_without_the_column_or_without_slos_has_no_goodput() -> None:
    rows = [msgspec.structs.asdict(_record(50, 11, 100))]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert summarize(table).goodput is None  # no SLO: null verdicts
    assert summarize(table.drop_columns(["slo_met"])).goodput is None  # a file from before format 1.7


# ---------------------------------------------------------------------------------------------
# a real replay


def _expected(records: pa.Table, ttft_s: float, tpot_s: float) -> tuple[list[bool], dict[str, float]]:
    """Each record's verdict and the goodput, recomputed from the records' own latencies."""
    rows = records.to_pylist()
    verdicts = [
        row["status"] == "ok"
        and row["ttft_s"] is not None
        and row["ttft_s"] <= ttft_s
        and (row[METRIC_COLUMNS["tpot"]] is None or row[METRIC_COLUMNS["tpot"]] <= tpot_s)
        for row in rows
    ]
    profiling = [row["phase"] == "profiling" and row["error_kind"] != "cancelled" for row in rows]
    kept = [row for row in rows if row["phase"] == "profiling" and row["status"] == "ok"]
    duration_s = (max(row["end_ns"] for row in kept) - min(row["sent_ns"] for row in kept)) / 1e9
    met = [row for row, ok, judged in zip(rows, verdicts, profiling, strict=True) if ok and judged]
    osl = sum(
        row["osl_server_tokens"] if row["osl_server_tokens"] is not None else row["osl_streamed_tokens"] for row in met
    )
    return verdicts, {
        "met": len(met),
        "judged": sum(profiling),
        "requests_per_s": len(met) / duration_s,
        "output_tps": osl / duration_s,
    }


def test_a_replay_with_a_tight_ttft_counts_the_requests_meeting_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "replay",
        str(SAMPLE_TRACE),
        "--mode",
        "closed",
        "--sessions",
        "4",
        "--concurrency",
        "4",
        "--delay-scale",
        "0",
    ]
    args += ["--sim-time-scale", "0.05", "--slo", "ttft=15ms", "--slo", "tpot=50ms", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(
        [sys.executable, "-m", "agentx.cli", *args], capture_output=True, text=True, timeout=240, env=env
    )
    assert result.returncode == 0, result.stderr

    records = read_records(out / "records.arrow")
    verdicts, expected = _expected(records, 0.015, 0.05)
    assert records.column("slo_met").to_pylist() == verdicts
    assert 0 < expected["met"] < expected["judged"], "the target should split the requests"
    good = json.loads((out / "run.json").read_text())["summary"]["goodput"]
    assert good["targets_s"] == {"ttft": 0.015, "tpot": 0.05}
    assert (good["met"], good["judged"]) == (expected["met"], expected["judged"])
    assert good["met_fraction"] == expected["met"] / expected["judged"]
    assert np.isclose(good["requests_per_s"], expected["requests_per_s"], rtol=1e-12)
    assert np.isclose(good["output_tps"], expected["output_tps"], rtol=1e-12)

    text = " ".join(result.stdout.split())
    share = f"{100 * good['met_fraction']:.2f}%"
    assert f"SLO met (TTFT ≤ 15 ms, TPOT ≤ 50 ms) │ {good['met']:,} / {good['judged']:,} ({share})" in text
    assert f"goodput: requests/s · output tok/s │ {good['requests_per_s']:,.3f} · {good['output_tps']:,.1f}" in text

    report = CliRunner().invoke(main, ["report", str(out), "--markdown"], env={"COLUMNS": "120"})
    assert report.exit_code == 0, report.output
    assert "goodput of run" in report.output and "(SLO: TTFT ≤ 15 ms, TPOT ≤ 50 ms)" in report.output
    row = f"| c4 | {good['met']:,} / {good['judged']:,} | {100 * good['met_fraction']:.1f}% | "
    assert row + f"{good['requests_per_s']:,.3f} | {good['output_tps']:,.1f} |" in report.output
    as_json = json.loads(CliRunner().invoke(main, ["report", str(out), "--json"]).output)
    level = as_json["series"][0]["levels"][0]
    assert level["goodput_requests_per_s"] == good["requests_per_s"] and level["slo_met"] == good["met"]


def test_streamed_records_carry_their_verdict(tmp_path: Path) -> None:
    """The library: `Scenario(slo=...)` judges every record as it is made; `stream_replay` hands it on judged."""
    import agentx

    requests = [Request(t=float(turn), model="m", in_tokens=64, out_tokens=8, api_time=0.1) for turn in range(4)]
    trace = Trace(sessions=[Session(session_id="s", root=Agent(requests=requests))], block_size=16)
    slos = Slos(ttft_s=10.0, tpot_s=1e-4)

    async def run(url: str, model: str) -> list[RequestRecord]:
        options = ReplayOptions(
            server=Server(url=url, model=model),
            out_dir=tmp_path,
            load=ClosedLoad(),
            scenario=Scenario(delay_scale=0.0, slo=slos),
        )
        async with agentx.stream_replay(trace, options) as stream:
            return [record async for record in stream]

    with SimServer(time_scale=0.01, block_size=16) as sim:
        streamed = asyncio.run(run(sim.url, sim.model))
    expected = [r.ttft_s is not None and r.ttft_s <= 10.0 and (r.tpot_s or 0.0) <= 1e-4 for r in streamed]
    assert len(streamed) == 4 and [record.slo_met for record in streamed] == expected
    written = read_records(tmp_path / "records.arrow").to_pylist()
    by_request = {row["request_id"]: row["slo_met"] for row in written}
    assert [by_request[record.request_id] for record in streamed] == expected
