"""`agentx report` on a real sweep: the tables (terminal, JSON, Markdown), the plots, comparisons, errors."""

from __future__ import annotations

import io
import json
import shutil
import sys
import xml.etree.ElementTree as ET
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
from agentx.cli.display.report_tables import MISSING, report_markdown, report_tables
from agentx.distribution import installed_version
from agentx.records.run_folder import RUN_FILE
from agentx.results.folders.run_file import read_run_file
from agentx.results.report.build import ReportOptions, build_report, load_series
from agentx.results.report.notes import suggest_targets, with_target
from agentx.results.summary.checks.acceptance import Acceptance, StreamAcceptance

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SIM = f"agentx-sim {installed_version()}"
"""How the simulator's runs name their engine."""


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "sweep"
    run_small_sweep(out)
    return out


def _report(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["report", *args, "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _interactivity(document: dict[str, Any]) -> dict[str, float]:
    return {level["label"]: level["interactivity_tps"] for level in document["series"][0]["levels"]}


def test_json_report_reads_the_sweep_directory(sweep_dir: Path) -> None:
    document = _report([str(sweep_dir)])
    assert document["statistic"] == "p90" and document["basis"] == "total" and document["tier"] == "hyperscaler"
    (series,) = document["series"]
    assert series["gpu_sku"] == "h100" and series["num_gpus"] == 2 and series["gpus_known"]
    assert [level["label"] for level in series["levels"]] == ["c1", "c2", "c4"]
    assert all(level["on_front"] for level in series["levels"])  # each level trades speed for throughput
    assert [t["target_tps"] for t in series["targets"]] == [30.0, 50.0, 75.0, 100.0, 150.0, 200.0]
    assert series["peak_total_tps_per_gpu"]["label"] == "c4"
    assert series["best_tpot_s"]["label"] == "c1"
    assert [c["tier"] for c in series["costs_at_target"]] == ["hyperscaler", "neocloud", "retail"]
    assert series["engine"] == SIM  # recorded by each run: the simulator says who it is


def test_engine_flag_names_the_engine_in_place_of_the_recorded_one(sweep_dir: Path) -> None:
    document = _report([str(sweep_dir), "--engine", "SGLang 0.5.2", "--label", "b300-sglang"])
    (series,) = document["series"]
    assert series["engine"] == "SGLang 0.5.2" and series["label"] == "b300-sglang"
    result = CliRunner().invoke(main, ["report", str(sweep_dir), "--engine", "a", "--engine", "b"])
    assert result.exit_code == 2 and "2 --engine for 1 directory" in result.output


def test_targets_interpolate_inside_the_front_price_at_the_given_rate_and_never_extrapolate(sweep_dir: Path) -> None:
    speeds = _interactivity(_report([str(sweep_dir)]))
    inside = (speeds["c1"] + speeds["c2"]) / 2
    above = speeds["c1"] * 1.5
    targets = f"{inside},{speeds['c4']},{above}"
    document = _report([str(sweep_dir), "--targets", targets, "--target", str(inside), "--price", "3.6"])
    (series,) = document["series"]
    middle, knot, beyond = series["targets"]
    levels = {level["label"]: level for level in series["levels"]}
    assert middle["between"] == ["c2", "c1"]
    assert levels["c1"]["total_tps_per_gpu"] < middle["total_tps_per_gpu"] < levels["c2"]["total_tps_per_gpu"]
    # $3.60/GPU/hr is $1 per 10⁶ tokens at 1000 tok/s/GPU.
    assert middle["cost"]["tier"] == "given"
    assert middle["cost"]["total_usd_per_m"] == pytest.approx(1000 / middle["total_tps_per_gpu"])
    assert middle["cost"]["output_usd_per_m"] == pytest.approx(1000 / middle["output_tps_per_gpu"])
    assert knot["total_tps_per_gpu"] == pytest.approx(levels["c4"]["total_tps_per_gpu"])
    assert knot["between"] == ["c4", "c4"]
    assert beyond["total_tps_per_gpu"] is None and beyond["cost"]["total_usd_per_m"] is None
    assert series["costs_at_target"][0]["tier"] == "given"
    assert series["costs_at_target"][0]["total_usd_per_m"] == pytest.approx(1000 / middle["total_tps_per_gpu"])


def test_terminal_and_markdown_tables_render(sweep_dir: Path) -> None:
    report = build_report([load_series(sweep_dir)], ReportOptions(kw_per_gpu=1.4))
    console = Console(file=io.StringIO(), width=200, record=True)
    for table in report_tables(report):
        console.print(table)
    text = console.export_text()
    for title in (
        "throughput at every interactivity target",
        "what serving actually costs at 50 tok/s/user",
        "best latency and peak throughput across levels",
        f"levels of sweep · {SIM} · agentx-sim · H100",
        "energy of sweep at 50 tok/s/user (1.4 kW per GPU)",
    ):
        assert title in text
    assert MISSING in text  # the simulator is far faster than 200 tok/s/user: the targets lie outside its front
    markdown = report_markdown(report)
    assert f"| tok/s/user | sweep · {SIM} · agentx-sim · H100: tok/s/GPU | $/M (hyperscaler) | at |" in markdown
    assert "| c4 | ok |" in markdown and "AWS p5.48xlarge" in markdown
    result = CliRunner().invoke(main, ["report", str(sweep_dir), "--markdown"])
    assert result.exit_code == 0 and result.stdout.startswith("### throughput at every interactivity target")


def _check_png(path: Path) -> None:
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400, (path, pixels.shape)
    assert pixels.std() > 0.01, path  # not a blank canvas


def test_every_plot_renders_as_png_and_svg_with_several_series(sweep_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    single = tmp_path / "single"
    shutil.copytree(sweep_dir / "c2", single)  # a plain run directory beside the sweep
    plots = tmp_path / "plots"
    result = CliRunner().invoke(
        main, ["report", str(sweep_dir), str(single), "--label", "swept", "--label", "one", "--plots", str(plots)]
    )
    assert result.exit_code == 0, result.output
    names = {"frontier", "cost", "latency", "swimlanes", "server_metrics", "chunks"}
    assert {p.name for p in plots.iterdir()} == {f"{n}.{s}" for n in names for s in ("png", "svg")}
    for name in names:
        _check_png(plots / f"{name}.png")
        root = ET.parse(plots / f"{name}.svg").getroot()
        assert root.tag.endswith("svg") and len(list(root.iter())) > 50
    assert "swept" in result.output and "one" in result.output


def test_directories_are_compared_side_by_side(sweep_dir: Path, tmp_path: Path) -> None:
    single = tmp_path / "c1-only"
    shutil.copytree(sweep_dir / "c1", single)
    (single / RUN_FILE).unlink()  # a run that crashed before writing run.json: its records still count
    older = tmp_path / "older"
    shutil.copytree(sweep_dir / "c2", older)
    (older / RUN_FILE).write_text('{"options": {}, "run": {"layout": "from another version"}}')
    document = _report([str(sweep_dir), str(single), str(older), "--gpus", "2"])
    first, second, third = document["series"]
    assert (first["label"], second["label"], third["label"]) == ("sweep", "c1-only", "older")
    # Summarized from the records, which also carry the run's options (its concurrency).
    assert [(level["label"], level["status"]) for level in second["levels"]] == [("c1", "no run.json")]
    assert second["levels"][0]["total_tps_per_gpu"] == pytest.approx(first["levels"][0]["total_tps_per_gpu"])
    assert [(level["label"], level["status"]) for level in third["levels"]] == [
        ("c2", "run.json unreadable: from records")
    ]
    assert third["levels"][0]["total_tps_per_gpu"] == pytest.approx(first["levels"][1]["total_tps_per_gpu"])


def test_report_without_matplotlib_still_prints_and_says_how_to_get_plots(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["report", str(sweep_dir), "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    assert "throughput at every interactivity target" in result.stdout
    assert "pip install 'agentx-replay[plot]'" in result.output
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json", "--markdown"], "not both"),
        (["--tier", "cheapest"], "--tier 'cheapest' is not one of"),
        (["--gpu-sku", "tpu9"], "not in the price table"),
        (["--targets", "50,fast"], "--targets wants"),
        (["--prices", "missing.json"], "cannot read the price file"),
        (["--label", "a", "--label", "b"], "2 --label for 1 directory"),
    ],
)
def test_report_mistakes_exit_2_with_one_paragraph(sweep_dir: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["report", str(sweep_dir), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1


def test_a_directory_without_runs_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "missing"):
        result = CliRunner().invoke(main, ["report", str(target)])
        assert result.exit_code == 2
        assert "Traceback" not in result.output
    result = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert "holds no run" in result.output


@pytest.mark.parametrize("width", WIDTHS)
def test_report_tables_fit_the_terminal(sweep_dir: Path, width: int) -> None:
    report = build_report([load_series(sweep_dir)], ReportOptions(kw_per_gpu=1.4))
    items = report_tables(report)
    text = assert_fits([item for item in items if isinstance(item, FittedTable)], width)
    assert "levels of sweep" in text and "TTFT" in text


def test_the_report_says_why_targets_and_prices_are_missing_and_what_to_pass(sweep_dir: Path) -> None:
    speeds = _interactivity(_report([str(sweep_dir)]))
    low, high = min(speeds.values()), max(speeds.values())
    document = _report([str(sweep_dir), "--gpu-sku", "h200"])
    (series,) = document["series"]
    assert all(row["total_tps_per_gpu"] is None for row in series["targets"])  # the simulator is far faster
    note = series["target_note"]
    assert note.startswith("sweep: every target lies outside its front") and f"{low:,.0f}–{high:,.0f}" in note
    suggested = [float(t) for t in note.split("--targets ")[1].split(",")]
    assert suggested and all(low <= t <= high for t in suggested)
    assert series["price_note"] == (
        "sweep: no hyperscaler price for H200 (no single current on-demand figure found): "
        "pass --tier neocloud (priced: neocloud, retail) or --price"
    )
    # The suggested targets all land on the front; the cost table's --target gets a row of its own.
    target = round((low + high) / 2)
    args = ["--targets", ",".join(f"{t:g}" for t in suggested), "--target", str(target), "--tier", "neocloud"]
    document = _report([str(sweep_dir), "--gpu-sku", "h200", *args])
    (series,) = document["series"]
    assert series["target_note"] is None and series["price_note"] is None
    assert sorted([*suggested, target]) == [row["target_tps"] for row in series["targets"]]
    assert all(row["total_tps_per_gpu"] is not None and row["cost"] is not None for row in series["targets"])
    result = CliRunner().invoke(main, ["report", str(sweep_dir), "--gpu-sku", "h200"])
    assert result.exit_code == 0 and "note: sweep: no hyperscaler price for H200" in result.stdout
    assert "> note: sweep: every target lies outside" in report_markdown(
        build_report([load_series(sweep_dir)], ReportOptions(gpu_sku="h200"))
    )


def test_suggested_targets_are_round_and_inside_the_range() -> None:
    assert suggest_targets(335.4, 656.9) == [380.0, 460.0, 540.0, 620.0]
    assert suggest_targets(2.0, 2.0) == [2.0]
    assert suggest_targets(0.0, 10.0) == []
    assert with_target((30.0, 50.0), 40.0) == (30.0, 40.0, 50.0)
    assert with_target((50.0, 30.0), 40.0) == (50.0, 30.0, 40.0)
    assert with_target((30.0, 50.0), 50.0) == (30.0, 50.0)


def test_a_run_json_before_vllms_names_reads_with_them(sweep_dir: Path, tmp_path: Path) -> None:
    """run.json files before the summary used vLLM's names held TPOT as `itl_s`, ITL as `chunk_itl_s` and E2EL as
    `e2e_s`: they read into today's fields, so `agentx report` compares old and new runs alike."""
    document = json.loads((sweep_dir / "c1" / RUN_FILE).read_text())
    latency = document["summary"]["latency"]
    old = dict(latency)
    old["chunk_itl_s"] = old.pop("itl_s")
    old["itl_s"] = old.pop("tpot_s")
    old["e2e_s"] = old.pop("e2el_s")
    document["summary"]["latency"] = old
    (tmp_path / RUN_FILE).write_text(json.dumps(document))
    read = read_run_file(tmp_path / RUN_FILE)
    assert msgspec.to_builtins(read.summary.latency) == latency


def test_a_run_json_with_the_stream_s_acceptance_reads_back(sweep_dir: Path, tmp_path: Path) -> None:
    """The acceptance's tokens-per-chunk histogram has integer keys, which JSON writes as strings (seen on a run
    against vLLM: its report fell back to the records)."""
    document = json.loads((sweep_dir / "c1" / RUN_FILE).read_text())
    stream = StreamAcceptance(
        stream_interval=1,
        requests=2,
        chunks=5,
        tokens_per_chunk_mean=1.6,
        tokens_per_step=1.6,
        tokens_per_chunk={1: 3, 3: 1, 2: 1},
    )
    acceptance = Acceptance(
        forced_al=None,
        spec_k=None,
        tolerance=0.05,
        counters=None,
        stream=stream,
        realized_al=1.6,
        realized_source="stream",
        mismatch=False,
    )
    document["summary"]["acceptance"] = msgspec.to_builtins(acceptance)
    (tmp_path / RUN_FILE).write_text(json.dumps(document))
    read = read_run_file(tmp_path / RUN_FILE)
    assert read.summary.acceptance is not None and read.summary.acceptance.stream == stream


@pytest.mark.parametrize(
    ("loop_lag_max_s", "says"),
    [(3.4, "the client read late: its event loop stalled for up to 3,400 ms"), (0.002, "the server sent each stream")],
)
def test_a_level_whose_tokens_arrived_at_one_instant_says_why_it_has_no_interactivity(
    sweep_dir: Path, tmp_path: Path, loop_lag_max_s: float, says: str
) -> None:
    """Every chunk of every response read at one instant: TPOT 0, no interactivity, no point; the report says so and
    puts it down to the client when its event loop stalled (seen against vLLM on a 2-core machine), else to the
    server."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    document = json.loads((copy / "c1" / RUN_FILE).read_text())
    summary = document["summary"]
    summary["latency"]["tpot_s"] = summary["latency"]["interactivity_tps"] = None
    summary["loop_lag"] = {"samples": 90, "p50_s": 0.0, "p99_s": loop_lag_max_s, "max_s": loop_lag_max_s}
    (copy / "c1" / RUN_FILE).write_text(json.dumps(document))
    document = _report([str(copy)])
    rows = {row["label"]: row for row in document["series"][0]["levels"]}
    assert rows["c1"]["interactivity_tps"] is None and not rows["c1"]["on_front"]
    assert rows["c1"]["note"].startswith("no request has a TPOT above 0: every response's tokens were read at one")
    assert says in rows["c1"]["note"]
    assert rows["c2"]["note"] is None and rows["c4"]["note"] is None
    result = CliRunner().invoke(main, ["report", str(copy)])
    assert result.exit_code == 0 and "note: sweep c1: no request has a TPOT above 0" in " ".join(result.stdout.split())


def test_each_level_says_where_its_plays_time_went(sweep_dir: Path) -> None:
    report = build_report([load_series(sweep_dir)], ReportOptions())
    rows = report.series[0].levels
    assert all(row.critical_path is not None and row.critical_path_plays > 0 for row in rows)
    for row in rows:
        p = row.critical_path
        assert p is not None
        assert p.server_s + p.think_s + p.join_wait_s + p.client_lag_s - p.idle_cut_s == pytest.approx(1.0)
        assert p.server_s > 0
    markdown = report_markdown(report)
    assert "### where the plays' time went, along their critical paths, of sweep" in markdown
    assert (
        "| level | plays | makespan mean (s) | server | think | waiting on joins | client lag | idle cut |" in markdown
    )
