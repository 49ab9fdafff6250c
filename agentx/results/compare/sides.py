"""The sides of a comparison: a run, a sweep or a folder of repeats as read from its folder, what it is for fairness
(agentx.results.compare.fairness), and the figures each side shows on its own (tasks, $ per task, the critical path,
the audit)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agentx.errors import RecordsError, ReportError
from agentx.records.record import read_records, run_info
from agentx.records.run_folder import RECORDS_FILE, REPEATS_FILE, RUN_FILE
from agentx.results.compare.fairness import Identity, identity
from agentx.results.compare.metrics import metrics
from agentx.results.compare.options import CompareOptions
from agentx.results.compare.sample import Repeat, RunSample
from agentx.results.folders.repeat_index import read_repeats
from agentx.results.folders.run_file import read_run_file
from agentx.results.report.build import Level, Series, load_series
from agentx.results.report.cost import PriceTable, prices_for
from agentx.results.summary.checks.audit import Finding
from agentx.results.summary.explain.critical_path import PathParts, pooled_shares


class Side(msgspec.Struct, kw_only=True):
    """One run or sweep of the comparison (its repeats pooled)."""

    label: str
    path: str
    kind: str
    """"run" or "sweep"."""
    repeats: int
    requests: int
    sessions: int
    """Clusters the bootstrap draws: root sessions (× repeats)."""
    gpus: int | None
    gpu_sku: str | None
    findings: list[Finding]
    """Every repeat's and level's plausibility audit findings (each once)."""
    tasks: int
    """Completed tasks (agentx.results.summary.tasks) over the repeats."""
    gpu_s_per_task: float | None
    critical_path: PathParts | None = None
    """Where the plays' time went, as shares of their summed makespans over every repeat and level
    (agentx.results.summary.explain.critical_path)."""
    loop_lag_p99_s: float | None = None
    """The client's event-loop lag p99 (the largest over its repeats): the resolution of one timestamp."""
    usd_per_task: dict[str, float] = {}
    """$ per task by price tier, where the GPU has a price."""


class Loaded(msgspec.Struct, kw_only=True):
    """A side as read from its folder: its runs or sweeps (one per repeat) and what it is, for fairness."""

    label: str
    path: str
    kind: str
    repeats: list[Series]
    identity: Identity


def load_side(path: Path) -> Loaded:
    """The run, sweep or folder of repeats in `path`; ReportError when it holds none with a summary."""
    repeat_dirs = read_repeats(path)
    folders = repeat_dirs if repeat_dirs is not None else [path]
    series = [load_series(folder) for folder in folders]
    kinds = {s.kind for s in series}
    if len(kinds) > 1:
        raise ReportError(f"{path / REPEATS_FILE}: its repeats mix runs and sweeps")
    first = series[0]
    level = next((lv for lv in first.levels if lv.summary is not None), None)
    if level is None:
        raise ReportError(f"{path}: no run in it has a summary to compare")
    options, run = _run_document(Path(level.run_dir))
    validity = level.summary.validity.verdict() if level.summary and level.summary.validity else None
    concurrency = ",".join(str(lv.concurrency) for lv in first.levels) if first.kind == "sweep" else None
    gpus = first.num_gpus if first.num_gpus is not None else _gpus(level)
    return Loaded(
        label=path.resolve().name,
        path=str(path),
        kind=first.kind,
        repeats=series,
        identity=identity(options, run, gpus=gpus, gpu_sku=first.gpu_sku, validity=validity, concurrency=concurrency),
    )


def _gpus(level: Level) -> int | None:
    throughput = level.summary.throughput if level.summary is not None else None
    return throughput.num_gpus if throughput is not None else None


def _run_document(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's options and RunResult as dicts: from run.json, else from the records' metadata (options only)."""
    if (run_dir / RUN_FILE).is_file():
        try:
            run_file = read_run_file(run_dir / RUN_FILE)
            return run_file.options, msgspec.to_builtins(run_file.run, enc_hook=str)
        except (OSError, msgspec.DecodeError):
            pass
    try:
        return run_info(read_records(run_dir / RECORDS_FILE)).options, {}
    except (OSError, RecordsError):
        return {}, {}


def level_repeat(level: Level, num_gpus: int | None) -> Repeat | None:
    """A run level read for resampling: its records, duration, GPUs and whether its end cut trees; None without a
    throughput (no kept request)."""
    summary = level.summary
    if summary is None or summary.throughput is None:
        return None
    try:
        records = read_records(Path(level.run_dir) / RECORDS_FILE)
    except (OSError, RecordsError) as exc:
        raise ReportError(f"{level.run_dir}: cannot read its records ({exc})") from None
    _, run = _run_document(Path(level.run_dir))
    started, finished = run.get("trees_started"), run.get("trees_finished")
    cut = not (isinstance(started, int) and isinstance(finished, int) and finished >= started)
    gpus = num_gpus if num_gpus is not None else summary.throughput.num_gpus
    energy_j = summary.energy.energy_j if summary.energy is not None else None
    return Repeat(
        records=records, duration_s=summary.throughput.duration_s, num_gpus=gpus, trees_cut=cut, energy_j=energy_j
    )


def side_repeats(item: Loaded) -> list[Repeat]:
    """Every level of every repeat of a side of runs; ReportError when none has kept requests."""
    repeats = [r for series in item.repeats for level in series.levels if (r := level_repeat(level, series.num_gpus))]
    if not repeats:
        raise ReportError(f"{item.path}: no run in it has kept requests to compare")
    return repeats


def runs_side(item: Loaded, sample: RunSample, prices: PriceTable, options: CompareOptions) -> Side:
    """A side of runs, its own figures taken from its pooled `sample`."""
    findings = side_findings(item)
    tasks = int(sample.values["task_tokens"].size) if "task_tokens" in sample.values else 0
    ones = np.ones((1, len(sample.clusters)), dtype=np.int64)
    gpu_s = None
    for spec, estimate in metrics(True):
        if spec.name == "GPU time per task":
            value = float(estimate(sample, ones)[0])
            gpu_s = value if math.isfinite(value) else None
    sku = options.gpu_sku or item.identity.gpu_sku
    usd = {
        tier: gpu_s * price.usd_per_gpu_hour / 3600.0
        for tier, price in prices_for(prices, sku, options.usd_per_gpu_hour)
        if gpu_s is not None and price.usd_per_gpu_hour is not None
    }
    return Side(
        label=item.label,
        path=item.path,
        kind=item.kind,
        repeats=len(item.repeats),
        loop_lag_p99_s=loop_lag_p99_s(item),
        critical_path=critical_path_shares(item),
        requests=int(sample.values["ttft_s"].size),
        sessions=len(sample.clusters),
        gpus=item.identity.gpus,
        gpu_sku=sku,
        findings=findings,
        tasks=tasks,
        gpu_s_per_task=gpu_s,
        usd_per_task=usd,
    )


def sweep_side(item: Loaded, prices: PriceTable, options: CompareOptions) -> Side:
    """A side of sweeps (its levels' kept requests summed; no per-task figures: they are per level)."""
    findings = side_findings(item)
    requests = sum(
        level.summary.counts.kept for series in item.repeats for level in series.levels if level.summary is not None
    )
    return Side(
        label=item.label, path=item.path, kind=item.kind, repeats=len(item.repeats), requests=requests, sessions=0,
        gpus=item.identity.gpus, gpu_sku=options.gpu_sku or item.identity.gpu_sku, findings=findings, tasks=0,
        gpu_s_per_task=None, critical_path=critical_path_shares(item),
    )  # fmt: skip


def critical_path_shares(item: Loaded) -> PathParts | None:
    """Where the plays of every repeat and level spent their makespans, pooled (None: no records say)."""
    found = [
        level.summary.critical_path
        for series in item.repeats
        for level in series.levels
        if level.summary is not None and level.summary.critical_path is not None
    ]
    return pooled_shares(found) if found else None


def loop_lag_p99_s(item: Loaded) -> float | None:
    """The largest event-loop lag p99 of the side's runs (None: none recorded it)."""
    lags = [
        level.summary.loop_lag.p99_s
        for series in item.repeats
        for level in series.levels
        if level.summary is not None and level.summary.loop_lag is not None
    ]
    return max(lags) if lags else None


def side_findings(item: Loaded) -> list[Finding]:
    """Every distinct audit finding of the side's runs, the first of each code."""
    seen: dict[str, Finding] = {}
    for series in item.repeats:
        for level in series.levels:
            if level.summary is not None and level.summary.audit is not None:
                for finding in level.summary.audit.findings:
                    seen.setdefault(finding.code, finding)
    return list(seen.values())
