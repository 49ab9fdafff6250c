"""Parent links followed to their roots (`agentx.trace.links`), against a plain walk of each node."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.trace.links import ABSENT, IN_CYCLE, NO_PARENT, follow


def _walk(parents: list[int], node: int) -> tuple[int, int]:
    """(root, depth) of one node, or (IN_CYCLE, IN_CYCLE), by following its links one at a time."""
    seen: set[int] = set()
    depth = 0
    while parents[node] >= 0:
        if node in seen:
            return IN_CYCLE, IN_CYCLE
        seen.add(node)
        node, depth = parents[node], depth + 1
    return node, depth


@st.composite
def _parents(draw: st.DrawFn) -> list[int]:
    count = draw(st.integers(0, 12))
    return draw(st.lists(st.integers(ABSENT, count - 1), min_size=count, max_size=count))


@settings(max_examples=examples(500), deadline=None)
@given(_parents())
def test_follow_agrees_with_walking_each_node(parents: list[int]) -> None:
    links = follow(parents)
    assert [(links.roots[n], links.depths[n]) for n in range(len(parents))] == [
        _walk(parents, n) for n in range(len(parents))
    ]
    assert sorted(links.orphans) == [n for n, parent in enumerate(parents) if parent == ABSENT]
    # Each loop once, closed, every link in it a real one; together they hold every node that is on a loop.
    on_loops = [node for cycle in links.cycles for node in cycle[:-1]]
    assert len(on_loops) == len(set(on_loops))
    for cycle in links.cycles:
        assert cycle[0] == cycle[-1] and all(parents[a] == b for a, b in itertools.pairwise(cycle))
    assert set(on_loops) == {n for n in range(len(parents)) if _loops(parents, n)}


def _loops(parents: list[int], node: int) -> bool:
    """Whether following links from `node` comes back to it."""
    current, steps = parents[node], 0
    while current >= 0 and steps <= len(parents):
        if current == node:
            return True
        current, steps = parents[current], steps + 1
    return False


def test_examples() -> None:
    links = follow([NO_PARENT, 0, 1, 3, ABSENT, 4])
    assert links.roots == [0, 0, 0, IN_CYCLE, 4, 4]
    assert links.depths == [0, 1, 2, IN_CYCLE, 0, 1]
    assert links.cycles == [[3, 3]]
    assert links.orphans == [4]
    assert follow([]) == ([], [], [], [])
