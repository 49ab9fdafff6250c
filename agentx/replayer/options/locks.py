"""The AgentX scenario's locked settings (docs/agentx.md §5): a run that changes one is not a valid submission.

The reference refuses to start with a locked rule broken unless `--unsafe-override` is given, and then marks
the run invalid. agentx never refuses (engineers explore with short runs and scaled delays); it lists the
broken locks in the run's metadata and sets `unsafe_override`, so `agentx export` and the summary report the
run as invalid with the reason `unsafe_override`. Locks that agentx cannot break (streaming, `ignore_eos`,
end-to-start delays, one concurrency per run) are not listed.
"""

from __future__ import annotations

from typing import Final

from agentx.replayer.options.replay import AgentxLoad, ReplayOptions

MIN_DURATION_S: Final = 900.0
SYSTEM_IDLE_CAP_S: Final = 10.0


def locks_broken(options: ReplayOptions) -> list[str]:
    """The locked rules `options` break, each a sentence naming the value and its flag (empty: a run that can be a
    valid submission); agentx.results.summary.checks.validity says them as the reasons of `unsafe_override`."""
    load = options.load
    if not isinstance(load, AgentxLoad):
        return [f"mode {load.mode}: the AgentX rules apply to --mode agentx only"]
    broken = []
    duration_s = options.scenario.duration_s
    if duration_s is None:
        broken.append(f"no --duration: the rules need a profiling window of at least {MIN_DURATION_S:g} s")
    elif duration_s < MIN_DURATION_S:
        broken.append(f"duration {duration_s:g} s, below the rules' {MIN_DURATION_S:g} s minimum (--duration)")
    if options.scenario.delay_scale != 1.0:
        broken.append(
            f"recorded delays scaled by {options.scenario.delay_scale:g} (--delay-scale); the rules replay them as "
            "recorded"
        )
    cap_s = options.scenario.system_idle_cap_s
    if cap_s != SYSTEM_IDLE_CAP_S:
        given = "off" if cap_s is None else f"{cap_s:g} s"
        broken.append(f"system idle cap {given} instead of the rules' {SYSTEM_IDLE_CAP_S:g} s (--system-idle-cap)")
    if load.cache_bust != "marker":
        broken.append(f"cache-bust {load.cache_bust} instead of the rules' first-turn marker (--cache-bust)")
    tree_cap_s = options.scenario.tree_idle_cap_s
    rules = options.scenario.rule_set
    if tree_cap_s is not None and not rules.tree_idle_cap_allowed:
        broken.append(f"a per-tree idle cap of {tree_cap_s:g} s, which the {rules.name} rules forbid (--tree-idle-cap)")
    return broken
