"""A comparison (agentx.results.compare.build) as sections of text: terminal tables (laid out for the width) and
Markdown for `agentx compare --markdown`, from the same sections so they always agree."""

from __future__ import annotations

from agentx.cli.display.layout import Column, FittedTable, markdown_table, text_column
from agentx.results.compare.build import Comparison, Row, Versus
from agentx.results.compare.gate import GateResult
from agentx.results.compare.sides import Side
from agentx.results.compare.sweeps import SweepVersus
from agentx.results.report.html import TableSection

MISSING = "—"
TEXT_HEADERS = frozenset(
    {
        "metric",
        "verdict",
        "run",
        "sweep",
        "audit",
        "differs in",
        "target",
        "$ per task",
        "finding",
        "bound",
        "gate",
        "why",
    }
)


class Section:
    """One table: a title, a header and rows of text (`TableSection` for the HTML page)."""

    def __init__(self, title: str, header: list[str], rows: list[list[str]], note: str | None = None) -> None:
        self.title = title
        self.header = header
        self.rows = rows
        self.note = note

    def table(self) -> FittedTable:
        columns = [
            text_column(name) if i == 0 or name in TEXT_HEADERS else Column(name) for i, name in enumerate(self.header)
        ]
        return FittedTable(self.title, columns, self.rows, caption=self.note)


def _n(value: float | None, digits: int = 2) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:+.1f}%"


def _interval(row: Row | object) -> str:
    low, high = getattr(row, "low", None), getattr(row, "high", None)
    return MISSING if low is None or high is None else f"[{low * 100:+.1f}%, {high * 100:+.1f}%]"


def _verdict(text: str) -> str:
    if text == "better":
        return "[green]better[/]"
    if text == "worse":
        return "[red]worse[/]"
    return text


def _sides(sides: list[Side]) -> Section:
    rows = []
    for side in sides:
        usd = " · ".join(f"{tier} ${value:,.4f}" for tier, value in side.usd_per_task.items()) or MISSING
        audit = ", ".join(("✗ " if f.severity == "error" else "! ") + f.code for f in side.findings) or "clean"
        path = side.critical_path
        shares = (
            MISSING
            if path is None
            else " · ".join(
                f"{value * 100:.0f}%"
                for value in (path.server_s, path.think_s, path.join_wait_s, path.client_lag_s, -path.idle_cut_s)
            )
        )
        rows.append(
            [
                side.label,
                side.kind + (f" × {side.repeats}" if side.repeats > 1 else ""),
                f"{side.requests:,}",
                f"{side.sessions:,}" if side.sessions else MISSING,
                MISSING if side.gpus is None else str(side.gpus),
                f"{side.tasks:,}" if side.tasks else MISSING,
                _n(side.gpu_s_per_task, 1),
                usd,
                shares,
                audit,
            ]
        )
    header = ["run", "kind", "requests", "sessions", "GPUs", "tasks", "GPU-s per task", "$ per task"]
    header += ["critical path", "audit"]
    note = (
        "critical path: the plays' summed makespans split into server time · think · waiting on joins · client lag · "
        "idle-cap cuts (docs/results.md)"
    )
    return Section("compared", header, rows, note)


def _differences(comparison: Comparison) -> Section | None:
    if not comparison.differences:
        return None
    rows = [[d.key, *d.values, "allowed" if d.allowed else "withholds every verdict"] for d in comparison.differences]
    header = ["differs in", *(side.label for side in comparison.sides), "so"]
    note = "pass --allow KEY to compare anyway, knowing the difference (docs/compare.md)"
    return Section("what differs between them", header, rows, note if comparison.withheld else None)


def _versus(versus: Versus, level: float) -> Section:
    spread = any(row.spread is not None for row in versus.rows)
    header = ["metric", "unit", versus.baseline, versus.other, "Δ", f"{level:.1%} interval", "resolvable"]
    header += ["spread (repeats)"] if spread else []
    header += ["verdict"]
    rows = []
    for row in versus.rows:
        cells = [row.metric, row.unit, _n(row.baseline), _n(row.value), _pct(row.relative), _interval(row)]
        cells.append(MISSING if row.resolvable is None else f"±{row.resolvable * 100:.1f}%")
        if spread:
            cells.append(f"{_n(row.baseline_spread)} / {_n(row.spread)}")
        cells.append(_verdict(row.verdict))
        rows.append(cells)
    note = versus.pairing
    if versus.requests is not None and versus.requests.matched:
        r = versus.requests
        faster = MISSING if r.e2el_faster_share is None else f"{r.e2el_faster_share:.0%}"
        note += (
            f"; {r.matched:,} requests matched one to one: median ΔTTFT {_n(r.ttft_median_delta_ms)} ms, "
            f"ΔE2EL {_n(r.e2el_median_delta_ms)} ms, {faster} faster end to end"
        )
    return Section(f"{versus.other} against {versus.baseline}", header, rows, note)


def _sweep(versus: SweepVersus, level: float, *, energy: bool = False) -> Section:
    """Throughput per GPU at each interactivity target; with `energy`, tokens per joule of GPU energy there."""
    header = ["target", versus.baseline, versus.other, "Δ", f"{level:.1%} interval", "resolvable", "verdict"]
    rows = [
        [
            f"{row.target_tps:g} tok/s/user",
            _n(row.baseline, 1 if not energy else 3),
            _n(row.value, 1 if not energy else 3),
            _pct(row.relative),
            _interval(row),
            MISSING if row.resolvable is None else f"±{row.resolvable * 100:.1f}%",
            _verdict(row.verdict),
        ]
        for row in (versus.tokens_per_joule if energy else versus.targets)
    ]
    figure = "tokens per joule of GPU energy" if energy else f"{versus.basis} tok/s per GPU"
    title = f"{versus.other} against {versus.baseline}: {figure} at interactivity ({versus.statistic})"
    return Section(title, header, rows, "each level resampled over its sessions, the front rebuilt per replicate")


def _findings(sides: list[Side]) -> Section | None:
    rows = [
        [f"{side.label}: {finding.code}", f"{finding.title}: {finding.evidence}. {finding.advice}"]
        for side in sides
        for finding in side.findings
    ]
    return (
        Section("plausibility audit (docs/results.md)", ["finding", "what, evidence, what to do"], rows)
        if rows
        else None
    )


def compare_sections(comparison: Comparison) -> list[Section]:
    """Every table of the comparison, in order."""
    sections = [_sides(comparison.sides)]
    if (differs := _differences(comparison)) is not None:
        sections.append(differs)
    sections += [_versus(versus, comparison.row_level) for versus in comparison.versus]
    sections += [_sweep(versus, comparison.row_level) for versus in comparison.sweeps]
    sections += [_sweep(v, comparison.row_level, energy=True) for v in comparison.sweeps if v.tokens_per_joule]
    if (findings := _findings(comparison.sides)) is not None:
        sections.append(findings)
    return sections


def _plain(cell: str) -> str:
    for markup in ("[green]", "[red]", "[/]"):
        cell = cell.replace(markup, "")
    return cell


def compare_markdown(comparison: Comparison) -> str:
    lines: list[str] = []
    for section in compare_sections(comparison):
        lines += markdown_table(section.title, section.header, [[_plain(cell) for cell in row] for row in section.rows])
        if section.note:
            lines += [f"> {section.note}", ""]
    return "\n".join(lines)


def html_sections(comparison: Comparison | None, gate: GateResult | None = None) -> list[TableSection]:
    """The sections as the HTML page takes them (markup stripped): the comparison's (None: there is none, only the
    gate's failure), then the gate's outcome when one was asked for."""
    sections = [] if comparison is None else compare_sections(comparison)
    sections += [] if gate is None else [gate_section(gate)]
    return [
        _HtmlSection(_plain(section.title), section.header, [[_plain(cell) for cell in row] for row in section.rows])
        for section in sections
    ]


class _HtmlSection:
    def __init__(self, title: str, header: list[str], rows: list[list[str]]) -> None:
        self.title, self.header, self.rows = title, header, rows


def gate_section(result: GateResult) -> Section:
    """The gate's outcome: one row per bound per compared side (`--fail-on`)."""
    rows = [
        [
            check.other_label,
            check.bound,
            _n(check.baseline),
            _n(check.value),
            _pct(check.relative),
            _interval(check),
            "[green]pass[/]" if check.passed else "[red]FAIL[/]",
            check.reason,
        ]
        for check in result.checks
    ]
    header = ["run", "bound", "baseline", "value", "Δ", "interval", "gate", "why"]
    failed = len(result.failed)
    title = f"gate --fail-on {result.spec}: " + ("passed" if result.passed else f"FAILED ({failed} of {len(rows)})")
    note = "a bound fails when its interval lies wholly beyond it, its verdict is withheld, or a side lacks the figure"
    return Section(title, header, rows, note)


def gate_markdown(result: GateResult) -> str:
    """The gate's table as Markdown, for a pull request's comment."""
    section = gate_section(result)
    lines = markdown_table(section.title, section.header, [[_plain(cell) for cell in row] for row in section.rows])
    if section.note:
        lines += [f"> {section.note}", ""]
    return "\n".join(lines)
