"""Cost per task (agentx.results.summary.tasks): which plays are tasks, and what each one took."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from strategies import record_identity

from agentx.records.record import SCHEMA, RequestRecord
from agentx.results.summary.tasks import task_costs

S = 1_000_000_000


def rec(play: int, lane: int, at_s: float, **overrides: Any) -> RequestRecord:
    sent = int(at_s * S)
    values: dict[str, Any] = {
        **record_identity(run_id="run-1"),
        "play": play,
        "lane": lane,
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_token_ns": sent + S // 10,
        "last_token_ns": sent + S // 2,
        "end_ns": sent + S // 2,
        "isl_recorded_tokens": 1000,
        "isl_sent_tokens": 1000,
        "isl_server_tokens": 1000,
        "cached_tokens": 600,
        "osl_recorded_tokens": 50,
        "osl_server_tokens": 50,
        "osl_streamed_tokens": 50,
    }
    values.update(overrides)
    return RequestRecord(**values)


def table(records: list[RequestRecord]) -> pa.Table:
    return pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA)


def test_tasks_are_whole_plays_of_the_profiling_phase() -> None:
    records = [
        rec(0, 0, 0.0, phase="warmup"),
        rec(0, 0, 1.0),  # began in the warmup: cut
        rec(1, 0, 2.0),
        rec(1, 0, 3.0),
        rec(1, 0, 4.0),  # a task: three requests, 2.5 s from the first sent to the last end
        rec(2, 1, 0.0),
        rec(2, 1, 1.0, status="error", error_kind="http", osl_server_tokens=None, cached_tokens=None),  # failed
        rec(3, 1, 2.0),
        rec(3, 1, 3.0, status="error", error_kind="cancelled"),  # cut by the run's end
        rec(4, 0, 5.0),  # the lane's last play
    ]
    every_tree_finished = task_costs(table(records), 2_100.0, trees_cut=False)
    assert every_tree_finished is not None
    assert (every_tree_finished.completed, every_tree_finished.failed, every_tree_finished.cut) == (2, 1, 2)
    assert every_tree_finished.requests is not None and every_tree_finished.requests.max == 3
    cut_at_the_end = task_costs(table(records), 2_100.0)
    assert cut_at_the_end is not None
    assert (cut_at_the_end.completed, cut_at_the_end.failed, cut_at_the_end.cut) == (1, 1, 3)
    assert cut_at_the_end.makespan_s is not None and cut_at_the_end.makespan_s.mean == 2.5
    assert cut_at_the_end.cached_tokens is not None and cut_at_the_end.cached_tokens.mean == 1_800
    assert cut_at_the_end.uncached_tokens is not None and cut_at_the_end.uncached_tokens.mean == 1_200
    assert cut_at_the_end.output_tokens is not None and cut_at_the_end.output_tokens.mean == 150
    assert cut_at_the_end.gpu_s is not None and cut_at_the_end.gpu_s.mean == 3_150 / 2_100.0


def test_without_cached_tokens_or_gpus_those_figures_are_absent() -> None:
    costs = task_costs(table([rec(0, 0, 0.0, cached_tokens=None), rec(0, 0, 1.0, cached_tokens=None)]), None,
                       trees_cut=False)  # fmt: skip
    assert costs is not None and costs.completed == 1
    assert costs.cached_tokens is None and costs.gpu_s is None
    assert costs.uncached_tokens is not None and costs.uncached_tokens.mean == 2_000


@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 5_000), st.integers(0, 5_000), st.integers(1, 500)),
        min_size=1,
        max_size=40,
    )
)
def test_the_tasks_tokens_add_up_to_the_requests(rows: list[tuple[int, int, int, int]]) -> None:
    records = [
        rec(play, play % 3, float(k), isl_server_tokens=isl, cached_tokens=min(cached, isl), osl_server_tokens=osl)
        for k, (play, isl, cached, osl) in enumerate(rows)
    ]
    costs = task_costs(table(records), 1_000.0, trees_cut=False)
    assert costs is not None and costs.completed == len({play for play, *_ in rows})
    assert costs.total_tokens is not None and costs.uncached_tokens is not None and costs.output_tokens is not None
    assert costs.cached_tokens is not None and costs.gpu_s is not None
    n = costs.completed
    assert round(costs.total_tokens.mean * n) == sum(isl + osl for _, isl, _, osl in rows)
    assert round(costs.cached_tokens.mean * n + costs.uncached_tokens.mean * n) == sum(isl for _, isl, _, _ in rows)
    assert abs(costs.gpu_s.mean - costs.total_tokens.mean / 1_000.0) < 1e-9
