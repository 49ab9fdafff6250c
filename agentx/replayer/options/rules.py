"""The AgentX rule sets agentx can play: which reference a run follows, and what differs between them
(docs/agentx.md, "Rule sets").

A rule set is named after the reference whose code it follows, with that reference's version:

- `agentx-harness-1.0.12` (the default): SemiAnalysis' AgentX harness (`agentx-harness` 1.0.12 on the package
  index, its fork of AIPerf inside, `agentx profile` with its `agentx` scenario), which InferenceX runs today;
- `aiperf-0.13.0`: AIPerf 0.13.0 with its `inferencex-agentx-mvp` scenario, the older rules.

`RuleSet` says every difference as data, one field per rule; the engine, the validity verdict and the exports read
these fields and nothing else about the rule set, so a difference lives in exactly one place. A rule set also
carries its scenario's defaults, which `agentx replay` and `agentx sweep` apply to the flags a user leaves unset in
`--mode agentx` (`scenario_defaults`); the options structs keep the generic defaults for library callers.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from agentx.errors import ConfigError

RulesName = Literal["agentx-harness-1.0.12", "aiperf-0.13.0"]
DEFAULT_RULES_NAME: Final[RulesName] = "agentx-harness-1.0.12"


class RuleSet(msgspec.Struct, frozen=True, kw_only=True):
    """What a reference does, rule by rule (docs/agentx.md names each rule's section and the reference's code)."""

    name: RulesName
    reference: str
    """The reference in words, with its version and scenario."""
    scenario: str
    """The reference's scenario name, as its `profile_export_aiperf.json` says it (`metadata.scenario`)."""
    aiperf_version: str
    """What the reference's exports say as `aiperf_version`."""
    join_waits_delay: bool
    """A join turn goes out at max(its recorded delay after the previous turn of its agent ends, the last child's
    end) (§3a); False: as soon as the last child ends when the children end last, with no think time."""
    tree_idle_cap_mode: Literal["runtime", "warp"]
    """How the per-tree idle cap acts when it is set (§4c): on the live schedule in profiling, or as a load-time warp
    of each tree's recorded gaps."""
    tree_idle_cap_allowed: bool
    """Whether the scenario allows a per-tree idle cap at all (False: setting one breaks a lock, §5)."""
    warmup_lead_cap: Literal["system", "tree"]
    """Which idle cap clamps a warmup primer's lead before t* (§4d)."""
    profiling_start: Literal["phase", "lane"]
    """Where the first profiling offsets are measured from (§4d): `phase`, the earliest live turn over every lane
    goes out at profiling time 0 (one phase-wide start); `lane`, every lane's offsets from t* as they are (a
    per-tree idle cap cutting a lane's leading idle, §4c)."""
    pressure: Literal["per_lane", "pooled"]
    """The cache-pressure stage (§4d): `per_lane`, a quota of requests per lane, the turns over it carried into
    profiling at their recorded offset from the tree's t*; `pooled`, one pool of lanes × requests, the first
    profiling turns waiting out their residual delay."""
    child_timers_capped: bool
    """Whether the idle caps move a subagent's delayed first turn and a join's deadline (§3a, §4b); False: those are
    slept outside the caps."""
    system_cap_at_return: bool
    """The system idle cap shifts at each return that leaves nothing in flight, the timers pending then (§4b);
    False: a watchdog shifts once nothing has been in flight for the cap."""
    coverage: Literal["last_metric", "union"]
    """The coverage rule of validity (§5): `last_metric`, the last first token (or last response end with an ITL)
    must reach 95% of the configured duration, else the run is invalid and exits non-zero; `union`, agentx's own:
    successful streamed requests stretched by 10 s must cover 98% of the profiling window (the verdict only)."""
    session_affinity_header: bool
    """Every request also carries its agent session's correlation id as `X-Session-Affinity` (§2d; the harness's
    fork of AIPerf does not send it)."""
    export_harness_metrics: bool
    """The AIPerf exports carry the harness's additions: the full-response metrics, `metric_duration_coverage`, and
    its omissions (`is_complete`, and `completed_request_count` and `request_error_rate` when no request or every
    request failed)."""
    defaults: dict[str, dict[str, Any]]
    """The scenario's defaults by options part ("scenario", "load") and field: applied by the command line to the
    flags a user did not give in `--mode agentx`."""


HARNESS: Final = RuleSet(
    name="agentx-harness-1.0.12",
    reference="SemiAnalysis agentx-harness 1.0.12 (its AIPerf fork, scenario agentx)",
    scenario="agentx",
    aiperf_version="1.0.12",
    join_waits_delay=True,
    tree_idle_cap_mode="runtime",
    tree_idle_cap_allowed=True,
    warmup_lead_cap="system",
    profiling_start="phase",
    pressure="per_lane",
    child_timers_capped=True,
    system_cap_at_return=False,
    coverage="last_metric",
    session_affinity_header=False,
    export_harness_metrics=True,
    defaults={
        "scenario": {
            "duration_s": 3600.0,
            "seed": 42,
            "tree_idle_cap_s": 300.0,
            "failed_request_threshold": 0.10,
        },
        "load": {"warmup_requests_per_lane": 10, "tstar_window": (0.25, 0.75)},
    },
)
AIPERF_0_13_0: Final = RuleSet(
    name="aiperf-0.13.0",
    reference="AIPerf 0.13.0 (scenario inferencex-agentx-mvp)",
    scenario="inferencex-agentx-mvp",
    aiperf_version="0.13.0",
    join_waits_delay=False,
    tree_idle_cap_mode="warp",
    tree_idle_cap_allowed=False,
    warmup_lead_cap="tree",
    profiling_start="lane",
    pressure="pooled",
    child_timers_capped=False,
    system_cap_at_return=True,
    coverage="union",
    session_affinity_header=True,
    export_harness_metrics=False,
    defaults={"scenario": {"duration_s": 1800.0}, "load": {"tstar_window": (0.25, 0.75)}},
)
RULE_SETS: Final[dict[str, RuleSet]] = {rules.name: rules for rules in (HARNESS, AIPERF_0_13_0)}


def rule_set(name: str | None) -> RuleSet:
    """The rule set called `name` (None: the default); ConfigError naming the known ones otherwise."""
    found = RULE_SETS.get(name or DEFAULT_RULES_NAME)
    if found is None:
        raise ConfigError(f"unknown rule set {name!r}: known are {', '.join(RULE_SETS)}")
    return found
