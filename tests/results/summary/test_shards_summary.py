"""A `--ray` run's shards in the summary (agentx.results.summary.shards): counts, losses, and a warning past 1 ms of
clock."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
from rich.console import Console

from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import RequestRecord, RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.replayer.run_result import ShardInfo
from agentx.results.summary.shards import shards_summary
from agentx.results.summary.summarize import summarize


def _shard(index: int, node: str, error_ns: int, drift_ns: int | None = 0, lost: bool = False) -> ShardInfo:
    return ShardInfo(
        index=index,
        node_id=node,
        node_ip="10.0.0.1",
        hostname="h",
        clock_offset_ns=123,
        clock_error_ns=error_ns,
        clock_drift_ns=drift_ns,
        lost=lost,
    )


def test_a_run_of_one_process_has_no_shards() -> None:
    assert shards_summary([]) is None


def test_tight_clocks_say_nothing_and_losses_are_named() -> None:
    found = shards_summary([_shard(0, "a", 400_000), _shard(1, "b", 300_000, None, lost=True), _shard(2, "b", 1)])
    assert found is not None
    assert (found.count, found.nodes, found.lost) == (3, 2, [1])
    assert found.clock_error_max_s == 0.0004 and found.clock_drift_max_s == 0.0 and found.clock_warning is None


def test_a_loose_bound_or_a_drift_past_a_millisecond_is_warned_in_the_table(tmp_path: Path) -> None:
    loose = shards_summary([_shard(0, "a", 1_500_000), _shard(1, "b", 100_000)])
    drifting = shards_summary([_shard(0, "a", 100_000, drift_ns=-2_500_000)])
    assert loose is not None and loose.clock_warning is not None and "±1.50 ms" in loose.clock_warning
    assert drifting is not None and drifting.clock_warning is not None and "2.50 ms" in drifting.clock_warning
    record = RequestRecord(
        run_id="r", phase="profiling", lane=0, play=0, session_id="s", agent_id="", depth=0, turn=0, model="m",
        scheduled_ns=0, sent_ns=1, first_token_ns=2, last_token_ns=3, end_ns=4, isl_recorded_tokens=1,
        isl_sent_tokens=1, osl_recorded_tokens=1, osl_streamed_tokens=1,
    )  # fmt: skip
    with RecordWriter(tmp_path / "records.arrow", RunInfo(run_id="r", wall_epoch_ns=0)) as writer:
        writer.append(record)
    summary = summarize(read_records(tmp_path / "records.arrow"))
    summary.shards = loose
    console = Console(width=200, record=True, file=io.StringIO())
    for table in summary_table(summary):
        console.print(table)
    text = " ".join(console.export_text().split())
    assert "Ray shards · nodes · lost" in text and "2 · 2 · none" in text
    assert "timestamps of different shards may be off" in text
    assert msgspec.json.decode(msgspec.json.encode(summary))["shards"]["clock_error_max_s"] == 0.0015
