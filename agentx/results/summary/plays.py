"""Per play and per session: roll-ups of a run's plays, and its slowdown against the trace.

A play is one replay of a session tree. Its roll-up spans all its records, warmup and errors included (the
wall time the tree held its lane): last end − first sent, and the same per (play, session).

Slowdown compares the replay with the trace: a request's observed server time is `end_ns − sent_ns`, its
recorded one `api_time_recorded_s`; per request the ratio, per (play, session) and per play Σ observed /
Σ recorded over the kept requests with a recorded time > 0. TTFT slowdown is `ttft_s / ttft_recorded_s` per
kept request where both are known and > 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.results.summary.columns import equals, floats, has, strings
from agentx.results.summary.model import PlayRollup, Rollups, Slowdown
from agentx.results.summary.stats import FloatArray, stats


def _observed_recorded(table: pa.Table) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """Per row: observed server time (end − sent, s), recorded api_time, and whether the pair counts."""
    if table.num_rows == 0 or not has(table, "api_time_recorded_s"):
        return np.zeros(table.num_rows), np.zeros(table.num_rows), np.zeros(table.num_rows, dtype=bool)
    observed = (floats(table, "end_ns") - floats(table, "sent_ns")) / 1e9
    recorded = floats(table, "api_time_recorded_s")
    usable = np.isfinite(observed) & np.isfinite(recorded) & (recorded > 0)
    return observed, recorded, usable


def _ratio_by_group(keys: list[Any], observed: FloatArray, recorded: FloatArray) -> FloatArray:
    sums: dict[Any, list[float]] = {}
    for key, obs, rec in zip(keys, observed.tolist(), recorded.tolist(), strict=True):
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += obs
        acc[1] += rec
    return np.array([obs / rec for obs, rec in sums.values()], dtype=np.float64)


def slowdown(table: pa.Table) -> Slowdown:
    """Slowdown vs the trace over the kept rows (`table` is already filtered to them)."""
    observed, recorded, usable = _observed_recorded(table)
    result = Slowdown()
    if usable.any():
        rows = np.flatnonzero(usable)
        obs, rec = observed[rows], recorded[rows]
        result.requests = stats(obs / rec)
        if has(table, "play"):
            plays = [int(p) for p in np.asarray(table.column("play").to_numpy(zero_copy_only=False))[rows]]
            sessions = strings(table, "session_id", "")
            result.plays = stats(_ratio_by_group(plays, obs, rec))
            result.sessions = stats(
                _ratio_by_group([(p, sessions[i]) for p, i in zip(plays, rows, strict=True)], obs, rec)
            )
    if has(table, "ttft_recorded_s"):
        ttft, ttft_recorded = floats(table, "ttft_s"), floats(table, "ttft_recorded_s")
        both = np.isfinite(ttft) & (ttft > 0) & np.isfinite(ttft_recorded) & (ttft_recorded > 0)
        result.ttft = stats(ttft[both] / ttft_recorded[both])
    return result


class _PlayAcc:
    """Running totals of one play while the rows stream by."""

    def __init__(self, lane: int, sent_ns: int, end_ns: int) -> None:
        self.lane = lane
        self.root_session_id = ""
        self.sessions: set[str] = set()
        self.requests = 0
        self.errors = 0
        self.first_sent_ns = sent_ns
        self.last_end_ns = end_ns
        self.observed_s = 0.0
        self.recorded_s = 0.0


def rollups(table: pa.Table, kept: npt.NDArray[np.bool_]) -> Rollups:
    """Per play and per (play, session) over every row of `table`; `kept`: the rows whose times count for slowdown."""
    if table.num_rows == 0 or not has(table, "play"):
        return Rollups(plays=[], play_makespan_s=None, session_makespan_s=None)
    # All the play's rows, warmup and errors included: the play's span is wall time the tree held its lane.
    n = table.num_rows
    rows = table.select([c for c in ("play", "lane", "session_id", "sent_ns", "end_ns") if has(table, c)]).to_pydict()
    lanes = rows.get("lane", [0] * n)
    sessions = [s or "" for s in strings(table, "session_id", "")]
    failed = ~equals(table, "status", "ok", missing=True)
    depths = table.column("depth").to_pylist() if has(table, "depth") else [0] * n
    observed, recorded, usable = _observed_recorded(table)
    usable = usable & kept
    plays: dict[int, _PlayAcc] = {}
    session_spans: dict[tuple[int, str], tuple[int, int]] = {}
    for i in range(n):
        play, sent, end, session = int(rows["play"][i]), int(rows["sent_ns"][i]), int(rows["end_ns"][i]), sessions[i]
        acc = plays.get(play)
        if acc is None:
            acc = plays[play] = _PlayAcc(int(lanes[i]), sent, end)
        acc.first_sent_ns, acc.last_end_ns = min(acc.first_sent_ns, sent), max(acc.last_end_ns, end)
        acc.sessions.add(session)
        acc.requests += 1
        acc.errors += int(failed[i])
        if usable[i]:
            acc.observed_s += float(observed[i])
            acc.recorded_s += float(recorded[i])
        if depths[i] == 0 and not acc.root_session_id:
            acc.root_session_id = session
        first, last = session_spans.get((play, session), (sent, end))
        session_spans[play, session] = (min(first, sent), max(last, end))
    per_play = [
        PlayRollup(
            play=play,
            lane=acc.lane,
            root_session_id=acc.root_session_id,
            sessions=len(acc.sessions),
            requests=acc.requests,
            errors=acc.errors,
            makespan_s=(acc.last_end_ns - acc.first_sent_ns) / 1e9,
            slowdown=acc.observed_s / acc.recorded_s if acc.recorded_s > 0 else None,
        )
        for play, acc in sorted(plays.items())
    ]
    session_makespans = np.array([(last - first) / 1e9 for first, last in session_spans.values()], dtype=np.float64)
    return Rollups(
        plays=per_play,
        play_makespan_s=stats(np.array([p.makespan_s for p in per_play], dtype=np.float64)),
        session_makespan_s=stats(session_makespans),
    )
