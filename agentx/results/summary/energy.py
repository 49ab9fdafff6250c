"""The GPUs' energy over a run (gpu_metrics.arrow, agentx.replayer.telemetry.gpu) and what it costs per token and per
task.

**The window** is the throughput's: the first kept request's send to the last one's end (`Throughput.duration_s`),
so joules per token is mean watts over tokens per second. Its edges fall between scrapes: the energy counter is
interpolated linearly between the scrapes around an edge (power constant between scrapes), and beyond the first or
last scrape the nearest interval's power goes on.

**Per GPU**, energy over the window is the energy counter's difference where every scrape in and around the window
has it and it never falls (`source = "counter"`: exact, whatever the power did between scrapes); else the power
samples integrated by the trapezoid rule (`"integrated"`: the power is taken as linear between scrapes). Mean watts
are the energy over the window's length; peak watts the largest power sample in the window.

**Figures**: J per output token = E / ΣOSL, J per token = E / Σ(ISL + OSL), J per task = E / completed tasks
(agentx.results.summary.tasks), tokens per joule = Σ(ISL + OSL) / E, tasks per MWh = tasks / (E / 3.6e9 J); E is the
sum over the GPUs. What is measured is GPU board power only: not the CPUs, memory, network, storage, power supplies'
losses or cooling.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.errors import ServerMetricsError
from agentx.records.record import run_info
from agentx.replayer.telemetry.gpu_file import aligned_gpu_times_ns, gpu_metrics_info, load_gpu_metrics

J_PER_MWH: Final = 3.6e9
INCLUDES: Final = (
    "GPU board power only (not CPUs, memory, network, storage, power-supply losses or cooling), over the throughput "
    "window (first kept request sent to last one ended), edges interpolated between scrapes"
)
FloatArray = npt.NDArray[np.float64]


class GpuEnergy(msgspec.Struct, kw_only=True):
    """One GPU over the window."""

    gpu: str
    """The exporter's GPU (`Hostname:gpu` for DCGM)."""
    energy_j: float
    source: Literal["counter", "integrated"]
    mean_w: float
    peak_w: float | None
    """The largest power sample in the window; None without power samples there."""
    samples: int
    """Scrapes of this GPU inside the window."""


class Energy(msgspec.Struct, kw_only=True):
    """The GPUs' energy over the window and what it costs (module docstring)."""

    window_s: float
    energy_j: float
    """Σ over the GPUs."""
    mean_w: float
    """All the GPUs together: energy over the window's length."""
    gpus: list[GpuEnergy]
    source: Literal["counter", "integrated", "mixed"]
    url: str
    """The endpoint scraped (without credentials)."""
    interval_s: float
    joules_per_output_token: float | None = None
    joules_per_token: float | None = None
    """Per total (input + output) token."""
    joules_per_task: float | None = None
    tokens_per_joule: float | None = None
    output_tokens_per_joule: float | None = None
    tasks_per_mwh: float | None = None
    includes: str = INCLUDES


def load_energy_table(records_path: str | os.PathLike[str]) -> pa.Table | None:
    """The gpu_metrics.arrow beside a records file, None when there is none."""
    return load_gpu_metrics(Path(records_path).parent)


def throughput_window_ns(table: pa.Table) -> tuple[int, int] | None:
    """(first send, last end) of the kept requests on the records' clock; None when empty."""
    import pyarrow.compute as pc  # only at the run's end (tests/project/test_lazy_imports.py)

    if table.num_rows == 0:
        return None
    start, end = int(pc.min(table.column("sent_ns")).as_py()), int(pc.max(table.column("end_ns")).as_py())
    return (start, end) if end > start else None


def summarize_energy(
    gpu_metrics: pa.Table | None,
    records: pa.Table,
    window_ns: tuple[int, int] | None,
    *,
    input_tokens: int,
    output_tokens: int,
    tasks: int | None,
) -> Energy | None:
    """The energy over `window_ns` (the kept requests' span, `throughput_window_ns`) from this run's gpu_metrics
    table; None without one, without a window, or when it is another run's."""
    if gpu_metrics is None or gpu_metrics.num_rows == 0 or window_ns is None:
        return None
    try:
        info = gpu_metrics_info(gpu_metrics.schema)
        run = run_info(records)
    except (ServerMetricsError, ValueError):  # RecordsError is a ValueError
        return None
    if info.run_id != run.run_id:
        return None
    times = np.asarray(aligned_gpu_times_ns(gpu_metrics, run.wall_epoch_ns), dtype=np.float64) / 1e9
    gpus = gpu_metrics.column("gpu").to_pylist()
    power = _floats(gpu_metrics, "power_w")
    energy = _floats(gpu_metrics, "energy_j")
    start, end = window_ns[0] / 1e9, window_ns[1] / 1e9
    per_gpu = []
    for gpu in dict.fromkeys(gpus):
        mask = np.asarray([g == gpu for g in gpus])
        one = gpu_energy(gpu, times[mask], power[mask], energy[mask], start, end)
        if one is not None:
            per_gpu.append(one)
    if not per_gpu:
        return None
    total = sum(g.energy_j for g in per_gpu)
    sources = {g.source for g in per_gpu}
    result = Energy(
        window_s=end - start,
        energy_j=total,
        mean_w=total / (end - start),
        gpus=per_gpu,
        source=sources.pop() if len(sources) == 1 else "mixed",
        url=info.url,
        interval_s=info.interval_s,
    )
    return with_figures(result, input_tokens=input_tokens, output_tokens=output_tokens, tasks=tasks)


def with_figures(energy: Energy, *, input_tokens: int, output_tokens: int, tasks: int | None) -> Energy:
    """`energy` with its per-token and per-task figures (None where a count or the energy is 0)."""
    joules = energy.energy_j
    if joules <= 0:
        return energy
    tokens = input_tokens + output_tokens
    energy.joules_per_output_token = joules / output_tokens if output_tokens else None
    energy.joules_per_token = joules / tokens if tokens else None
    energy.tokens_per_joule = tokens / joules
    energy.output_tokens_per_joule = output_tokens / joules
    if tasks is not None:
        energy.joules_per_task = joules / tasks if tasks else None
        energy.tasks_per_mwh = tasks / (joules / J_PER_MWH)
    return energy


def gpu_energy(
    gpu: str, times: FloatArray, power: FloatArray, energy: FloatArray, start: float, end: float
) -> GpuEnergy | None:
    """One GPU's energy over [start, end] s from its samples (times in s, sorted); None when it has too few."""
    order = np.argsort(times, kind="stable")
    times, power, energy = times[order], power[order], energy[order]
    inside = (times >= start) & (times <= end)
    has_power = np.isfinite(power)
    peak = float(power[inside & has_power].max()) if (inside & has_power).any() else None
    joules = _counter_energy(times, energy, start, end)
    source: Literal["counter", "integrated"] = "counter"
    if joules is None:
        joules = _integrated_energy(times[has_power], power[has_power], start, end)
        source = "integrated"
    if joules is None:
        return None
    return GpuEnergy(
        gpu=gpu,
        energy_j=joules,
        source=source,
        mean_w=joules / (end - start),
        peak_w=peak,
        samples=int(inside.sum()),
    )


def _counter_energy(times: FloatArray, energy: FloatArray, start: float, end: float) -> float | None:
    """E(end) − E(start), E linear between scrapes and along the nearest interval beyond them; None when the
    counter is missing from a scrape that matters or falls (a reset)."""
    if times.size < 2:
        return None
    first = max(int(np.searchsorted(times, start, side="right")) - 1, 0)
    last = min(int(np.searchsorted(times, end, side="left")), times.size - 1)
    used = energy[first : last + 1]
    if used.size < 2 or not np.isfinite(used).all() or (np.diff(used) < 0).any():
        return None
    return _linear(times[first : last + 1], used, end) - _linear(times[first : last + 1], used, start)


def _linear(times: FloatArray, values: FloatArray, at: float) -> float:
    """The piecewise-linear interpolant through the points at `at`, extended along its end segments."""
    if at <= times[0]:
        i = 0
    elif at >= times[-1]:
        i = times.size - 2
    else:
        return float(np.interp(at, times, values))
    span = times[i + 1] - times[i]
    slope = (values[i + 1] - values[i]) / span if span > 0 else 0.0
    return float(values[i] + slope * (at - times[i]))


def _integrated_energy(times: FloatArray, power: FloatArray, start: float, end: float) -> float | None:
    """∫ power over [start, end] by the trapezoid rule, power linear between samples and held beyond them."""
    if times.size == 0:
        return None
    grid = np.concatenate(([start], times[(times > start) & (times < end)], [end]))
    watts = np.interp(grid, times, power)
    return float(np.sum((watts[1:] + watts[:-1]) / 2 * np.diff(grid)))


def _floats(table: pa.Table, name: str) -> FloatArray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
