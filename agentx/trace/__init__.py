"""The trace: the model (model.py), its checks (validation.py, findings.py, links.py for parent links as files state
them), reading and writing every format (io.py over formats/), inspection (stats.py), hidden agents split out of
flattened sessions (chains.py and chain_*.py) and the idle cap's load-time warp (warp.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentx.exports import lazy_exports

if TYPE_CHECKING:
    from agentx.trace.chain_rules import ChainRules as ChainRules
    from agentx.trace.findings import Findings as Findings
    from agentx.trace.io import detect_format as detect_format
    from agentx.trace.io import load_trace as load_trace
    from agentx.trace.io import save_trace as save_trace
    from agentx.trace.model import Agent as Agent
    from agentx.trace.model import Provenance as Provenance
    from agentx.trace.model import Request as Request
    from agentx.trace.model import Session as Session
    from agentx.trace.model import Trace as Trace
    from agentx.trace.stats import TraceStats as TraceStats
    from agentx.trace.stats import trace_stats as trace_stats
    from agentx.trace.validation import validate as validate

EXPORTS: dict[str, tuple[str, ...]] = {
    "agentx.trace.chain_rules": ("ChainRules",),
    "agentx.trace.findings": ("Findings",),
    "agentx.trace.io": ("detect_format", "load_trace", "save_trace"),
    "agentx.trace.model": ("Agent", "Provenance", "Request", "Session", "Trace"),
    "agentx.trace.stats": ("TraceStats", "trace_stats"),
    "agentx.trace.validation": ("validate",),
}
"""Every public name, by the module it lives in: `__all__` and the lazy imports are made from it."""
__all__, _getattr, __dir__ = lazy_exports(__name__, EXPORTS)

if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error for them
    __getattr__ = _getattr
