"""Parent links as a file states them (a Bailian row's `parent_chat_id`, an Arrow row's `parent_agent_id`): where each
node's links end, how many there are, the loops they form and the links to a parent that is not there. Each reader
words what they mean in its own terms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

NO_PARENT: Final = -1
"""The parent of a root."""
ABSENT: Final = -2
"""The parent of an orphan: a node whose link names no node (it counts as a root of its own)."""
IN_CYCLE: Final = -1
"""The root, and the depth, of a node whose links loop or lead into a loop."""
_UNKNOWN: Final = -3


class Links(NamedTuple):
    """What following every node's parent links found (`follow`)."""

    roots: list[int]
    """Each node's root (the node its links end at: itself for a root or an orphan), or IN_CYCLE."""
    depths: list[int]
    """Each node's number of links to its root, or IN_CYCLE."""
    cycles: list[list[int]]
    """Each loop once, from the node it was entered at, around, and back to that node."""
    orphans: list[int]
    """The nodes whose parent is ABSENT, in the order they were met."""


def follow(parents: Sequence[int]) -> Links:
    """Follow the links of nodes `0..len(parents)-1`: `parents[i]` is the index of node i's parent, NO_PARENT or
    ABSENT. Iterative, and each node is walked once: a file's long or looping chains cost no recursion."""
    count = len(parents)
    roots = [_UNKNOWN] * count
    depths = [_UNKNOWN] * count
    cycles: list[list[int]] = []
    orphans: list[int] = []
    for start in range(count):
        path: list[int] = []
        on_path: set[int] = set()
        current = start
        while True:
            if roots[current] != _UNKNOWN:  # met a node already resolved (on an earlier walk)
                root, depth = roots[current], depths[current]
                break
            if current in on_path:
                cycles.append([*path[path.index(current) :], current])
                root, depth = IN_CYCLE, IN_CYCLE
                break
            path.append(current)
            on_path.add(current)
            parent = parents[current]
            if parent < 0:  # NO_PARENT or ABSENT: `current` is a root, and the last node of the path
                if parent == ABSENT:
                    orphans.append(current)
                root, depth = current, -1
                break
            current = parent
        for steps, node in enumerate(reversed(path), start=1):
            roots[node] = root
            depths[node] = IN_CYCLE if root == IN_CYCLE else depth + steps
    return Links(roots=roots, depths=depths, cycles=cycles, orphans=orphans)
