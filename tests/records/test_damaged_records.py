"""A finished records.arrow cut short is never read as empty: `agentx export` (every format) and `agentx report`
refuse it in one line naming the file, run.json's row count and the rows that could be read (exit 2), and
`agentx.read_records` raises `RecordsDamaged` unless asked for the `partial` rows; a file that lost only its footer
reads whole, and a killed run's stream keeps its complete batches.

The run folders come from real replays against the simulator; the cuts are made at known places of the file: just
its footer, its middle, the middle of its first record batch, inside its schema.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from builders import make_request, make_session, make_trace
from click.testing import CliRunner

from agentx.cli import main
from agentx.errors import RecordsDamaged
from agentx.records import writer as record_writer
from agentx.records.ipc_files import FILE_MAGIC, META_ROWS
from agentx.records.record import read_records
from agentx.records.run_folder import RECORDS_FILE, RUN_FILE
from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.results.export.export_run import FILES
from agentx.run.replay import replay_sync
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
SESSIONS = 4
TURNS = 5
ROWS = SESSIONS * TURNS
SMALL_BATCH_ROWS = 3


def _trace() -> Trace:
    requests = [make_request(float(i), 20 + 16 * i, 4, added=tuple(range(i + 2))) for i in range(TURNS)]
    return make_trace(*(make_session(f"s{n}", requests) for n in range(SESSIONS)), block_size=BLOCK)


def _replay(out: Path) -> Path:
    with SimServer(time_scale=0.01, block_size=BLOCK) as sim:
        options = ReplayOptions(
            server=Server(url=sim.url, model=sim.model, stream_usage="continuous"),
            out_dir=out,
            load=ClosedLoad(concurrency=2),
            scenario=Scenario(delay_scale=0.0),
            runtime=Runtime(grace_s=5.0),
        )
        result = replay_sync(_trace(), options)
    assert result.summary.counts.rows == ROWS
    return out


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run as a replay leaves it: one record batch (fewer rows than `FINAL_BATCH_ROWS`)."""
    return _replay(tmp_path_factory.mktemp("finished") / "run")


@pytest.fixture(scope="module")
def batched_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose file holds several record batches, as a run of more than `FINAL_BATCH_ROWS` rows does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(record_writer, "FINAL_BATCH_ROWS", SMALL_BATCH_ROWS)
        return _replay(tmp_path_factory.mktemp("batched") / "run")


def _layout(path: Path) -> tuple[int, list[tuple[int, int]]]:
    """Where the schema message ends and where each record batch message lies (start, end) in an IPC file."""
    data = path.read_bytes()
    assert data.startswith(FILE_MAGIC)
    source = pa.BufferReader(pa.py_buffer(data))
    source.seek(8)
    ipc.read_message(source)  # the schema
    schema_end = source.tell()
    batches = []
    while True:
        start = source.tell()
        message = ipc.read_message(source)
        if message.type != "record batch":
            raise AssertionError(message.type)
        batches.append((start, source.tell()))
        if len(batches) == ipc.open_file(pa.py_buffer(data)).num_record_batches:
            return schema_end, batches


def _footer_start(path: Path) -> int:
    data = path.read_bytes()
    footer_bytes: int = struct.unpack("<i", data[-10:-6])[0]  # the footer, then its length and the magic
    return len(data) - 10 - footer_bytes


def _cut_copy(run: Path, where: Callable[[Path], int], into: Path) -> Path:
    """A copy of the run folder whose records file ends at `where(records)` bytes."""
    shutil.copytree(run, into)
    records = into / RECORDS_FILE
    size = where(records)
    assert 0 < size < records.stat().st_size
    with open(records, "r+b") as handle:
        handle.truncate(size)
    return into


def _half(path: Path) -> int:
    return path.stat().st_size // 2


def _mid_first_batch(path: Path) -> int:
    _, batches = _layout(path)
    start, end = batches[0]
    return (start + end) // 2


def _in_schema(path: Path) -> int:
    schema_end, _ = _layout(path)
    return schema_end // 2


def _complete_batches_before(path: Path, size: int) -> int:
    """The rows of the record batches that end before `size` bytes."""
    _, batches = _layout(path)
    whole = sum(1 for _, end in batches if end <= size)
    return sum(ipc.open_file(path).get_batch(i).num_rows for i in range(whole))


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output  # one line (the terminal may wrap it)
    return lines[0]


# ---------------------------------------------------------------------------------------------
# a finished file cut short


CUTS: dict[str, Callable[[Path], int]] = {"half": _half, "mid-first-batch": _mid_first_batch, "in-schema": _in_schema}


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("export_format", [*FILES, "arrow-in-place"])
def test_export_refuses_a_short_file_naming_run_json_count_and_rows_read(
    finished_run: Path, batched_run: Path, tmp_path: Path, cut: str, export_format: str
) -> None:
    for name, run in (("one-batch", finished_run), ("batched", batched_run)):
        damaged = _cut_copy(run, CUTS[cut], tmp_path / name)
        records = damaged / RECORDS_FILE
        before = records.read_bytes()
        readable = 0 if cut == "in-schema" else _complete_batches_before(run / RECORDS_FILE, len(before))
        if export_format == "arrow-in-place":
            args, target = ["export", str(damaged), "--format", "arrow"], records
        else:
            target = tmp_path / f"{name}.{export_format}"
            args = ["export", str(damaged), "--format", export_format, "--out", str(target)]
        line = _refused(args)
        assert line == (
            f"error: {records}: run.json says the file holds {ROWS} rows, but only {readable} could be read (it is "
            "cut short or damaged); nothing written"
        )
        assert records.read_bytes() == before  # the damaged file is left as it was, for whatever can salvage it
        if export_format != "arrow-in-place":
            assert not target.exists() and not list(tmp_path.glob(f".{target.name}.*"))


@pytest.mark.parametrize("cut", CUTS)
def test_report_refuses_a_short_file(finished_run: Path, batched_run: Path, tmp_path: Path, cut: str) -> None:
    for name, run in (("one-batch", finished_run), ("batched", batched_run)):
        damaged = _cut_copy(run, CUTS[cut], tmp_path / name)
        records = damaged / RECORDS_FILE
        readable = 0 if cut == "in-schema" else _complete_batches_before(run / RECORDS_FILE, records.stat().st_size)
        assert _refused(["report", str(damaged)]) == (
            f"error: {records}: run.json says the file holds {ROWS} rows, but only {readable} could be read (it is "
            "cut short or damaged); no report made"
        )
        (damaged / RUN_FILE).unlink()  # the report then summarizes the records, which say how many they held
        if cut != "in-schema":
            line = _refused(["report", str(damaged)])
            assert f"the file says it holds {ROWS} rows, but only {readable} could be read" in line


def test_report_of_the_whole_run_stands(finished_run: Path, batched_run: Path) -> None:
    for run in (finished_run, batched_run):
        result = CliRunner().invoke(main, ["report", str(run), "--json"])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("cut", ["half", "mid-first-batch"])
def test_read_records_raises_unless_partial_and_then_gives_the_complete_batches(
    finished_run: Path, batched_run: Path, tmp_path: Path, cut: str
) -> None:
    for name, run in (("one-batch", finished_run), ("batched", batched_run)):
        damaged = _cut_copy(run, CUTS[cut], tmp_path / name) / RECORDS_FILE
        with pytest.raises(RecordsDamaged) as refused:
            read_records(damaged)
        readable = _complete_batches_before(run / RECORDS_FILE, damaged.stat().st_size)
        assert (refused.value.rows_read, refused.value.rows_expected) == (readable, ROWS)
        assert str(refused.value) == (
            f"{damaged}: the file says it holds {ROWS} rows, but only {readable} could be read (it is cut short or "
            "damaged)"
        )
        partial = read_records(damaged, partial=True)
        whole = read_records(run / RECORDS_FILE)
        assert partial.num_rows == readable
        assert partial.column("request_id").to_pylist() == whole.column("request_id").to_pylist()[:readable]
    half = _cut_copy(batched_run, _half, tmp_path / "recovered") / RECORDS_FILE
    assert 0 < read_records(half, partial=True).num_rows < ROWS  # bounded batches: a cut file keeps what precedes


def test_a_file_cut_in_its_schema_cannot_give_even_partial_rows(finished_run: Path, tmp_path: Path) -> None:
    damaged = _cut_copy(finished_run, _in_schema, tmp_path / "run") / RECORDS_FILE
    for partial in (False, True):
        with pytest.raises(RecordsDamaged) as refused:
            read_records(damaged, partial=partial)
        assert (refused.value.rows_read, refused.value.rows_expected) == (0, None)


# ---------------------------------------------------------------------------------------------
# what still reads whole


def test_a_file_that_lost_only_its_footer_reads_whole_exports_and_is_repaired(
    finished_run: Path, batched_run: Path, tmp_path: Path
) -> None:
    for name, run in (("one-batch", finished_run), ("batched", batched_run)):
        damaged = _cut_copy(run, _footer_start, tmp_path / name)
        records = damaged / RECORDS_FILE
        whole = read_records(run / RECORDS_FILE)
        assert read_records(records).equals(whole)
        for export_format in FILES:
            target = tmp_path / f"{name}.{export_format}"
            result = CliRunner().invoke(main, ["export", str(damaged), "--format", export_format, "--out", str(target)])
            assert result.exit_code == 0, result.output
        assert len(target.read_text().splitlines()) == ROWS + 1  # the CSV: a header and every row
        result = CliRunner().invoke(main, ["export", str(damaged), "--format", "arrow"])
        assert result.exit_code == 0 and f"as an Arrow IPC file ({ROWS} rows)" in result.output, result.output
        with ipc.open_file(records) as repaired:
            assert repaired.schema.metadata[META_ROWS] == str(ROWS).encode()
            assert repaired.read_all().column("request_id").equals(whole.column("request_id"))


def test_the_finished_file_says_its_rows_and_holds_batches_of_at_most_final_batch_rows(batched_run: Path) -> None:
    with ipc.open_file(batched_run / RECORDS_FILE) as reader:
        sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        assert reader.schema.metadata[META_ROWS] == str(ROWS).encode()
    assert sum(sizes) == ROWS and max(sizes) == SMALL_BATCH_ROWS and len(sizes) == -(-ROWS // SMALL_BATCH_ROWS)
    assert META_ROWS not in (read_records(batched_run / RECORDS_FILE).schema.metadata or {})


def _stream_run(run: Path, into: Path) -> Path:
    """The run as if its writer had been killed: its records as a stream of small batches, as a run writes them."""
    shutil.copytree(run, into)
    table = read_records(run / RECORDS_FILE)
    with pa.OSFile(str(into / RECORDS_FILE), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    return into


def test_a_killed_runs_stream_cut_short_keeps_its_complete_batches(finished_run: Path, tmp_path: Path) -> None:
    stream = _stream_run(finished_run, tmp_path / "killed")
    (stream / RUN_FILE).unlink()  # a killed run writes none
    records = stream / RECORDS_FILE
    with open(records, "r+b") as handle:
        handle.truncate(records.stat().st_size * 2 // 3)
    kept = read_records(records)  # no error: what a killed run's stream holds is what it measured
    assert 0 < kept.num_rows < ROWS and kept.num_rows % 2 == 0
    target = tmp_path / "kept.jsonl"
    result = CliRunner().invoke(main, ["export", str(stream), "--format", "aiperf-jsonl", "--out", str(target)])
    assert result.exit_code == 0, result.output
    assert len(target.read_bytes().splitlines()) == kept.num_rows


def test_a_stream_shorter_than_its_run_json_says_is_refused(finished_run: Path, tmp_path: Path) -> None:
    stream = _stream_run(finished_run, tmp_path / "run")  # a run whose finalizing failed: its stream stayed
    records = stream / RECORDS_FILE
    with open(records, "r+b") as handle:
        handle.truncate(records.stat().st_size * 2 // 3)
    kept = read_records(records).num_rows
    line = _refused(["export", str(stream), "--format", "csv", "--out", str(tmp_path / "x.csv")])
    assert f"run.json says the file holds {ROWS} rows, but only {kept} could be read" in line


def test_run_json_of_another_run_witnesses_nothing(finished_run: Path, tmp_path: Path) -> None:
    stream = _stream_run(finished_run, tmp_path / "run")
    (stream / RUN_FILE).unlink()
    stale = msgspec.json.decode((finished_run / RUN_FILE).read_bytes())
    stale["summary"]["run_id"] = "another-run"
    stale["summary"]["counts"]["rows"] = ROWS + 5  # a killed --overwrite run left the old run.json
    (stream / RUN_FILE).write_bytes(msgspec.json.encode(stale))
    result = CliRunner().invoke(main, ["export", str(stream), "--format", "csv", "--out", str(tmp_path / "x.csv")])
    assert result.exit_code == 0, result.output
