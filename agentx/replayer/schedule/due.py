"""When a step of a tree is due, before any idle cap (agentx.replayer.schedule.idle) moves it: its anchor's send or
completion plus its recorded delay; in a lane's first AgentX tree, its offset from t* after the profiling start;
never before its barriers or the profiling start (§4d). The subagents a step joins hold it by the rule set's join
rule (docs/agentx.md §3a): under AIPerf 0.13.0's here, when the last one completes after the anchor (`join_due`);
under the harness's the runner waits for them after this due time (`Step.joins`). Each due time comes with what
released it (agentx.replayer.schedule.release)."""

from __future__ import annotations

from agentx.replayer.options.load import AgentxLoad, Load
from agentx.replayer.options.rules import RuleSet
from agentx.replayer.plan.play import Play
from agentx.replayer.plan.steps import SessionPlan, Step
from agentx.replayer.schedule.release import Release
from agentx.replayer.schedule.warmup import first_offset_cut


def due(
    tree: Play,
    step: Step,
    *,
    profiling_start_ns: int,
    load: Load,
    rules: RuleSet,
    tree_idle_cap_s: float | None,
    phase_cut_s: float,
    delay_scale: float,
) -> Release:
    """When `step` of `tree` is due, on the perf-counter clock in ns, and what released it (module docstring).
    `phase_cut_s` is how much earlier every lane's first live turns go under a phase-wide profiling start
    (`RuleSet.profiling_start`)."""
    state = tree.snapshot
    completed_ns = tree.completed_ns
    if step.anchor is None:
        base_ns, anchor = tree.start_ns, None
    else:
        base_ns, anchor = (tree.sent_ns if step.from_anchor_send else completed_ns)[step.anchor], step.anchor
    if state is not None and step.index in state.first_live:
        burst = isinstance(load, AgentxLoad) and load.warmup == "burst"
        if rules.profiling_start == "phase" and not burst:
            cut_s = phase_cut_s
        else:
            cut_s = first_offset_cut(state, burst, tree_idle_cap_s if rules.profiling_start == "lane" else None)
        offset_s = max(0.0, state.first_live[step.index] - cut_s)
        release = Release.after(None, profiling_start_ns, int(offset_s * delay_scale * 1e9))
    else:
        release = Release.after(anchor, base_ns, int(step.delay_s * delay_scale * 1e9))
    if not rules.join_waits_delay and step.joins:
        # A join whose last subagent completed after the agent's previous turn goes out at once (§3a, `join_due`).
        last = max(step.joins, key=completed_ns.__getitem__)
        if completed_ns[last] > base_ns:
            release.hold(last, completed_ns[last])
    for barrier in step.barriers:
        if completed_ns[barrier] > release.due_ns:
            release.hold(barrier, completed_ns[barrier])
    # After a cache-pressure stage, a turn due before the profiling start goes out at it (§4d).
    release.not_before(profiling_start_ns)
    return release


def replay_offset_s(tree: Play, step: Step) -> float:
    """`step`'s recorded start after its tree's replay origin: the lane's t* for a first tree, else the tree's first
    request (the harness's `_handoff_replay_offset_ms`, §4d); never negative."""
    origin = tree.snapshot.t_star if tree.snapshot is not None else plan_origin_t(tree.prepared.plan)
    return max(0.0, step.request.t - origin)


def plan_origin_t(plan: SessionPlan) -> float:
    """The recorded start of a tree played from turn 0: its root's first request, else its earliest request."""
    if not plan.steps:
        return 0.0
    first = plan.steps[0]
    return first.request.t if first.depth == 0 else min(step.request.t for step in plan.steps)


def handoff_due(tree: Play, step: Step, *, profiling_start_ns: int, phase_cut_s: float, delay_scale: float) -> Release:
    """When a turn a per-lane cache-pressure stage handed over to profiling is due (§4d): its recorded offset from its
    tree's origin less the phase-wide cut, after the profiling start (no residual delay is kept)."""
    offset_s = max(0.0, replay_offset_s(tree, step) - phase_cut_s)
    return Release.after(None, profiling_start_ns, int(offset_s * delay_scale * 1e9))
