"""A report (agentx.results.report.build) as tables: for the terminal (laid out for its width,
agentx.cli.display.layout) and Markdown for `agentx report --markdown`.

Both come from one list of sections of text (`report_sections`), so they always agree; the plausibility audit's
findings (`audit_lines`) and the notes that say why a figure is missing follow the tables in both. A figure the audit
rejects carries "✗" wherever it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from agentx.cli.display.layout import Column, FittedTable, markdown_table, text_column
from agentx.results.report.build import AuditMark, Best, Report, SeriesReport, SeriesTasks, TargetRow
from agentx.results.report.cost import Cost
from agentx.results.report.notes import (
    REJECTED_MARK,
    finding_heading,
    levels_text,
    rejected_text,
    severity_mark,
)

MISSING = "—"
"""How a value that does not exist (outside the front, no price) is shown."""


def _n(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value:,.{digits}f}"


def _usd(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"${value:,.3f}" if value < 10 else f"${value:,.2f}"


def _ms(value: float | None) -> str:
    return MISSING if value is None else f"{value * 1000:,.1f}"


def _at(between: tuple[str, str] | None) -> str:
    if between is None:
        return MISSING
    return between[0] if between[0] == between[1] else f"{between[0]}–{between[1]}"


def _usd_per_task(value: float | None) -> str:
    """Dollars with two significant digits at least: a task can cost a fraction of a cent."""
    if value is None:
        return MISSING
    if value == 0 or value >= 0.01:
        return _usd(value)
    return f"${value:,.{1 - math.floor(math.log10(value))}f}"


def _figures(value: float | None) -> str:
    """Three significant digits, no exponent (seconds of GPU time span 0.01 to thousands)."""
    if value is None:
        return MISSING
    if value == 0:
        return "0"
    return f"{value:,.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def _marked(text: str, codes: Sequence[str]) -> str:
    """`text` with the mark of a figure the audit rejects, when `codes` reject it."""
    return f"{text} {REJECTED_MARK}" if codes and text != MISSING else text


def _best_cells(best: Best | None, show: str) -> list[str]:
    """A best figure and where it is, the audit's rejection said beside the level."""
    if best is None:
        return [MISSING, MISSING]
    if not best.rejected:
        return [show, best.label]
    return [_marked(show, best.rejected_by), f"{best.label} ({rejected_text(best.rejected_by)})"]


def _audit_cell(marks: Sequence[AuditMark]) -> str:
    """A level's findings, "✗bundled_output, !kv_cache_full": the mark joined to its code, so a narrow column wraps
    between findings, never between a mark and its code."""
    return ", ".join(f"{severity_mark(mark.severity)}{mark.code}" for mark in marks)


TEXT_HEADERS = frozenset({"at", "source", "series", "level", "status", "tier", "error", "front", "audit"})
"""Columns of words (wrapped to fit), not numbers."""
DROP_FIRST = {"input": 3, "output": 2, "source": 1}
"""Columns the terminal drops to fit its width, the highest first (the Markdown keeps every column)."""


class Section(msgspec.Struct, kw_only=True):
    """One table of the report as text."""

    title: str
    header: list[str]
    rows: list[list[str]]

    def columns(self) -> list[Column]:
        return [
            text_column(name) if i == 0 or name in TEXT_HEADERS else Column(name, drop=DROP_FIRST.get(name, 0))
            for i, name in enumerate(self.header)
        ]


def report_notes(report: Report) -> list[str]:
    """Why figures are missing, one line each (a level off the frontier, targets off a front, no price), with what
    to pass instead."""
    levels = [f"{s.label} {row.label}: {row.note}" for s in report.series for row in s.levels if row.note is not None]
    return levels + [note for s in report.series for note in (s.target_note, s.price_note) if note is not None]


def _name(s: SeriesReport) -> str:
    parts = [s.label] + [part for part in (s.engine, s.model) if part] + ([s.gpu_sku.upper()] if s.gpu_sku else [])
    return " · ".join(parts)


def report_sections(report: Report) -> list[Section]:
    """Each table as text: the one source of the terminal and the Markdown forms."""
    stat, basis = report.statistic, report.basis
    sections: list[Section] = []
    header = ["tok/s/user"]
    for s in report.series:
        header += [f"{_name(s)}: tok/s/GPU", f"$/M ({report.tier})", "at"]
    rows = []
    for i, target in enumerate(report.series[0].targets if report.series else []):
        row = [_n(target.target_tps, 0)]
        for s in report.series:
            t = s.targets[i]
            row += [
                _marked(_n(_basis(t, basis)), t.rejected_by),
                _marked(_usd(_basis_cost(t.cost, basis)), t.rejected_by),
                _at(t.between),
            ]
        rows.append(row)
    sections.append(
        Section(
            title=f"throughput at every interactivity target ({basis} tokens, {stat} TPOT)", header=header, rows=rows
        )
    )

    if any(t.tokens_per_joule is not None for s in report.series for t in s.targets):
        sections.append(_energy_section(report))

    header = (
        ["tier", "$/GPU/hr"]
        + [f"{s.label}: $/M total" for s in report.series]
        + [f"{s.label}: $/M output" for s in report.series]
        + ["source"]
    )
    tiers: list[str] = []
    for s in report.series:
        tiers += [c.tier for c in s.costs_at_target if c.tier not in tiers]
    rows = []
    # The cost table's figures are the targets table's at --target: rejected where that row is.
    rejected = [_target_rejected(s, report.target_tps) for s in report.series]
    for tier in tiers:
        found = [next((c for c in s.costs_at_target if c.tier == tier), None) for s in report.series]
        first = next((c for c in found if c is not None), None)
        price = first.usd_per_gpu_hour if first else None
        source = ", ".join(part for part in (first.what, first.date) if part) if first else ""
        rows.append(
            [tier, _usd(price)]
            + [_marked(_usd(c.total_usd_per_m if c else None), codes) for c, codes in zip(found, rejected, strict=True)]
            + [
                _marked(_usd(c.output_usd_per_m if c else None), codes)
                for c, codes in zip(found, rejected, strict=True)
            ]
            + [source]
        )
    sections.append(
        Section(title=f"what serving actually costs at {report.target_tps:g} tok/s/user", header=header, rows=rows)
    )

    header = [
        "series",
        "best TTFT p50 (ms)",
        "at",
        "best TPOT p50 (ms)",
        "at",
        "peak tok/s/GPU",
        "at",
        "peak output tok/s/GPU",
        "at",
    ]
    rows = []
    for s in report.series:
        rows.append(
            [
                _name(s) + ("" if s.gpus_known else " (GPUs unknown: per server)"),
                *_best_cells(s.best_ttft_s, _ms(s.best_ttft_s.value if s.best_ttft_s else None)),
                *_best_cells(s.best_tpot_s, _ms(s.best_tpot_s.value if s.best_tpot_s else None)),
                *_best_cells(
                    s.peak_total_tps_per_gpu, _n(s.peak_total_tps_per_gpu.value if s.peak_total_tps_per_gpu else None)
                ),
                *_best_cells(
                    s.peak_output_tps_per_gpu,
                    _n(s.peak_output_tps_per_gpu.value if s.peak_output_tps_per_gpu else None),
                ),
            ]
        )
    sections.append(Section(title="best latency and peak throughput across levels", header=header, rows=rows))

    for s in report.series:
        header = [
            "level",
            "status",
            "requests",
            f"tok/s/user ({stat})",
            "tok/s/GPU total",
            "output",
            "input",
            "TTFT p50 (ms)",
            "TPOT p50 (ms)",
            "front",
        ]
        # The errors and audit columns only where a level has some: a clean series' table is as it always was.
        failing = any(r.errors for r in s.levels)
        audited = any(r.audit for r in s.levels)
        rows = [
            [
                r.label,
                r.status,
                f"{r.requests:,}",
                _marked(_n(r.interactivity_tps), r.rejecting("interactivity")),
                _marked(_n(r.total_tps_per_gpu), r.rejecting("throughput")),
                _marked(_n(r.output_tps_per_gpu), r.rejecting("throughput")),
                _marked(_n(r.input_tps_per_gpu), r.rejecting("throughput")),
                _marked(_ms(r.ttft_p50_s), r.rejecting("ttft")),
                _marked(_ms(r.tpot_p50_s), r.rejecting("tpot")),
                "✓" if r.on_front else "",
            ]
            + ([(r.errors_text or "0") + (" ✗ over threshold" if r.over_failure_threshold else "")] if failing else [])
            + ([_audit_cell(r.audit)] if audited else [])
            for r in s.levels
        ]
        header += (["errors"] if failing else []) + (["audit"] if audited else [])
        sections.append(Section(title=f"levels of {_name(s)} ({s.path}, {s.num_gpus} GPU)", header=header, rows=rows))
        if s.tasks is not None:
            sections += _task_sections(s, s.tasks)
        paths = _critical_path_section(s)
        if paths is not None:
            sections.append(paths)
        goodput = _goodput_section(s)
        if goodput is not None:
            sections.append(goodput)
        errors = [[r.label, r.error] for r in s.levels if r.error is not None]
        if errors:
            sections.append(Section(title=f"failed levels of {s.label}", header=["level", "error"], rows=errors))
        if s.energy_at_target is not None:
            e = s.energy_at_target
            sections.append(
                Section(
                    title=f"energy of {s.label} at {report.target_tps:g} tok/s/user ({e.kw_per_gpu:g} kW per GPU)",
                    header=["J/token", "J/output token", "tok/s per MW", "output tok/s per MW"],
                    rows=[
                        [
                            _n(e.joules_per_token, 3),
                            _n(e.joules_per_output_token, 3),
                            _n(e.total_tps_per_mw, 0),
                            _n(e.output_tps_per_mw, 0),
                        ]
                    ],
                )
            )
    return sections


def _energy_section(report: Report) -> Section:
    """Tokens per joule and tasks per MWh of GPU energy at each interactivity target (series measured with
    `--gpu-metrics`), read along the front as the throughput is."""
    header = ["tok/s/user"]
    for s in report.series:
        header += [f"{_name(s)}: tokens/J", "tasks/MWh"]
    rows = []
    for i, target in enumerate(report.series[0].targets):
        row = [_n(target.target_tps, 0)]
        for s in report.series:
            t = s.targets[i]
            row += [_marked(_n(t.tokens_per_joule, 2), t.rejected_by), _marked(_n(t.tasks_per_mwh, 0), t.rejected_by)]
        rows.append(row)
    return Section(title="GPU energy at every interactivity target (GPU board power only)", header=header, rows=rows)


def _critical_path_section(s: SeriesReport) -> Section | None:
    """Where each level's plays spent their makespans, along their critical paths, when the runs recorded them."""
    levels = [r for r in s.levels if r.critical_path is not None]
    if not levels:
        return None
    header = ["level", "plays", "makespan mean (s)", "server", "think", "waiting on joins", "client lag", "idle cut"]
    rows = [
        [
            r.label,
            f"{r.critical_path_plays:,}",
            _n(r.play_makespan_mean_s),
            *(f"{100 * share:.1f}%" for share in (p.server_s, p.think_s, p.join_wait_s, p.client_lag_s)),
            f"−{100 * p.idle_cut_s:.1f}%",
        ]
        for r in levels
        if (p := r.critical_path) is not None
    ]
    title = f"where the plays' time went, along their critical paths, of {_name(s)} (shares of the summed makespans)"
    return Section(title=title, header=header, rows=rows)


def _goodput_section(s: SeriesReport) -> Section | None:
    """The levels' goodput, when any ran with `--slo`: the requests meeting every target, their rates."""
    judged = [r for r in s.levels if r.slo is not None]
    if not judged:
        return None
    slos = "; ".join(dict.fromkeys(r.slo for r in judged if r.slo is not None))
    rows = [
        [
            r.label,
            MISSING if r.slo_met is None else f"{r.slo_met:,} / {r.slo_judged or 0:,}",
            MISSING if r.slo_met_fraction is None else f"{100 * r.slo_met_fraction:.1f}%",
            _n(r.goodput_requests_per_s, 3),
            _n(r.goodput_output_tps_per_gpu),
        ]
        for r in judged
    ]
    header = ["level", "SLO met", "share", "goodput req/s", "good output tok/s/GPU"]
    return Section(title=f"goodput of {_name(s)} (SLO: {slos})", header=header, rows=rows)


def _task_sections(s: SeriesReport, tasks: SeriesTasks) -> list[Section]:
    """What one task costs: per level from its GPU time and per price tier; at each target from its tokens."""
    tiers = [price.tier for price in tasks.levels[0].prices] if tasks.levels else []
    header = ["level", "tasks", "tokens/task cached · uncached · output", "GPU-s/task"]
    header += [f"$/task ({tier})" for tier in tiers]
    rows = [
        [
            level.label,
            f"{level.completed:,}",
            " · ".join(_n(v, 0) for v in (level.cached_tokens, level.uncached_tokens, level.output_tokens)),
            _marked(_figures(level.gpu_s), level.rejected_by),
        ]
        + [_marked(_usd_per_task(price.usd_per_task), level.rejected_by) for price in level.prices]
        for level in tasks.levels
    ]
    sections = [
        Section(
            title=f"cost per task of {_name(s)} by level (mean per completed task; $ = GPU-s × $/GPU-hr / 3600)",
            header=header,
            rows=rows,
        )
    ]
    if tiers and tasks.total_tokens is not None:
        rows = [
            [_n(target.target_tps, 0)]
            + [_marked(_usd_per_task(price.usd_per_task), target.rejected_by) for price in target.prices]
            for target in tasks.targets
        ]
        sections.append(
            Section(
                title=(
                    f"cost per task of {_name(s)} at each interactivity target ({tasks.total_tokens:,.0f} tokens per "
                    f"task, the mean of {tasks.tasks:,} tasks; $ = tokens × $/M total / 10⁶)"
                ),
                header=["tok/s/user"] + [f"$/task ({tier})" for tier in tiers],
                rows=rows,
            )
        )
    return sections


def _target_rejected(s: SeriesReport, target_tps: float) -> list[str]:
    return next((t.rejected_by for t in s.targets if t.target_tps == target_tps), [])


def audit_lines(report: Report) -> list[str]:
    """Each distinct finding of the levels' audits: its mark, code, what it rejects, the levels, its title; then per
    level its evidence, and what to do. Empty when every run is clean."""
    lines = []
    for entry in report.audit:
        where = levels_text((found.series, found.level) for found in entry.levels)
        text = [f"{finding_heading(entry.code, entry.severity, entry.affects)} at {where}: {entry.title}"]
        text += [f"  {found.series} {found.level}: {found.evidence}" for found in entry.levels]
        text.append(f"  what to do: {entry.advice}")
        lines.append("\n".join(text))
    return lines


def _basis(target: TargetRow, basis: str) -> float | None:
    if basis == "output":
        return target.output_tps_per_gpu
    return target.input_tps_per_gpu if basis == "input" else target.total_tps_per_gpu


def _basis_cost(found: Cost | None, basis: str) -> float | None:
    if found is None:
        return None
    if basis == "output":
        return found.output_usd_per_m
    return found.input_usd_per_m if basis == "input" else found.total_usd_per_m


AUDIT_TITLE = "plausibility audit: what cannot be true in these runs (✗ error: the figure is rejected; ! warning)"


def report_tables(report: Report) -> list[FittedTable | str]:
    """The report for the terminal: its tables, the audit's findings, then its notes."""
    tables: list[FittedTable | str] = [
        FittedTable(section.title, section.columns(), section.rows) for section in report_sections(report)
    ]
    findings = audit_lines(report)
    audit: list[FittedTable | str] = [AUDIT_TITLE, *findings] if findings else []
    return tables + audit + [f"note: {note}" for note in report_notes(report)]


def report_markdown(report: Report) -> str:
    """The report as Markdown tables, the audit's findings, then its notes."""
    lines: list[str] = []
    for section in report_sections(report):
        lines += markdown_table(section.title, section.header, section.rows)
    if report.audit:
        lines += [f"### {AUDIT_TITLE}", ""]
        for entry in report.audit:
            where = levels_text((found.series, found.level) for found in entry.levels)
            lines.append(
                f"- **{finding_heading(entry.code, entry.severity, entry.affects)}** at {where}: {entry.title}"
            )
            lines += [f"  - {found.series} {found.level}: {found.evidence}" for found in entry.levels]
            lines.append(f"  - what to do: {entry.advice}")
        lines.append("")
    lines += [f"> note: {note}" for note in report_notes(report)]
    return "\n".join(lines) + ("\n" if report_notes(report) else "")
