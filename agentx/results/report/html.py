"""A report as one self-contained HTML page (`agentx report DIR... --html OUT.html`).

The page holds, with nothing fetched from elsewhere (inline CSS, inline SVG, no script): each series' identity (engine,
model, GPUs, trace, server) and every level's validity with its reasons in words; the report's tables, from the same
sections as the terminal and Markdown forms (agentx.cli.display.report_tables builds them; this module gets them as
plain `Section`s so it stays below the CLI); the plausibility audit's findings, each once with the levels it was made
at, its evidence and what to do; the notes that say why a figure is missing; and the plots (`write_plots`,
inline SVG) when matplotlib is installed, else a line saying how to get them. Text from run folders is escaped, and
credentials in a server URL are scrubbed (agentx.secrets).
"""

from __future__ import annotations

import datetime as dt
import html
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from agentx.distribution import installed_version
from agentx.results.folders.run_file import finished_run
from agentx.results.report.build import Report, Series, SeriesReport
from agentx.results.report.notes import REJECTED_MARK, finding_heading, levels_text
from agentx.secrets import scrub

PLOT_TITLES: Final = {
    "frontier": "Throughput per GPU vs interactivity",
    "cost": "What serving costs vs interactivity",
    "latency": "TTFT and TPOT distributions",
    "swimlanes": "Requests over time (the highest level of each series)",
    "server_metrics": "Server telemetry over time (the same level)",
    "chunks": "Tokens per streamed chunk",
}
"""The plots in page order, by the file name `write_plots` gives them."""

_STYLE: Final = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #1b1b1b; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; } h3 { font-size: 1rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; vertical-align: top; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f3f3f3; text-align: left; }
.note { color: #7a4a00; } .invalid { color: #a00000; } .valid { color: #006400; } .muted { color: #666; }
.finding { margin: 0.5rem 0 1rem; } .finding.error > p:first-child, td.rejected { color: #a00000; }
figure { margin: 1rem 0 2rem; } figure svg { width: 100%; height: auto; max-width: 64rem; }
"""


class TableSection(Protocol):
    """What the page needs of one table: agentx.cli.display.report_tables' `Section`."""

    title: str
    header: list[str]
    rows: list[list[str]]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _number(cell: str) -> bool:
    figure = cell.removesuffix(f" {REJECTED_MARK}")  # a figure the audit rejects is still a figure
    return bool(figure) and (figure[0].isdigit() or figure[0] in "$—–-✓") and " " not in figure.strip("~")


def _cell_class(cell: str) -> str:
    return "number rejected" if cell.endswith(f" {REJECTED_MARK}") else "number"


def _table(section: TableSection) -> str:
    head = "".join(f"<th>{_e(name)}</th>" for name in section.header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{_cell_class(cell)}">{_e(cell)}</td>' if i and _number(cell) else f"<td>{_e(cell)}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in section.rows
    )
    return f"<h3>{_e(section.title)}</h3>\n<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Rows:
    """A table of this module's own, shaped as `TableSection`."""

    def __init__(self, title: str, header: list[str], rows: list[list[str]]) -> None:
        self.title, self.header, self.rows = title, header, rows


def _measured_energy(shown: SeriesReport) -> str:
    """Tokens per joule and tasks per MWh measured from the GPUs' power at each target; "" when unmeasured."""
    rows = [
        [
            f"{t.target_tps:g}",
            f"{t.tokens_per_joule:,.3g}",
            "—" if t.tasks_per_mwh is None else f"{t.tasks_per_mwh:,.4g}",
        ]
        for t in shown.targets
        if t.tokens_per_joule is not None
    ]
    if not rows:
        return ""
    title = f"measured GPU energy of {shown.label} at each target (GPU board power only, --gpu-metrics)"
    return _table(_Rows(title, ["tok/s/user", "tokens per J", "tasks per MWh"], rows))


def _identity(series: Series, shown: SeriesReport) -> str:
    """Per level: the run's identity and its validity, in words."""
    rows = []
    for level in series.levels:
        run_file = finished_run(Path(level.run_dir))
        options: dict[str, Any] = run_file.options if run_file is not None else {}
        server = scrub(str(options.get("url", "") or ""))
        trace = (run_file.run.trace_path or "") if run_file is not None else ""
        validity = level.summary.validity if level.summary is not None else None
        if validity is None:
            verdict = '<span class="muted">unknown</span>'
        elif not validity.applies:
            verdict = f'<span class="muted">{_e(validity.verdict())}</span>'
        elif validity.valid:
            verdict = '<span class="valid">yes</span>'
        else:
            reasons = "".join(f"<li>{_e(reason.message)}</li>" for reason in validity.explained) or "".join(
                f"<li>{_e(code)}</li>" for code in validity.reasons
            )
            verdict = f'<span class="invalid">no</span><ul>{reasons}</ul>'
        cells = [level.label, level.status, level.engine or "", level.model or "", server, trace]
        rows.append("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + f"<td>{verdict}</td></tr>")
    head = "".join(
        f"<th>{name}</th>"
        for name in ("level", "status", "engine", "model", "server", "trace", "valid AgentX submission")
    )
    # The report's SKU and GPU count: what was recorded, or what the command line said instead.
    gpus = f"{shown.num_gpus} × {shown.gpu_sku.upper() if shown.gpu_sku else 'GPU'}" if shown.gpus_known else ""
    return (
        f'<h2>{_e(series.label)}</h2>\n<p class="muted">{_e(series.path)}{" · " + _e(gpus) if gpus else ""}</p>\n'
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _audit(report: Report) -> str:
    """Each distinct finding of the levels' audits: what it rejects or concerns, where, its evidence per level and
    what to do; "" when every run is clean."""
    if not report.audit:
        return ""
    parts = [
        "<h2>Plausibility audit</h2>",
        '<p class="muted">What cannot be true in these runs: ✗ an error, whose figures the tables mark and never show '
        "as a best unmarked; ! a warning, to read the figures knowing it.</p>",
    ]
    for entry in report.audit:
        where = levels_text((found.series, found.level) for found in entry.levels)
        evidence = "".join(
            f"<li>{_e(found.series)} {_e(found.level)}: {_e(found.evidence)}</li>" for found in entry.levels
        )
        parts.append(
            f'<div class="finding {_e(entry.severity)}" id="audit-{_e(entry.code)}">'
            f"<p><strong>{_e(finding_heading(entry.code, entry.severity, entry.affects))}</strong> at {_e(where)}: "
            f"{_e(entry.title)}</p><ul>{evidence}</ul><p>What to do: {_e(entry.advice)}</p></div>"
        )
    return "\n".join(parts)


def _plots(report: Report) -> str:
    """The plots as inline SVG figures, or why there are none."""
    from agentx.errors import PlotsUnavailableError
    from agentx.results.report.plots import write_plots

    with tempfile.TemporaryDirectory(prefix="agentx-html-") as scratch:
        try:
            written = write_plots(report, Path(scratch))
        except PlotsUnavailableError as exc:
            return f'<p class="note">No plots: {_e(exc)}</p>'
        svgs = {path.stem: path.read_text(encoding="utf-8") for path in written if path.suffix == ".svg"}
    figures = []
    for name, title in PLOT_TITLES.items():
        svg = svgs.pop(name, None)
        if svg is not None:
            figures.append(f'<figure id="plot-{name}">{_inline(svg)}<figcaption>{_e(title)}</figcaption></figure>')
    figures += [
        f'<figure id="plot-{_e(name)}">{_inline(svg)}<figcaption>{_e(name)}</figcaption></figure>'
        for name, svg in svgs.items()
    ]
    return "\n".join(figures)


def _inline(svg: str) -> str:
    """An SVG file's markup without its XML prolog and doctype, ready to sit in the page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def html_report(
    report: Report,
    series: Sequence[Series],
    sections: Sequence[TableSection],
    notes: Sequence[str],
    *,
    plots: bool = True,
    title: str = "agentx report",
) -> str:
    """The page of `report` (built from `series`), its tables `sections` and `notes`; plots when `plots`."""
    parts = _head(
        title,
        f" · interactivity at {_e(report.statistic)} TPOT · {_e(report.basis)} tokens · prices: {_e(report.tier)} tier"
        + (f" (table of {_e(report.prices_updated)})" if report.prices_updated else ""),
    )
    parts += [
        *(_identity(s, shown) for s, shown in zip(series, report.series, strict=True)),
        "<h2>Tables</h2>",
        *(_table(section) for section in sections),
        *(_measured_energy(shown) for shown in report.series),
        _audit(report),
    ]
    if notes:
        parts.append('<h2>Notes</h2><ul class="note">' + "".join(f"<li>{_e(note)}</li>" for note in notes) + "</ul>")
    if plots:
        parts += ["<h2>Plots</h2>", _plots(report)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def tables_page(title: str, sections: Sequence[TableSection]) -> str:
    """A self-contained page of `sections`' tables under `title` (the report's style), e.g. `agentx compare --html`."""
    parts = [*_head(title, ""), *(_table(section) for section in sections), "</body></html>"]
    return "\n".join(parts) + "\n"


def _head(title: str, about: str) -> list[str]:
    """A page's start: its title, the style, and a line of what made it (`about`: more of it, as HTML)."""
    made = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="muted">agentx {_e(installed_version())} · {made}{about}</p>',
    ]
