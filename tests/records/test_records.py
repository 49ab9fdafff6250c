"""Replay records: derived latencies, the streaming writer, crash safety and credential redaction."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import REPO
from strategies import examples, record_identity

from agentx.errors import RecordsError
from agentx.records.record import (
    MAX_ERROR_MESSAGE,
    SCHEMA,
    RequestRecord,
    RunInfo,
    describe_layout,
    read_records,
    run_info,
    to_records,
)
from agentx.records.writer import RecordWriter, write_jsonl
from agentx.replayer.options.replay import DecodeOptions, ReplayOptions, Scenario, Server
from agentx.secrets import REDACTED, redact

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

RUN = RunInfo(run_id="run-1", wall_epoch_ns=1_780_000_000_000_000_000, options={"concurrency": 4})
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
NS = st.integers(min_value=0, max_value=2**63 - 1)
COUNT = st.integers(min_value=0, max_value=2**40)
INT32 = st.integers(min_value=0, max_value=2**31 - 1)
TEXT = st.text(max_size=12)


def make(**overrides: Any) -> RequestRecord:
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "scheduled_ns": 0,
        "sent_ns": 2_000_000,
        "first_token_ns": 52_000_000,
        "last_token_ns": 1_052_000_000,
        "end_ns": 1_060_000_000,
        "chunk_times_ns": [52_000_000, 1_052_000_000],
        "chunk_tokens": [1, 100],
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 101,
        "osl_recorded_tokens": 101,
        "osl_streamed_tokens": 101,
    }
    values.update(overrides)
    return RequestRecord(**values)


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    status = draw(st.sampled_from(["ok", "error"]))
    return RequestRecord(
        run_id="run-1",
        phase=draw(st.sampled_from(["warmup", "profiling"])),
        lane=draw(INT32),
        play=draw(COUNT),
        session_id=draw(TEXT),
        agent_id=draw(TEXT),
        depth=draw(st.integers(0, 50)),
        turn=draw(INT32),
        model=draw(TEXT),
        scheduled_ns=draw(NS),
        sent_ns=draw(NS),
        first_token_ns=draw(st.none() | NS),
        last_token_ns=draw(st.none() | NS),
        end_ns=draw(NS),
        chunk_times_ns=draw(st.lists(INT64, max_size=5)),
        chunk_tokens=draw(st.lists(INT32, max_size=5)),
        isl_recorded_tokens=draw(COUNT),
        isl_sent_tokens=draw(COUNT),
        isl_server_tokens=draw(st.none() | COUNT),
        osl_recorded_tokens=draw(COUNT),
        osl_server_tokens=draw(st.none() | COUNT),
        osl_streamed_tokens=draw(COUNT),
        tokens_estimated=draw(st.booleans()),
        cached_tokens=draw(st.none() | COUNT),
        theoretical_hit_blocks=draw(st.none() | COUNT),
        theoretical_total_blocks=draw(st.none() | COUNT),
        status=status,  # type: ignore[arg-type]
        error_kind=None
        if status == "ok"
        else draw(st.sampled_from(["http", "timeout", "connection", "protocol", "context_overflow", "cancelled"])),
        error_message=None if status == "ok" else draw(st.text(max_size=600)),
        http_status=draw(st.none() | st.integers(100, 599)),
    )


# ---------------------------------------------------------------------------------------------
# the record


def test_derived_latencies() -> None:
    record = make()
    assert record.dispatch_lag_s == pytest.approx(0.002)
    assert record.ttft_s == pytest.approx(0.050)
    assert record.e2el_s == pytest.approx(1.050)
    assert record.tpot_s == pytest.approx(1.0 / 100)  # (E2E − TTFT)/(OSL − 1)


def test_itl_uses_the_server_osl_when_reported() -> None:
    assert make(osl_server_tokens=11).tpot_s == pytest.approx(0.1)
    assert make(osl_server_tokens=None, osl_streamed_tokens=51).tpot_s == pytest.approx(0.02)


@pytest.mark.parametrize("osl", [0, 1])
def test_itl_is_null_below_two_output_tokens(osl: int) -> None:
    assert make(osl_streamed_tokens=osl).tpot_s is None
    assert make(osl_server_tokens=osl, osl_streamed_tokens=500).tpot_s is None


def test_no_content_means_null_ttft_e2e_and_itl() -> None:
    record = make(first_token_ns=None, last_token_ns=None, chunk_times_ns=[], chunk_tokens=[], status="error")
    assert (record.ttft_s, record.e2el_s, record.tpot_s) == (None, None, None)
    assert record.dispatch_lag_s == pytest.approx(0.002)


def test_derived_fields_cannot_be_set_by_the_caller() -> None:
    record = make(ttft_s=99.0, tpot_s=-1.0, dispatch_lag_s=5.0)
    assert (record.ttft_s, record.tpot_s, record.dispatch_lag_s) == pytest.approx((0.05, 0.01, 0.002))
    later = msgspec.structs.replace(record, sent_ns=12_000_000)
    assert later.ttft_s == pytest.approx(0.040) and later.dispatch_lag_s == pytest.approx(0.012)


def test_error_message_is_cut_and_scrubbed() -> None:
    record = make(status="error", error_kind="http", http_status=401, error_message="x" * 2000)
    assert record.error_message == "x" * MAX_ERROR_MESSAGE
    leaky = make(status="error", error_kind="http", error_message="bad header Authorization: Bearer abcdef123456")
    assert leaky.error_message is not None and "abcdef123456" not in leaky.error_message


def test_a_record_has_no_place_for_headers_or_keys() -> None:
    names = {field.name for field in msgspec.structs.fields(RequestRecord)}
    assert not {name for name in names if "header" in name or "key" in name or "auth" in name}
    with pytest.raises(TypeError):
        make(headers={"Authorization": "Bearer x"})


# ---------------------------------------------------------------------------------------------
# writing and reading


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(records(), max_size=12), flush_rows=st.integers(1, 5))
def test_round_trip(tmp_path: Path, batch: list[RequestRecord], flush_rows: int) -> None:
    path = tmp_path / "records.arrow"
    with RecordWriter(path, RUN, flush_rows=flush_rows) as writer:
        for record in batch:
            writer.append(record)
    table = read_records(path)
    assert table.schema.equals(SCHEMA)
    assert to_records(table) == batch
    assert run_info(table) == RUN


def test_jsonl_round_trip(tmp_path: Path) -> None:
    batch = [make(turn=i, cached_tokens=i or None) for i in range(3)]
    assert write_jsonl(batch, tmp_path / "r.jsonl") == 3
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["tpot_s"] == pytest.approx(0.01)
    decoder = msgspec.json.Decoder(RequestRecord)
    assert [decoder.decode(line) for line in lines] == batch


def test_an_empty_run_still_leaves_a_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.arrow"
    writer = RecordWriter(path, RUN)  # never closed, as if killed before the first flush
    table = read_records(path)
    assert table.num_rows == 0 and run_info(table).run_id == "run-1"
    writer.close()


def test_a_reader_polling_the_run_never_finds_the_file_without_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream is written under another name until its schema is on disk: a reader that polls the run folder (a
    live progress, a test waiting for the first records) sees no file or a readable one, never an empty one."""
    path = tmp_path / "r.arrow"
    seen: list[bool] = []
    real_new_stream = ipc.new_stream

    def new_stream(*args: Any, **kwargs: Any) -> Any:
        seen.append(path.exists())
        return real_new_stream(*args, **kwargs)

    monkeypatch.setattr(ipc, "new_stream", new_stream)
    writer = RecordWriter(path, RUN)
    assert seen == [False]
    assert read_records(path).num_rows == 0 and sorted(os.listdir(tmp_path)) == ["r.arrow"]
    writer.close()


def test_the_file_opens_in_plain_pyarrow(tmp_path: Path) -> None:
    path = tmp_path / "r.arrow"
    with RecordWriter(path, RUN) as writer:
        writer.append(make())
    with pa.OSFile(str(path), "rb") as source:
        table = ipc.open_file(source).read_all()  # closed: an IPC file (docs/replay.md, Records and summary)
    assert table.column("tpot_s").to_pylist() == pytest.approx([0.01])


def test_a_file_before_vllms_names_reads_with_them(tmp_path: Path) -> None:
    """Files before format 1.8 named TPOT `itl_s` and E2EL `e2e_s`: they read under the names used since, with
    their metadata, so every consumer sees one layout."""
    path = tmp_path / "r.arrow"
    with RecordWriter(path, RUN) as writer:
        writer.append(make())
    new = read_records(path)
    names = [{"tpot_s": "itl_s", "e2el_s": "e2e_s"}.get(name, name) for name in new.column_names]
    old = new.rename_columns(names).replace_schema_metadata(new.schema.metadata)
    with pa.OSFile(str(tmp_path / "old.arrow"), "wb") as sink, ipc.new_stream(sink, old.schema) as stream:
        stream.write_table(old)
    table = read_records(tmp_path / "old.arrow")
    assert table.column_names == new.column_names and run_info(table) == RUN
    assert table.column("tpot_s").to_pylist() == pytest.approx([0.01])
    assert table.column("e2el_s").to_pylist() == new.column("e2el_s").to_pylist()
    assert to_records(table) == to_records(new)


def test_foreign_run_ids_and_appends_after_close_are_refused(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "r.arrow", RUN)
    with pytest.raises(ValueError, match="run"):
        writer.append(make(run_id="other"))
    writer.close()
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.append(make())


def test_not_a_records_file(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"hello world, this is not arrow")
    with pytest.raises(RecordsError):
        read_records(tmp_path / "junk")
    other = tmp_path / "other.arrow"
    with pa.OSFile(str(other), "wb") as sink, ipc.new_stream(sink, pa.schema([("a", pa.int64())])) as writer:
        writer.write_batch(pa.record_batch([pa.array([1])], names=["a"]))
    with pytest.raises(RecordsError, match="not an agentx records file"):
        read_records(other)
    with pytest.raises(RecordsError, match="cannot read"):
        read_records(tmp_path / "missing.arrow")


def test_a_newer_major_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.arrow"
    with RecordWriter(path, RUN) as writer:
        writer.append(make())
    table = read_records(path)
    newer = table.replace_schema_metadata({**table.schema.metadata, b"agentx.version": b"2.0"})
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, newer.schema) as stream:
        stream.write_table(newer)
    with pytest.raises(RecordsError, match="version"):
        read_records(path)


# ---------------------------------------------------------------------------------------------
# flush cadence


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rows_on_disk(path: Path) -> int:
    return int(read_records(path).num_rows)


def test_append_flushes_once_a_second(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "r.arrow"
    writer = RecordWriter(path, RUN, clock=clock)
    writer.append(make(turn=0))
    clock.now += 0.999
    writer.append(make(turn=1))
    assert _rows_on_disk(path) == 0
    clock.now += 0.001
    writer.append(make(turn=2))
    assert _rows_on_disk(path) == 3 and writer.rows_written == 3
    clock.now += 0.5
    writer.append(make(turn=3))
    assert _rows_on_disk(path) == 3
    writer.close()
    assert _rows_on_disk(path) == 4


def test_maybe_flush_writes_pending_rows_of_a_quiet_loop(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "r.arrow"
    writer = RecordWriter(path, RUN, clock=clock)
    assert not writer.maybe_flush()  # nothing pending
    writer.append(make())
    assert not writer.maybe_flush()
    clock.now += 1.0
    assert writer.maybe_flush()
    assert _rows_on_disk(path) == 1
    clock.now += 5.0
    assert not writer.maybe_flush()
    writer.close()


def test_a_full_buffer_flushes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "r.arrow"
    writer = RecordWriter(path, RUN, clock=FakeClock(), flush_rows=3)
    for turn in range(7):
        writer.append(make(turn=turn))
    assert _rows_on_disk(path) == 6
    writer.flush()
    assert _rows_on_disk(path) == 7
    writer.close()


# ---------------------------------------------------------------------------------------------
# crash safety

_CHILD = textwrap.dedent(
    """
    import sys
    from agentx.records.writer import RecordWriter
    from agentx.records.record import RequestRecord, RunInfo

    run = RunInfo(run_id="run-1", wall_epoch_ns=1, options={})
    writer = RecordWriter(sys.argv[1], run, flush_rows=7)
    turn = 0
    while True:
        writer.append(RequestRecord(
            run_id="run-1", phase="profiling", lane=turn % 4, play=0, session_id="s", agent_id="", depth=0,
            turn=turn, model="m", scheduled_ns=turn, sent_ns=turn + 5, first_token_ns=turn + 9,
            last_token_ns=turn + 99, end_ns=turn + 100, chunk_times_ns=[turn + 9, turn + 99], chunk_tokens=[1, 3],
            isl_recorded_tokens=10, isl_sent_tokens=10, osl_recorded_tokens=4, osl_streamed_tokens=4,
        ))
        turn += 1
        if writer.rows_written and turn % 7 == 0:
            print(writer.rows_written, flush=True)
    """
)


def test_a_killed_writer_leaves_every_flushed_record(tmp_path: Path) -> None:
    path = tmp_path / "crash.arrow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    flushed = 0
    try:
        for line in child.stdout:
            flushed = int(line)
            if flushed >= 700:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    recovered = to_records(read_records(path))
    assert len(recovered) >= flushed >= 700
    assert [record.turn for record in recovered] == list(range(len(recovered)))
    assert all(record.tpot_s == pytest.approx(90 / 3 / 1e9) for record in recovered)


def test_a_file_cut_anywhere_yields_its_complete_batches(tmp_path: Path) -> None:
    path = tmp_path / "r.arrow"
    ends: list[int] = []
    writer = RecordWriter(path, RUN, clock=FakeClock())
    header_end = path.stat().st_size
    for turn in range(12):
        writer.append(make(turn=turn, chunk_times_ns=list(range(turn))))
        if turn % 3 == 2:
            writer.flush()
            ends.append(path.stat().st_size)
    data = path.read_bytes()  # the stream a killed run leaves (closing makes it an IPC file)
    writer.close()
    offsets = sorted({*range(0, len(data), 7), *ends, *(end - 1 for end in ends), len(data) - 1, len(data)})
    cut = tmp_path / "cut.arrow"
    for offset in offsets:
        cut.write_bytes(data[:offset])
        if offset < header_end:
            with contextlib.suppress(RecordsError):  # a torn schema may or may not be readable
                assert read_records(cut).num_rows == 0
            continue
        complete = sum(1 for end in ends if end <= offset)
        table = read_records(cut)
        assert table.num_rows == 3 * complete, offset
        assert [r.turn for r in to_records(table)] == list(range(3 * complete))


# ---------------------------------------------------------------------------------------------
# secrets


def test_redact_removes_credentials_from_nested_options() -> None:
    options = {
        "api_key": "sk-live-0123456789abcdef",
        "OPENAI_API_KEY": "sk-other-0123456789",
        "max_tokens": 256,
        "max_completion_tokens": 10,
        "token_counts": {"prompt_tokens": 5, "cached_tokens": 3},
        "aws_secret_access_key": "AKIA-secret-value",
        "servers": [
            {
                "url": "https://user:hunter2@example.com/v1",
                "headers": {"Authorization": "Bearer tok-abc", "X-Custom": "plain"},
                "auth_token": "abc123",
            }
        ],
        "argv": [
            "agentx",
            "replay",
            "--api-key",
            "sk-cli-0123456789",
            "--header=Authorization: hdrval",
            "-H",
            "X-Api-Key: shortflag",
            "--seed",
            "1",
        ],
        "extra_headers": [["Authorization", "Bearer zzz"]],
        "note": "curl -H 'Authorization: Bearer qwerty12345'",
        "password": None,
    }
    original = json.dumps(options)
    clean = redact(options)
    assert json.dumps(options) == original  # not modified in place
    text = json.dumps(clean)
    for secret in (
        "sk-live",
        "sk-other",
        "hunter2",
        "tok-abc",
        "abc123",
        "sk-cli",
        "zzz",
        "qwerty12345",
        "hdrval",
        "shortflag",
    ):
        assert secret not in text, secret
    assert clean["max_tokens"] == 256 and clean["max_completion_tokens"] == 10
    assert clean["token_counts"] == {"prompt_tokens": 5, "cached_tokens": 3}
    assert clean["servers"][0]["headers"] == {"Authorization": REDACTED, "X-Custom": REDACTED}
    assert clean["servers"][0]["url"].endswith("@example.com/v1")
    assert clean["argv"][:3] == ["agentx", "replay", "--api-key"] and clean["argv"][-2:] == ["--seed", "1"]
    assert redact(clean) == clean


def test_a_planted_secret_never_reaches_the_file(tmp_path: Path) -> None:
    secret = "sk-PLANTED-secret-value-42"
    run = RunInfo(
        run_id="run-1",
        wall_epoch_ns=5,
        options={"client": {"api_key": secret, "headers": {"Authorization": f"Bearer {secret}"}}, "base": secret},
    )
    path = tmp_path / "r.arrow"
    with RecordWriter(path, run) as writer:
        writer.append(make(status="error", error_kind="http", http_status=401, error_message=f"key {secret} invalid"))
    assert secret.encode() not in path.read_bytes()
    assert b"PLANTED" not in path.read_bytes()
    stored = run_info(read_records(path)).options
    assert stored["client"]["api_key"] == REDACTED


# ---------------------------------------------------------------------------------------------
# documentation


def test_layout_doc_names_every_column() -> None:
    text = describe_layout()
    for field in SCHEMA:
        assert f"`{field.name}`" in text


def test_options_reprs_show_no_secret() -> None:
    url = "http://someone:pa55word-9@127.0.0.1:8000"
    headers = (("Authorization", "Bearer tok-123456789"), ("X-Team", "team-value-42"))
    for options in (
        ReplayOptions(
            server=Server(url=url, model="m", api_key="sk-abcdef123456", headers=headers),
            out_dir=Path("run"),
            scenario=Scenario(seed=7),
        ),
        DecodeOptions(server=Server(url=url, model="m", api_key="sk-abcdef123456", headers=headers), seed=7),
    ):
        shown = repr(options)
        for secret in ("pa55word-9", "tok-123456789", "team-value-42", "sk-abcdef123456"):
            assert secret not in shown and secret not in str(options)
        assert shown.startswith(
            f"{type(options).__name__}(server=Server(url='http://[redacted]@127.0.0.1:8000', model='m'"
        )
        assert "seed=7" in shown and "api_key='[redacted]'" in shown
