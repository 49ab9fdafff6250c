"""The summary of a run and its speculative acceptance as rich tables, for the terminal (`agentx replay`,
`agentx decode`)."""

from __future__ import annotations

from rich.table import Table

from agentx.results.acceptance import Acceptance
from agentx.results.summary_model import Summary
from agentx.results.validity import DISPATCH_LAG_MAX_P99_S


def _s(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float) -> str:
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}%"


def summary_table(summary: Summary, title: str = "") -> list[Table]:
    """The summary as compact rich tables: overview, latency, slowdown vs the trace (when known), cache."""
    overview = Table(title=title or f"run {summary.run_id or ''}".strip(), show_header=False, title_justify="left")
    overview.add_column("what", style="bold")
    overview.add_column("value", justify="right")
    c = summary.counts
    errors = ", ".join(f"{k} {v:,}" for k, v in c.errors_by_kind.items()) or "none"
    overview.add_row("requests kept / profiling", f"{c.kept:,} / {c.profiling:,}")
    overview.add_row("errors", f"{c.errors:,} ({errors})")
    overview.add_row("cancelled · warmup excluded", f"{c.cancelled:,} · {c.warmup_excluded:,}")
    t = summary.throughput
    if t is not None:
        overview.add_row("duration (s)", _s(t.duration_s, 1))
        overview.add_row(
            "input / output / total (tok/s)", f"{t.input_tps:,.1f} / {t.output_tps:,.1f} / {t.total_tps:,.1f}"
        )
        if t.num_gpus is not None:
            overview.add_row(
                f"per GPU ({t.num_gpus}) input / output / total",
                f"{_s(t.input_tps_per_gpu, 1)} / {_s(t.output_tps_per_gpu, 1)} / {_s(t.total_tps_per_gpu, 1)}",
            )
        overview.add_row("requests/s", _s(t.requests_per_s, 3))
    lag = summary.dispatch_lag
    if lag is not None:
        behind = " BEHIND SCHEDULE" if lag.p99_s > DISPATCH_LAG_MAX_P99_S else ""
        overview.add_row(
            "dispatch lag p50 / p99 / max (s)", f"{_s(lag.p50_s)} / {_s(lag.p99_s)} / {_s(lag.max_s)}{behind}"
        )
    loop = summary.loop_lag
    if loop is not None:
        overview.add_row(
            "event-loop lag p50 / p99 / max (s)", f"{_s(loop.p50_s)} / {_s(loop.p99_s)} / {_s(loop.max_s)}"
        )
    if summary.validity is not None:
        verdict = "yes" if summary.validity.valid else "no: " + ", ".join(summary.validity.reasons)
        overview.add_row("valid AgentX submission", verdict)
    if summary.stream_usage:
        overview.add_row("stream usage", summary.stream_usage)
    if summary.calibration:
        overview.add_row("chat calibration", ", ".join(f"{k}={v}" for k, v in summary.calibration.items())[:80])
    r = summary.rollups
    if r.play_makespan_s is not None:
        overview.add_row(
            "plays · makespan p50 / max (s)",
            f"{len(r.plays):,} · {_s(r.play_makespan_s.p50, 1)} / {_s(r.play_makespan_s.max, 1)}",
        )

    latency = Table(title="latency", title_justify="left")
    latency.add_column("metric", no_wrap=True)
    for column in ("count", "mean", "p50", "p90", "p95", "p99", "std"):
        latency.add_column(column, justify="right", no_wrap=True)
    lat = summary.latency
    for name, stats, digits in (
        ("TTFT (s)", lat.ttft_s, 3),
        ("E2E (s)", lat.e2e_s, 3),
        ("ITL (s)", lat.itl_s, 4),
        ("chunk ITL (s)", lat.chunk_itl_s, 4),
        ("tokens/chunk", lat.chunk_tokens, 2),
    ):
        if stats is None:
            latency.add_row(name, "0", *("–" for _ in range(6)))
            continue
        latency.add_row(
            name,
            f"{stats.count:,}",
            *(_s(v, digits) for v in (stats.mean, stats.p50, stats.p90, stats.p95, stats.p99, stats.std)),
        )
    i = lat.interactivity_tps
    if i is not None:
        latency.add_row("interactivity (tok/s)", "", *(_s(v, 1) for v in (i.mean, i.p50, i.p90, i.p95, i.p99, i.std)))

    tables = [overview, latency]
    if summary.acceptance is not None:
        if summary.acceptance.mismatch:
            overview.add_row("[bold red]speculative acceptance[/]", "[bold red]MISMATCH (see below)[/]")
        tables.insert(1, acceptance_table(summary.acceptance))
    slow = summary.slowdown
    if any(x is not None for x in (slow.requests, slow.sessions, slow.plays, slow.ttft)):
        slowdown = Table(title="slowdown vs the trace's recorded times (×)", title_justify="left")
        slowdown.add_column("per", no_wrap=True)
        for column in ("count", "mean", "p50", "p90", "p99"):
            slowdown.add_column(column, justify="right", no_wrap=True)
        for name, stats in (
            ("play (Σ server time)", slow.plays),
            ("session (Σ server time)", slow.sessions),
            ("request (server time)", slow.requests),
            ("request TTFT", slow.ttft),
        ):
            if stats is None:
                slowdown.add_row(name, "0", *("–" for _ in range(4)))
            else:
                slowdown.add_row(
                    name, f"{stats.count:,}", *(_ratio(v) for v in (stats.mean, stats.p50, stats.p90, stats.p99))
                )
        tables.append(slowdown)

    cache = Table(title="prefix-cache hit", title_justify="left")
    cache.add_column("source")
    cache.add_column("hit rate", justify="right")
    cache.add_row(
        f"usage cached tokens ({summary.cache.usage_reported_requests:,} requests)", _pct(summary.cache.usage_hit_rate)
    )
    cache.add_row("server (vLLM counters)", _pct(summary.cache.server_hit_rate))
    cache.add_row("theoretical (trace)", _pct(summary.cache.theoretical_hit_rate))
    tables.append(cache)
    return tables


def acceptance_table(result: Acceptance) -> Table:
    """The acceptance as a rich table; a mismatch is in its title, in red."""
    if result.mismatch:
        title = "[bold red]speculative acceptance: MISMATCH — " + "; ".join(result.mismatch_reasons) + "[/]"
    else:
        title = "speculative acceptance"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    forced = "none" if result.forced_al is None else f"{result.forced_al:g}"
    k = "–" if result.spec_k is None else str(result.spec_k)
    table.add_row("forced AL · K · tolerance", f"{forced} · {k} · ±{result.tolerance:g}")
    source = f" ({result.realized_source})" if result.realized_source else ""
    table.add_row("realized AL", _s(result.realized_al) + source)
    c = result.counters
    if c is not None:
        window = "Δ over the run" if c.window == "run" else "server gauge"
        table.add_row(f"counters ({c.engine}, {window}) AL", _s(c.acceptance_length))
        table.add_row("draft acceptance rate", _s(c.draft_acceptance_rate))
        if c.per_position_rates:
            table.add_row("acceptance by position", " ".join(f"{rate:.2f}" for rate in c.per_position_rates))
        if c.draft_tokens_per_step is not None:
            table.add_row("draft tokens per step (K)", _s(c.draft_tokens_per_step, 2))
    s = result.stream
    if s is not None:
        table.add_row(
            f"stream tokens/step (interval {s.stream_interval}"
            + (", steps told apart by gaps" if s.grouped_by_gap else "")
            + ")",
            f"{s.tokens_per_step:.3f} over {s.chunks:,} chunks of {s.requests:,} requests",
        )
    return table
