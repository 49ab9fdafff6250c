"""The summary of a run and its speculative acceptance as tables for the terminal (`agentx replay`, `agentx
decode`), laid out for its width (agentx.cli.display.layout)."""

from __future__ import annotations

from collections.abc import Callable

from agentx.cli.display.layout import Column, FittedTable, text_column
from agentx.results.summary.checks.acceptance import Acceptance
from agentx.results.summary.checks.audit import Audit, Figure
from agentx.results.summary.checks.validity import DISPATCH_LAG_MAX_P99_S, Validity
from agentx.results.summary.energy import Energy
from agentx.results.summary.explain.cache_misses import CacheMisses
from agentx.results.summary.explain.critical_path import CriticalPath
from agentx.results.summary.goodput import slo_text
from agentx.results.summary.model import Interactivity, Summary
from agentx.results.summary.server_telemetry import ServerTelemetry
from agentx.results.summary.stats import Stats, percentile_key


def _s(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float) -> str:
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}%"


def _at(stats: Stats | Interactivity, p: float) -> float | None:
    """The `p`-th percentile, or None for a summary that did not compute it (an older run.json)."""
    try:
        return stats.at(p)
    except KeyError:
        return None


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:,.2f}"


def _key_values(title: str, rows: list[tuple[str, str]]) -> FittedTable:
    return FittedTable(title, [text_column("what"), Column("value")], rows, show_header=False)


def summary_table(summary: Summary, title: str = "") -> list[FittedTable]:
    """The summary as tables laid out for the terminal's width: overview, validity, acceptance and audit (when they
    have something to say), latency, slowdown vs the trace (when known), cache, and why it missed, the critical path
    and the server's telemetry (when known). Metric names are vLLM's and AIPerf's (docs/replay.md)."""
    rows = _count_rows(summary) + _rate_rows(summary) + _run_rows(summary)
    tables: list[FittedTable] = [_key_values(title or f"run {summary.run_id or ''}".strip(), rows)]
    if summary.validity is not None and summary.validity.applies and not summary.validity.valid:
        tables.append(validity_table(summary.validity))
    if summary.acceptance is not None:
        tables.append(acceptance_table(summary.acceptance))
    if summary.audit is not None and summary.audit.findings:
        tables.append(audit_table(summary.audit))
    tables.append(latency_table(summary))
    if (slowdown := slowdown_table(summary)) is not None:
        tables.append(slowdown)
    tables.append(cache_table(summary))
    if summary.cache_misses is not None:
        tables.append(cache_misses_table(summary.cache_misses))
    if summary.critical_path is not None:
        tables.append(critical_path_table(summary.critical_path))
    if summary.server_telemetry is not None:
        tables.append(telemetry_table(summary.server_telemetry))
    if summary.energy is not None:
        tables.append(energy_table(summary.energy))
    return tables


def _count_rows(summary: Summary) -> list[tuple[str, str]]:
    """What was sent and what came back: successes, errors by kind, cancellations, answers the server got wrong."""
    rows: list[tuple[str, str]] = []
    c = summary.counts
    errors = c.errors_text() or "none"
    rows.append(("profiling requests succeeded / sent", f"{c.kept:,} / {c.profiling:,}"))
    rows.append(("errors", f"{c.errors:,} ({errors})"))
    rows.append(("cancelled · warmup excluded", f"{c.cancelled:,} · {c.warmup_excluded:,}"))
    if c.server_notices:
        wrong = ", ".join(f"{kind} {count:,}" for kind, count in c.server_notices.items())
        rows.append(("answers the server got wrong", wrong))
    return rows


def _rate_rows(summary: Summary) -> list[tuple[str, str]]:
    """How fast, and whether on time: throughput (per GPU when known), goodput, dispatch and event-loop lag, QPS."""
    rows: list[tuple[str, str]] = []
    t = summary.throughput
    if t is not None:
        rows.append(("duration (s)", _s(t.duration_s, 1)))
        rows.append(
            ("input · output · total (tok/s)", f"{t.input_tps:,.1f} · {t.output_tps:,.1f} · {t.total_tps:,.1f}")
        )
        if t.num_gpus is not None:
            rows.append(
                (
                    f"per GPU ({t.num_gpus}): input · output · total (tok/s)",
                    f"{_s(t.input_tps_per_gpu, 1)} · {_s(t.output_tps_per_gpu, 1)} · {_s(t.total_tps_per_gpu, 1)}",
                )
            )
        rows.append(("requests/s", _s(t.requests_per_s, 3)))
    good = summary.goodput
    if good is not None:
        met = f"{good.met:,} / {good.judged:,}" + ("" if good.met_fraction is None else f" ({_pct(good.met_fraction)})")
        rows.append((f"SLO met ({slo_text(good.targets_s) or '--slo'})", met))
        rows.append(("goodput: requests/s · output tok/s", f"{_s(good.requests_per_s)} · {_s(good.output_tps, 1)}"))
    lag = summary.dispatch_lag
    if lag is not None:
        behind = " BEHIND SCHEDULE" if lag.p99_s > DISPATCH_LAG_MAX_P99_S else ""
        rows.append(
            ("dispatch lag p50 · p99 · max (ms)", f"{_ms(lag.p50_s)} · {_ms(lag.p99_s)} · {_ms(lag.max_s)}{behind}")
        )
    loop = summary.loop_lag
    if loop is not None:
        rows.append(
            ("event-loop lag p50 · p99 · max (ms)", f"{_ms(loop.p50_s)} · {_ms(loop.p99_s)} · {_ms(loop.max_s)}")
        )
    qps = summary.inferencex.qps if summary.inferencex is not None else None
    if qps is not None and qps.p90 is not None:
        rows.append(
            ("QPS in 1 s windows: mean · p50 · p90", f"{_s(qps.mean, 2)} · {_s(qps.p50, 1)} · {_s(qps.p90, 1)}")
        )
    return rows


def _run_rows(summary: Summary) -> list[tuple[str, str]]:
    """What the run was: its rules and validity, what it detected, its plays and tasks, its shards, its acceptance."""
    rows: list[tuple[str, str]] = []
    if summary.rules is not None:
        rows.append(("AgentX rules", summary.rules))
    if summary.validity is not None:
        why = " (why below)" if summary.validity.applies and not summary.validity.valid else ""
        rows.append(("valid AgentX submission", summary.validity.verdict() + why))
    if summary.stream_usage:
        rows.append(("stream usage", summary.stream_usage))
    if summary.calibration:
        rows.append(("chat calibration", ", ".join(f"{k}={v}" for k, v in summary.calibration.items())))
    r = summary.rollups
    if r.play_makespan_s is not None:
        rows.append(
            (
                "plays · makespan p50 · max (s)",
                f"{len(r.plays):,} · {_s(r.play_makespan_s.p50, 1)} · {_s(r.play_makespan_s.max, 1)}",
            )
        )
    tasks = summary.tasks
    if tasks is not None:
        rows.append(("tasks: completed · cut · failed", f"{tasks.completed:,} · {tasks.cut:,} · {tasks.failed:,}"))
        if tasks.total_tokens is not None and tasks.uncached_tokens is not None and tasks.output_tokens is not None:
            cached = tasks.cached_tokens.mean if tasks.cached_tokens is not None else None
            tokens = f"{_s(cached, 0)} · {tasks.uncached_tokens.mean:,.0f} · {tasks.output_tokens.mean:,.0f}"
            rows.append(("per task, mean tokens: cached · uncached · output", tokens))
        if tasks.makespan_s is not None:
            gpu_s = "" if tasks.gpu_s is None else f" · {tasks.gpu_s.mean:,.1f} GPU-s"
            rows.append(("per task, mean: makespan (s) · GPU time", f"{tasks.makespan_s.mean:,.1f}{gpu_s}"))
    shards = summary.shards
    if shards is not None:
        lost = ", ".join(map(str, shards.lost)) or "none"
        rows.append(("Ray shards · nodes · lost", f"{shards.count} · {shards.nodes} · {lost}"))
        drift = "—" if shards.clock_drift_max_s is None else _ms(shards.clock_drift_max_s)
        clocks = f"{_ms(shards.clock_error_max_s)} · {drift}"
        rows.append(("shard clocks: bound · drift max (ms)", clocks))
        if shards.clock_warning is not None:
            rows.append(("[bold red]shard clocks[/]", f"[bold red]{shards.clock_warning}[/]"))
    if summary.acceptance is not None and summary.acceptance.mismatch:
        rows.append(("[bold red]speculative acceptance[/]", "[bold red]MISMATCH (see below)[/]"))
    return rows


def latency_table(summary: Summary) -> FittedTable:
    """TTFT, TPOT, ITL, E2EL and tokens per chunk at the run's percentiles, figures the audit rejects marked, and the
    interactivity beside them."""
    lat = summary.latency
    shown = summary.percentiles
    latency_rows: list[list[str]] = []
    audit = summary.audit or Audit()
    rejected = "  [bold red]✗ audit[/]"
    latency_figures: list[tuple[str, Stats | None, Callable[[float | None], str], Figure | None]] = [
        ("TTFT (ms)", lat.ttft_s, _ms, "ttft"),
        ("TPOT (ms)", lat.tpot_s, _ms, "tpot"),
        ("ITL (ms)", lat.itl_s, _ms, "itl"),
        ("E2EL (ms)", lat.e2el_s, _ms, "e2el"),
        ("tokens/chunk", lat.chunk_tokens, lambda v: _s(v, 2), None),
    ]
    for name, stats, unit, figure in latency_figures:
        if figure is not None and audit.rejects(figure):
            name += rejected
        if stats is None:
            latency_rows.append([name, "0", *("–" for _ in range(len(shown) + 2))])
            continue
        values = [stats.mean, *(_at(stats, p) for p in shown), stats.std]
        latency_rows.append([name, f"{stats.count:,}", *(unit(v) for v in values)])
    i = lat.interactivity_tps
    inferencex = summary.inferencex
    extra: list[tuple[str, Interactivity | None]] = [("interactivity (tok/s/user)", i)]
    if inferencex is not None:
        extra += [
            ("full-response interactivity", inferencex.full_response_interactivity_tps),
            ("E2E-normalized interactivity", inferencex.e2e_norm_interactivity_tps),
        ]
    for name, rate in extra:
        if audit.rejects("interactivity"):
            name += rejected
        if rate is not None:
            values = [rate.mean, *(_at(rate, p) for p in shown), rate.std]
            latency_rows.append([name, "", *(_s(v, 1) for v in values)])
    # The first and last percentiles asked for stay longest; the ones between go first, then the std.
    middle = {p: len(shown) - k for k, p in enumerate(shown[1:-1], start=1)}
    return FittedTable(
        "latency",
        [
            text_column("metric"),
            Column("n"),
            Column("mean"),
            *(Column(percentile_key(p), drop=middle.get(p, 0)) for p in shown),
            Column("std", drop=len(shown) + 1),
        ],
        latency_rows,
        caption="interactivity = 1/TPOT; pN = 1/(pN TPOT): N% of requests at least this fast; full-response: TPOT "
        "to the end of the response (InferenceX's AgentX interactivity); E2E-normalized: 1/(E2EL/OSL)"
        if i is not None
        else None,
    )


def slowdown_table(summary: Summary) -> FittedTable | None:
    """How much slower than the trace's recorded server times each play, session and request went; None when the
    trace recorded none."""
    slow = summary.slowdown
    if all(x is None for x in (slow.requests, slow.sessions, slow.plays, slow.ttft)):
        return None
    slowdown_rows: list[list[str]] = []
    for name, stats in (
        ("play (Σ server time)", slow.plays),
        ("session (Σ server time)", slow.sessions),
        ("request (server time)", slow.requests),
        ("request TTFT", slow.ttft),
    ):
        if stats is None:
            slowdown_rows.append([name, "0", *("–" for _ in range(4))])
        else:
            slowdown_rows.append(
                [name, f"{stats.count:,}", *(_ratio(v) for v in (stats.mean, stats.p50, stats.p90, stats.p99))]
            )
    return FittedTable(
        "slowdown vs the trace's recorded times (×)",
        [text_column("per"), Column("n"), Column("mean"), Column("p50"), Column("p90"), Column("p99")],
        slowdown_rows,
    )


def cache_table(summary: Summary) -> FittedTable:
    """The prefix-cache hit by source: the usage, the server's counters, and the bounds of the run and the trace."""
    cache_rows = [
        [
            f"usage cached tokens ({summary.cache.usage_reported_requests:,} requests)",
            _pct(summary.cache.usage_hit_rate),
        ],
        ["server (vLLM counters)", _pct(summary.cache.server_hit_rate)],
        ["bound: infinite cache of what the run sent", _pct(summary.cache.replayed_hit_rate)],
        ["theoretical: the trace's, per turn (AgentX)", _pct(summary.cache.theoretical_hit_rate)],
    ]
    return FittedTable("prefix-cache hit", [text_column("source"), Column("hit rate")], cache_rows)


def cache_misses_table(misses: CacheMisses) -> FittedTable:
    """The uncached prompt tokens by cause, and the hit beside the bounds on the server's grid (docs/results.md)."""
    uncached = misses.uncached_tokens

    def share(tokens: int) -> str:
        return _pct(tokens / uncached if uncached else None)

    rows = [
        [name, f"{tokens:,}", share(tokens)]
        for name, tokens in (
            ("first seen", misses.first_seen_tokens),
            ("cache-bust scope (sent under another marker)", misses.cache_bust_scope_tokens),
            ("block-boundary remainder", misses.block_boundary_tokens),
            ("seen before but not hit (evicted, elsewhere)", misses.seen_not_hit_tokens),
            (f"uncached ({misses.requests:,} requests)", uncached),
        )
    ]
    lru = "–" if misses.lru_hit_rate is None else _pct(misses.lru_hit_rate)
    rows.append(
        [
            "hit: achieved · LRU of the server's size · bound",
            f"{_pct(misses.achieved_hit_rate)} · {lru} · {_pct(misses.replayed_hit_rate)}",
            "",
        ]
    )
    return FittedTable("why the cache missed", [text_column("cause"), Column("tokens"), Column("share")], rows)


def critical_path_table(path: CriticalPath) -> FittedTable:
    """Where the plays' time went along their critical paths, summed over the plays (docs/results.md)."""
    parts, shares = path.parts, path.shares
    rows = [
        [name, _s(seconds, 3), _pct(share)]
        for name, seconds, share in (
            ("server time", parts.server_s, shares.server_s),
            ("think (recorded × delay scale)", parts.think_s, shares.think_s),
            ("waiting on joins", parts.join_wait_s, shares.join_wait_s),
            ("client lag", parts.client_lag_s, shares.client_lag_s),
            ("idle caps' cut (subtracted)", -parts.idle_cut_s, -shares.idle_cut_s),
            (f"makespan ({path.plays:,} plays)", path.makespan_s, 1.0),
        )
    ]
    return FittedTable(
        "where the plays' time went (critical path)", [text_column("part"), Column("s"), Column("share")], rows
    )


def telemetry_table(telemetry: ServerTelemetry) -> FittedTable:
    """The server's `/metrics` over the profiling phase: running and waiting requests, KV-cache usage, hit rate."""
    rows: list[list[str]] = []
    for name, level, mean, peak in (
        ("running requests", telemetry.requests_running, lambda v: _s(v, 1), lambda v: _s(v, 0)),
        ("waiting requests", telemetry.requests_waiting, lambda v: _s(v, 1), lambda v: _s(v, 0)),
        ("KV-cache usage", telemetry.kv_cache_usage_ratio, _pct, _pct),
    ):
        if level is not None:
            rows.append([name, mean(level.mean), peak(level.peak)])
    if telemetry.prefix_cache_hit_rate is not None:
        rows.append(
            [f"prefix-cache hit ({telemetry.prefix_cache_hit_source})", _pct(telemetry.prefix_cache_hit_rate), ""]
        )
    scrapes = f"{telemetry.window_scrapes:,} scrapes, every {telemetry.interval_s:g} s"
    return FittedTable(
        f"server telemetry ({telemetry.engine}, {scrapes})",
        [text_column("series"), Column("mean"), Column("peak")],
        rows,
    )


def energy_table(energy: Energy) -> FittedTable:
    """The GPUs' energy over the throughput window (`--gpu-metrics`): per token and per task, watts per GPU."""

    def number(value: float | None, digits: int) -> str:
        return "–" if value is None else f"{value:,.{digits}f}"

    peaks = [gpu.peak_w for gpu in energy.gpus if gpu.peak_w is not None]
    per_gpu = energy.mean_w / len(energy.gpus) if energy.gpus else None
    peak = max(peaks) if peaks else None
    rows = [
        ("energy (J) · window (s)", f"{energy.energy_j:,.0f} · {energy.window_s:,.1f}"),
        ("J per output token · per token", f"{number(energy.joules_per_output_token, 3)} · "
                                            f"{number(energy.joules_per_token, 4)}"),
        ("J per completed task · tasks per MWh", f"{number(energy.joules_per_task, 0)} · "
                                                  f"{number(energy.tasks_per_mwh, 0)}"),
        ("tokens per J · output tokens per J", f"{number(energy.tokens_per_joule, 1)} · "
                                                f"{number(energy.output_tokens_per_joule, 3)}"),
        (f"W per GPU ({len(energy.gpus)}): mean · peak", f"{number(per_gpu, 0)} · {number(peak, 0)}"),
    ]  # fmt: skip
    return _key_values(f"GPU energy ({energy.source}, every {energy.interval_s:g} s; GPU board power only)", rows)


def audit_table(audit: Audit) -> FittedTable:
    """The plausibility audit's findings: each one's severity and code, what is wrong, its evidence, what to do."""
    rows = [
        [
            f"[bold red]{finding.code}[/]" if finding.severity == "error" else f"[yellow]{finding.code}[/]",
            f"{finding.title}: {finding.evidence}. {finding.advice}",
        ]
        for finding in audit.findings
    ]
    errors = sum(finding.severity == "error" for finding in audit.findings)
    return FittedTable(
        f"plausibility audit: {len(rows)} finding{'s' * (len(rows) != 1)}, {errors} rejecting figures "
        "(✗ audit; docs/results.md)",
        [text_column("finding"), text_column("what, evidence, what to do")],
        rows,
    )


def validity_table(validity: Validity) -> FittedTable:
    """Why a run is not a valid AgentX submission: each reason's code and its sentence with the figure."""
    explained = [(reason.code, reason.message) for reason in validity.explained]
    known = {code for code, _ in explained}
    # A run.json from before the sentences existed has the codes only.
    explained += [(code, code.replace("_", " ")) for code in validity.reasons if code not in known]
    return FittedTable(
        "why the run is not a valid AgentX submission (docs/agentx.md §5)",
        [text_column("reason"), text_column("because")],
        explained,
    )


def acceptance_table(result: Acceptance) -> FittedTable:
    """The acceptance as a table; a mismatch is in its title, in red."""
    if result.mismatch:
        title = "[bold red]speculative acceptance: MISMATCH — " + "; ".join(result.mismatch_reasons) + "[/]"
    else:
        title = "speculative acceptance"
    rows: list[tuple[str, str]] = []
    forced = "none" if result.forced_al is None else f"{result.forced_al:g}"
    k = "–" if result.spec_k is None else str(result.spec_k)
    rows.append(("forced AL · K · tolerance", f"{forced} · {k} · ±{result.tolerance:g}"))
    source = f" ({result.realized_source})" if result.realized_source else ""
    rows.append(("realized AL", _s(result.realized_al) + source))
    c = result.counters
    if c is not None:
        window = "Δ over the run" if c.window == "run" else "server gauge"
        rows.append((f"counters ({c.engine}, {window}) AL", _s(c.acceptance_length)))
        rows.append(("draft acceptance rate", _s(c.draft_acceptance_rate)))
        if c.per_position_rates:
            rows.append(("acceptance by position", " ".join(f"{rate:.2f}" for rate in c.per_position_rates)))
        if c.draft_tokens_per_step is not None:
            rows.append(("draft tokens per step (K)", _s(c.draft_tokens_per_step, 2)))
    s = result.stream
    if s is not None:
        rows.append(
            (
                f"stream tokens/step (interval {s.stream_interval}"
                + (", steps told apart by gaps" if s.grouped_by_gap else "")
                + ")",
                f"{s.tokens_per_step:.3f} over {s.chunks:,} chunks of {s.requests:,} requests",
            )
        )
    return _key_values(title, rows)
