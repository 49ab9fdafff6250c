"""Tests name a run's options flat (`url=`, `concurrency=`, `delay_scale=`), as run.json stores them; this sorts
them into the parts of `ReplayOptions` (agentx.replayer.options.replay)."""

from __future__ import annotations

from typing import Any

import msgspec

from agentx.replayer.options.replay import (
    LOADS,
    Connection,
    ReplayOptions,
    Runtime,
    Scenario,
    Server,
    Speculative,
)

_SPECULATIVE = {
    "spec_al": "al",
    "spec_k": "k",
    "spec_al_tolerance": "al_tolerance",
    "stream_interval": "stream_interval",
}


def _names(kind: type) -> set[str]:
    return {field.name for field in msgspec.structs.fields(kind)}


def replay_options(**fields: Any) -> ReplayOptions:
    """`ReplayOptions` from flat keyword arguments; a name that fits no part is a TypeError, as a typo should be."""
    mode = fields.pop("mode", "agentx")
    load_kind = next(load for load in LOADS if load.mode == mode)
    parts: dict[str, dict[str, Any]] = {"server": {}, "connection": {}, "load": {}, "scenario": {}, "runtime": {}}
    top: dict[str, Any] = {}
    speculative: dict[str, Any] = {}
    kinds: dict[str, type[msgspec.Struct]] = {
        "server": Server,
        "connection": Connection,
        "load": load_kind,
        "scenario": Scenario,
        "runtime": Runtime,
    }
    for name, value in fields.items():
        if name in _SPECULATIVE:
            speculative[_SPECULATIVE[name]] = value
        elif name in ("out_dir", "overwrite"):
            top[name] = value
        elif (part := next((p for p, kind in kinds.items() if name in _names(kind)), None)) is not None:
            parts[part][name] = value
        else:
            raise TypeError(f"no part of ReplayOptions has a field {name!r} (mode {mode!r})")
    return ReplayOptions(
        server=Server(**parts["server"]),
        connection=Connection(**parts["connection"]),
        load=load_kind(**parts["load"]),
        scenario=Scenario(**parts["scenario"]),
        runtime=Runtime(**parts["runtime"]),
        speculative=Speculative(**speculative),
        **top,
    )
