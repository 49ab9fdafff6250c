"""How many profiling requests a run will send, drawn as its engine draws them: the progress bar's denominator.

A run ends by time (`duration_s`), by trees (`sessions`, or one pass of the trace when nothing else bounds it) or
by requests (`num_requests`); only the last two are counts. Trees are taken from the engine's own order
(`session_order`, or the recorded starts in `trace` mode) over the sessions the run keeps (`prepare_trace` leaves
out over-long ones). In `agentx` mode each lane's first tree resumes at its t* (docs/agentx.md §4d): only its
steps from t* on are profiling requests (the primers before t* are warmup), a tree with nothing to send from its
t* is passed over, and those trees are planned to know it, as the engine plans them before its first request;
the cache-pressure stage's requests (`warmup_requests_per_lane` × lanes) are turns of the trees sent as warmup.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from agentx.replayer.options.limits import tree_limit
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, TraceLoad
from agentx.replayer.plan.play import PreparedTrace
from agentx.trace.model import Trace


def planned_requests(trace: Trace | PreparedTrace, options: ReplayOptions) -> int | None:
    """Profiling requests the run will send when it ends by trees or by a request cap (the smaller); None when it
    ends by time only. Pass the `PreparedTrace` the run gets, so the first trees of an `agentx` run are planned
    once (module docstring)."""
    cap = options.scenario.num_requests
    if tree_limit(options.scenario, 0) is None:
        return cap
    from agentx.replayer.plan.preparation import prepare_trace

    prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, options)
    trees = tree_limit(options.scenario, len(prepared.trace.sessions))
    assert trees is not None
    by_trees = _requests_of_trees(prepared, options, trees)
    return by_trees if cap is None else min(by_trees, cap)


def _order(prepared: PreparedTrace, options: ReplayOptions) -> Iterator[int]:
    """The session indices trees are drawn in (agentx.replayer.schedule.runner: lanes and `rate` draw `session_order`,
    `trace` starts every session once, by recorded start)."""
    if isinstance(options.load, TraceLoad):
        from agentx.replayer.plan.arrivals import trace_arrivals

        return iter([index for _, index in trace_arrivals(prepared.trace, options.load.speedup)])
    from agentx.replayer.plan.steps import session_order

    scenario = options.scenario
    return session_order(len(prepared.trace.sessions), scenario.session_order, scenario.seed)


def _requests_of_trees(prepared: PreparedTrace, options: ReplayOptions, limit: int) -> int:
    """Profiling requests of the first `limit` trees."""
    sessions = prepared.trace.sessions
    if prepared.trace.request_count == 0:
        return 0  # the engine starts no tree
    order = _order(prepared, options)
    started = 0
    requests = 0
    load = options.load
    if isinstance(load, AgentxLoad):
        from agentx.replayer.plan.tstar import snapshot, t_star

        # As Runner._first_plays: each lane draws until a tree has something to send from its t*.
        attempts = load.concurrency + 2 * len(sessions)
        for lane in range(load.concurrency):
            while attempts > 0 and started < limit and (index := next(order, None)) is not None:
                attempts -= 1
                plan = prepared.prepared(index).plan
                state = snapshot(plan, t_star(options.scenario.seed, plan.session_id, lane, plan, load.tstar_window))
                if state.sendable:
                    started += 1
                    requests += len(plan.steps) - len(state.not_sent)
                    break
    for index in itertools.islice(order, max(limit - started, 0)):
        requests += sessions[index].request_count  # a recycled tree plays whole, from turn 0
    if isinstance(load, AgentxLoad):
        requests -= min(load.warmup_requests_per_lane * load.concurrency, requests)
    return requests
