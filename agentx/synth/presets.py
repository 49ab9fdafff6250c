"""Named session models. Their numbers come from public corpora, as each docstring says."""

from __future__ import annotations

import msgspec

from agentx.synth.dist import Dist
from agentx.synth.session_model import AgentShape, ApiTime, Profile, SessionModel

_WEKA = (
    "medians of the 7 public Claude Code traces of the Weka sample "
    "(repository callanjfox/kv-cache-tester, Apache-2.0): 226 requests"
)


def agentic_coding() -> SessionModel:
    """Claude Code-like sessions, numbers from the public Weka sample (`_WEKA`):

    - first root prompt: median 17,869 tokens, of which ~15,100 are system prompt + tools
      (`system_tokens` 2,900 + `tool_tokens` 12,200 recorded per session);
    - tokens added per turn: median ~640 (per-session medians 87 to 7,370), so a long log-normal;
    - output: median 270, p90 1,024 tokens;
    - gaps: median 7 s, p90 77 s; 5 in 226 requests follow an end_turn (human) with minutes-long
      gaps, the rest are tool-loop gaps of a few seconds;
    - requests per session: median 7, mean 32 (the whole 739-trace corpus averages 80), so a
      wide log-normal with median 12;
    - api_time: median 6.6 s; subagents (Explore on Haiku) in 3 of 7 sessions, 4 spawn groups of
      mean fan-out 1.75, one background subagent; compaction of contexts near 150k tokens;
    - models: Opus roots, Haiku subagents; 1 of the 7 sessions ran on Sonnet (a profile of weight 1/7).
    """
    root = AgentShape(
        model="claude-opus-4-5",
        requests=Dist.lognormal(12, 1.2, low=1, high=400),
        system_tokens=15_100,
        first_user_tokens=Dist.lognormal(2_500, 1.0, low=16, high=40_000),
        added_tokens=Dist.lognormal(640, 1.3, low=32, high=60_000),
        out_tokens=Dist.lognormal(270, 1.0, low=1, high=32_000),
        tool_gap_s=Dist.lognormal(6.0, 0.9, low=0.2, high=600),
        human_gap_s=Dist.lognormal(60.0, 1.3, low=3, high=3_600),
        end_turn_share=0.03,
        compact_at_tokens=150_000,
        summary_tokens=Dist.lognormal(9_000, 0.3, low=2_000, high=20_000),
    )
    sub = AgentShape(
        model="claude-haiku-4-5",
        requests=Dist.lognormal(8, 0.8, low=1, high=100),
        system_tokens=9_000,
        first_user_tokens=Dist.lognormal(400, 0.8, low=16, high=8_000),
        added_tokens=Dist.lognormal(1_500, 1.0, low=32, high=40_000),
        out_tokens=Dist.lognormal(200, 1.0, low=1, high=16_000),
        tool_gap_s=Dist.lognormal(2.0, 0.8, low=0.1, high=120),
        human_gap_s=Dist.lognormal(2.0, 0.8, low=0.1, high=120),
    )
    profile = Profile(
        weight=6 / 7,
        root=root,
        sub=sub,
        spawn_share=0.05,
        fan_out=Dist(quantiles=(1, 1, 1, 2, 2, 3, 3), log=False),
        background_share=0.15,
    )
    sonnet = msgspec.structs.replace(profile, weight=1 / 7, root=msgspec.structs.replace(root, model="claude-sonnet-4"))
    return SessionModel(
        name="agentic-coding",
        source=_WEKA,
        profiles=(profile, sonnet),
        api=ApiTime(base_s=2.0, prefill_tokens_per_s=8_000.0, decode_tokens_per_s=70.0),
    )


PRESETS = {"agentic-coding": agentic_coding}


def preset(name: str) -> SessionModel:
    """The named preset; ValueError listing the known ones otherwise."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]()
