"""Flattened-agent detection's thresholds (`ChainRules`) and what it found (`ChainCounts`, `ChainReport`).

The detection itself is `agentx.trace.chain_detection` and `agentx.trace.chain_kinds`; the session rewrite and the
entry points are `agentx.trace.chains` (docs/agentx.md §3b).
"""

from __future__ import annotations

from typing import Literal

import msgspec

SubagentChains = Literal["sibling", "child"]


class ChainRules(msgspec.Struct, frozen=True, kw_only=True):
    """Thresholds of flattened-agent detection (§3b); defaults are the reference's
    (`AIPERF_DATASET_WEKA_*` environment variables in brackets)."""

    aux_max_requests: int = 1
    """A chain of at most this many requests may be an `aux` sidecar [AUX_MAX_REQUESTS]; 0 disables `aux`."""
    aux_isl_floor: int = 16384
    """`aux`: first `in` below max(this, `aux_isl_ratio` × main-chain peak `in`) [AUX_ISL_FLOOR]; also the
    minimum `in` of an `aux:red` reduction."""
    aux_isl_ratio: float = 0.10
    """`aux`: see `aux_isl_floor` [AUX_ISL_RATIO]."""
    aux_cross_model: bool = True
    """`aux`: a short chain on another model than the main chain's first request [AUX_CROSS_MODEL]."""
    aux_reduction_osl_max: int = 4000
    """`aux:red`: one same-model request with 0 < `out` < this [AUX_REDUCTION_OSL_MAX]; 0 disables it."""
    aux_reduction_ratio: float = 20.0
    """`aux:red`: and `in / out` above this [AUX_REDUCTION_RATIO]."""
    worker_group_min: int = 3
    """`wg`: at least this many overlapping chains forked from one point [WORKER_GROUP_MIN]; 0 disables."""
    seam_max_gap_seconds: float = 3600.0
    """Seam guard: a compaction continuation starting more than this after its tail ends… [SEAM_MAX_GAP_SECONDS]"""
    seam_min_overlap_ratio: float = 0.5
    """…and keeping less than this fraction of the tail's ids spawns instead [SEAM_MIN_OVERLAP_RATIO]."""
    preamble_max_out: int = 64
    """A prefix-disjoint earliest request with `out` at most this is a preamble (title generation)."""
    subagent_chains: SubagentChains = "sibling"
    """Where chains found inside a subagent go: next to it in its branch (the reference) or under it."""


DEFAULT_RULES = ChainRules()
"""The reference's thresholds."""


class ChainCounts(msgspec.Struct, kw_only=True):
    """What detection found in one session (root and subagents together)."""

    fa: int = 0
    aux: int = 0
    aux_red: int = 0
    wg: int = 0
    seams: int = 0
    """Compaction continuations spliced back onto their chain."""
    preambles: int = 0
    """Earliest requests set aside as preambles (and kept on their main chain)."""
    without_ids: int = 0
    """Requests without hash ids (kept on their main chain)."""

    @property
    def chains(self) -> int:
        """Derived chains: new agents created."""
        return self.fa + self.aux + self.aux_red + self.wg

    def add(self, other: ChainCounts) -> None:
        for name in self.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class ChainReport(msgspec.Struct, kw_only=True):
    """Per-session counts of a `split_trace` run, in trace order (every session, split or not)."""

    sessions: dict[str, ChainCounts] = msgspec.field(default_factory=dict)

    @property
    def total(self) -> ChainCounts:
        total = ChainCounts()
        for counts in self.sessions.values():
            total.add(counts)
        return total

    @property
    def sessions_split(self) -> int:
        return sum(1 for counts in self.sessions.values() if counts.chains)
