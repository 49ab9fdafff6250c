"""The clock model of a `--ray` run (agentx.replayer.cluster.clocks): the midpoint estimate is within its bound."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentx.replayer.cluster.clocks import ClockRound, estimate, measure

NS = st.integers(min_value=0, max_value=10**9)


@given(
    offset_ns=st.integers(min_value=-(10**15), max_value=10**15),
    trips=st.lists(st.tuples(NS, NS, st.integers(min_value=0, max_value=10**12)), min_size=1, max_size=20),
)
def test_the_estimate_is_within_its_bound_whatever_each_direction_took(
    offset_ns: int, trips: list[tuple[int, int, int]]
) -> None:
    """The shard answers `out` ns after the question left and the answer takes `back` ns: any split of a round trip."""
    rounds = [
        ClockRound(asked_ns=asked, shard_ns=asked + out + offset_ns, answered_ns=asked + out + back)
        for out, back, asked in trips
    ]
    found = estimate(rounds)
    assert abs(found.offset_ns - offset_ns) <= found.error_ns
    quickest = min(out + back for out, back, _ in trips)
    assert found.error_ns <= quickest // 2 + 2  # the bound is the quickest trip's, not a slower one's
    assert found.to_shard(0) == found.offset_ns and found.rounds == len(trips)


def test_a_symmetric_trip_gives_the_offset_exactly() -> None:
    found = estimate([ClockRound(asked_ns=100, shard_ns=5_150, answered_ns=200)])
    assert found.offset_ns == 5_000 and found.error_ns == 51


def test_an_estimate_needs_a_sane_round() -> None:
    with pytest.raises(ValueError, match="at least one"):
        estimate([])
    with pytest.raises(ValueError, match="ended before it began"):
        estimate([ClockRound(asked_ns=10, shard_ns=0, answered_ns=5)])


def test_measure_asks_each_round_and_keeps_the_quickest() -> None:
    driver = iter([0, 900, 1_000, 1_100, 2_000, 2_800])  # trips of 900, 100 and 800 ns
    answers = iter([10_450, 11_050, 12_400])  # offset 10,000 ns; the quick round is answered at its midpoint

    async def ask() -> int:
        return next(answers)

    found = asyncio.run(measure(ask, rounds=3, now_ns=lambda: next(driver)))
    assert found.offset_ns == 10_000 and found.error_ns == 51 and found.rounds == 3
