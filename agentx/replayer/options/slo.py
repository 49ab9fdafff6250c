"""Per-request service-level objectives (`--slo ttft=2s --slo tpot=50ms`) and whether a request met them.

A request meets the SLOs when it succeeded and each metric given is at most its target (inclusive, as vLLM bench's
`--goodput` judges). The metrics are per request, under vLLM's names:

- `ttft`: time to the first content chunk;
- `tpot`: (E2EL − TTFT) / (OSL − 1); a request of fewer than 2 output tokens has none, and that target does not
  judge it (vLLM bench counts its TPOT as 0);
- `e2el`: time to the last content chunk.

ITL is a gap between streamed chunks, many per request, so it is no per-request objective; TPOT is its per-request
form. A request without a TTFT or E2EL (no content arrived) fails those targets. The verdict is made when the record
is (agentx.replayer.schedule.sending), so it is in the crash-safe records stream too (`slo_met`); the summary's goodput
counts it (agentx.results.summary.goodput).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Final

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError, SloError

if TYPE_CHECKING:
    from agentx.records.record import RequestRecord

METRIC_COLUMNS: Final = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s"}
"""Each metric's record column (seconds)."""
UNITS_S: Final = {"ms": 1e-3, "s": 1.0}
"""The units a target takes, in seconds (a unit is required: vLLM's `--goodput` takes milliseconds, AIPerf's
`--goodput` too, so a bare number is ambiguous)."""
_NUMBER_AND_UNIT: Final = re.compile(r"([-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:e[-+]?\d+)?|[-+]?inf|nan)\s*([a-zµ]*)")
"""A target as written, lowercased: a number (Python's float syntax, `inf` and `nan` included so they are named as
what is wrong), then its unit."""
NOT_PER_REQUEST: Final = {"itl": "ITL is a gap between streamed chunks, not one value per request; use tpot"}

Target = Annotated[float, Meta(gt=0)] | None


class Slos(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The targets a request must meet, in seconds; None: not judged. All None: no SLO (records say null)."""

    ttft_s: Target = None
    tpot_s: Target = None
    e2el_s: Target = None

    def __post_init__(self) -> None:
        for metric, target_s in self.targets_s().items():
            if not math.isfinite(target_s):
                raise ConfigError(f"the {metric} SLO must be a finite number of seconds, got {target_s}")

    def targets_s(self) -> dict[str, float]:
        """The targets given, by metric name ("ttft", "tpot", "e2el"), in seconds."""
        given = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2el": self.e2el_s}
        return {metric: target for metric, target in given.items() if target is not None}

    def met(self, record: RequestRecord) -> bool | None:
        """Whether `record` meets every target (module docstring); None when no target is given."""
        targets = self.targets_s()
        if not targets:
            return None
        if record.status != "ok":
            return False
        for metric, target_s in targets.items():
            value: float | None = getattr(record, METRIC_COLUMNS[metric])
            if value is None:
                if metric == "tpot":
                    continue  # fewer than 2 output tokens: no TPOT to judge
                return False
            if value > target_s:
                return False
        return True


def parse_slo(text: str) -> tuple[str, float]:
    """`ttft=2s` (or `ttft:2000ms`, vLLM's separator) as ("ttft", 2.0); SloError naming what is wrong."""
    metric, sep, raw = text.replace(":", "=", 1).partition("=")
    metric, raw = metric.strip().lower(), raw.strip().lower()
    if not sep or not metric or not raw:
        raise SloError(f"--slo {text!r} is not METRIC=VALUE (e.g. ttft=2s or tpot=50ms)")
    if metric in NOT_PER_REQUEST:
        raise SloError(f"--slo {text!r}: {NOT_PER_REQUEST[metric]}")
    if metric not in METRIC_COLUMNS:
        raise SloError(f"--slo {text!r}: unknown metric {metric!r} (known: {', '.join(METRIC_COLUMNS)})")
    parts = _NUMBER_AND_UNIT.fullmatch(raw)
    if parts is None:
        raise SloError(f"--slo {text!r}: {raw!r} is not a number and a unit (e.g. {metric}=2s or {metric}=2000ms)")
    number, unit = parts.groups()
    if not unit:
        raise SloError(f"--slo {text!r}: give the value a unit, s or ms (e.g. {metric}=2s or {metric}=2000ms)")
    if unit not in UNITS_S:
        raise SloError(f"--slo {text!r}: the unit {unit!r} is not s or ms")
    value = float(number)
    if not (math.isfinite(value) and value > 0):
        raise SloError(f"--slo {text!r}: the target must be a positive, finite time")
    return metric, value * UNITS_S[unit]


def parse_slos(texts: tuple[str, ...] | list[str]) -> Slos:
    """Every `--slo` given (each may hold several, comma-separated) as one `Slos`; a metric given twice is refused."""
    targets_s: dict[str, float] = {}
    for text in texts:
        for part in text.split(","):
            if not part.strip():
                continue
            metric, seconds = parse_slo(part.strip())
            if metric in targets_s:
                raise SloError(f"--slo {metric} is given twice; give each metric once")
            targets_s[metric] = seconds
    return Slos(**{f"{metric}_s": seconds for metric, seconds in targets_s.items()})
