"""Rich output for the terminal: the tables `agentx inspect` and `agentx decode` show (the live progress of
`agentx replay` is in progress.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from agentx.cli.summary_tables import acceptance_table
from agentx.trace.stats import Distribution, TraceStats

if TYPE_CHECKING:
    from agentx.run.decode import DecodeResult


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def stats_tables(stats: TraceStats, title: str = "") -> list[Table]:
    """The inspect report as three tables: overview, distributions, cache hits."""
    overview = Table(title=title or "trace", show_header=False, title_justify="left")
    overview.add_column("what", style="bold")
    overview.add_column("value", justify="right")
    shape = stats.shape
    for name, value in (
        ("sessions", f"{stats.sessions:,}"),
        ("agents (roots + subagents)", f"{stats.agents:,}"),
        ("requests", f"{stats.requests:,}"),
        ("input / output tokens", f"{stats.input_tokens:,} / {stats.output_tokens:,}"),
        ("block size · hash-id scope", f"{stats.block_size} · {stats.hash_id_scope}"),
        ("sessions with subagents", f"{shape.sessions_with_subagents:,}"),
        ("subagents: joined / background / empty", f"{shape.joined:,} / {shape.background:,} / {shape.empty:,}"),
        (
            "spawn groups · fan-out mean / max",
            f"{shape.spawn_groups:,} · {shape.mean_fan_out:.2f} / {shape.max_fan_out}",
        ),
        ("deepest nesting", str(shape.max_depth)),
    ):
        overview.add_row(name, value)
    for model, count in stats.models.items():
        overview.add_row(f"model {model or '(none)'}", f"{count:,} requests")

    distributions = Table(title="distributions", title_justify="left")
    for column in ("quantity", "count", "mean", "p50", "p90", "p99", "max"):
        if column == "quantity":
            distributions.add_column(column, no_wrap=True)
        else:
            distributions.add_column(column, justify="right", no_wrap=True)
    rows: list[tuple[str, Distribution]] = [
        ("in (tokens)", stats.in_tokens),
        ("out (tokens)", stats.out_tokens),
        ("think_time (s)", stats.think_time_s),
        ("api_time (s)", stats.api_time_s),
        ("requests/session", stats.requests_per_session),
        ("peak context/session (tokens)", stats.peak_context_tokens),
        ("session length (s)", stats.session_duration_s),
    ]
    for name, dist in rows:
        digits = 2 if "(s)" in name else 0
        distributions.add_row(
            name,
            f"{dist.count:,}",
            *(_number(v, digits) for v in (dist.mean, dist.p50, dist.p90, dist.p99, dist.max)),
        )

    cache = Table(title="prefix-cache hit (blocks)", title_justify="left")
    cache.add_column("cache")
    cache.add_column("hit rate", justify="right")
    cache.add_column("hit / total blocks", justify="right")
    hit = stats.theoretical_hit
    cache.add_row("theoretical (infinite, causal)", f"{100 * hit.rate:.2f}%", f"{hit.hits:,} / {hit.total:,}")
    for lru in stats.lru_hits:
        cache.add_row(f"LRU {lru.capacity_tokens:,} tokens", f"{100 * lru.rate:.2f}%", f"{lru.hits:,} / {lru.total:,}")
    return [overview, distributions, cache]


def decode_tables(result: DecodeResult, title: str = "decode-only speed") -> list[Table]:
    """The result as rich tables: decode tokens/s per user, then the acceptance (a mismatch in red)."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    o = result.options
    table.add_row(
        "ISL · OSL · concurrency · repetitions",
        f"{o['isl_tokens']} · {o['osl_tokens']} · {o['concurrency']} · {o['repetitions']}",
    )
    speed = result.decode_tps
    if speed is None:
        table.add_row("decode tokens/s per user", "–")
    else:
        table.add_row("decode tokens/s per user p50 / p90", f"{speed.p50:,.1f} / {speed.p90:,.1f}")
        table.add_row("mean · min · max", f"{speed.mean:,.1f} · {speed.min:,.1f} · {speed.max:,.1f}")
        table.add_row("requests measured", f"{speed.count:,}")
    realized = result.acceptance.realized_al
    source = f" ({result.acceptance.realized_source})" if result.acceptance.realized_source else ""
    table.add_row("realized AL", ("–" if realized is None else f"{realized:.3f}") + source)
    if result.failed:
        table.add_row("[bold red]failed requests[/]", f"[bold red]{result.failed:,}[/]")
    return [table, acceptance_table(result.acceptance)]
