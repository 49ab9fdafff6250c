"""The replay's prefix-cache bound: the leading run of a prompt's blocks the run had already sent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentx.replayer.plan.sent_blocks import DENSE_IDS, Seen

IDS = st.one_of(st.integers(0, 64), st.integers(DENSE_IDS - 2, DENSE_IDS + 2), st.integers(-(2**63), 2**63 - 1))


@given(st.lists(st.lists(IDS, max_size=12).map(tuple), max_size=12))
def test_seen_counts_the_leading_run_already_sent_as_a_set_would(prompts: list[tuple[int, ...]]) -> None:
    seen, model = Seen(), set[int]()
    for ids in prompts:
        expected = next((i for i, block in enumerate(ids) if block not in model), len(ids))
        assert seen.hit_then_add(ids) == expected
        model.update(ids)


def test_a_prompt_sent_again_hits_whole_and_one_that_parts_hits_to_where_it_parts() -> None:
    seen = Seen()
    assert seen.hit_then_add((1, 2, 3)) == 0
    assert seen.hit_then_add((1, 2, 3)) == 3
    assert seen.hit_then_add((1, 2, 9, 3)) == 2
    assert seen.hit_then_add((2**40, 1)) == 0 and seen.hit_then_add((2**40, 1, 4)) == 2
