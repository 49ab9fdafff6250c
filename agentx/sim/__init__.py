"""A simulated OpenAI-compatible inference server (`agentx sim`), for tests, demos and what-if studies.

It runs in its own process and is driven over HTTP, never called into: `engine/` is the model of a
continuously batching server (scheduler, KV cache with prefix caching, synthetic speculative
decoding, a step-time model), `server.py` its OpenAI-compatible HTTP surface with vLLM's metrics and injectable
faults, `process.py` a context manager that starts one on a free loopback port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentx.exports import lazy_exports

if TYPE_CHECKING:
    from agentx.sim.engine.config import EngineConfig as EngineConfig
    from agentx.sim.faults import FaultConfig as FaultConfig
    from agentx.sim.power import PowerModel as PowerModel
    from agentx.sim.process import SimServer as SimServer

EXPORTS: dict[str, tuple[str, ...]] = {
    "agentx.sim.engine.config": ("EngineConfig",),
    "agentx.sim.faults": ("FaultConfig",),
    "agentx.sim.power": ("PowerModel",),
    "agentx.sim.process": ("SimServer",),
}
"""Every public name, by the module it lives in: `__all__` and the lazy imports are made from it."""
__all__, _getattr, __dir__ = lazy_exports(__name__, EXPORTS)

if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error for them
    __getattr__ = _getattr
