"""Speculative decoding at a fixed acceptance length: engine settings (`flags`) and published golden ALs (`golden`).

Benchmarks compare servers that speculate by forcing each engine to accept draft tokens at the same
published acceptance length; `agentx spec flags` prints the settings and `agentx spec golden` the values.
"""

from agentx.engines import ENGINES
from agentx.spec.flags import EngineSettings, engine_settings
from agentx.spec.golden import GoldenAL, GoldenCurve, find_curve, golden_al, golden_models

__all__ = [
    "ENGINES",
    "EngineSettings",
    "GoldenAL",
    "GoldenCurve",
    "engine_settings",
    "find_curve",
    "golden_al",
    "golden_models",
]
