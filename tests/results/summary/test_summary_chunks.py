"""The summary's chunk-level figures read a slice at a time (agentx/results/summary/run_records.py, population.py):
the same figures as from the whole chunk lists at once, exact, with never more than a slice of them in memory."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from strategies import record_identity

from agentx.errors import RecordsDamaged, RecordsError
from agentx.records.record import CHUNK_COLUMNS, SCHEMA, RequestRecord, RunInfo, read_records
from agentx.records.writer import RecordWriter
from agentx.results.summary import columns, population, run_records
from agentx.results.summary.checks.acceptance import table_stream_acceptance
from agentx.results.summary.population import IntCounts, IntPopulation
from agentx.results.summary.run_records import RunRecords
from agentx.results.summary.stats import Stats, stats
from agentx.results.summary.summarize import summarize, summarize_run

MS = 1_000_000
S = 1_000_000_000


def _reference(values: np.ndarray, percentiles: tuple[float, ...] = ()) -> Stats | None:
    """The statistics as the summary computed them before it read chunk lists in slices: all values at once."""
    return stats(np.asarray(values, dtype=np.float64), percentiles)


def _same(found: Stats | None, expected: Stats | None, *, moments: bool = True) -> None:
    """Ranks (count, min, max, every percentile) exactly equal; mean and std within float rounding (`moments`)."""
    assert (found is None) == (expected is None)
    if found is None or expected is None:
        return
    for name in ("count", "p50", "p75", "p90", "p95", "p99", "min", "max"):
        assert getattr(found, name) == getattr(expected, name), name
    assert found.more == expected.more
    if moments:
        assert found.mean == pytest.approx(expected.mean, rel=1e-12, abs=1e-15)
        assert found.std == pytest.approx(expected.std, rel=1e-9, abs=1e-12)


def _population(values: np.ndarray, parts: int, percentiles: tuple[float, ...], scale: int = 1) -> Stats | None:
    pieces = np.array_split(np.asarray(values, dtype=np.int64), parts)
    found = IntPopulation()
    for piece in pieces:
        found.add(piece)
    return found.stats(percentiles, lambda: iter(pieces), scale)


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(1).gamma(4.0, 3e6, 200_000).astype(np.int64),  # ITL-like gaps, ns
        np.concatenate([np.zeros(50_000, np.int64), np.random.default_rng(2).integers(0, 10**11, 300)]),  # bursts
        np.random.default_rng(3).integers(-(10**12), 10**12, 100_000),  # negative: a clock stepping back
        np.random.default_rng(4).integers(-(2**62), 2**62, 50_000),  # beyond float64's exact integers
        np.full(999, 12_345_678_901, np.int64),
        np.array([7], np.int64),
        np.array([0, 2**63 - 1, -(2**63)], np.int64),
    ],
)
def test_population_ranks_are_exact(values: np.ndarray) -> None:
    percentiles = (10.0, 99.9, 50.0)
    found = _population(values, 7, percentiles, scale=10**9)
    # Past 2⁵³ a float64 sum (the reference's mean) loses the low digits; the population's sum is exact.
    moderate = int(np.abs(values).max()) < 2**53
    _same(found, _reference(values / 1e9, percentiles), moments=moderate)
    assert found is not None and found.mean == float(Fraction(sum(values.tolist()), values.size * 10**9))


def test_population_narrows_crowded_bins_over_several_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bins too crowded to keep and too wide to count one value per sub-bin are counted in wider sub-bins and read
    # again, until each wanted rank is known.
    monkeypatch.setattr(population, "SUB_BINS", 16)
    monkeypatch.setattr(population, "COLLECT_MAX", 8)
    values = np.random.default_rng(5).integers(10**9, 10**9 + 10**7, 20_000)
    pieces = np.array_split(values, 5)
    found = IntPopulation()
    for piece in pieces:
        found.add(piece)
    reads: list[int] = []

    def passes() -> Any:
        reads.append(1)
        return iter(pieces)

    _same(found.stats((1.0, 33.3), passes, 1), _reference(values, (1.0, 33.3)))
    assert len(reads) > 2


def test_population_refuses_a_population_that_changed_between_passes() -> None:
    found = IntPopulation()
    found.add(np.arange(1000, dtype=np.int64) * 100_000)
    with pytest.raises(ValueError, match="changed between passes"):
        found.stats((), lambda: iter([np.arange(10, dtype=np.int64)]), 1)


def test_counts_give_the_statistics_of_every_value() -> None:
    values = np.random.default_rng(6).integers(0, 6, 10_000)
    counts = IntCounts()
    for piece in (values[:7], values[7:], np.array([10**9, -3])):
        counts.add(piece)
    everything = np.concatenate([values, [10**9, -3]])
    _same(counts.stats((99.9,)), _reference(everything, (99.9,)))
    assert counts.mean() == float(np.mean(everything))  # exact: sums of integers
    assert counts.as_dict()[10**9] == 1 and sum(counts.as_dict().values()) == everything.size


def _row(rng: np.random.Generator, index: int, one_token: float) -> dict[str, Any]:
    sent = (1 + index) * S
    chunks = int(rng.choice([0, 1, 2, 3, 40, 300]))
    gaps = rng.gamma(2.0, 5 * MS, max(chunks - 1, 0)).astype(np.int64)
    gaps[rng.random(gaps.size) < 0.1] = 0  # chunks read together
    times = (sent + 100 * MS + np.concatenate([[0], np.cumsum(gaps)])).astype(np.int64)[:chunks]
    tokens = np.where(rng.random(chunks) < one_token, 1, rng.integers(2, 5, chunks))
    warmup, error = index < 3, rng.random() < 0.1
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "phase": "warmup" if warmup else "profiling",
        "turn": index,
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_token_ns": int(times[0]) if chunks else None,
        "last_token_ns": int(times[-1]) if chunks else None,
        "end_ns": int(times[-1]) + MS if chunks else sent + MS,
        "chunk_times_ns": times.tolist(),
        "chunk_tokens": tokens.tolist(),
        "isl_recorded_tokens": 100,
        "isl_sent_tokens": 100,
        "osl_recorded_tokens": int(tokens.sum()),
        "osl_streamed_tokens": int(tokens.sum()),
        "tokens_estimated": rng.random() < 0.1,
        "status": "error" if error else "ok",
        "error_kind": "http" if error else None,
    }
    return msgspec.structs.asdict(RequestRecord(**values))


def _table(rows: int = 400, seed: int = 7, one_token: float = 0.9) -> pa.Table:
    rng = np.random.default_rng(seed)
    table = pa.Table.from_pylist([_row(rng, i, one_token) for i in range(rows)], schema=SCHEMA)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"x": b"y"})


def _reference_chunks(table: pa.Table, percentiles: tuple[float, ...]) -> tuple[Stats | None, Stats | None]:
    """ITL and tokens per chunk as the summary computed them with the whole lists flat."""
    kept = table.filter(pa.array([r["phase"] != "warmup" and r["status"] == "ok" for r in table.to_pylist()]))
    gaps = [np.diff(np.asarray(times, dtype=np.int64)) for times in kept.column("chunk_times_ns").to_pylist()]
    tokens = [t for row in kept.column("chunk_tokens").to_pylist() for t in row]
    return _reference(np.concatenate(gaps) / 1e9, percentiles), _reference(np.asarray(tokens), percentiles)


def _write(table: pa.Table, path: Path) -> RecordWriter:
    """A records stream of `table`'s rows in many small batches, as a run's flushes leave it; closing the writer
    rewrites it into the IPC file a run's end leaves."""
    writer = RecordWriter(path, RunInfo(run_id="run-1", wall_epoch_ns=0, options={"stream_interval": 1}))
    for batch in table.to_batches(max_chunksize=7):
        writer.write_table(pa.Table.from_batches([batch]))
    writer.flush()
    return writer


@pytest.mark.parametrize("finalize", [True, False], ids=["ipc-file", "stream"])
def test_a_records_file_summarized_a_slice_at_a_time_gives_the_whole_tables_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finalize: bool
) -> None:
    monkeypatch.setattr(run_records, "SLICE_STAMPS", 97)  # many slices, and requests longer than one
    table = _table()
    path = tmp_path / "records.arrow"
    writer = _write(table, path)
    if finalize:
        writer.close()
    percentiles = (50.0, 99.9, 12.5)
    itl, tokens = _reference_chunks(table, percentiles)
    for summary in (summarize(path, percentiles=percentiles), summarize(read_records(path), percentiles=percentiles)):
        _same(summary.latency.itl_s, itl)
        _same(summary.latency.chunk_tokens, tokens)
    whole = summarize(read_records(path), percentiles=percentiles)
    sliced = summarize_run(RunRecords.read(path), percentiles=percentiles)
    assert sliced.counts == whole.counts and sliced.throughput == whole.throughput
    assert sliced.audit == whole.audit and sliced.tasks == whole.tasks and sliced.rollups == whole.rollups
    writer.close()


def test_the_chunk_lists_are_never_flattened_more_than_a_slice_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_records, "SLICE_STAMPS", 500)
    table = _table(rows=600)
    path = tmp_path / "records.arrow"
    _write(table, path).close()
    longest = max(len(times) for times in table.column("chunk_times_ns").to_pylist())
    flattened: list[int] = []
    flat_lists = columns.flat_lists

    def counting(column: pa.ChunkedArray) -> Any:
        values, offsets = flat_lists(column)
        flattened.append(values.size)
        return values, offsets

    monkeypatch.setattr(run_records, "flat_lists", counting)
    summary = summarize(path)
    assert summary.latency.itl_s is not None and summary.latency.itl_s.count > 10 * 500
    assert flattened and max(flattened) <= max(500, longest)


def test_reading_without_the_chunk_columns_keeps_every_other_column(tmp_path: Path) -> None:
    table = _table(rows=50)
    path = tmp_path / "records.arrow"
    with _write(table, path):  # a stream: each batch's columns share one buffer
        slim = read_records(path, chunks=False)
        assert slim.column_names == [name for name in table.column_names if name not in CHUNK_COLUMNS]
        assert slim.equals(read_records(path).drop_columns(list(CHUNK_COLUMNS)))
        assert slim.schema.metadata == read_records(path).schema.metadata


@pytest.mark.parametrize("group_bursts", [False, True])
def test_stream_acceptance_from_the_file_matches_the_table(tmp_path: Path, group_bursts: bool) -> None:
    table = _table(rows=300, seed=9, one_token=0.99)  # nearly one token a chunk: grouped into steps when speculating
    path = tmp_path / "records.arrow"
    _write(table, path).close()
    from_table = table_stream_acceptance(table, group_bursts=group_bursts)
    assert table_stream_acceptance(RunRecords.read(path), group_bursts=group_bursts) == from_table
    assert from_table is not None and from_table.grouped_by_gap is group_bursts
    if not group_bursts:
        middles = [
            row["chunk_tokens"][1:-1]
            for row in table.to_pylist()
            if row["phase"] != "warmup" and row["status"] == "ok" and not row["tokens_estimated"]
        ]
        flat = [tokens for middle in middles for tokens in middle]
        assert from_table.requests == sum(1 for middle in middles if middle) and from_table.chunks == len(flat)
        assert from_table.tokens_per_chunk_mean == sum(flat) / len(flat)


def test_rows_a_live_run_appends_after_the_first_read_are_left_out(tmp_path: Path) -> None:
    table = _table(rows=200)
    path = tmp_path / "records.arrow"
    with _write(table.slice(0, 120), path) as writer:
        records = RunRecords.read(path)
        writer.write_table(table.slice(120))  # the stream grows before the chunk lists are read again
        writer.flush()
        itl, tokens = _reference_chunks(table.slice(0, 120), ())
        summary = summarize_run(records)
    assert summary.counts.rows == 120
    _same(summary.latency.itl_s, itl)
    _same(summary.latency.chunk_tokens, tokens)


def test_a_finished_file_cut_short_is_refused_unless_partial(tmp_path: Path) -> None:
    table = _table(rows=5_000)
    path = tmp_path / "records.arrow"
    _write(table, path).close()  # batches of 4,096 rows: a cut in the second loses it
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size * 3 // 4)
    with pytest.raises(RecordsDamaged):
        RunRecords.read(path)
    kept = RunRecords.read(path, partial=True)
    assert 0 < kept.table.num_rows < table.num_rows and kept.file_rows == kept.table.num_rows
    itl, _ = _reference_chunks(table.slice(0, kept.table.num_rows), ())
    _same(kept.itl_stats(), itl)


def test_a_file_replaced_by_a_shorter_one_between_the_reads_is_named(tmp_path: Path) -> None:
    table = _table(rows=100)
    path = tmp_path / "records.arrow"
    _write(table, path).close()
    records = RunRecords.read(path)
    _write(table.slice(0, 40), path).close()
    with pytest.raises(RecordsError, match=f"{path}: 40 rows when read again, 100 before"):
        summarize_run(records)
