"""What one agent task costs: per completed root session (one play of a session tree, its subagents included).

A *task* is a play that ran to its end inside the profiling phase with every request answered: a play with a warmup
record, or one the run cut (the last play of its lane in a run that ended with trees unfinished, or one with a
cancelled request), is `cut`; one with a failed request is `failed`. Over the tasks, per task: its requests, its
prompt tokens split into cached (the server's `cached_tokens`) and uncached, its output tokens, its makespan, and its
GPU-seconds: its total tokens over the run's total tokens/s per GPU, so the run's GPU time is shared among the tokens
it served
(the same basis as $ per million total tokens, agentx.results.report.cost). Dollars need a price, which the report and
`agentx compare` apply: $ per task = GPU-seconds × $/GPU-hour / 3600.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.results.summary.columns import equals, floats, has, ints_or
from agentx.results.summary.stats import FloatArray, IntArray, Stats, stats


class TaskCosts(msgspec.Struct, kw_only=True):
    completed: int
    """Plays run to their end in the profiling phase with every request answered: the tasks."""
    failed: int
    """Plays run to their end with a failed request; left out of the figures."""
    cut: int
    """Plays the run cut (or that began in the warmup); left out of the figures."""
    requests: Stats | None
    cached_tokens: Stats | None
    """None when the server reported no cached tokens."""
    uncached_tokens: Stats | None
    """Prompt tokens less cached ones (all prompt tokens when the server reported no cached tokens)."""
    output_tokens: Stats | None
    total_tokens: Stats | None
    makespan_s: Stats | None
    gpu_s: Stats | None = None
    """Total tokens / the run's total tokens/s per GPU; None without a GPU count."""


class PlayTotals(NamedTuple):
    """Per play of a run (in `ids` order), what the task figures are made of."""

    ids: IntArray
    """The play numbers."""
    done: npt.NDArray[np.bool_]
    """Tasks: run to their end in the profiling phase, every request answered."""
    failed: npt.NDArray[np.bool_]
    cut: npt.NDArray[np.bool_]
    requests: FloatArray
    cached_tokens: FloatArray
    uncached_tokens: FloatArray
    output_tokens: FloatArray
    makespan_s: FloatArray
    cached_reported: bool
    """Whether a task's request reported cached tokens."""

    @property
    def total_tokens(self) -> FloatArray:
        total: FloatArray = self.cached_tokens + self.uncached_tokens + self.output_tokens
        return total


def play_totals(records: pa.Table, *, trees_cut: bool = True) -> PlayTotals | None:
    """Per play of a records table (every row), None when it has no plays; `trees_cut` as `task_costs`."""
    if records.num_rows == 0 or not has(records, "play"):
        return None
    plays = np.asarray(records.column("play").to_numpy(zero_copy_only=False), dtype=np.int64)
    ids, play_of_row = np.unique(plays, return_inverse=True)
    count = ids.size

    def per_play(values: npt.ArrayLike) -> FloatArray:
        weights = np.asarray(values, dtype=np.float64)
        return np.bincount(play_of_row, weights=weights, minlength=count).astype(np.float64)

    warmup = per_play(equals(records, "phase", "warmup", missing=False)) > 0
    cancelled = per_play(equals(records, "error_kind", "cancelled", missing=False)) > 0
    failed = (per_play(~equals(records, "status", "ok", missing=True)) > 0) & ~cancelled
    isl = per_play(ints_or(records, "isl_server_tokens", "isl_sent_tokens"))
    cached = floats(records, "cached_tokens")
    reported = np.isfinite(cached)
    cached_sum = per_play(np.where(reported, cached, 0.0))
    sent = np.full(count, np.inf)
    np.minimum.at(sent, play_of_row, floats(records, "sent_ns"))
    end = np.full(count, -np.inf)
    np.maximum.at(end, play_of_row, floats(records, "end_ns"))
    cut = warmup | cancelled | (_last_of_lane(records, play_of_row, sent) if trees_cut else False)
    done = ~cut & ~failed
    return PlayTotals(
        ids=ids,
        done=done,
        failed=failed & ~cut,
        cut=cut,
        requests=np.bincount(play_of_row, minlength=count).astype(np.float64),
        cached_tokens=cached_sum,
        uncached_tokens=isl - cached_sum,
        output_tokens=per_play(ints_or(records, "osl_server_tokens", "osl_streamed_tokens")),
        makespan_s=(end - sent) / 1e9,
        cached_reported=bool((per_play(reported) > 0)[done].any()),
    )


def task_costs(records: pa.Table, total_tps_per_gpu: float | None, *, trees_cut: bool = True) -> TaskCosts | None:
    """The tasks of a run from its records table (every row), None when it has no plays.

    `trees_cut`: whether the run ended with trees unfinished (`RunResult.trees_finished < trees_started`), which cuts
    the last play of each lane; true when unknown, so no cut tree passes for a task.
    """
    plays = play_totals(records, trees_cut=trees_cut)
    if plays is None:
        return None
    done = plays.done
    total = plays.total_tokens[done]
    return TaskCosts(
        completed=int(done.sum()),
        failed=int(plays.failed.sum()),
        cut=int(plays.cut.sum()),
        requests=stats(plays.requests[done]),
        cached_tokens=stats(plays.cached_tokens[done]) if plays.cached_reported else None,
        uncached_tokens=stats(plays.uncached_tokens[done]),
        output_tokens=stats(plays.output_tokens[done]),
        total_tokens=stats(total),
        makespan_s=stats(plays.makespan_s[done]),
        gpu_s=stats(total / total_tps_per_gpu) if total_tps_per_gpu is not None and total_tps_per_gpu > 0 else None,
    )


def _last_of_lane(records: pa.Table, play_of_row: IntArray, first_sent_ns: FloatArray) -> npt.NDArray[np.bool_]:
    """The last play each lane started: the one the run's end may have cut."""
    last = np.zeros(first_sent_ns.size, dtype=bool)
    if not has(records, "lane"):
        return last | True
    lane_of_play = np.zeros(first_sent_ns.size, dtype=np.int64)
    lane_of_play[play_of_row] = np.asarray(records.column("lane").to_numpy(zero_copy_only=False), dtype=np.int64)
    for lane in np.unique(lane_of_play):
        plays = np.flatnonzero(lane_of_play == lane)
        last[plays[np.argmax(first_sent_ns[plays])]] = True
    return last


__all__ = ["PlayTotals", "TaskCosts", "play_totals", "task_costs"]
