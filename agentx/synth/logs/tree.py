"""Rebuilding agent trees from requests: which requests form one agent, and who spawned whom.

Explicit links win: requests carrying an agent key form that agent, and a parent key names its
parent. Otherwise, in start order, a request continues the idle agent whose whole last prompt is
a prefix of its own (the longest such); else it starts a new chain. A chain that starts after
another chain's last request ended, with no other response in between, and shares its first
blocks (the system prompt) is that chain continuing after a compaction or an edit of its history,
unless it runs inside a third chain's tool call. Finally a chain that runs wholly inside another
chain's tool call (between one request's end and the next one's start) is that chain's subagent,
spawned after the request before the gap; other chains hang under the chain whose request ended
last before they started (background subagents), or, when nothing precedes them and no session
key groups them, are roots of their own sessions.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

TIME_SLACK_S = 1e-3
"""Clock jitter allowed when comparing ends and starts of different requests."""


class Call(msgspec.Struct, kw_only=True):
    """What the tree needs of one request: times, block ids, explicit links, and an opaque payload index."""

    index: int
    start_s: float
    end_s: float
    ids: list[int]
    n_tokens: int
    """Prompt length in the tokenizer's tokens."""
    final_digest: bytes
    """The chain digest of the whole prompt (internal: never written)."""
    anchor: bytes = b""
    """The digest of the prompt's last full block (b"" when it has none)."""
    agent_key: str | None = None
    parent_key: str | None = None


class Chain(msgspec.Struct, kw_only=True):
    """One agent: its calls in order, and where it sits in the tree."""

    calls: list[Call] = msgspec.field(default_factory=list)
    key: str | None = None
    parent_key: str | None = None
    parent: Chain | None = None
    spawn_after: int = 0
    children: list[Chain] = msgspec.field(default_factory=list)

    @property
    def start_s(self) -> float:
        return self.calls[0].start_s

    @property
    def end_s(self) -> float:
        return max(call.end_s for call in self.calls)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


Extends = Callable[[Call], bool]
"""Whether the request being added extends a given earlier call's whole prompt."""


class ChainBuilder:
    """Groups calls, added in start order, into agents: explicit keys first, else prompt extension.

    Candidates are found through the digest of their last prompt's last full block: a prompt that
    extends another holds that digest at the same position, so one lookup per block of the new
    prompt finds them all, however many agents are open.
    """

    def __init__(self) -> None:
        self.chains: list[Chain] = []
        self._keyed: dict[str, Chain] = {}
        self._by_anchor: dict[bytes, list[Chain]] = {}

    def add(self, call: Call, extends: Extends, digests: list[bytes], block_size: int) -> None:
        """Add `call` (whose prompt has these block `digests`) to its agent."""
        if call.agent_key is not None:
            chain = self._keyed.get(call.agent_key)
            if chain is None:
                chain = self._keyed[call.agent_key] = Chain(key=call.agent_key, parent_key=call.parent_key)
                self.chains.append(chain)
            chain.calls.append(call)
            return
        best: Chain | None = None
        anchors = [b"", *digests[: call.n_tokens // block_size]]
        for anchor in anchors:
            for candidate in self._by_anchor.get(anchor, ()):
                last = candidate.calls[-1]
                if last.end_s > call.start_s + TIME_SLACK_S:
                    continue  # an agent waits for its response before its next request
                if (best is None or last.n_tokens > best.calls[-1].n_tokens) and extends(last):
                    best = candidate
        if best is None:
            best = Chain()
            self.chains.append(best)
        else:
            self._by_anchor[best.calls[-1].anchor].remove(best)
        best.calls.append(call)
        self._by_anchor.setdefault(call.anchor, []).append(best)

    def finish(self, *, merge_restarts: bool) -> list[Chain]:
        """The chains; with `merge_restarts` (one session), restarted chains joined to their agent."""
        return _merge_compactions(self.chains) if merge_restarts else self.chains


def _merge_compactions(chains: list[Chain]) -> list[Chain]:
    """Join a chain to an earlier, finished one that it restarts from the same system prompt.

    The earlier chain's last response must be the latest one before the restart (a compaction
    follows its own agent's summary request); otherwise the newcomer is a subagent some other
    chain just launched (and shares only its siblings' system prompt).
    """
    kept: list[Chain] = []
    for chain in chains:
        target = None
        if chain.key is None:
            ends = [call.end_s for other in kept for call in other.calls if call.end_s <= chain.start_s + TIME_SLACK_S]
            latest = max(ends, default=None)
            best_shared = 0
            for earlier in kept:
                if earlier.key is not None or earlier.end_s > chain.start_s + TIME_SLACK_S or earlier.end_s != latest:
                    continue
                if any(_inside_gap(chain, other) is not None for other in kept if other is not earlier):
                    continue  # it runs inside someone's tool call: a subagent, not a compaction
                shared = common_prefix(earlier.calls[0].ids, chain.calls[0].ids)
                if shared > best_shared:
                    target, best_shared = earlier, shared
        if target is None:
            kept.append(chain)
        else:
            target.calls.extend(chain.calls)
    return kept


def _inside_gap(chain: Chain, parent: Chain) -> int | None:
    """The index of `parent`'s request after which `chain` runs wholly inside a tool call, else None."""
    start, end = chain.start_s, chain.end_s
    calls = parent.calls
    for i in range(len(calls) - 1):
        if calls[i].end_s <= start + TIME_SLACK_S and end <= calls[i + 1].start_s + TIME_SLACK_S:
            return i
    return None


def build_trees(chains: list[Chain], *, one_session: bool) -> list[Chain]:
    """Link chains into trees; the roots returned in start order.

    With `one_session` (all chains share a session key) the earliest chain is the root and every
    other chain ends up below it; otherwise unlinked chains become roots of their own.
    """
    chains = sorted(chains, key=lambda c: c.start_s)
    by_key = {chain.key: chain for chain in chains if chain.key is not None}
    roots: list[Chain] = []
    for position, chain in enumerate(chains):
        earlier = chains[:position]
        parent = by_key.get(chain.parent_key) if chain.parent_key is not None else None
        spawn_after = None
        if parent is not None and any(parent is c for c in earlier):  # earlier only: no cycles
            spawn_after = sum(1 for call in parent.calls if call.end_s <= chain.start_s + TIME_SLACK_S)
        else:
            parent = None
            tightest = -1.0
            for candidate in earlier:
                gap = _inside_gap(chain, candidate)
                if gap is not None and candidate.calls[gap].end_s > tightest:
                    parent, spawn_after, tightest = candidate, gap + 1, candidate.calls[gap].end_s
            if parent is None and earlier and (one_session or chain.key is not None):
                parent, spawn_after = _latest_before(chain, earlier)
        if parent is None:
            roots.append(chain)
            continue
        chain.parent, chain.spawn_after = parent, spawn_after or 0
        parent.children.append(chain)
    for chain in chains:
        chain.children.sort(key=lambda c: (c.spawn_after, c.start_s))
    return roots


def _latest_before(chain: Chain, earlier: list[Chain]) -> tuple[Chain, int]:
    """The chain with the latest request end before `chain` starts (a background spawn), else the first."""
    best, best_end, best_after = earlier[0], -1.0, 0
    for candidate in earlier:
        done = [call.end_s for call in candidate.calls if call.end_s <= chain.start_s + TIME_SLACK_S]
        if done and max(done) > best_end:
            best, best_end, best_after = candidate, max(done), len(done)
    return best, best_after
