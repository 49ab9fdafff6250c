"""Rich tables for the terminal: what `agentx inspect` shows."""

from __future__ import annotations

from rich.table import Table

from agentx.trace.stats import Distribution, TraceStats


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
