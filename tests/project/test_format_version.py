"""One version rule for the three Arrow files agentx writes (agentx.format_version): a trace, a run's records and its
server metrics each read their own major version and older ones, and refuse a newer major or an unreadable version
with the same sentence."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from small_sweep import small_trace

from agentx.errors import RecordsError, ServerMetricsError, TraceError
from agentx.format_version import version_refusal
from agentx.records.record import FORMAT_VERSION as RECORDS_VERSION
from agentx.records.record import RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.replayer.telemetry import arrow_file as telemetry
from agentx.trace.formats import arrow
from agentx.trace.io import load_trace
from agentx.trace.model import FORMAT_VERSION as TRACE_VERSION


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])


@given(
    st.integers(0, 50), st.integers(0, 99), st.sampled_from([TRACE_VERSION, RECORDS_VERSION, telemetry.FORMAT_VERSION])
)
def test_a_reader_reads_its_own_major_and_older_ones_and_refuses_newer(major: int, minor: int, reads: str) -> None:
    refusal = version_refusal(f"{major}.{minor}", reads, "records")
    assert (refusal is None) is (major <= _major(reads))
    if refusal is not None:
        assert f"version {major}.{minor}" in refusal and "Upgrade agentx" in refusal and "\n" not in refusal


@pytest.mark.parametrize("version", ["", "x.y", "-1.0", "\N{SUPERSCRIPT TWO}.0", " 1.0"])
def test_a_version_that_is_not_one_is_refused(version: str) -> None:
    assert version_refusal(version, "1.0", "trace") is not None


def _with_version(table: pa.Table, version: str, path: Path) -> Path:
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"agentx.version": version.encode()})
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def _telemetry_schema(version: str) -> pa.Schema:
    metadata = {
        telemetry.META_FORMAT: telemetry.FORMAT_NAME.encode(),
        telemetry.META_VERSION: version.encode(),
        telemetry.META_RUN_ID: b"r",
        telemetry.META_EPOCH: b"0",
        telemetry.META_ENGINE: b"vllm",
        telemetry.META_ENDPOINT: b"http://127.0.0.1:1/metrics",
        telemetry.META_INTERVAL: b"1.0",
        telemetry.META_SOURCES: b"{}",
    }
    return pa.schema([("t_ns", pa.int64())]).with_metadata(metadata)


@pytest.mark.parametrize(("version", "read"), [("0.3", True), ("1.0", True), ("1.99", True), ("2.0", False)])
def test_the_three_files_follow_the_same_rule(tmp_path: Path, version: str, read: bool) -> None:
    """Each reader reads the file (a trace, records) or its description (server metrics), or says the same sentence."""
    records = tmp_path / "written.arrow"
    with RecordWriter(records, RunInfo(run_id="r", wall_epoch_ns=0, options={})):
        pass
    refusals: list[str] = []
    try:
        load_trace(_with_version(arrow.to_table(small_trace(1, 1)), version, tmp_path / "trace.arrow"), format="arrow")
    except TraceError as exc:
        refusals.append(str(exc))
    try:
        read_records(_with_version(read_records(records), version, tmp_path / "records.arrow"))
    except RecordsError as exc:
        refusals.append(str(exc))
    try:
        telemetry.server_metrics_info(_telemetry_schema(version))
    except ServerMetricsError as exc:
        refusals.append(str(exc))
    if read:
        assert refusals == []
    else:
        assert len(refusals) == 3
        assert all(f"format version {version};" in text and "Upgrade agentx" in text for text in refusals)
