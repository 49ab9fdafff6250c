"""`agentx report` with the plausibility audit and the cost per task: marks, best figures, the audit's section, and
the dollars per task, on a real sweep whose run.json files are given findings."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from rich.console import Console
from small_sweep import run_small_sweep
from tables80 import WIDTHS, assert_fits

from agentx.cli import main
from agentx.cli.display.layout import FittedTable
from agentx.cli.display.report_tables import Section, report_markdown, report_notes, report_sections, report_tables
from agentx.records.run_folder import RUN_FILE
from agentx.results.report.build import Report, ReportOptions, build_report, load_series
from agentx.results.report.html import html_report
from agentx.results.summary.checks.audit import Audit, Figure, Finding, Severity

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

LEVELS = ("c1", "c2", "c4")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report-audit") / "sweep"
    run_small_sweep(out)
    return out


def _finding(code: str, severity: Severity, affects: tuple[Figure, ...], evidence: str) -> Finding:
    return Finding(
        code=code,
        severity=severity,
        title=f"the {code} title",
        evidence=evidence,
        advice=f"the {code} advice",
        affects=affects,
    )


def bundled(level: str) -> Finding:
    return _finding("bundled_output", "error", ("tpot", "itl", "interactivity"), f"{level}: 9 of 9 requests at 1 µs")


def _audited(sweep_dir: Path, tmp_path: Path, findings: Mapping[str, Sequence[Finding]]) -> Path:
    """A copy of the sweep whose levels' run.json carry `findings` (level label → its audit's findings)."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    for level, found in findings.items():
        path = copy / level / RUN_FILE
        document = json.loads(path.read_text())
        document["summary"]["audit"] = msgspec.to_builtins(Audit(findings=list(found)))
        path.write_text(json.dumps(document))
    return copy


def _json(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["report", *args, "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _terminal(report: Report) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    for item in report_tables(report):
        if isinstance(item, str):  # the audit's findings and the notes: their brackets are text
            console.print(item, markup=False)
        else:
            console.print(item)
    return console.export_text()


def _html(report: Report, sweep: Path) -> str:
    series = [load_series(sweep)]
    return html_report(report, series, report_sections(report), report_notes(report), plots=False)


def _section(report: Report, starts: str) -> Section:
    (found,) = [section for section in report_sections(report) if section.title.startswith(starts)]
    return found


def _cells(section: Section, label: str) -> dict[str, str]:
    (row,) = [row for row in section.rows if row[0] == label]
    return dict(zip(section.header, row, strict=True))


def test_a_best_tpot_the_audit_rejects_gives_way_to_a_level_whose_audit_does_not(
    sweep_dir: Path, tmp_path: Path
) -> None:
    clean = _json([str(sweep_dir)])["series"][0]
    tpot = {row["label"]: row["tpot_p50_s"] for row in clean["levels"]}
    fastest = clean["best_tpot_s"]["label"]
    trusted = min((label for label in tpot if label != fastest), key=lambda label: tpot[label])
    copy = _audited(sweep_dir, tmp_path, {fastest: [bundled(fastest)]})

    series = _json([str(copy)])["series"][0]
    assert series["best_tpot_s"]["label"] == trusted and series["best_tpot_s"]["value"] == tpot[trusted]
    assert not series["best_tpot_s"]["rejected"] and series["best_tpot_s"]["rejected_by"] == []
    assert series["best_ttft_s"] == clean["best_ttft_s"]  # bundled output rejects no TTFT
    rows = {row["label"]: row for row in series["levels"]}
    assert rows[fastest]["audit"] == [{"code": "bundled_output", "severity": "error"}]
    assert rows[fastest]["rejected"]["interactivity"] == ["bundled_output"]
    assert "rests on interactivity that its plausibility audit rejects (bundled_output)" in rows[fastest]["note"]
    assert rows[trusted]["audit"] == [] and rows[trusted]["note"] is None

    report = build_report([load_series(copy)])
    levels = _section(report, "levels of")
    assert _cells(levels, fastest)["audit"] == "✗bundled_output"
    assert _cells(levels, fastest)["tok/s/user (p90)"].endswith(" ✗")
    assert _cells(levels, fastest)["TPOT p50 (ms)"].endswith(" ✗")
    assert not _cells(levels, fastest)["TTFT p50 (ms)"].endswith("✗")
    assert _cells(levels, trusted)["audit"] == "" and not _cells(levels, trusted)["TPOT p50 (ms)"].endswith("✗")
    best = _section(report, "best latency")
    assert best.rows[0][best.header.index("best TPOT p50 (ms)") + 1] == trusted
    assert f"note: sweep {fastest}: its point on the frontier rests on interactivity" in " ".join(
        _terminal(report).split()
    )


def test_when_every_level_is_rejected_the_best_tpot_is_shown_marked_in_every_form(
    sweep_dir: Path, tmp_path: Path
) -> None:
    clean = _json([str(sweep_dir)])["series"][0]
    copy = _audited(sweep_dir, tmp_path, {level: [bundled(level)] for level in LEVELS})

    series = _json([str(copy)])["series"][0]
    best = series["best_tpot_s"]
    assert best["label"] == clean["best_tpot_s"]["label"] and best["value"] == clean["best_tpot_s"]["value"]
    assert best["rejected"] and best["rejected_by"] == ["bundled_output"]

    report = build_report([load_series(copy)])
    shown = f"{best['value'] * 1000:,.1f} ✗"
    mark = f"{best['label']} (rejected by the audit: bundled_output)"
    terminal = _terminal(report)
    assert shown in terminal and mark in " ".join(terminal.split())
    markdown = report_markdown(report)
    assert f"| {shown} | {mark} |" in markdown
    page = _html(report, copy)
    assert f'<td class="number rejected">{shown}</td><td>{mark}</td>' in page

    # The audit's section: the finding once, with every level it was made at, its evidence and advice.
    assert [entry["code"] for entry in _json([str(copy)])["audit"]] == ["bundled_output"]
    heading = "✗ bundled_output (error: rejects TPOT, ITL, interactivity) at sweep c1, c2, c4: the bundled_output title"
    for text in (" ".join(terminal.split()), markdown, page):
        assert text.count("✗ bundled_output (error") == 1
        assert "the bundled_output advice" in text
        assert all(f"{level}: 9 of 9 requests at 1 µs" in text for level in LEVELS)
    assert heading in " ".join(terminal.split()) and f"- **{heading.split(' at ')[0]}** at sweep c1, c2, c4" in markdown
    assert page.count('id="audit-bundled_output"') == 1


def test_a_clean_report_shows_no_audit_and_an_old_run_json_counts_as_clean(sweep_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(sweep_dir, old)
    for level in LEVELS:
        path = old / level / RUN_FILE
        document = json.loads(path.read_text())
        del document["summary"]["audit"], document["summary"]["tasks"]
        path.write_text(json.dumps(document))
    for sweep in (sweep_dir, old):
        report = build_report([load_series(sweep)])
        assert report.audit == []
        (series,) = report.series
        assert all(row.audit == [] and row.rejected == {} for row in series.levels)
        bests = (series.best_ttft_s, series.best_tpot_s, series.peak_total_tps_per_gpu)
        assert all(best is not None and not best.rejected for best in bests)
        assert "audit" not in _section(report, "levels of").header
        for text in (_terminal(report), report_markdown(report), _html(report, sweep)):
            assert "plausibility audit" not in text.lower() and "✗" not in text
    assert build_report([load_series(sweep_dir)]).series[0].tasks is not None
    old_report = build_report([load_series(old)])
    assert old_report.series[0].tasks is None and "cost per task" not in report_markdown(old_report)


def test_a_warning_is_listed_but_rejects_nothing(sweep_dir: Path, tmp_path: Path) -> None:
    clean = build_report([load_series(sweep_dir)]).series[0]
    full = _finding("kv_cache_full", "warning", ("ttft", "e2el", "throughput"), "KV-cache usage peaked at 100.0%")
    copy = _audited(sweep_dir, tmp_path, {"c4": [full]})
    report = build_report([load_series(copy)])
    (series,) = report.series
    assert series.peak_total_tps_per_gpu == clean.peak_total_tps_per_gpu and series.best_ttft_s == clean.best_ttft_s
    assert _cells(_section(report, "levels of"), "c4")["audit"] == "!kv_cache_full"
    assert all(not cell.endswith("✗") for section in report_sections(report) for row in section.rows for cell in row)
    markdown = report_markdown(report)
    assert "- **! kv_cache_full (warning: concerns TTFT, E2EL, throughput)** at sweep c4" in markdown
    assert "KV-cache usage peaked at 100.0%" in markdown


def test_a_rejected_throughput_marks_its_point_the_targets_beside_it_and_its_task_cost(
    sweep_dir: Path, tmp_path: Path
) -> None:
    clean = _json([str(sweep_dir)])["series"][0]
    throughput = {row["label"]: row["total_tps_per_gpu"] for row in clean["levels"]}
    peak = clean["peak_total_tps_per_gpu"]["label"]
    runner_up = max((label for label in throughput if label != peak), key=lambda label: throughput[label])
    behind = _finding(
        "client_bound", "error", ("ttft", "tpot", "itl", "e2el", "interactivity", "throughput"), "dispatch lag 2 s"
    )
    copy = _audited(sweep_dir, tmp_path, {peak: [behind]})
    speeds = {row["label"]: row["interactivity_tps"] for row in clean["levels"]}
    targets = ",".join(f"{(speeds[a] + speeds[b]) / 2:.1f}" for a, b in (("c1", "c2"), ("c2", "c4")))
    series = _json([str(copy), "--targets", targets, "--price", "3.6"])["series"][0]
    assert series["peak_total_tps_per_gpu"]["label"] == runner_up and not series["peak_total_tps_per_gpu"]["rejected"]
    next_to_peak = [t for t in series["targets"] if t["between"] is not None and peak in t["between"]]
    assert next_to_peak and all(t["rejected_by"] == ["client_bound"] for t in next_to_peak)
    away = [t for t in series["targets"] if t["between"] is not None and peak not in t["between"]]
    assert away and all(t["rejected_by"] == [] for t in away)
    tasks = {level["label"]: level for level in series["tasks"]["levels"]}
    assert tasks[peak]["rejected_by"] == ["client_bound"] and tasks[runner_up]["rejected_by"] == []
    note = {row["label"]: row["note"] for row in series["levels"]}[peak]
    assert "rests on interactivity and throughput that its plausibility audit rejects (client_bound)" in note


def _recorded_tasks(sweep: Path) -> dict[str, dict[str, Any]]:
    """Each level's run.json: its task figures and the GPUs its throughput was divided by."""
    found = {}
    for level in LEVELS:
        summary = json.loads((sweep / level / RUN_FILE).read_text())["summary"]
        found[level] = {**summary["tasks"], "num_gpus": summary["throughput"]["num_gpus"]}
    return found


def test_cost_per_task_is_gpu_seconds_times_the_price_and_tokens_times_the_cost_per_million(sweep_dir: Path) -> None:
    recorded = _recorded_tasks(sweep_dir)
    speeds = {row["label"]: row["interactivity_tps"] for row in _json([str(sweep_dir)])["series"][0]["levels"]}
    inside = (speeds["c1"] + speeds["c2"]) / 2
    targets = f"{inside},{speeds['c4']},{speeds['c1'] * 2}"
    document = _json([str(sweep_dir), "--targets", targets, "--target", str(inside), "--price", "3.6"])
    (series,) = document["series"]
    tasks = series["tasks"]
    for level in tasks["levels"]:
        mine = recorded[level["label"]]
        assert mine["completed"] > 0 and level["completed"] == mine["completed"]
        for field in ("cached_tokens", "uncached_tokens", "output_tokens", "total_tokens"):
            assert level[field] == mine[field]["mean"]
        assert level["gpu_s"] == pytest.approx(mine["gpu_s"]["mean"])
        prices = {price["tier"]: price for price in level["prices"]}
        assert list(prices) == [cost["tier"] for cost in series["costs_at_target"]]
        assert prices["given"]["usd_per_task"] == pytest.approx(mine["gpu_s"]["mean"] * 3.6 / 3600)
        for price in prices.values():
            assert price["usd_per_task"] == pytest.approx(mine["gpu_s"]["mean"] * price["usd_per_gpu_hour"] / 3600)

    completed = sum(mine["completed"] for mine in recorded.values())
    tokens = sum(mine["completed"] * mine["total_tokens"]["mean"] for mine in recorded.values()) / completed
    assert tasks["tasks"] == completed and tasks["total_tokens"] == pytest.approx(tokens)
    assert [t["target_tps"] for t in tasks["targets"]] == [t["target_tps"] for t in series["targets"]]
    priced = 0
    for row, at in zip(series["targets"], tasks["targets"], strict=True):
        given = next(price for price in at["prices"] if price["tier"] == "given")
        assert given["total_usd_per_m"] == row["cost"]["total_usd_per_m"]
        if row["cost"]["total_usd_per_m"] is None:
            assert given["usd_per_task"] is None  # off the front: no throughput, no dollars
            continue
        priced += 1
        assert given["usd_per_task"] == pytest.approx(tokens * row["cost"]["total_usd_per_m"] / 1e6)
    assert priced == 2
    # At --target, each tier's $/M is the cost table's.
    at_target = next(at for at in tasks["targets"] if at["target_tps"] == inside)
    for cost, price in zip(series["costs_at_target"], at_target["prices"], strict=True):
        assert price["tier"] == cost["tier"] and price["usd_per_task"] == pytest.approx(
            tokens * cost["total_usd_per_m"] / 1e6
        )

    markdown = report_markdown(build_report([load_series(sweep_dir)], ReportOptions(usd_per_gpu_hour=3.6)))
    c1 = recorded["c1"]
    split = " · ".join(f"{c1[field]['mean']:,.0f}" for field in ("cached_tokens", "uncached_tokens", "output_tokens"))
    assert f"| c1 | {c1['completed']} | {split} |" in markdown
    assert f"at each interactivity target ({tokens:,.0f} tokens per task, the mean of {completed} tasks" in markdown


def test_gpus_given_on_the_command_line_rescale_the_gpu_seconds_per_task(sweep_dir: Path) -> None:
    recorded = _recorded_tasks(sweep_dir)
    (series,) = _json([str(sweep_dir), "--gpus", "8", "--price", "3.6"])["series"]
    for level in series["tasks"]["levels"]:
        mine = recorded[level["label"]]
        assert mine["num_gpus"] != 8
        assert level["gpu_s"] == pytest.approx(mine["gpu_s"]["mean"] * 8 / mine["num_gpus"])
        given = next(price for price in level["prices"] if price["tier"] == "given")
        assert given["usd_per_task"] == pytest.approx(level["gpu_s"] * 3.6 / 3600)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_audit_column_and_task_tables_fit_the_terminal(sweep_dir: Path, tmp_path: Path, width: int) -> None:
    full = _finding("kv_cache_full", "warning", ("ttft", "e2el", "throughput"), "KV-cache usage peaked at 100.0%")
    copy = _audited(sweep_dir, tmp_path, {"c1": [bundled("c1"), full]})
    report = build_report([load_series(copy)], ReportOptions(usd_per_gpu_hour=3.6))
    text = assert_fits([item for item in report_tables(report) if isinstance(item, FittedTable)], width)
    assert "cost per task of sweep" in text and "bundled_output" in text


def test_a_level_whose_requests_failed_shows_its_errors_with_their_statuses(sweep_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    path = copy / "c2" / RUN_FILE
    document = json.loads(path.read_text())
    counts = {"errors": 46, "profiling": 104, "errors_by_kind": {"http": 46}, "errors_by_status": {"503": 46}}
    document["summary"]["counts"].update(counts)
    document["options"]["failed_request_threshold"] = 0.10  # 46 of 104 is above it
    path.write_text(json.dumps(document))

    levels = _section(build_report([load_series(copy)]), "levels of")
    assert _cells(levels, "c2")["errors"] == "http 46 (HTTP 503 ×46) ✗ over threshold"
    assert _cells(levels, "c1")["errors"] == "0"
    rows = {row["label"]: row for row in _json([str(copy)])["series"][0]["levels"]}
    assert rows["c2"]["errors"] == 46 and rows["c2"]["over_failure_threshold"]
    assert rows["c1"]["errors"] == 0 and not rows["c1"]["over_failure_threshold"]
    # A series without errors shows no errors column.
    assert "errors" not in _section(build_report([load_series(sweep_dir)]), "levels of").header
