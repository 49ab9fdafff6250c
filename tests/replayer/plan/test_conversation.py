"""The segment model of chat prompt reconstruction (docs/agentx.md §2b–§2c): hand-computed
turns for each rule, then the invariants over random turn sequences.

The hand-computed examples use 4-token blocks, so `in_tokens = 4·blocks + filler`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.replayer.prompts.conversation import ChatTurn, Conversation, Segment
from agentx.trace.formats.weka_reader import read_weka

BS = 4
"""Block size of the hand-computed examples."""


def system(*ids: int) -> Segment:
    return Segment("system", ids)


def assistant(*ids: int) -> Segment:
    return Segment("assistant", ids)


def user(*ids: int, filler: int = 0, turn: int | None = None, key: str = "k") -> Segment:
    """A user segment; `turn` names the turn whose filler it carries."""
    return Segment("user", ids, filler, f"{key}:turn_{turn}" if turn is not None else "")


def conversation(prefix_blocks: int = 0) -> Conversation:
    return Conversation(BS, prefix_blocks=prefix_blocks, filler_key="k")


# Turn 0


def test_first_turn_is_one_user_message_without_prefix() -> None:
    # in=14 covers 3 blocks; the 4th id is a partial block, so its 2 tokens are filler.
    turn = conversation().next_turn([1, 2, 3, 4], 14, None)
    assert turn == ChatTurn((user(1, 2, 3, filler=2, turn=0),), new_from=0, reset_context=False)


def test_first_turn_opens_with_the_system_prefix() -> None:
    turn = conversation(prefix_blocks=2).next_turn([1, 2, 3, 4, 5], 19, None)
    assert turn.segments == (system(1, 2), user(3, 4, filler=3, turn=0))
    assert (turn.new_from, turn.reset_context, turn.ends_on_user) == (0, False, True)


def test_system_prefix_is_clamped_to_covered_blocks() -> None:
    # 5 prefix blocks, but in=13 covers 3: the user message is the 1 filler token.
    turn = conversation(prefix_blocks=5).next_turn([1, 2, 3], 13, None)
    assert turn.segments == (system(1, 2, 3), user(filler=1, turn=0))


def test_system_prefix_gives_a_block_back_when_it_would_take_everything() -> None:
    assert conversation(prefix_blocks=3).next_turn([1, 2, 3], 12, None).segments == (system(1, 2), user(3))
    # A one-block system prefix of a one-block prompt disappears: the user message is all there is.
    assert conversation(prefix_blocks=1).next_turn([1], 4, None).segments == (user(1),)


@pytest.mark.parametrize(
    ("prefix_blocks", "hash_ids", "in_tokens", "expected"),
    [
        pytest.param(1, [], 10, (user(filler=10, turn=0),), id="no-ids-all-filler"),
        pytest.param(1, [1, 2], 3, (user(filler=3, turn=0),), id="under-one-block"),
        pytest.param(0, [1, 2, 3, 4, 5], 9, (user(1, 2, filler=1, turn=0),), id="surplus-ids-ignored"),
        pytest.param(0, [1], 10, (user(1, filler=6, turn=0),), id="missing-blocks-become-filler"),
        pytest.param(1, [1], 10, (system(1), user(filler=6, turn=0)), id="prefix-then-filler"),
        pytest.param(1, [1, 2], 0, (user(),), id="no-content-one-empty-message"),
    ],
)
def test_first_turn_edge_cases(
    prefix_blocks: int, hash_ids: list[int], in_tokens: int, expected: tuple[Segment, ...]
) -> None:
    turn = conversation(prefix_blocks).next_turn(hash_ids, in_tokens, None)
    assert turn.segments == expected
    assert turn.ends_on_user


# Growth turns


def test_growth_turn_appends_assistant_then_user() -> None:
    conv = conversation()
    conv.next_turn([1, 2, 3], 12, None)
    # 7 covered blocks + 2 filler; prev out=5 tokens → ceil(5/4)=2 assistant blocks, the rest is the user's.
    turn = conv.next_turn([1, 2, 3, 4, 5, 6, 7], 30, 5)
    assert turn == ChatTurn(
        (user(1, 2, 3), assistant(4, 5), user(6, 7, filler=2, turn=1)),
        new_from=1,
        reset_context=False,
        kept_blocks=3,
    )


@pytest.mark.parametrize(
    ("out_tokens", "assistant_blocks"),
    [(None, 0), (0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (-3, 0)],
)
def test_assistant_part_rounds_output_up_to_whole_blocks(out_tokens: int | None, assistant_blocks: int) -> None:
    conv = conversation()
    conv.next_turn([1], 4, None)
    turn = conv.next_turn(list(range(1, 11)), 40, out_tokens)
    new = list(range(2, 11))
    expected = (assistant(*new[:assistant_blocks]),) if assistant_blocks else ()
    assert turn.segments == (user(1), *expected, user(*new[assistant_blocks:]))


def test_one_block_goes_back_to_the_user() -> None:
    conv = conversation()
    conv.next_turn([1, 2], 8, None)
    # 2 new blocks, no filler, 25 assistant blocks asked: the last block stays the user's.
    assert conv.next_turn([1, 2, 3, 4], 16, 100).segments == (user(1, 2), assistant(3), user(4))


def test_filler_alone_is_enough_for_the_user() -> None:
    conv = conversation()
    conv.next_turn([1, 2], 8, None)
    assert conv.next_turn([1, 2, 3, 4], 17, 100).segments == (
        user(1, 2),
        assistant(3, 4),
        user(filler=1, turn=1),
    )


def test_lcp_uses_only_the_blocks_the_previous_turn_covered() -> None:
    conv = conversation()
    # in=8 covers [1, 2]; ids 3 and 4 were filler positions, so matching them again proves nothing shared.
    conv.next_turn([1, 2, 3, 4], 8, None)
    turn = conv.next_turn([1, 2, 3, 4, 5], 20, 4)
    assert turn.segments == (user(1, 2), assistant(3), user(4, 5))
    assert (turn.kept_blocks, turn.new_from, turn.reset_context) == (2, 1, False)


# Cuts


def three_segment_conversation() -> Conversation:
    """A conversation whose last turn is user(1,2,3) assistant(4,5) user(6,7)+2 filler."""
    conv = conversation()
    conv.next_turn([1, 2, 3], 12, None)
    assert conv.next_turn([1, 2, 3, 4, 5, 6, 7], 30, 5).segments == (
        user(1, 2, 3),
        assistant(4, 5),
        user(6, 7, filler=2, turn=1),
    )
    return conv


def test_mid_segment_cut_slices_on_a_block_boundary() -> None:
    conv = three_segment_conversation()
    # lcp=4 falls inside assistant(4,5): it keeps block 4; the new blocks 9, 10 split 1/1.
    turn = conv.next_turn([1, 2, 3, 4, 9, 10], 24, 4)
    assert turn == ChatTurn(
        (user(1, 2, 3), assistant(4), assistant(9), user(10)),
        new_from=0,
        reset_context=True,
        kept_blocks=4,
    )


def test_cut_at_a_segment_end_strips_the_filler_tail() -> None:
    conv = conversation()
    conv.next_turn([1, 2, 3, 4], 14, None)  # user(1,2,3)+2 filler: the partial 4th block
    # The 4th block is now full, with a new id: the cut at block 3 drops the filler of turn 0.
    turn = conv.next_turn([1, 2, 3, 8, 9], 20, 4)
    assert turn.segments == (user(1, 2, 3), assistant(8), user(9))
    assert (turn.new_from, turn.reset_context, turn.kept_blocks) == (0, True, 3)


def test_cut_at_a_segment_end_drops_the_later_segments() -> None:
    conv = three_segment_conversation()
    turn = conv.next_turn([1, 2, 3, 8], 16, 4)
    # One new block, no filler: it stays the user's, whatever the previous output.
    assert turn.segments == (user(1, 2, 3), user(8))
    assert (turn.new_from, turn.reset_context, turn.context_loss) == (0, True, False)


def test_compaction_keeps_a_short_prefix_and_resets() -> None:
    conv = three_segment_conversation()
    turn = conv.next_turn([1, 50, 51, 52], 16, 8)
    assert turn.segments == (user(1), assistant(50, 51), user(52))
    assert (turn.reset_context, turn.kept_blocks, turn.context_loss) == (True, 1, False)


def test_context_loss_when_no_user_segment_survives() -> None:
    conv = conversation(prefix_blocks=2)
    assert conv.next_turn([1, 2, 3, 4], 16, None).segments == (system(1, 2), user(3, 4))
    # Only the system prefix survives: nothing for an assistant to answer, so all the new blocks are the user's.
    turn = conv.next_turn([1, 2, 7, 8], 16, 100)
    assert turn.segments == (system(1, 2), user(7, 8))
    assert (turn.context_loss, turn.reset_context, turn.new_from) == (True, True, 0)


def test_total_cut_is_context_loss() -> None:
    conv = three_segment_conversation()
    turn = conv.next_turn([9, 10], 9, 100)
    assert turn.segments == (user(9, 10, filler=1, turn=2),)
    assert (turn.context_loss, turn.reset_context, turn.kept_blocks) == (True, True, 0)


def test_turn_adding_nothing_may_end_on_an_assistant() -> None:
    conv = three_segment_conversation()
    turn = conv.next_turn([1, 2, 3, 4], 16, 4)
    assert turn.segments == (user(1, 2, 3), assistant(4))
    assert (turn.ends_on_user, turn.reset_context, turn.context_loss) == (False, True, False)


def test_turn_adding_nothing_may_end_on_the_system_prefix() -> None:
    conv = conversation(prefix_blocks=2)
    conv.next_turn([1, 2, 3], 12, None)
    turn = conv.next_turn([1, 2], 8, 4)
    assert turn.segments == (system(1, 2),)
    assert (turn.ends_on_user, turn.context_loss) == (False, True)


# Repeats and empty turns


def test_repeat_resends_the_same_segments_with_a_reset() -> None:
    conv = three_segment_conversation()
    before = conv.next_turn([1, 2, 3, 4, 5, 6, 7, 8, 9], 37, 4)
    # Same covered ids and size (the surplus id 99 is ignored): the same messages, filler of the same turn.
    again = conv.next_turn([1, 2, 3, 4, 5, 6, 7, 8, 9, 99], 37, 500)
    assert again == ChatTurn(before.segments, new_from=0, reset_context=True, kept_blocks=9)
    assert again.segments[-1].filler_key == "k:turn_2"


def test_repeat_of_a_turn_ending_on_an_assistant_still_flags_it() -> None:
    conv = three_segment_conversation()
    conv.next_turn([1, 2, 3, 4], 16, 4)
    turn = conv.next_turn([1, 2, 3, 4], 16, 4)
    assert turn.segments == (user(1, 2, 3), assistant(4))
    assert (turn.ends_on_user, turn.reset_context) == (False, True)


def test_same_ids_with_more_filler_is_not_a_repeat() -> None:
    conv = conversation()
    conv.next_turn([1, 2], 9, None)
    turn = conv.next_turn([1, 2], 11, 4)
    # The old filler is stripped (a reset); the new filler is a new user message keyed by this turn.
    assert turn.segments == (user(1, 2), user(filler=3, turn=1))
    assert turn.reset_context


def test_empty_turns() -> None:
    conv = conversation()
    assert conv.next_turn([], 0, None).segments == (user(),)
    assert conv.next_turn([], 0, 10) == ChatTurn((user(),), new_from=0, reset_context=True)
    # The empty message never survives: the next real turn replaces it.
    turn = conv.next_turn([1], 5, 10)
    assert turn.segments == (user(1, filler=1, turn=2),)
    assert (turn.reset_context, turn.context_loss) == (True, True)
    assert conv.next_turn([1], 0, 10).segments == (user(),)


# Filler keys


def test_filler_keys_are_per_conversation_key_and_turn() -> None:
    a, b, other = conversation(), conversation(), Conversation(BS, filler_key="other")
    turns = [([1], 6), ([1, 2], 9), ([1, 2, 3], 15)]
    keys_a = [a.next_turn(ids, size, 1).segments[-1].filler_key for ids, size in turns]
    keys_b = [b.next_turn(ids, size, 1).segments[-1].filler_key for ids, size in turns]
    keys_other = [other.next_turn(ids, size, 1).segments[-1].filler_key for ids, size in turns]
    assert keys_a == keys_b == ["k:turn_0", "k:turn_1", "k:turn_2"]
    assert len(set(keys_a)) == 3
    assert not set(keys_a) & set(keys_other)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        Conversation(0)
    with pytest.raises(ValueError):
        Conversation(BS, prefix_blocks=-1)
    with pytest.raises(ValueError):
        conversation().next_turn([1], -1, None)


# Invariants over random turn sequences


@dataclass(frozen=True)
class Step:
    hash_ids: list[int]
    in_tokens: int
    prev_out_tokens: int | None


@st.composite
def sessions(draw: st.DrawFn) -> tuple[int, int, list[Step]]:
    """A block size, a system prefix, and turns that grow, repeat, resize, cut back (compaction) or restart.
    Ids come from a small range, so cuts often land on ids that reappear later."""
    block_size = draw(st.integers(min_value=1, max_value=6))
    prefix_blocks = draw(st.integers(min_value=0, max_value=4))
    new_ids = st.lists(st.integers(min_value=0, max_value=12), max_size=6)
    ids = draw(new_ids)
    steps: list[Step] = []
    in_tokens = 0
    for index in range(draw(st.integers(min_value=1, max_value=12))):
        kind = draw(st.sampled_from(["grow", "grow", "grow", "repeat", "resize", "cut", "restart"]))
        if index and kind == "grow":
            ids = ids + draw(new_ids)
        elif index and kind == "cut":
            ids = ids[: draw(st.integers(min_value=0, max_value=len(ids)))] + draw(new_ids)
        elif index and kind == "restart":
            ids = draw(new_ids)
        if not index or kind != "repeat":
            # Usually the ids cover `in` with a partial last block; sometimes too few or too many ids.
            exact = max(0, len(ids) - 1) * block_size + draw(st.integers(min_value=0, max_value=block_size))
            in_tokens = draw(st.just(exact) | st.integers(min_value=0, max_value=(len(ids) + 2) * block_size))
        out = None if not index else draw(st.integers(min_value=0, max_value=4 * block_size) | st.none())
        steps.append(Step(list(ids), in_tokens, out))
    return block_size, prefix_blocks, steps


def block_starts(segments: tuple[Segment, ...]) -> list[int]:
    starts, start = [], 0
    for segment in segments:
        starts.append(start)
        start += len(segment.hash_ids)
    return starts


def check_turn(turn: ChatTurn, step: Step, block_size: int, index: int, previous: ChatTurn | None) -> None:
    segments = turn.segments
    covered = min(len(step.hash_ids), step.in_tokens // block_size)
    filler = step.in_tokens - covered * block_size
    # Tiling: the blocks are the covered ids in order; only the last segment has filler; exactly `in` tokens.
    assert [hash_id for segment in segments for hash_id in segment.hash_ids] == step.hash_ids[:covered]
    assert all(segment.filler_tokens == 0 for segment in segments[:-1])
    assert segments[-1].filler_tokens == filler
    assert sum(len(s.hash_ids) * block_size + s.filler_tokens for s in segments) == step.in_tokens
    # No empty message, except the single one of a turn without content.
    if step.in_tokens == 0:
        assert segments == (Segment("user", ()),)
    else:
        assert all(segment.hash_ids or segment.filler_tokens for segment in segments)
    assert turn.ends_on_user == (segments[-1].role == "user")
    assert all(segment.role != "system" for segment in segments[1:])
    if previous is None:
        assert (turn.new_from, turn.reset_context, turn.context_loss, turn.ends_on_user) == (0, False, False, True)
        return
    assert turn.kept_blocks <= covered
    if not turn.ends_on_user:
        assert (turn.kept_blocks, filler) == (covered, 0)  # only a turn adding nothing ends elsewhere
    # Delta: a reset exactly when the old list is not kept as a prefix, or nothing changed at all.
    sent = previous.segments
    kept = segments[: len(sent)] == sent
    assert turn.reset_context == (not kept or segments == sent)
    assert turn.new_from == (0 if turn.reset_context else len(sent))
    # The new region: at most one assistant part, sized from the previous output, none after a context loss.
    new = [s for s, start in zip(segments, block_starts(segments), strict=True) if start >= turn.kept_blocks]
    if turn.context_loss:
        assert all(segment.role != "assistant" for segment in new)
    answer = [segment for segment in new if segment.role == "assistant"]
    out_blocks = -(-(step.prev_out_tokens or 0) // block_size)
    assert len(answer) <= 1
    assert all(0 < len(segment.hash_ids) <= out_blocks for segment in answer)
    # Filler keys name the conversation and the turn that made the filler.
    if filler and not (segments == sent and turn.reset_context):
        assert segments[-1].filler_key == f"k:turn_{index}"


@settings(max_examples=examples(400), deadline=None)
@given(session=sessions())
def test_invariants_over_random_sessions(session: tuple[int, int, list[Step]]) -> None:
    block_size, prefix_blocks, steps = session
    conv = Conversation(block_size, prefix_blocks=prefix_blocks, filler_key="k")
    previous: ChatTurn | None = None
    filler_by_key: dict[str, int] = {}
    for index, step in enumerate(steps):
        turn = conv.next_turn(step.hash_ids, step.in_tokens, step.prev_out_tokens)
        check_turn(turn, step, block_size, index, previous)
        for segment in turn.segments:
            if segment.filler_tokens:
                # Equal keys render equal text, so a key must always mean the same filler length.
                assert filler_by_key.setdefault(segment.filler_key, segment.filler_tokens) == segment.filler_tokens
        previous = turn


@settings(max_examples=examples(200), deadline=None)
@given(session=sessions())
def test_replaying_a_session_is_deterministic(session: tuple[int, int, list[Step]]) -> None:
    block_size, prefix_blocks, steps = session
    runs = [Conversation(block_size, prefix_blocks=prefix_blocks, filler_key="k") for _ in range(2)]
    for step in steps:
        first, second = (conv.next_turn(step.hash_ids, step.in_tokens, step.prev_out_tokens) for conv in runs)
        assert first == second


@settings(max_examples=examples(200), deadline=None)
@given(
    block_size=st.integers(min_value=1, max_value=6),
    start=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=6),
    growth=st.lists(st.lists(st.integers(min_value=100, max_value=200), min_size=1, max_size=4), max_size=8),
    outs=st.lists(st.integers(min_value=0, max_value=30), min_size=8, max_size=8),
)
def test_pure_growth_only_appends(block_size: int, start: list[int], growth: list[list[int]], outs: list[int]) -> None:
    """Whole-block growth never resets: each turn sends the old messages unchanged plus new ones."""
    conv = Conversation(block_size, filler_key="k")
    ids = list(start)
    previous = conv.next_turn(ids, len(ids) * block_size, None)
    for added, out in zip(growth, outs, strict=False):
        ids = ids + added
        turn = conv.next_turn(ids, len(ids) * block_size, out)
        assert not turn.reset_context
        assert turn.segments[: turn.new_from] == previous.segments
        assert turn.new_from == len(previous.segments) < len(turn.segments)
        assert turn.ends_on_user
        previous = turn


def test_long_session_stays_cheap() -> None:
    """200 turns growing to 1,500 blocks of 64 tokens, with a compaction halfway."""
    conv = Conversation(64, prefix_blocks=3, filler_key="k")
    ids: list[int] = []
    for index in range(200):
        ids = ids[:20] if index == 100 else ids + list(range(len(ids), len(ids) + 15))
        turn = conv.next_turn(ids, len(ids) * 64 - 10, 300)
        assert sum(len(s.hash_ids) for s in turn.segments) == len(ids) - 1
    assert len(turn.segments) < 250


def test_real_sample_traces_keep_the_invariants(weka_sample_dir: Path) -> None:
    """Every agent of the real Weka sample, replayed turn by turn (§1e prefix included)."""
    trace = read_weka(weka_sample_dir)
    bs = trace.block_size
    turns = resets = 0
    for session in trace.sessions:
        for agent, _, _ in session.root.walk():
            covered_first = (
                min(len(agent.requests[0].hash_ids_added), agent.requests[0].in_tokens // bs) if agent.requests else 0
            )
            prefix_blocks = min(-(-(agent.tool_tokens + agent.system_tokens) // bs), covered_first)
            conv = Conversation(bs, prefix_blocks=prefix_blocks, filler_key="k")
            previous: ChatTurn | None = None
            out: int | None = None
            for index, (request, ids) in enumerate(zip(agent.requests, agent.iter_hash_ids(), strict=True)):
                step = Step(list(ids), request.in_tokens, out)
                turn = conv.next_turn(ids, request.in_tokens, out)
                check_turn(turn, step, bs, index, previous)
                turns += 1
                resets += turn.reset_context
                previous, out = turn, request.out_tokens
    assert turns > 0
    assert resets < turns
