"""Keyed chain hashing, first-seen remapping and the built-in tokenizer: properties that must always hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentx.synth.logs.hashing import ChainHasher, IdRemap
from agentx.synth.logs.tokenize import ApproxTokenizer

tokens_lists = st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=60)
salts = st.binary(min_size=1, max_size=100)


@given(st.text(max_size=400))
def test_the_builtin_tokenizer_covers_every_character(text: str) -> None:
    pieces = ApproxTokenizer().encode(text)
    assert "".join(pieces) == text
    assert all(pieces)


def test_the_builtin_tokenizer_is_about_four_characters_per_token_on_prose() -> None:
    text = "The quick brown fox jumps over the lazy dog, then reads config.yaml at line 42. " * 50
    ratio = len(text) / len(ApproxTokenizer().encode(text))
    assert 3.0 < ratio < 5.0


@given(tokens_lists, salts, st.integers(1, 8))
def test_same_content_same_ids(tokens: list[str], salt: bytes, block_size: int) -> None:
    hasher = ChainHasher(salt, block_size)
    remap = IdRemap()
    first = remap.ids(hasher.digests(tokens))
    again = remap.ids(ChainHasher(salt, block_size).digests(list(tokens)))
    assert first == again
    assert len(first) == -(-len(tokens) // block_size)


@given(tokens_lists, salts, st.integers(1, 8), st.data())
def test_a_change_in_a_block_changes_it_and_every_later_block(
    tokens: list[str], salt: bytes, block_size: int, data: st.DataObject
) -> None:
    position = data.draw(st.integers(0, len(tokens) - 1))
    replacement = data.draw(st.text(min_size=1, max_size=3).filter(lambda t: t != tokens[position]))
    changed = [*tokens[:position], replacement, *tokens[position + 1 :]]
    hasher = ChainHasher(salt, block_size)
    before, after = hasher.digests(tokens), hasher.digests(changed)
    block = position // block_size
    assert before[:block] == after[:block]
    assert all(x != y for x, y in zip(before[block:], after[block:], strict=True))


@given(tokens_lists, salts, salts, st.integers(1, 8))
def test_different_salts_give_unrelated_digests(tokens: list[str], salt: bytes, other: bytes, block_size: int) -> None:
    if salt == other:
        return
    assert not set(ChainHasher(salt, block_size).digests(tokens)) & set(ChainHasher(other, block_size).digests(tokens))


@given(tokens_lists, salts, st.integers(1, 8), st.data())
def test_prefix_digest_matches_hashing_the_prefix(
    tokens: list[str], salt: bytes, block_size: int, data: st.DataObject
) -> None:
    length = data.draw(st.integers(1, len(tokens)))
    hasher = ChainHasher(salt, block_size)
    assert hasher.prefix_digest(tokens, hasher.digests(tokens), length) == hasher.digests(tokens[:length])[-1]


def test_token_boundaries_matter_not_only_the_text() -> None:
    hasher = ChainHasher(b"k", 4)
    assert hasher.digests(["ab", "c"]) != hasher.digests(["a", "bc"])


def test_remap_hands_out_small_ids_in_first_seen_order_and_fresh_ids_never_collide() -> None:
    remap = IdRemap()
    assert remap.ids([b"x" * 16, b"y" * 16, b"x" * 16]) == [0, 1, 0]
    assert remap.fresh() == 2
    assert remap.ids([b"z" * 16]) == [3]
