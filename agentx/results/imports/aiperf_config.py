"""What AIPerf's summary, `profile_export_aiperf.json`, says about the run: its options as agentx names them, its rule
set, whether it was cancelled.

The options (run.json's `options`, the records' metadata) say where the run came from: `imported_from` ("aiperf"),
`tool` (`agentx-harness` for the harness's scenario `agentx`, else `aiperf`), `tool_version` (`aiperf_version`),
`artifact_dir` and `benchmark_id`. From `input_config`, under agentx's names: `url` (the first of `endpoint.urls`,
without credentials; all of them in `urls` when there are several), `model` (the first of `models.items`), `api`
(`endpoint.type`), `streaming`, `use_server_token_count`; from the profiling phase `mode` (`agentx` for AIPerf's
`agentic_replay` timing, `closed` for concurrency, `rate` for a request rate, `trace` for a fixed schedule),
`concurrency`, `duration_s`, `grace_s`, `tstar_window`, `warmup_requests_per_lane`, `failed_request_threshold`,
`system_idle_cap_s`; from the dataset `tree_idle_cap_s` and `seed` (else `run_info.random_seed`); `scenario`,
`unsafe_override` and `rules`, the agentx rule set whose reference this is (`aiperf_version` and scenario of
agentx-harness 1.0.12 or AIPerf 0.13.0; absent for another version, whose rules agentx does not know). Nothing else
is copied: no header, key or command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec

from agentx.errors import ArtifactError
from agentx.replayer.options.rules import HARNESS, RULE_SETS

TIMING_MODES: Final = {"agentic_replay": "agentx"}
"""AIPerf's timing mode of a profiling phase → agentx's mode (before the phase type is looked at)."""
PHASE_TYPES: Final = {"concurrency": "closed", "request_rate": "rate", "fixed_schedule": "trace"}
"""AIPerf's type of a profiling phase → agentx's mode."""
PHASE_OPTIONS: Final = {
    "concurrency": "concurrency",
    "duration": "duration_s",
    "grace_period": "grace_s",
    "warmup_requests_per_lane": "warmup_requests_per_lane",
    "failed_request_threshold": "failed_request_threshold",
    "system_idle_gap_cap_seconds": "system_idle_cap_s",
}
"""A profiling phase's settings → agentx's option names."""


def read_summary(path: Path) -> dict[str, Any] | None:
    """`profile_export_aiperf.json` as a dict, None when there is no such file; ArtifactError when it is not JSON
    or not an object."""
    if not path.is_file():
        return None
    try:
        document = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ArtifactError(f"{path}: not a readable AIPerf summary ({exc})") from None
    if not isinstance(document, dict):
        raise ArtifactError(f"{path}: not an AIPerf summary (expected a JSON object)")
    return document


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def without_credentials(url: str) -> str:
    """`url` without a `user:password@` part, a query or a fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def profiling_phase(config: Mapping[str, Any]) -> dict[str, Any]:
    """The input config's profiling phase (the last phase when none says its kind)."""
    phases = [phase for phase in _list(config.get("phases")) if isinstance(phase, dict)]
    profiling = [phase for phase in phases if phase.get("kind") == "profiling"]
    return (profiling or phases or [{}])[-1]


def scenario(summary: Mapping[str, Any]) -> str | None:
    config = _dict(summary.get("input_config"))
    return _text(config.get("scenario")) or _text(_dict(summary.get("metadata")).get("scenario"))


def rules_name(summary: Mapping[str, Any]) -> str | None:
    """The agentx rule set whose reference wrote `summary` (its version and scenario), else None."""
    version, played = _text(summary.get("aiperf_version")), scenario(summary)
    for rules in RULE_SETS.values():
        if rules.aiperf_version == version and rules.scenario == played:
            return rules.name
    return None


def tool(summary: Mapping[str, Any] | None) -> str:
    return "agentx-harness" if summary is not None and scenario(summary) == HARNESS.scenario else "aiperf"


def model_name(summary: Mapping[str, Any] | None) -> str:
    """The first model of the input config ("" when unknown)."""
    items = _list(_dict(_dict(_dict(summary).get("input_config")).get("models")).get("items"))
    first = items[0] if items and isinstance(items[0], dict) else {}
    return _text(first.get("name")) or ""


def trace_path(summary: Mapping[str, Any] | None) -> str | None:
    """The dataset's path, as the run was given it."""
    datasets = _list(_dict(_dict(summary).get("input_config")).get("datasets"))
    first = datasets[0] if datasets and isinstance(datasets[0], dict) else {}
    return _text(first.get("path"))


def cancelled(summary: Mapping[str, Any] | None) -> bool:
    """Whether AIPerf says the run was cancelled (`was_cancelled`, or `is_complete` false)."""
    if summary is None:
        return False
    return summary.get("was_cancelled") is True or summary.get("is_complete") is False


def run_options(summary: Mapping[str, Any] | None, artifact_dir: Path) -> dict[str, Any]:
    """The run's options under agentx's names (see the module docstring)."""
    options: dict[str, Any] = {
        "imported_from": "aiperf",
        "tool": tool(summary),
        "artifact_dir": str(artifact_dir.resolve()),
    }
    if summary is None:
        return options
    config = _dict(summary.get("input_config"))
    endpoint = _dict(config.get("endpoint"))
    phase = profiling_phase(config)
    dataset = next((d for d in _list(config.get("datasets")) if isinstance(d, dict)), {})
    urls = [without_credentials(url) for url in _list(endpoint.get("urls")) if isinstance(url, str)]
    found: dict[str, Any] = {
        "tool_version": _text(summary.get("aiperf_version")),
        "benchmark_id": _text(summary.get("benchmark_id")),
        "url": urls[0] if urls else None,
        "urls": urls if len(urls) > 1 else None,
        "model": model_name(summary) or None,
        "api": _text(endpoint.get("type")),
        "streaming": endpoint.get("streaming") if isinstance(endpoint.get("streaming"), bool) else None,
        "use_server_token_count": (
            endpoint.get("use_server_token_count") if isinstance(endpoint.get("use_server_token_count"), bool) else None
        ),
        "mode": TIMING_MODES.get(str(phase.get("timing_mode"))) or PHASE_TYPES.get(str(phase.get("type"))),
    }
    for key, name in PHASE_OPTIONS.items():
        found[name] = _number(phase.get(key))
    low, high = _number(phase.get("trajectory_start_min_ratio")), _number(phase.get("trajectory_start_max_ratio"))
    found["tstar_window"] = [low, high] if low is not None and high is not None else None
    found["tree_idle_cap_s"] = _number(dataset.get("trace_idle_gap_cap_seconds"))
    seed = dataset.get("random_seed", _dict(summary.get("run_info")).get("random_seed"))
    found["seed"] = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    found["scenario"] = scenario(summary)
    found["unsafe_override"] = config.get("unsafe_override") is True
    found["rules"] = rules_name(summary)
    options.update({key: value for key, value in found.items() if value is not None})
    return options
