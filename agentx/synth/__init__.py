"""Making traces: from anonymized logs (`logs/`), from a fitted statistical model (`generate`, `fit`),
and judging how alike two traces are (`compare`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentx.exports import lazy_exports

if TYPE_CHECKING:
    from agentx.synth.dist import Dist as Dist
    from agentx.synth.fidelity import Fidelity as Fidelity
    from agentx.synth.fidelity import compare as compare
    from agentx.synth.fitting import fit as fit
    from agentx.synth.generation import generate as generate
    from agentx.synth.logs.from_logs import from_logs as from_logs
    from agentx.synth.logs.options import FromLogsOptions as FromLogsOptions
    from agentx.synth.presets import preset as preset
    from agentx.synth.session_model import AgentShape as AgentShape
    from agentx.synth.session_model import ApiTime as ApiTime
    from agentx.synth.session_model import Profile as Profile
    from agentx.synth.session_model import SessionModel as SessionModel

EXPORTS: dict[str, tuple[str, ...]] = {
    "agentx.synth.fidelity": ("Fidelity", "compare"),
    "agentx.synth.fitting": ("fit",),
    "agentx.synth.generation": ("generate",),
    "agentx.synth.logs.from_logs": ("from_logs",),
    "agentx.synth.logs.options": ("FromLogsOptions",),
    "agentx.synth.dist": ("Dist",),
    "agentx.synth.session_model": ("AgentShape", "ApiTime", "Profile", "SessionModel"),
    "agentx.synth.presets": ("preset",),
}
"""Every public name, by the module it lives in: `__all__` and the lazy imports are made from it."""
__all__, _getattr, __dir__ = lazy_exports(__name__, EXPORTS)

if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error for them
    __getattr__ = _getattr
