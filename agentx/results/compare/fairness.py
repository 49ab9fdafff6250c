"""Apples to apples: every way two runs differ that breaks a fair comparison of their numbers.

Each `Difference` has a key, the name `--allow` takes: a difference not allowed withholds every verdict of the
comparison (the figures are still shown). The keys:

- `trace`: the trace's content digest (`RunResult.trace_digest`; a run without one is compared by its trace path);
- `rules`: the AgentX rule set; `mode`: agentx, closed, rate...;
- `model`: the model name sent;
- `gpus`: the GPU count (throughputs are per GPU either way; other figures are the deployment's);
- `gpu-sku`: the GPU model, when given (a sweep's `--gpu-sku`);
- `acceptance`: the forced speculative acceptance (AL and K);
- `concurrency`: the concurrency (a run's, or a sweep's levels);
- `duration`: the configured duration or session budget;
- `validity`: whether each is a valid AgentX submission (an invalid run is compared only when allowed);
- `version`: the agentx version that ran it.

A difference in seed alone is not unfair (the sample differs, which the intervals account for) but stops pairing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

KEYS: Final = (
    "trace",
    "rules",
    "mode",
    "model",
    "gpus",
    "gpu-sku",
    "acceptance",
    "concurrency",
    "duration",
    "validity",
    "version",
)


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """What a side of a comparison is, as far as fairness goes; None: unknown (an older run, an imported one)."""

    trace: str | None
    rules: str | None
    mode: str | None
    model: str | None
    gpus: int | None
    gpu_sku: str | None
    acceptance: str | None
    concurrency: str | None
    duration: str | None
    validity: str | None
    version: str | None
    seed: int | None

    def value(self, key: str) -> str | int | None:
        value: str | int | None = getattr(self, key.replace("-", "_"))
        return value


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    values: list[str]
    """Each side's value, in the comparison's order ("?" when unknown)."""
    allowed: bool


def identity(options: dict[str, Any], run: dict[str, Any], *, gpus: int | None, gpu_sku: str | None,
             validity: str | None, concurrency: str | None = None) -> Identity:  # fmt: skip
    """A run's identity from its options (run.json's `options`) and its `RunResult` as a dict."""

    def text(value: Any) -> str | None:
        return None if value is None else str(value)

    al, k = options.get("spec_al"), options.get("spec_k")
    acceptance = "none" if al is None and k is None else f"AL {al} K {k}"
    duration_s, sessions = options.get("duration_s"), options.get("sessions")
    duration = None if duration_s is None and sessions is None else f"{duration_s} s, {sessions} sessions"
    trace = run.get("trace_digest") or text(run.get("trace_path"))
    seed = options.get("seed")
    return Identity(
        trace=trace,
        rules=text(options.get("rules")),
        mode=text(options.get("mode")),
        model=text(options.get("model")),
        gpus=gpus,
        gpu_sku=gpu_sku.lower() if gpu_sku else None,
        acceptance=acceptance,
        concurrency=concurrency if concurrency is not None else text(options.get("concurrency")),
        duration=duration,
        validity=validity,
        version=text(run.get("agentx_version")) or None,
        seed=seed if isinstance(seed, int) else None,
    )


def differences(identities: Sequence[Identity], allow: frozenset[str]) -> list[Difference]:
    """The keys on which the sides differ (an unknown value differs from a known one only for `trace`)."""
    found: list[Difference] = []
    for key in KEYS:
        values = [identity.value(key) for identity in identities]
        known = {value for value in values if value is not None}
        unknown = any(value is None for value in values)
        if len(known) > 1 or (key == "trace" and unknown and len(identities) > 1):
            shown = ["?" if value is None else _short(key, value) for value in values]
            found.append(Difference(key=key, values=shown, allowed=key in allow))
    return found


def _short(key: str, value: str | int) -> str:
    text = str(value)
    return text[:12] if key == "trace" and len(text) == 64 else text


def paired(identities: Sequence[Identity]) -> bool:
    """Whether the runs played the same sessions in the same order: same trace (known), rules, mode and seed."""
    first = identities[0]
    return first.trace is not None and all(
        other.trace == first.trace
        and other.rules == first.rules
        and other.mode == first.mode
        and other.seed == first.seed
        for other in identities[1:]
    )
