"""Where a session's time goes: each play's critical path, and its makespan split (docs/results.md, "Where a session's
time goes").

A play's critical path is the chain of requests that set when its last request ended: from its last-ending profiling
request back along `released_by_request_id` (the agent's previous turn, the joined subagent or barrier that
completed last, or the turn that spawned a subagent's first turn) until a request released by the play's or the
profiling's start, or by a request outside the play's profiling records.

The makespan (first sent → last end over the play's profiling records, errors included) is cut into one interval per
request of the path: the first's from the first send, each other's from its release (`scheduled_ns − think_s +
idle_cut_s`: the end of the request before it, or its send for a branch started from it), each up to the next one's
release, the last's up to its end. Inside its interval a request's time is think (release → due), client lag (due →
sent) and server time (sent → end, or → the next release when that came first). A join held past its own agent's
due by a subagent (`join_wait_s`) is released by that subagent, so the path runs through it; the stretch of it the
join waited past its own due counts as waiting on joins instead. Think is the delay as the schedule prescribed it
(recorded × delay scale), and what the idle caps cut of it is credited, so that for every play, exactly in ns,

    server + think + join wait + client lag − idle cut = makespan.

Everything is read from the records' columns; a file without the release columns (before format 1.11) gives None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
import numpy as np
import pyarrow as pa

from agentx.results.summary.columns import equals, floats, has
from agentx.results.summary.stats import FloatArray, IntArray, Stats, stats

RELEASE_COLUMNS: Final = ("released_by_request_id", "think_s", "idle_cut_s", "join_wait_s")
"""The records' columns the analysis needs beside the times (format 1.11)."""
_NEEDED: Final = ("play", "request_id", "scheduled_ns", "sent_ns", "end_ns", *RELEASE_COLUMNS)


class PathParts(msgspec.Struct, kw_only=True):
    """A makespan split, in seconds: `server_s + think_s + join_wait_s + client_lag_s − idle_cut_s` is the makespan."""

    server_s: float
    """Sent → end of the path's requests (cut at the next release when a branch started from a send)."""
    think_s: float
    """The delays the schedule prescribed between each release and the due time (recorded × delay scale), the idle
    caps' cuts included."""
    join_wait_s: float
    """Joins held past their own agent's due by the subagents (or barriers) they wait for."""
    idle_cut_s: float
    """What the idle caps removed of those delays: subtracted."""
    client_lag_s: float
    """Due → sent of the path's requests: the client's dispatch lag."""

    def total_s(self) -> float:
        """What the parts add up to: the makespan."""
        return self.server_s + self.think_s + self.join_wait_s + self.client_lag_s - self.idle_cut_s


class PlayPath(msgspec.Struct, kw_only=True):
    """One play's critical path: its requests, first to last, and its makespan split."""

    play: int
    root_session_id: str
    makespan_s: float
    parts: PathParts
    request_ids: list[str]
    """The `X-Request-ID`s of the path's requests, first to last."""


class PlayCriticalPath(msgspec.Struct, kw_only=True):
    """One play's makespan split, as the summary keeps it (without the request ids)."""

    play: int
    root_session_id: str
    makespan_s: float
    parts: PathParts
    requests: int
    """Requests on the path."""


class CriticalPath(msgspec.Struct, kw_only=True):
    """Where the plays' time went, summed over the plays (module docstring)."""

    plays: int
    makespan_s: float
    """Σ the plays' makespans."""
    parts: PathParts
    """Each part summed over the plays."""
    shares: PathParts
    """Each sum over Σ makespan (`server + think + join wait + client lag − idle cut` = 1)."""
    play_makespan_s: Stats | None
    per_play: list[PlayCriticalPath]


class _Rows(msgspec.Struct, frozen=True, kw_only=True):
    """A records table's profiling rows as the walk needs them: times in ns, each row's releaser (−1: none in its
    play), its release instant and its join wait."""

    table: pa.Table
    play: IntArray
    depth: IntArray
    scheduled_ns: IntArray
    sent_ns: IntArray
    end_ns: IntArray
    released_ns: IntArray
    idle_cut_ns: IntArray
    join_wait_ns: IntArray
    parent: IntArray


def _ns(seconds: FloatArray) -> IntArray:
    """Seconds as integer ns, NaN as 0 (the columns hold ns / 1e9: rounding gives the ns back)."""
    return np.rint(np.nan_to_num(seconds, nan=0.0) * 1e9).astype(np.int64)


def _ints(table: pa.Table, name: str) -> IntArray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def _rows(records: pa.Table) -> _Rows | None:
    import pyarrow.compute as pc

    if records.num_rows == 0 or any(not has(records, name) for name in _NEEDED):
        return None
    columns = [name for name in (*_NEEDED, "depth", "session_id") if has(records, name)]
    # Not the chunk lists: a filter copies what it keeps.
    table = records.select(columns).filter(pa.array(~equals(records, "phase", "warmup", missing=False)))
    think_s = floats(table, "think_s")
    known = np.isfinite(think_s)
    if not known.any():
        return None
    play = _ints(table, "play")
    ids = table.column("request_id").combine_chunks()
    by = table.column("released_by_request_id")
    found = pc.fill_null(pc.index_in(by, value_set=ids), -1)
    parent = np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)
    released = np.asarray(pc.fill_null(pc.not_equal(by, ""), False).to_numpy(zero_copy_only=False), dtype=bool)
    parent[~(released & known)] = -1
    linked = parent >= 0
    parent[linked & (play[np.where(linked, parent, 0)] != play)] = -1  # a release from another play ends the path
    scheduled = _ints(table, "scheduled_ns")
    idle_cut = _ns(floats(table, "idle_cut_s"))
    depth = _ints(table, "depth") if has(table, "depth") else np.zeros(table.num_rows, dtype=np.int64)
    return _Rows(
        table=table,
        play=play,
        depth=depth,
        scheduled_ns=scheduled,
        sent_ns=_ints(table, "sent_ns"),
        end_ns=_ints(table, "end_ns"),
        released_ns=scheduled - _ns(think_s) + idle_cut,
        idle_cut_ns=np.where(known, idle_cut, 0),
        join_wait_ns=np.where(known, _ns(floats(table, "join_wait_s")), 0),
        parent=parent,
    )


def _walk(rows: _Rows, last: int, limit: int) -> IntArray:
    """The path ending at row `last`, first to last (at most `limit` requests: a play's own)."""
    path = [last]
    parent = rows.parent
    while (previous := int(parent[path[-1]])) >= 0 and len(path) < limit:
        path.append(previous)
    path.reverse()
    return np.asarray(path, dtype=np.int64)


def _union(starts: IntArray, stops: IntArray) -> tuple[IntArray, IntArray]:
    """The union of intervals [start, stop) as disjoint sorted intervals (empty ones dropped)."""
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    order = np.argsort(starts, kind="stable")
    merged_starts: list[int] = []
    merged_stops: list[int] = []
    for start, stop in zip(starts[order].tolist(), stops[order].tolist(), strict=True):
        if merged_stops and start <= merged_stops[-1]:
            merged_stops[-1] = max(merged_stops[-1], stop)
        else:
            merged_starts.append(start)
            merged_stops.append(stop)
    return np.asarray(merged_starts, dtype=np.int64), np.asarray(merged_stops, dtype=np.int64)


def _outside(starts: IntArray, stops: IntArray, union: tuple[IntArray, IntArray]) -> int:
    """The total length of intervals [start, stop) outside `union` (disjoint intervals)."""
    total = int((stops - starts).sum())
    union_starts, union_stops = union
    if union_starts.size == 0:
        return total
    overlap = np.minimum(stops[:, None], union_stops[None, :]) - np.maximum(starts[:, None], union_starts[None, :])
    return total - int(np.clip(overlap, 0, None).sum())


def _split_path(rows: _Rows, path: IntArray, first_sent_ns: int) -> tuple[int, int, int, int, int, int]:
    """The makespan split of `path` (row indices, first to last) from `first_sent_ns`, in ns: (makespan, server,
    think, join wait, idle cut, client lag), with server + think + join wait + client lag − idle cut = makespan."""
    last_end = int(rows.end_ns[path[-1]])
    released = rows.released_ns[path]
    # Each request's interval runs from its release to the next one's; clipped to stay a chain from the first send
    # to the last end, so that the intervals add up to the makespan whatever the columns say.
    bounds = np.empty(path.size + 1, dtype=np.int64)
    bounds[0] = first_sent_ns
    bounds[1:-1] = released[1:]
    bounds[-1] = last_end
    bounds = np.clip(np.maximum.accumulate(bounds), first_sent_ns, last_end)
    low, high = bounds[:-1], bounds[1:]
    due = np.clip(rows.scheduled_ns[path], low, high)
    sent = np.clip(rows.sent_ns[path], due, high)
    scheduled = rows.scheduled_ns[path]
    waits = rows.join_wait_ns[path]
    union = _union(np.clip(scheduled - waits, first_sent_ns, last_end), np.clip(scheduled, first_sent_ns, last_end))
    think_applied = _outside(low, due, union)
    lag = _outside(due, sent, union)
    server = _outside(sent, high, union)
    join_wait = int((union[1] - union[0]).sum())
    # The first request's cut is on the path only when its release is.
    credited = rows.idle_cut_ns[path].copy()
    if released[0] < first_sent_ns:
        credited[0] = 0
    idle_cut = int(credited.sum())
    return last_end - first_sent_ns, server, think_applied + idle_cut, join_wait, idle_cut, lag


def _parts(server: int, think: int, join_wait: int, idle_cut: int, lag: int) -> PathParts:
    return PathParts(
        server_s=server / 1e9,
        think_s=think / 1e9,
        join_wait_s=join_wait / 1e9,
        idle_cut_s=idle_cut / 1e9,
        client_lag_s=lag / 1e9,
    )


def play_paths(records: pa.Table) -> list[PlayPath] | None:
    """Every play's critical path and makespan split, by play (module docstring); None when the records lack the
    release columns (format 1.11) or have no profiling request that carries them."""
    rows = _rows(records)
    if rows is None:
        return None
    order = np.lexsort((rows.sent_ns, rows.end_ns, rows.play))
    plays = rows.play[order]
    starts = np.flatnonzero(np.r_[True, plays[1:] != plays[:-1]])
    stops = np.r_[starts[1:], plays.size]
    paths: list[IntArray] = []
    splits: list[tuple[int, int, int, int, int, int]] = []
    root_rows: list[int] = []
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        members = order[start:stop]
        path = _walk(rows, int(members[-1]), members.size)
        paths.append(path)
        splits.append(_split_path(rows, path, int(rows.sent_ns[members].min())))
        roots = members[rows.depth[members] == 0]
        root_rows.append(int(roots[0]) if roots.size else int(members[-1]))
    # One take for every play's ids: a take per play costs more than the walks.
    on_paths = rows.table.column("request_id").take(pa.array(np.concatenate(paths))).to_pylist()
    has_sessions = has(rows.table, "session_id")
    sessions = rows.table.column("session_id").take(pa.array(root_rows)).to_pylist() if has_sessions else []
    found: list[PlayPath] = []
    offset = 0
    for index, (path, split) in enumerate(zip(paths, splits, strict=True)):
        makespan, server, think, join_wait, idle_cut, lag = split
        found.append(
            PlayPath(
                play=int(plays[starts[index]]),
                root_session_id=str(sessions[index] or "") if has_sessions else "",
                makespan_s=makespan / 1e9,
                parts=_parts(server, think, join_wait, idle_cut, lag),
                request_ids=[str(request_id) for request_id in on_paths[offset : offset + path.size]],
            )
        )
        offset += path.size
    return found


def critical_path(records: pa.Table) -> CriticalPath | None:
    """The plays' makespan splits, summed and as shares of Σ makespan, with each play's (module docstring); None
    when `play_paths` is."""
    paths = play_paths(records)
    if not paths:
        return None
    makespans = np.array([path.makespan_s for path in paths], dtype=np.float64)
    total = float(makespans.sum())
    summed = {
        name: float(sum(getattr(path.parts, name) for path in paths))
        for name in ("server_s", "think_s", "join_wait_s", "idle_cut_s", "client_lag_s")
    }
    return CriticalPath(
        plays=len(paths),
        makespan_s=total,
        parts=PathParts(**summed),
        shares=PathParts(**{name: value / total if total > 0 else 0.0 for name, value in summed.items()}),
        play_makespan_s=stats(makespans),
        per_play=[
            PlayCriticalPath(
                play=path.play,
                root_session_id=path.root_session_id,
                makespan_s=path.makespan_s,
                parts=path.parts,
                requests=len(path.request_ids),
            )
            for path in paths
        ],
    )


def pooled_shares(paths: Sequence[CriticalPath]) -> PathParts | None:
    """The parts of several runs' critical paths summed, over their summed makespans (None when they sum to 0)."""
    makespan_s = sum(path.makespan_s for path in paths)
    if makespan_s <= 0:
        return None
    return PathParts(
        server_s=sum(path.parts.server_s for path in paths) / makespan_s,
        think_s=sum(path.parts.think_s for path in paths) / makespan_s,
        join_wait_s=sum(path.parts.join_wait_s for path in paths) / makespan_s,
        idle_cut_s=sum(path.parts.idle_cut_s for path in paths) / makespan_s,
        client_lag_s=sum(path.parts.client_lag_s for path in paths) / makespan_s,
    )
