"""A run as `agentx compare` resamples it: its kept requests, chunk gaps, plays and tasks, each tagged with its cluster.

A cluster is a root session of the trace (every play of one session tree in the run, recycled plays included): the
unit the bootstrap draws (agentx.results.compare.bootstrap). Repeats of one configuration pool into one sample whose
clusters are (repeat, root session), so a session drawn stays within its repeat. `over_time` gives one run's sample
with stretches of its window as the clusters instead (the frontier search draws both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import pyarrow as pa

from agentx.results.compare.bootstrap import FloatArray, IntArray
from agentx.results.summary.columns import equals, flat, floats, has, ints_or, strings
from agentx.results.summary.tasks import play_totals


class Repeat(NamedTuple):
    """One run of a configuration: its records table and what its summary says it lasted and ran on."""

    records: pa.Table
    duration_s: float
    num_gpus: int | None
    trees_cut: bool = True
    energy_j: float | None = None
    """The GPUs' measured energy over its throughput window (agentx.results.summary.energy); None unmeasured."""


class RunSample:
    """The arrays of one side of a comparison (one run, or its repeats pooled), every one tagged with its cluster."""

    def __init__(self, repeats: Sequence[Repeat]) -> None:
        self.clusters: list[str] = []
        index: dict[str, int] = {}

        def cluster_of(keys: list[str]) -> IntArray:
            out = np.empty(len(keys), dtype=np.int64)
            for i, key in enumerate(keys):
                found = index.get(key)
                if found is None:
                    found = index[key] = len(self.clusters)
                    self.clusters.append(key)
                out[i] = found
            return out

        parts: dict[str, list[FloatArray]] = {}
        cluster_parts: dict[str, list[IntArray]] = {}
        keys: list[tuple[str, str, int, int]] = []
        self.gpu_seconds = 0.0
        """Σ over repeats of duration × GPUs (× 1 without a GPU count): what per-GPU rates divide by."""
        self.num_gpus = repeats[0].num_gpus if repeats else None
        self.repeats = len(repeats)
        energies = [repeat.energy_j for repeat in repeats]
        self.energy_j = sum(e for e in energies if e is not None) if energies and None not in energies else None
        """Σ over repeats of the GPUs' measured energy over `gpu_seconds`' durations; None when one is unmeasured."""
        for number, repeat in enumerate(repeats):
            prefix = f"r{number}:" if len(repeats) > 1 else ""
            records = repeat.records
            roots = _root_sessions(records)
            kept = ~equals(records, "phase", "warmup", missing=False) & equals(records, "status", "ok", missing=True)
            table = records.filter(pa.array(kept)) if records.num_rows else records
            plays = _ints(table, "play")
            request_cluster = cluster_of([prefix + roots.get(int(p), "") for p in plays])
            self.gpu_seconds += repeat.duration_s * (repeat.num_gpus or 1)
            for name in ("ttft_s", "tpot_s", "e2el_s"):
                parts.setdefault(name, []).append(floats(table, name))
                cluster_parts.setdefault(name, []).append(request_cluster)
            for name, column in (("sent_s", "sent_ns"), ("end_s", "end_ns")):
                parts.setdefault(name, []).append(_ints(table, column).astype(np.float64) / 1e9)
                cluster_parts.setdefault(name, []).append(request_cluster)
            output = ints_or(table, "osl_server_tokens", "osl_streamed_tokens").astype(np.float64)
            total = output + ints_or(table, "isl_server_tokens", "isl_sent_tokens").astype(np.float64)
            for name, values in (("output_tokens", output), ("total_tokens", total)):
                parts.setdefault(name, []).append(values)
                cluster_parts.setdefault(name, []).append(request_cluster)
            slo = floats(table, "slo_met") if has(table, "slo_met") else np.full(table.num_rows, np.nan)
            parts.setdefault("slo_met", []).append(slo)
            cluster_parts.setdefault("slo_met", []).append(request_cluster)
            times_ns, parents = flat(table, "chunk_times_ns")
            same = parents[1:] == parents[:-1]
            parts.setdefault("itl_s", []).append((np.diff(times_ns)[same] / 1e9).astype(np.float64))
            cluster_parts.setdefault("itl_s", []).append(request_cluster[parents[1:][same]])
            per_play = play_totals(records, trees_cut=repeat.trees_cut)
            if per_play is not None:
                play_cluster = cluster_of([prefix + roots.get(int(p), "") for p in per_play.ids])
                parts.setdefault("lane_s", []).append(per_play.makespan_s)
                cluster_parts.setdefault("lane_s", []).append(play_cluster)
                parts.setdefault("makespan_s", []).append(per_play.makespan_s[~per_play.cut])
                cluster_parts.setdefault("makespan_s", []).append(play_cluster[~per_play.cut])
                parts.setdefault("task_tokens", []).append(per_play.total_tokens[per_play.done])
                cluster_parts.setdefault("task_tokens", []).append(play_cluster[per_play.done])
            occurrence: dict[tuple[str, str, int], int] = {}
            for session, agent, turn in zip(
                strings(table, "session_id"), strings(table, "agent_id"), _ints(table, "turn").tolist(), strict=True
            ):
                seen = occurrence.get((session, agent, turn), 0)
                occurrence[session, agent, turn] = seen + 1
                keys.append((prefix + session, agent, turn, seen))
        self.values = {name: np.concatenate(arrays) for name, arrays in parts.items()}
        self.cluster = {name: np.concatenate(arrays) for name, arrays in cluster_parts.items()}
        self.request_keys = keys
        """(session, agent, turn, occurrence) per kept request, in `values` order: what pairs two runs' requests."""

    def with_clusters(self, clusters: list[str]) -> RunSample:
        """This sample re-indexed on `clusters` (another sample's, for pairing): values of clusters not in it are
        dropped."""
        position = {key: i for i, key in enumerate(clusters)}
        mapping = np.array([position.get(key, -1) for key in self.clusters], dtype=np.int64)
        other = RunSample([])
        other.clusters = clusters
        other.gpu_seconds, other.num_gpus, other.repeats = self.gpu_seconds, self.num_gpus, self.repeats
        other.energy_j = self.energy_j
        other.values, other.cluster, other.request_keys = {}, {}, self.request_keys
        for name, values in self.values.items():
            mapped = mapping[self.cluster[name]] if self.cluster[name].size else self.cluster[name]
            inside = mapped >= 0
            other.values[name], other.cluster[name] = values[inside], mapped[inside]
        return other


_AT_MIDPOINT: Final = ("ttft_s", "tpot_s", "e2el_s", "slo_met", "sent_s", "end_s")
"""The per-request figures `over_time` counts in the stretch that holds the request's midpoint."""
_SPREAD_OVER_TIME: Final = ("output_tokens", "total_tokens")
"""The per-request figures `over_time` spreads over the stretches the request spans."""


def over_time(sample: RunSample, stretches: int) -> RunSample:
    """One run's sample with the `stretches` equal parts of its window (first sent to last end) as its clusters
    instead of sessions: a request's latencies in the part holding its midpoint, its tokens spread over the parts it
    spans in proportion to its time in each (so that a part's tokens are what the server did then). Drawn, the parts
    show how much the run's figures move with time, which sessions drawn across the whole window average out: a
    machine whose speed wanders between runs wanders within one too. Per-request figures only; an empty sample, or
    one whose window has no length, is returned unchanged."""
    if sample.repeats > 1:
        raise ValueError("a sample over time is one run's: repeats have windows of their own")
    sent, end = sample.values.get("sent_s"), sample.values.get("end_s")
    if sent is None or end is None or sent.size == 0 or not float(end.max()) > float(sent.min()):
        return sample
    start, span = float(sent.min()), float(end.max()) - float(sent.min())
    edges = start + span * np.arange(stretches + 1) / stretches
    middle = np.clip(((sent + end) / 2 - start) / span * stretches, 0, stretches - 1).astype(np.int64)
    overlap = np.minimum(end[:, None], edges[None, 1:]) - np.maximum(sent[:, None], edges[None, :-1])
    length = end - sent
    share = np.where(
        (length > 0)[:, None],
        np.clip(overlap, 0.0, None) / np.where(length > 0, length, 1.0)[:, None],
        (np.arange(stretches)[None, :] == middle[:, None]).astype(np.float64),
    )
    other = RunSample([])
    other.clusters = [f"t{k}" for k in range(stretches)]
    other.gpu_seconds, other.num_gpus, other.repeats = sample.gpu_seconds, sample.num_gpus, sample.repeats
    other.energy_j, other.request_keys = sample.energy_j, sample.request_keys
    other.values, other.cluster = {}, {}
    for name in _AT_MIDPOINT:
        if name in sample.values:
            other.values[name], other.cluster[name] = sample.values[name], middle
    parts = np.tile(np.arange(stretches, dtype=np.int64), sent.size)
    for name in _SPREAD_OVER_TIME:
        if name in sample.values:
            other.values[name] = (sample.values[name][:, None] * share).ravel()
            other.cluster[name] = parts
    return other


def _ints(table: pa.Table, name: str) -> IntArray:
    if not has(table, name):
        return np.zeros(table.num_rows, dtype=np.int64)
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def _root_sessions(records: pa.Table) -> dict[int, str]:
    """The root session of every play: the session of its shallowest request."""
    plays, depths = _ints(records, "play"), _ints(records, "depth")
    sessions = strings(records, "session_id")
    roots: dict[int, tuple[int, str]] = {}
    for play, depth, session in zip(plays.tolist(), depths.tolist(), sessions, strict=True):
        found = roots.get(play)
        if found is None or depth < found[0]:
            roots[play] = (depth, session)
    return {play: session for play, (_, session) in roots.items()}
