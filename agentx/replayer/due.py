"""When a step of a tree is due, before any idle cap (agentx.replayer.idle) moves it: its anchor's send or
completion plus its recorded delay; in a lane's first AgentX tree, its offset from t* after the profiling start;
never before the subagents it joins complete (docs/agentx.md §3a), its barriers, or the profiling start (§4d)."""

from __future__ import annotations

from agentx.replayer.load import AgentxLoad, Load
from agentx.replayer.plan import Step, join_due
from agentx.replayer.play import Play
from agentx.replayer.warmup import first_offset_cut


def due_ns(
    tree: Play,
    step: Step,
    *,
    profiling_start_ns: int,
    load: Load,
    tree_idle_cap_s: float | None,
    delay_scale: float,
) -> int:
    """The time `step` of `tree` is due, on the perf-counter clock in ns (module docstring)."""
    state = tree.snapshot
    if step.anchor is None:
        base_ns = tree.start_ns
    else:
        base_ns = (tree.sent_ns if step.from_anchor_send else tree.completed_ns)[step.anchor]
    if state is not None and step.index in state.first_live:
        burst = isinstance(load, AgentxLoad) and load.warmup == "burst"
        offset_s = state.first_live[step.index] - first_offset_cut(state, burst, tree_idle_cap_s)
        due = profiling_start_ns + int(offset_s * delay_scale * 1e9)
    else:
        due = base_ns + int(step.delay_s * delay_scale * 1e9)
    # A join whose last subagent completed after the agent's previous turn goes out at once (§3a).
    due = int(join_due(base_ns, due - base_ns, [tree.completed_ns[joined] for joined in step.joins]))
    for barrier in step.barriers:
        due = max(due, tree.completed_ns[barrier])
    # After a cache-pressure stage, a turn due before the profiling start goes out at it (§4d).
    return max(due, profiling_start_ns)
