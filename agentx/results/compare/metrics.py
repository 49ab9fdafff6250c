"""The figures `agentx compare` puts side by side, each computable on any bootstrap replicate of a run's sample.

Latencies are percentiles over requests (ITL over chunk gaps), interactivity 1/TPOT at a percentile, throughput the
run's tokens over its GPU-seconds (duration × GPUs, summed over repeats) resampled as a ratio of tokens to the lane
time their plays held, goodput the requests meeting every SLO per second (the same way), session makespan over the
plays the run did not cut, GPU-seconds per task a task's mean tokens over the replicate's tokens per GPU-second
(agentx.results.summary.tasks). The energy figures (runs measured with `--gpu-metrics`: agentx.results.summary.energy)
take the run's GPU energy over its GPU-seconds as its mean power, over the replicate's tokens per GPU-second: J per
token and per output token, tokens per joule, J per task (a task's mean tokens × J per token) and tasks per MWh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec
import numpy as np

from agentx.results.compare.bootstrap import FloatArray, IntArray, weighted_means, weighted_percentiles, weighted_sums
from agentx.results.compare.sample import RunSample
from agentx.results.summary.checks.audit import Figure

Better = Literal["lower", "higher"]


class MetricSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    unit: str
    better: Better
    scale: float = 1.0
    """Shown value = computed value × scale (seconds to ms)."""
    figure: Figure | None = None
    """The audit's name for what it measures: a finding rejecting it rejects the row."""


Estimator = Callable[[RunSample, IntArray], FloatArray]


def _percentile(name: str, p: float, invert: bool = False, zeros: bool = False) -> Estimator:
    """`p`-th percentile of `name`'s values > 0 (≥ 0 with `zeros`: ITL keeps chunks read together, as the summary)."""

    def estimate(sample: RunSample, weights: IntArray) -> FloatArray:
        values = sample.values.get(name)
        if values is None:
            return np.full(weights.shape[0], np.nan)
        kept = np.where((values >= 0) if zeros else (values > 0), values, np.nan)
        result = weighted_percentiles(kept, sample.cluster[name], weights, p)
        return 1.0 / result if invert else result

    return estimate


def _mean(name: str) -> Estimator:
    def estimate(sample: RunSample, weights: IntArray) -> FloatArray:
        values = sample.values.get(name)
        if values is None or values.size == 0:
            return np.full(weights.shape[0], np.nan)
        return weighted_means(values, sample.cluster[name], weights)

    return estimate


def _per_gpu_second(name: str) -> Estimator:
    """Σ `name` per GPU-second: the run's figure (over its duration) times how the replicate's ratio of `name` to the
    lane-seconds its plays held (a ratio estimator: a replicate of longer sessions has more tokens *and* more time)
    compares with the run's own ratio."""

    def estimate(sample: RunSample, weights: IntArray) -> FloatArray:
        values = sample.values.get(name)
        if values is None or sample.gpu_seconds <= 0:
            return np.full(weights.shape[0], np.nan)
        ones = np.ones((1, weights.shape[1]), dtype=np.int64)
        tokens = weighted_sums(values, sample.cluster[name], weights)
        lanes = sample.values.get("lane_s")
        if lanes is None:
            return tokens / sample.gpu_seconds
        lane_s = weighted_sums(lanes, sample.cluster["lane_s"], weights)
        point_tokens = float(weighted_sums(values, sample.cluster[name], ones)[0])
        point_lane_s = float(weighted_sums(lanes, sample.cluster["lane_s"], ones)[0])
        if point_lane_s <= 0:
            return tokens / sample.gpu_seconds
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio: FloatArray = (tokens / lane_s) / (point_tokens / point_lane_s)
        return point_tokens / sample.gpu_seconds * ratio

    return estimate


def _gpu_s_per_task(sample: RunSample, weights: IntArray) -> FloatArray:
    if sample.num_gpus is None or "task_tokens" not in sample.values or sample.values["task_tokens"].size == 0:
        return np.full(weights.shape[0], np.nan)
    tokens_per_task = weighted_means(sample.values["task_tokens"], sample.cluster["task_tokens"], weights)
    tokens_per_gpu_s = _per_gpu_second("total_tokens")(sample, weights)
    with np.errstate(invalid="ignore", divide="ignore"):
        result: FloatArray = tokens_per_task / tokens_per_gpu_s
    return result


J_PER_MWH = 3.6e9


def _joules_per(name: str) -> Estimator:
    """J per token of `name`: the run's energy per GPU-second (its mean power per GPU) over the replicate's tokens
    per GPU-second; NaN for a run without measured energy."""

    def estimate(sample: RunSample, weights: IntArray) -> FloatArray:
        if sample.energy_j is None or sample.gpu_seconds <= 0:
            return np.full(weights.shape[0], np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            result: FloatArray = (sample.energy_j / sample.gpu_seconds) / _per_gpu_second(name)(sample, weights)
        return result

    return estimate


def _tokens_per_joule(sample: RunSample, weights: IntArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        result: FloatArray = 1.0 / _joules_per("total_tokens")(sample, weights)
    return result


def _joules_per_task(sample: RunSample, weights: IntArray) -> FloatArray:
    if "task_tokens" not in sample.values or sample.values["task_tokens"].size == 0:
        return np.full(weights.shape[0], np.nan)
    tokens_per_task = weighted_means(sample.values["task_tokens"], sample.cluster["task_tokens"], weights)
    result: FloatArray = tokens_per_task * _joules_per("total_tokens")(sample, weights)
    return result


def _tasks_per_mwh(sample: RunSample, weights: IntArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        result: FloatArray = J_PER_MWH / _joules_per_task(sample, weights)
    return result


def energy_metrics() -> list[tuple[MetricSpec, Estimator]]:
    """The energy figures, NaN (left out) for runs without measured GPU energy."""
    return [
        (MetricSpec(name="joules per token", unit="J/token", better="lower"), _joules_per("total_tokens")),
        (MetricSpec(name="joules per output token", unit="J/token", better="lower"), _joules_per("output_tokens")),
        (MetricSpec(name="tokens per joule", unit="token/J", better="higher"), _tokens_per_joule),
        (MetricSpec(name="joules per task", unit="J", better="lower"), _joules_per_task),
        (MetricSpec(name="tasks per MWh", unit="task/MWh", better="higher"), _tasks_per_mwh),
    ]


def _goodput(sample: RunSample, weights: IntArray) -> FloatArray:
    met = sample.values.get("slo_met")
    if met is None or not np.isfinite(met).any():
        return np.full(weights.shape[0], np.nan)
    sample.values.setdefault("slo_met_count", np.where(met > 0, 1.0, 0.0))
    sample.cluster.setdefault("slo_met_count", sample.cluster["slo_met"])
    return _per_gpu_second("slo_met_count")(sample, weights) * (sample.num_gpus or 1)


def _latency(figure: Figure, column: str, p: float) -> tuple[MetricSpec, Estimator]:
    name = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}[figure]
    spec = MetricSpec(name=f"{name} p{p:g}", unit="ms", better="lower", scale=1e3, figure=figure)
    return spec, _percentile(column, p, zeros=figure == "itl")


def metrics(per_gpu: bool) -> list[tuple[MetricSpec, Estimator]]:
    """The compared figures in the order shown; throughputs per GPU when every run has a GPU count, else per run."""
    unit = "tok/s/GPU" if per_gpu else "tok/s"
    return [
        *(_latency("ttft", "ttft_s", p) for p in (50, 90, 99)),
        *(_latency("tpot", "tpot_s", p) for p in (50, 90)),
        *(_latency("itl", "itl_s", p) for p in (50, 99)),
        *(_latency("e2el", "e2el_s", p) for p in (50, 90)),
        *(
            (
                MetricSpec(name=f"interactivity p{p}", unit="tok/s/user", better="higher", figure="interactivity"),
                _percentile("tpot_s", p, invert=True),
            )
            for p in (50, 90)
        ),
        (
            MetricSpec(name="output throughput", unit=unit, better="higher", figure="throughput"),
            _per_gpu_second("output_tokens"),
        ),
        (
            MetricSpec(name="total throughput", unit=unit, better="higher", figure="throughput"),
            _per_gpu_second("total_tokens"),
        ),
        (MetricSpec(name="goodput", unit="req/s", better="higher"), _goodput),
        (MetricSpec(name="session makespan p50", unit="s", better="lower"), _percentile("makespan_s", 50)),
        (MetricSpec(name="session makespan mean", unit="s", better="lower"), _mean("makespan_s")),
        (MetricSpec(name="GPU time per task", unit="GPU-s", better="lower", figure="throughput"), _gpu_s_per_task),
        *energy_metrics(),
    ]
