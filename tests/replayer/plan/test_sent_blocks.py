"""The replay's prefix-cache bound: the leading run of a prompt's blocks the run had already sent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentx.replayer.plan.play import Play, PreparedSession
from agentx.replayer.plan.sent_blocks import DENSE_IDS, Seen, SentBlocks
from agentx.replayer.plan.steps import plan_session
from agentx.trace.model import Agent, Request, Session

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


def _play(session_id: str, prompts: list[tuple[int, ...]], marker: str | None) -> Play:
    """A play of session `session_id` whose root sends `prompts` (their hash ids), one request each."""
    requests = [Request(t=float(i), model="m", in_tokens=16 * len(ids), out_tokens=1) for i, ids in enumerate(prompts)]
    plan = plan_session(Session(session_id=session_id, root=Agent(requests=requests)))
    n = len(prompts)
    steps = tuple(range(n))
    prepared = PreparedSession(
        plan, tuple(prompts), {"": 0}, (0,) * n, (0,) * n, {"": steps}, ("m",) * n, (True,) * n, {}
    )
    return Play(prepared, 0, 0, 0, marker=marker)


MARKED_SESSION = {"m1": "a", "m2": "b"}
"""A marker is one play's: of one session."""
SENDS = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, "m1", "m2"]), st.lists(st.integers(0, 6)).map(tuple)),
    max_size=16,
)


@given(SENDS, st.booleans())
def test_sent_blocks_counts_the_same_key_and_any_marker_as_sets_would(
    sends: list[tuple[str, str | None, tuple[int, ...]]], session_scope: bool
) -> None:
    """The same key is a play's marker, else the hash-id namespace (the session's, or the run's); any marker is the
    namespace alone. An LRU that never fills holds what the same key sent."""
    marked = {
        marker: _play(session, [ids for _, m, ids in sends if m == marker], marker)
        for marker, session in MARKED_SESSION.items()
    }
    next_step = dict.fromkeys(MARKED_SESSION, 0)
    sent = SentBlocks(session_scope, lru_blocks=1000)
    same: dict[str, set[int]] = {}
    any_marker: dict[str, set[int]] = {}

    def leading(ids: tuple[int, ...], seen: set[int]) -> int:
        return next((i for i, block in enumerate(ids) if block not in seen), len(ids))

    for session, marker, ids in sends:
        if marker is None:
            play, step = _play(session, [ids], None), 0
        else:
            session, play, step = MARKED_SESSION[marker], marked[marker], next_step[marker]
            next_step[marker] += 1
        namespace = session if session_scope else ""
        key = marker if marker is not None else f"scope:{namespace}"
        hits = sent.hit(play, play.prepared.plan.steps[step])
        assert hits == (
            leading(ids, same.get(key, set())),
            leading(ids, any_marker.get(namespace, set())),
            hits.replayed,
        )
        same.setdefault(key, set()).update(ids)
        any_marker.setdefault(namespace, set()).update(ids)


def test_a_play_never_forgotten_does_not_lend_its_last_prompt_to_a_later_play() -> None:
    """Plays made and dropped one after another (as a caller that never calls `forget` does) may reuse one address;
    each new session's first prompt still hits nothing."""
    sent = SentBlocks(session_scope=True)
    for number in range(200):
        play = _play(f"s{number}", [(0, 1)], None)
        assert sent.hit(play, play.prepared.plan.steps[0]).replayed == 0
        del play
