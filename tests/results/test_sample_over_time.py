"""A run's sample drawn over stretches of its window (agentx.results.compare.sample.over_time), what the frontier
search's level intervals add to the draw over sessions."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import record_identity

from agentx.records.record import SCHEMA, RequestRecord
from agentx.results.compare.bootstrap import draw_weights, interval
from agentx.results.compare.sample import Repeat, RunSample, over_time
from agentx.results.compare.sweeps import level_replicates

MS = 1_000_000


def _request(session: str, sent_ms: int, tokens_out: int, tpot_ms: int, tokens_in: int = 100) -> RequestRecord:
    first = (sent_ms + 50) * MS
    last = first + (tokens_out - 1) * tpot_ms * MS
    values: dict[str, Any] = {
        **record_identity(session_id=session),
        "scheduled_ns": sent_ms * MS,
        "sent_ns": sent_ms * MS,
        "first_token_ns": first,
        "last_token_ns": last,
        "end_ns": last + MS,
        "chunk_times_ns": [first, last],
        "chunk_tokens": [1, tokens_out - 1],
        "isl_recorded_tokens": tokens_in,
        "isl_sent_tokens": tokens_in,
        "osl_recorded_tokens": tokens_out,
        "osl_streamed_tokens": tokens_out,
    }
    return RequestRecord(**values)


def _sample(records: list[RequestRecord], duration_s: float) -> RunSample:
    table = pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA)
    return RunSample([Repeat(records=table, duration_s=duration_s, num_gpus=1)])


requests = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(2, 200), st.integers(1, 50), st.integers(0, 5_000)),
    min_size=1,
    max_size=40,
)


@given(requests, st.integers(1, 12))
def test_every_token_lands_in_the_stretches_its_request_spans_and_none_is_lost(
    rows: list[tuple[int, int, int, int]], stretches: int
) -> None:
    records = [_request(f"s{i % 3}", sent, out, tpot, tokens_in) for i, (sent, out, tpot, tokens_in) in enumerate(rows)]
    sample = _sample(records, 10.0)
    timed = over_time(sample, stretches)
    sent, end = sample.values["sent_s"], sample.values["end_s"]
    if not end.max() > sent.min():
        assert timed is sample
        return
    assert timed.clusters == [f"t{k}" for k in range(stretches)]
    start, span = sent.min(), end.max() - sent.min()
    for name in ("output_tokens", "total_tokens"):
        parts = timed.values[name].reshape(len(records), stretches)
        assert parts.min() >= 0
        assert parts.sum(axis=1) == pytest.approx(sample.values[name])
        for row, (first, last) in zip(parts, zip(sent, end, strict=True), strict=True):
            for k in np.nonzero(row > 1e-9)[0]:  # a request's tokens lie only in the stretches its time overlaps
                low, high = start + span * k / stretches, start + span * (k + 1) / stretches
                assert low <= last + 1e-9 and first - 1e-9 <= high
    middle = ((sent + end) / 2 - start) / span * stretches
    assert (timed.cluster["tpot_s"] == np.clip(np.floor(middle), 0, stretches - 1)).all()
    assert timed.values["tpot_s"] is sample.values["tpot_s"]


def test_a_run_whose_speed_drifts_is_wider_over_time_than_over_sessions() -> None:
    """Every session sends all along the window while the server slows from 10 ms to 20 ms per token halfway: the
    sessions drawn each hold both halves and barely move the figure, the stretches drawn do."""
    records = [
        _request(f"s{session}", sent_ms, 64, 10 if sent_ms < 10_000 else 20)
        for session in range(40)
        for sent_ms in range(session * 10, 20_000, 1_000)
    ]
    sample = _sample(records, 20.0)
    widths = {}
    for name, view in (("sessions", sample), ("time", over_time(sample, 10))):
        weights = draw_weights(np.random.default_rng(0), len(view.clusters), 2000)
        interactivity, throughput = level_replicates(view, weights, "mean", "total")
        bounds = interval(interactivity, 0.95)
        assert bounds is not None and bounds[0] * (1 - 1e-9) <= 1 / 0.015 <= bounds[1] * (1 + 1e-9)
        widths[name] = bounds[1] - bounds[0]
        spread = interval(throughput, 0.95)
        assert spread is not None and spread[0] <= sample.values["total_tokens"].sum() / 20.0 <= spread[1]
    # The mean TPOT is 15 ms (66.7 tok/s/user); which stretches are drawn moves it by a third either way.
    assert widths["sessions"] < 0.01 * 66.7 and widths["time"] > 0.2 * 66.7


def test_repeats_have_no_common_window() -> None:
    table = pa.Table.from_pylist([msgspec.structs.asdict(_request("s", 0, 8, 10))], schema=SCHEMA)
    pooled = RunSample([Repeat(records=table, duration_s=1.0, num_gpus=1)] * 2)
    with pytest.raises(ValueError, match="one run"):
        over_time(pooled, 4)
