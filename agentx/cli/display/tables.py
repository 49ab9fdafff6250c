"""The tables `agentx inspect` and `agentx decode` show, laid out for the terminal's width (agentx.cli.display.layout;
the live progress of `agentx replay` is in progress.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from agentx.cli.display.layout import Column, FittedTable, text_column
from agentx.cli.display.summary_tables import acceptance_table
from agentx.trace.stats import Distribution, TraceStats

if TYPE_CHECKING:
    from agentx.run.decode import DecodeResult


GAPS_CAPTION: Final = (
    "Replay waits the turn gaps, never the think times: after an agent's turn completes, its next turn's recorded "
    "start minus that turn's recorded end (× --delay-scale). --mode trace starts sessions the session start gaps "
    "apart (÷ --speedup)."
)


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def stats_tables(stats: TraceStats, title: str = "") -> list[FittedTable]:
    """The inspect report as three tables: overview, distributions, cache hits."""
    shape = stats.shape
    rows = [
        ("sessions", f"{stats.sessions:,}"),
        ("agents (roots + subagents)", f"{stats.agents:,}"),
        ("requests", f"{stats.requests:,}"),
        ("input · output tokens", f"{stats.input_tokens:,} · {stats.output_tokens:,}"),
        ("block size · hash-id scope", f"{stats.block_size} · {stats.hash_id_scope}"),
        ("sessions with subagents", f"{shape.sessions_with_subagents:,}"),
        ("subagents: joined · background · empty", f"{shape.joined:,} · {shape.background:,} · {shape.empty:,}"),
        (
            "spawn groups · fan-out mean · max",
            f"{shape.spawn_groups:,} · {shape.mean_fan_out:.2f} · {shape.max_fan_out}",
        ),
        ("deepest nesting", str(shape.max_depth)),
    ]
    rows += [(f"model {model or '(none)'}", f"{count:,} requests") for model, count in stats.models.items()]
    overview = FittedTable(title or "trace", [text_column("what"), Column("value")], rows, show_header=False)

    # `recorded`: a field a trace may leave out, so that no value at all means the trace does not say.
    distributions: list[tuple[str, Distribution, bool]] = [
        ("in (tokens)", stats.in_tokens, False),
        ("out (tokens)", stats.out_tokens, False),
        ("think time (s)", stats.think_time_s, True),
        ("turn gap (s)", stats.turn_gap_s, False),
        ("session start gap (s)", stats.session_start_gap_s, False),
        ("API time (s)", stats.api_time_s, True),
        ("requests/session", stats.requests_per_session, False),
        ("peak context/session (tokens)", stats.peak_context_tokens, False),
        ("session length (s)", stats.session_duration_s, False),
    ]
    distribution_rows = [
        [
            name,
            f"{dist.count:,}",
            *(_number(v, 2 if "(s)" in name else 0) for v in (dist.mean, dist.p50, dist.p90, dist.p99, dist.max)),
        ]
        if dist.count
        else [name, "0", "not recorded" if recorded else "–", "–", "–", "–", "–"]
        for name, dist, recorded in distributions
    ]
    distribution_table = FittedTable(
        "distributions",
        [
            text_column("quantity"),
            Column("n", drop=1),
            Column("mean"),
            Column("p50"),
            Column("p90"),
            Column("p99"),
            Column("max", drop=2),
        ],
        distribution_rows,
        caption=GAPS_CAPTION,
    )

    hit = stats.theoretical_hit
    cache_rows = [["theoretical (infinite, causal)", f"{100 * hit.rate:.2f}%", f"{hit.hits:,} / {hit.total:,}"]]
    cache_rows += [
        [f"LRU {lru.capacity_tokens:,} tokens", f"{100 * lru.rate:.2f}%", f"{lru.hits:,} / {lru.total:,}"]
        for lru in stats.lru_hits
    ]
    cache = FittedTable(
        "prefix-cache hit (blocks)",
        [text_column("cache"), Column("hit rate"), Column("hit / total blocks", drop=1)],
        cache_rows,
    )
    return [overview, distribution_table, cache]


def decode_tables(result: DecodeResult, title: str = "decode-only speed") -> list[FittedTable]:
    """The result as tables: decode tokens/s per user, then the acceptance (a mismatch in red).

    Percentiles of tokens/s per user follow the summary's direction: p90 is the speed 90% of requests reached
    at least (the slow tail; docs/replay.md)."""
    o = result.options
    rows = [
        (
            "ISL · OSL · concurrency · repetitions",
            f"{o['isl_tokens']} · {o['osl_tokens']} · {o['concurrency']} · {o['repetitions']}",
        )
    ]
    speed = result.decode_tps
    if speed is None:
        rows.append(("decode tokens/s per user", "–"))
    else:
        rows.append(("decode tokens/s per user p50 · p90", f"{speed.p50:,.1f} · {speed.p90:,.1f}"))
        rows.append(("mean · min · max", f"{speed.mean:,.1f} · {speed.min:,.1f} · {speed.max:,.1f}"))
        rows.append(("requests measured", f"{speed.count:,}"))
    realized = result.acceptance.realized_al
    source = f" ({result.acceptance.realized_source})" if result.acceptance.realized_source else ""
    rows.append(("realized AL", ("–" if realized is None else f"{realized:.3f}") + source))
    if result.failed:
        rows.append(("[bold red]failed requests[/]", f"[bold red]{result.failed:,}[/]"))
    table = FittedTable(title, [text_column("what"), Column("value")], rows, show_header=False)
    return [table, acceptance_table(result.acceptance)]
