"""Plots of a report (matplotlib, the optional extra `agentx-replay[plot]`, imported only when plotting), PNG and SVG.

`write_plots(report, out_dir)` writes, every series of the report on the same axes where that makes sense:
`frontier` (throughput per GPU vs interactivity, the interpolated front and the targets marked), `cost` ($/M vs
interactivity along the front at the report's tier), `latency` (TTFT and TPOT distributions per level),
`swimlanes` (each series' highest level: a lane per row, a bar per request, each play's critical path marked, the
in-flight count beneath), `server_metrics` (the same level's server telemetry on the same time axis: running and
waiting requests beside the client's in-flight count, KV-cache usage, prefix-cache hit rate) and `chunks` (tokens per
streamed chunk). Records and server_metrics.arrow are read from the levels' directories.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agentx.errors import PlotsUnavailableError
from agentx.records.record import read_records, run_info
from agentx.records.run_folder import RECORDS_FILE
from agentx.replayer.telemetry.arrow_file import aligned_times_ns, load_server_metrics, server_metrics_info
from agentx.results.report.build import LevelRow, Report, SeriesReport
from agentx.results.report.cost import usd_per_million_tokens
from agentx.results.report.frontier import Point, curve
from agentx.results.summary.explain.critical_path import play_paths
from agentx.results.summary.population import IntCounts
from agentx.results.summary.run_records import RunRecords

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOT_HINT: Final = "plots need matplotlib: pip install 'agentx-replay[plot]'"
FORMATS: Final = ("png", "svg")
_DPI = 120


def _new_figure(rows: int = 1, columns: int = 1, *, height_in: float = 4.5, **subplots: Any) -> tuple[Figure, Any]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotsUnavailableError(PLOT_HINT) from None
    # A bare Figure, not pyplot: no global figure registry, no GUI backend.
    figure = Figure(figsize=(9.0, height_in * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, **subplots)
    return figure, axes


def _save(figure: Figure, out_dir: Path, name: str) -> list[Path]:
    written = []
    for suffix in FORMATS:
        path = out_dir / f"{name}.{suffix}"
        figure.savefig(path, dpi=_DPI)
        written.append(path)
    return written


def _points(rows: Sequence[LevelRow], *, front_only: bool) -> list[Point]:
    return [
        Point(
            label=r.label,
            concurrency=r.concurrency,
            interactivity_tps=r.interactivity_tps,
            total_tps_per_gpu=r.total_tps_per_gpu or 0.0,
            output_tps_per_gpu=r.output_tps_per_gpu or 0.0,
            input_tps_per_gpu=r.input_tps_per_gpu or 0.0,
            num_gpus=1,
            gpus_known=True,
        )
        for r in sorted(rows, key=lambda r: r.interactivity_tps or 0.0)
        if r.interactivity_tps is not None and (r.on_front or not front_only)
    ]


def plot_frontier(report: Report, out_dir: Path) -> list[Path]:
    """Throughput per GPU vs interactivity: every level, the interpolated front, the targets."""
    figure, axes = _new_figure()
    ax: Axes = axes[0][0]
    basis = report.basis
    for i, s in enumerate(report.series):
        color = f"C{i}"
        points = _points(s.levels, front_only=False)
        ax.scatter(
            [p.interactivity_tps for p in points],
            [p.throughput(basis) for p in points],
            color=color,
            label=s.label,
            zorder=3,
        )
        for p in points:
            ax.annotate(
                p.label,
                (p.interactivity_tps, p.throughput(basis)),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
                color=color,
            )
        xs, ys = curve(_points(s.levels, front_only=True), basis)
        ax.plot(xs, ys, color=color, linewidth=1.5)
        hits = [(t.target_tps, _basis(t, basis)) for t in s.targets]
        hit_x = [x for x, y in hits if y is not None]
        hit_y = [y for x, y in hits if y is not None]
        ax.scatter(hit_x, hit_y, marker="D", facecolors="none", edgecolors=color, zorder=4)
    for target in report.series[0].targets if report.series else []:
        ax.axvline(target.target_tps, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel(f"interactivity (tok/s/user, 1/TPOT {report.statistic})")
    ax.set_ylabel(f"{basis} throughput (tok/s/GPU)")
    ax.set_title("throughput per GPU vs interactivity (◇: at the targets)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(figure, out_dir, "frontier")


def _basis(target: Any, basis: str) -> float | None:
    value: float | None = getattr(target, f"{basis}_tps_per_gpu")
    return value


def _price(s: SeriesReport, tier: str) -> float | None:
    return next((c.usd_per_gpu_hour for c in s.costs_at_target if c.tier == tier), None)


def plot_cost(report: Report, out_dir: Path) -> list[Path]:
    """$/1M tokens vs interactivity along each front at the report's tier."""
    figure, axes = _new_figure()
    ax: Axes = axes[0][0]
    basis = report.basis
    priced = 0
    for i, s in enumerate(report.series):
        price = _price(s, report.tier)
        if price is None:
            continue
        priced += 1
        front = _points(s.levels, front_only=True)
        xs, ys = curve(front, basis)
        usd = [usd_per_million_tokens(price, y) for y in ys]
        ax.plot(
            [x for x, u in zip(xs, usd, strict=True) if u is not None],
            [u for u in usd if u is not None],
            color=f"C{i}",
            label=f"{s.label} (${price:.2f}/GPU/hr, {report.tier})",
        )
        knots = [(p.interactivity_tps, usd_per_million_tokens(price, p.throughput(basis))) for p in front]
        ax.scatter([x for x, u in knots if u is not None], [u for x, u in knots if u is not None], color=f"C{i}")
    if not priced:
        reasons = [s.price_note for s in report.series if s.price_note is not None]
        ax.text(
            0.5,
            0.5,
            "\n".join(reasons) or f"no {report.tier} price for these GPUs",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    else:
        ax.legend()
    ax.set_xlabel(f"interactivity (tok/s/user, 1/TPOT {report.statistic})")
    ax.set_ylabel(f"$ per 1M {basis} tokens")
    ax.set_title("what serving costs vs interactivity")
    ax.grid(alpha=0.3)
    return _save(figure, out_dir, "cost")


def _kept(run_dir: str) -> pa.Table | None:
    """The level's profiling requests that succeeded, or None without records."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.is_file():
        return None
    table = read_records(path, chunks=False)
    if table.num_rows == 0:
        return table
    mask = pc.and_(pc.not_equal(table.column("phase"), "warmup"), pc.equal(table.column("status"), "ok"))
    return table.filter(pc.fill_null(mask, False))


def _floats(table: pa.Table, name: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    values = np.asarray(pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    return values[np.isfinite(values) & (values > 0)]


def _ecdf(ax: Axes, values: np.ndarray[Any, np.dtype[np.float64]], label: str, color: str, style: str) -> None:
    data = np.sort(values)
    ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", label=label, color=color, linestyle=style)


def plot_latency(report: Report, out_dir: Path) -> list[Path]:
    """TTFT and TPOT distributions (ECDF) of every level of every series."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    figure, axes = _new_figure(1, 2)
    ttft_ax: Axes = axes[0][0]
    tpot_ax: Axes = axes[0][1]
    styles = ("-", "--", ":", "-.")
    shown = 0
    for i, s in enumerate(report.series):
        for j, level in enumerate(r for r in s.levels if r.interactivity_tps is not None):
            table = _kept(level.run_dir)
            if table is None or table.num_rows == 0:
                continue
            label, color, style = f"{s.label} {level.label}", f"C{j % 10}", styles[i % len(styles)]
            _ecdf(ttft_ax, _floats(table, "ttft_s") * 1000, label, color, style)
            _ecdf(tpot_ax, _floats(table, "tpot_s") * 1000, label, color, style)
            shown += 1
    # TTFT spans orders of magnitude once requests queue (log scale); TPOT stays within a few-fold (linear).
    ttft_ax.set_xscale("log")
    ttft_ax.xaxis.set_major_formatter(ScalarFormatter())
    ttft_ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a short log range
    for ax, what in ((ttft_ax, "TTFT (ms)"), (tpot_ax, "TPOT (ms)")):
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests ≤")
        ax.grid(alpha=0.3)
        if shown:
            ax.legend(fontsize=7)
    ttft_ax.set_title("TTFT distribution")
    tpot_ax.set_title("TPOT distribution")
    return _save(figure, out_dir, "latency")


def _highest_level(s: SeriesReport) -> LevelRow | None:
    levels = [r for r in s.levels if r.interactivity_tps is not None and (Path(r.run_dir) / RECORDS_FILE).is_file()]
    return max(levels, key=lambda r: r.concurrency or 0, default=None)


def plot_swimlanes(report: Report, out_dir: Path) -> list[Path]:
    """Per series (its highest level): a row per lane, a bar per request (colour: the play), in-flight beneath."""
    from matplotlib.ticker import MaxNLocator

    count = max(len(report.series), 1)
    figure, axes = _new_figure(2 * count, 1, height_in=2.6, sharex=False)
    for i, s in enumerate(report.series):
        lanes_ax: Axes = axes[2 * i][0]
        flight_ax: Axes = axes[2 * i + 1][0]
        level = _highest_level(s)
        if level is None:
            lanes_ax.set_title(f"{s.label}: no records")
            continue
        table = read_records(Path(level.run_dir) / RECORDS_FILE, chunks=False)
        columns = table.select(["lane", "play", "depth", "sent_ns", "end_ns"]).to_pydict()
        sent = np.asarray(columns["sent_ns"], dtype=np.float64) / 1e9
        end = np.asarray(columns["end_ns"], dtype=np.float64) / 1e9
        # Open-loop modes have no lanes (lane −1): a row per play instead. Subagents sit a little above their
        # lane's root so that the requests running beside it stay visible.
        rows = np.asarray(
            [
                (lane if lane >= 0 else play) + min(depth, 3) * 0.2
                for lane, play, depth in zip(columns["lane"], columns["play"], columns["depth"], strict=True)
            ],
            dtype=np.float64,
        )
        colors = [f"C{play % 10}" for play in columns["play"]]
        lanes_ax.hlines(rows, sent, end, colors=colors, linewidth=4)
        on_path = on_critical_path(table)
        if on_path is not None:
            lanes_ax.hlines(rows[on_path], sent[on_path], end[on_path], colors="black", linewidth=1.5, zorder=3)
        lanes_ax.set_ylabel("lane (subagents above)")
        lanes_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        marked = ", black line: the play's critical path" if on_path is not None else ""
        lanes_ax.set_title(f"{s.label} {level.label}: sessions over time (colour: play{marked})")
        times = np.concatenate([sent, end])
        steps = np.concatenate([np.ones_like(sent), -np.ones_like(end)])
        order = np.lexsort((steps, times))  # at a tie an end comes before a start
        flight_ax.step(times[order], np.cumsum(steps[order]), where="post", color="C0")
        flight_ax.set_ylabel("in flight")
        flight_ax.set_xlabel("time since the run start (s)")
        flight_ax.sharex(lanes_ax)
        flight_ax.grid(alpha=0.3)
    return _save(figure, out_dir, "swimlanes")


def on_critical_path(table: pa.Table) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
    """Which rows of a records table are on their play's critical path (agentx.results.summary.explain.critical_path);
    None for records that do not say what released each request (before format 1.11)."""
    paths = play_paths(table)
    if paths is None:
        return None
    on_path = pa.array([request_id for path in paths for request_id in path.request_ids], pa.string())
    return np.asarray(pc.is_in(table.column("request_id"), value_set=on_path).to_numpy(zero_copy_only=False), bool)


def plot_server_metrics(report: Report, out_dir: Path) -> list[Path]:
    """Per series (the swimlanes' level, on their time axis): the server's running and waiting requests beside the
    client's in-flight count, its KV-cache usage, and its prefix-cache hit rate between consecutive scrapes."""
    count = max(len(report.series), 1)
    figure, axes = _new_figure(3 * count, 1, height_in=2.2, sharex=False)
    for i, s in enumerate(report.series):
        requests_ax: Axes = axes[3 * i][0]
        usage_ax: Axes = axes[3 * i + 1][0]
        hit_ax: Axes = axes[3 * i + 2][0]
        level = _highest_level(s)
        telemetry = load_server_metrics(level.run_dir) if level is not None else None
        if level is None or telemetry is None or telemetry.num_rows == 0:
            requests_ax.set_title(f"{s.label}: no server telemetry (server_metrics.arrow)")
            continue
        records = read_records(Path(level.run_dir) / RECORDS_FILE, chunks=False)
        times = np.asarray(aligned_times_ns(telemetry, run_info(records).wall_epoch_ns), dtype=np.float64) / 1e9
        engine = server_metrics_info(telemetry.schema).engine
        sent = np.asarray(records.column("sent_ns").to_numpy(zero_copy_only=False), dtype=np.float64) / 1e9
        end = np.asarray(records.column("end_ns").to_numpy(zero_copy_only=False), dtype=np.float64) / 1e9
        edges = np.concatenate([sent, end])
        steps = np.concatenate([np.ones_like(sent), -np.ones_like(end)])
        order = np.lexsort((steps, edges))
        requests_ax.step(edges[order], np.cumsum(steps[order]), where="post", color="grey", label="in flight (client)")
        for name, color in (("requests_running", "C0"), ("requests_waiting", "C3")):
            requests_ax.plot(times, _series(telemetry, name), color=color, marker=".", label=name.replace("_", " "))
        requests_ax.set_ylabel("requests")
        requests_ax.set_title(f"{s.label} {level.label}: server telemetry ({engine})")
        requests_ax.legend(fontsize=7, loc="upper right")
        usage_ax.plot(times, 100 * _series(telemetry, "kv_cache_usage_ratio"), color="C2", marker=".")
        usage_ax.set_ylabel("KV cache used (%)")
        hits, queries = _series(telemetry, "prefix_cache_hits_total"), _series(telemetry, "prefix_cache_queries_total")
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(np.diff(queries) > 0, np.diff(hits) / np.diff(queries), np.nan)
        if np.isfinite(rate).any():
            hit_ax.step(times[1:], 100 * rate, where="pre", color="C1")
            hit_ax.set_ylabel("prefix hit (%)\nper interval")
        else:  # engines without counters expose a hit-rate gauge of their own
            hit_ax.plot(times, 100 * _series(telemetry, "prefix_cache_hit_ratio"), color="C1", marker=".")
            hit_ax.set_ylabel("prefix hit (%)\n(engine's gauge)")
        hit_ax.set_xlabel("time since the run start (s)")
        for ax in (requests_ax, usage_ax, hit_ax):
            ax.grid(alpha=0.3)
            if ax is not requests_ax:
                ax.sharex(requests_ax)
    return _save(figure, out_dir, "server_metrics")


def _series(table: pa.Table, name: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A server_metrics column as float64, nulls as NaN (gaps in the plot)."""
    column = pc.cast(table.column(name), pa.float64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def plot_chunks(report: Report, out_dir: Path) -> list[Path]:
    """Tokens per streamed content chunk, every level of each series together."""
    from matplotlib.ticker import MaxNLocator

    figure, axes = _new_figure()
    ax: Axes = axes[0][0]
    shown = False
    seen: set[int] = set()
    for i, s in enumerate(report.series):
        tokens = IntCounts()  # the kept requests' chunks, counted a batch of records at a time
        for level in s.levels:
            path = Path(level.run_dir) / RECORDS_FILE
            if path.is_file():
                tokens.merge(RunRecords.read(path).scan.tokens)
        if not tokens.count:
            continue
        shown = True
        # Bars side by side per token count, as fractions of the series' chunks.
        sizes, counts = tokens.values, tokens.counts
        width = 0.8 / max(len(report.series), 1)
        offset = (i - (len(report.series) - 1) / 2) * width
        ax.bar(sizes + offset, counts / counts.sum(), width=width, color=f"C{i}", label=s.label)
        seen.update(int(size) for size in sizes)
    if 0 < len(seen) <= 20:
        ax.set_xticks(sorted(seen))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tokens per chunk")
    ax.set_ylabel("fraction of chunks")
    ax.set_title("tokens per streamed chunk")
    ax.grid(alpha=0.3)
    if shown:
        ax.legend()
    return _save(figure, out_dir, "chunks")


PLOTS: Final = (plot_frontier, plot_cost, plot_latency, plot_swimlanes, plot_server_metrics, plot_chunks)


def write_plots(report: Report, out_dir: Path) -> list[Path]:
    """Every plot of `report` into `out_dir` as PNG and SVG; PlotsUnavailableError without matplotlib."""
    _new_figure()  # fails fast, before any file is written, when matplotlib is missing
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for plot in PLOTS:
        written += plot(report, out_dir)
    return written
