"""A run sharded over a Ray cluster, in the summary: how many shards on how many nodes, which were lost, and how far
apart their clocks may be (docs/distributed.md, "One timeline")."""

from __future__ import annotations

import msgspec

from agentx.replayer.cluster.clocks import CLOCK_WARN_NS
from agentx.replayer.run_result import ShardInfo


class Shards(msgspec.Struct, kw_only=True):
    """The shards of a `--ray` run (run.json's `run.shards`, each in full)."""

    count: int
    nodes: int
    lost: list[int]
    """The shards lost during the run (`worker_lost`)."""
    clock_error_max_s: float
    """The largest bound on a shard's measured clock offset."""
    clock_drift_max_s: float | None
    """The largest change of a shard's offset over the run (None: none measured at the end)."""
    clock_warning: str | None = None
    """Said when the bound or the drift exceeds 1 ms."""


def shards_summary(shards: list[ShardInfo]) -> Shards | None:
    """The summary of a run's shards; None for a run that had none (one process, `--workers`)."""
    if not shards:
        return None
    error_s = max(shard.clock_error_ns for shard in shards) / 1e9
    drifts = [abs(shard.clock_drift_ns) / 1e9 for shard in shards if shard.clock_drift_ns is not None]
    drift_s = max(drifts) if drifts else None
    warning = None
    if error_s * 1e9 > CLOCK_WARN_NS or (drift_s or 0.0) * 1e9 > CLOCK_WARN_NS:
        warning = (
            f"shard clocks known to ±{error_s * 1e3:.2f} ms"
            + ("" if drift_s is None else f", drifting up to {drift_s * 1e3:.2f} ms over the run")
            + ": timestamps of different shards may be off by as much (docs/distributed.md)"
        )
    return Shards(
        count=len(shards),
        nodes=len({shard.node_id for shard in shards}),
        lost=[shard.index for shard in shards if shard.lost],
        clock_error_max_s=error_s,
        clock_drift_max_s=drift_s,
        clock_warning=warning,
    )
