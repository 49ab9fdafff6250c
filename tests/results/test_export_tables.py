"""`agentx export RUN_DIR --format arrow|parquet|csv` (agentx/results/export/tables.py): the values round-trip,
the files open in pyarrow, polars and duckdb, and an existing file is never replaced unless asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples, record_identity

from agentx.cli import main
from agentx.errors import OutputExists
from agentx.records import writer as record_writer
from agentx.records.ipc_files import FILE_MAGIC
from agentx.records.record import COLUMN_NAMES, SCHEMA, RequestRecord, RunInfo, read_records, run_info
from agentx.records.writer import RecordWriter
from agentx.results.export.export_run import export_run
from agentx.results.export.tables import LIST_COLUMNS, csv_table

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

RUN = RunInfo(run_id="run-1", wall_epoch_ns=1_780_000_000_000_000_000, options={"mode": "closed", "seed": 3})
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
NS = st.integers(min_value=0, max_value=2**62)
COUNT = st.integers(min_value=0, max_value=2**40)
INT32 = st.integers(min_value=0, max_value=2**31 - 1)
# Text as it may reach a record: separators, quotes, line breaks, non-ASCII, and words a reader could take for null.
TEXT = st.text(max_size=12) | st.sampled_from(["", "a,b", 'say "hi"', "two\nlines", "cr\r\nlf", "null", "NA", "é中"])


def rec(**fields: Any) -> RequestRecord:
    """A record of session "s" with the given fields; the rest at small valid values."""
    values: dict[str, Any] = {
        **record_identity(),
        "scheduled_ns": 0,
        "sent_ns": 1,
        "end_ns": 2,
        "isl_recorded_tokens": 1,
        "isl_sent_tokens": 1,
        "osl_recorded_tokens": 1,
    }
    values.update(fields)
    return RequestRecord(**values)


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    status = draw(st.sampled_from(["ok", "error"]))
    return rec(
        phase=draw(st.sampled_from(["warmup", "profiling"])),
        lane=draw(st.integers(-1, 2**31 - 1)),
        play=draw(COUNT),
        session_id=draw(TEXT),
        agent_id=draw(TEXT),
        turn=draw(INT32),
        model=draw(TEXT),
        request_id=draw(TEXT),
        scheduled_ns=draw(NS),
        queued_ns=draw(st.none() | NS),
        sent_ns=draw(NS),
        first_token_ns=draw(st.none() | NS),
        last_token_ns=draw(st.none() | NS),
        end_ns=draw(NS),
        chunk_times_ns=draw(st.lists(INT64, max_size=4)),
        chunk_tokens=draw(st.lists(INT32, max_size=4)),
        isl_recorded_tokens=draw(COUNT),
        isl_sent_tokens=draw(COUNT),
        isl_server_tokens=draw(st.none() | COUNT),
        osl_recorded_tokens=draw(COUNT),
        osl_server_tokens=draw(st.none() | COUNT),
        osl_streamed_tokens=draw(COUNT),
        tokens_estimated=draw(st.booleans()),
        cached_tokens=draw(st.none() | COUNT),
        api_time_recorded_s=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False)),
        ttft_recorded_s=draw(st.none() | st.floats(min_value=0, allow_nan=False, allow_infinity=False)),
        status=status,
        error_kind=None if status == "ok" else draw(st.sampled_from(["http", "timeout", "cancelled"])),
        error_message=None if status == "ok" else draw(st.none() | TEXT),
        http_status=draw(st.none() | st.integers(100, 599)),
    )


def write_run(directory: Path, batch: list[RequestRecord]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    with RecordWriter(directory / "records.arrow", RUN, flush_rows=3) as writer:
        for record in batch:
            writer.append(record)
    return directory


def read_csv_back(path: Path) -> pa.Table:
    """The CSV export read with the records' types: list columns parsed from their JSON arrays."""
    types = {field.name: pa.string() if field.name in LIST_COLUMNS else field.type for field in SCHEMA}
    table = csv.read_csv(
        path,
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False
        ),
    )
    for name in LIST_COLUMNS:
        index = table.schema.get_field_index(name)
        values = [json.loads(text) for text in table.column(name).to_pylist()]
        table = table.set_column(index, SCHEMA.field(name), pa.array(values, type=SCHEMA.field(name).type))
    return table


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(records(), max_size=8))
def test_parquet_and_csv_round_trip_every_value(tmp_path_factory: pytest.TempPathFactory, batch: list[Any]) -> None:
    run = write_run(tmp_path_factory.mktemp("run"), batch)
    original = read_records(run / "records.arrow")
    parquet = export_run(run, "parquet")
    assert parquet == run / "records.parquet"
    from_parquet = pq.read_table(parquet)
    assert from_parquet.equals(original) and run_info(from_parquet) == RUN
    text = export_run(run, "csv")
    assert text.read_text(encoding="utf-8").split("\n", 1)[0] == ",".join(f'"{name}"' for name in COLUMN_NAMES)
    from_csv = read_csv_back(text)
    assert from_csv.schema.names == COLUMN_NAMES
    assert from_csv.to_pylist() == original.to_pylist()


def test_csv_writes_lists_as_json_arrays_and_tells_null_from_empty(tmp_path: Path) -> None:
    record = rec(
        agent_id="",
        chunk_times_ns=[6, 8],
        chunk_tokens=[],
        status="error",
        error_kind="http",
        error_message='bad, "really"\nbad',
    )
    run = write_run(tmp_path / "run", [record])
    row = csv_table(read_records(run / "records.arrow")).to_pylist()[0]
    assert row["chunk_times_ns"] == "[6,8]" and row["chunk_tokens"] == "[]"
    lines = export_run(run, "csv").read_text().splitlines()
    assert len(lines) == 3  # the header, and one record whose message holds a line break
    values = lines[1]
    assert '"[6,8]","[]"' in values and ',"",' in values  # agent_id "" quoted
    assert ",,," in values  # null first/last token times: empty fields


def test_the_exports_open_in_polars_and_duckdb(tmp_path: Path) -> None:
    batch = [
        rec(
            turn=turn,
            agent_id="" if turn % 2 else "sub",
            scheduled_ns=turn,
            sent_ns=turn + 1,
            first_token_ns=turn + 2 if turn else None,
            last_token_ns=turn + 5 if turn else None,
            end_ns=turn + 6,
            chunk_times_ns=[turn + 2, turn + 5],
            chunk_tokens=[1, turn],
            osl_recorded_tokens=turn + 1,
            osl_streamed_tokens=turn + 1,
        )
        for turn in range(5)
    ]
    run = write_run(tmp_path / "run", batch)
    original = read_records(run / "records.arrow")
    expected = [(r["turn"], r["agent_id"], r["ttft_s"], r["chunk_tokens"]) for r in original.to_pylist()]
    parquet, text = export_run(run, "parquet"), export_run(run, "csv")
    query = "SELECT turn, agent_id, ttft_s, chunk_tokens{cast} FROM {source} ORDER BY turn"

    assert pl.read_parquet(parquet).select("turn", "agent_id", "ttft_s", "chunk_tokens").rows() == expected
    connection = duckdb.connect()
    from_parquet = query.format(cast="", source=f"read_parquet('{parquet}')")
    assert connection.execute(from_parquet).fetchall() == expected
    frame = pl.read_csv(text).with_columns(pl.col("chunk_tokens").str.json_decode(pl.List(pl.Int32)))
    assert frame.select("turn", "agent_id", "ttft_s", "chunk_tokens").rows() == expected
    from_csv = query.format(cast="::INTEGER[]", source=f"read_csv('{text}', allow_quoted_nulls = false)")
    assert connection.execute(from_csv).fetchall() == expected


# ---------------------------------------------------------------------------------------------
# the command


def _records(n: int) -> list[RequestRecord]:
    return [rec(turn=turn, scheduled_ns=turn, sent_ns=turn + 1, end_ns=turn + 2) for turn in range(n)]


@pytest.mark.parametrize(("export_format", "name"), [("parquet", "records.parquet"), ("csv", "records.csv")])
def test_cli_writes_beside_the_run_or_into_out_and_says_where(tmp_path: Path, export_format: str, name: str) -> None:
    run = write_run(tmp_path / "run", _records(3))
    result = CliRunner().invoke(main, ["export", str(run), "--format", export_format])
    assert result.exit_code == 0, result.output
    assert f"wrote {run / name}" in result.output and (run / name).is_file()
    out = tmp_path / "elsewhere"
    out.mkdir()
    result = CliRunner().invoke(main, ["export", str(run), "--format", export_format, "--out", str(out)])
    assert result.exit_code == 0 and (out / name).is_file()
    named = tmp_path / f"mine.{export_format}"
    result = CliRunner().invoke(main, ["export", str(run), "--format", export_format, "--out", str(named)])
    assert result.exit_code == 0 and named.is_file()
    assert [path.name for path in run.iterdir() if path.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("export_format", ["parquet", "csv", "arrow", "aiperf-jsonl", "aiperf-summary"])
def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path: Path, export_format: str) -> None:
    run = write_run(tmp_path / "run", _records(2))
    target = tmp_path / "export.out"
    target.write_bytes(b"a user's file")
    args = ["export", str(run), "--format", export_format, "--out", str(target)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "already exists" in result.output and "--overwrite" in result.output
    assert target.read_bytes() == b"a user's file"
    with pytest.raises(OutputExists):
        export_run(run, export_format, target)
    result = CliRunner().invoke(main, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert target.read_bytes() != b"a user's file"


def test_arrow_out_elsewhere_copies_a_killed_runs_stream_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_writer, "finalize_records", lambda path: False)  # as if killed: the stream stays
    run = write_run(tmp_path / "run", _records(4))
    stream = (run / "records.arrow").read_bytes()
    assert not stream.startswith(FILE_MAGIC)
    monkeypatch.undo()
    copy = tmp_path / "copy.arrow"
    result = CliRunner().invoke(main, ["export", str(run), "--format", "arrow", "--out", str(copy)])
    assert result.exit_code == 0, result.output
    assert (run / "records.arrow").read_bytes() == stream  # the run's own file is left as it was
    assert copy.read_bytes().startswith(FILE_MAGIC) and copy.read_bytes().endswith(FILE_MAGIC)
    assert pl.read_ipc(copy).height == 4
    assert read_records(copy).equals(read_records(run / "records.arrow"))
    assert run_info(read_records(copy)) == RUN
