"""The AgentX scenario's locked settings (docs/agentx.md §5): a run that changes one is not a valid submission.

The reference refuses to start with a locked rule broken unless `--unsafe-override` is given, and then marks
the run invalid. agentx never refuses (engineers explore with short runs and scaled delays); it lists the
broken locks in the run's metadata and sets `unsafe_override`, so `agentx export` and the summary report the
run as invalid with the reason `unsafe_override`. Locks that agentx cannot break (streaming, `ignore_eos`,
end-to-start delays, one concurrency per run) are not listed.
"""

from __future__ import annotations

from typing import Final

from agentx.replayer.options import AgentxLoad, ReplayOptions

MIN_DURATION_S: Final = 900.0
SYSTEM_IDLE_CAP_S: Final = 10.0


def locks_broken(options: ReplayOptions) -> list[str]:
    """The locked rules `options` break, as short sentences (empty: a run that can be a valid submission)."""
    load = options.load
    if not isinstance(load, AgentxLoad):
        return [f"mode {load.mode!r} is not the agentx scenario"]
    broken = []
    if options.scenario.duration_s is None or options.scenario.duration_s < MIN_DURATION_S:
        broken.append(f"duration below {MIN_DURATION_S:g} s")
    if options.scenario.delay_scale != 1.0:
        broken.append(f"delays scaled by {options.scenario.delay_scale:g}")
    if options.scenario.system_idle_cap_s != SYSTEM_IDLE_CAP_S:
        broken.append(f"system idle cap {options.scenario.system_idle_cap_s} instead of {SYSTEM_IDLE_CAP_S:g} s")
    if load.cache_bust != "marker":
        broken.append(f"cache-bust {load.cache_bust!r} instead of the first-turn marker")
    return broken
