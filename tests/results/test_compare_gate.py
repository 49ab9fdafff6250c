"""`agentx compare --fail-on` (agentx.results.compare.gate): the grammar, evaluation on comparisons built here and on
the simulator, the exit codes, the JUnit file read back, and a run without completed requests or tokens never
passing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import msgspec
import pytest
from click.testing import CliRunner
from compare_runs import BLOCK, compare_sweep, compare_trace
from flat import replay_options
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx import replay_sync
from agentx.cli import main
from agentx.errors import ConfigError
from agentx.results.compare.build import Comparison, Row, Versus, compare
from agentx.results.compare.gate import (
    Gate,
    check_kinds,
    evaluate,
    junit_xml,
    known_figures,
    metric_name,
    parse_gate,
    run_figures,
)
from agentx.results.compare.metrics import metrics
from agentx.results.compare.options import CompareOptions
from agentx.results.compare.sides import Side
from agentx.results.compare.sweeps import SweepVersus, TargetRow
from agentx.results.report.frontier import FrontierOptions
from agentx.sim.engine.config import EngineConfig
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts the simulator (tests/project/test_tiers.py)

TARGETS = (30.0, 50.0, 75.0)


# ---------------------------------------------------------------------------------------------
# the grammar


def test_every_figure_compare_shows_is_nameable() -> None:
    names = run_figures()
    for spec, _ in metrics(True):
        assert names[metric_name(spec.name)] == spec.better
    assert {"ttft_p90", "tpot_p50", "itl_p99", "e2el_p90", "interactivity_p50", "output_throughput"} <= set(names)
    assert {"total_throughput", "goodput", "session_makespan_p50", "gpu_time_per_task", "usd_per_task"} <= set(names)
    assert {"tput_per_gpu@30", "tput_per_gpu@50", "tput_per_gpu@75"} <= set(known_figures(TARGETS))


worse_bounds = st.sampled_from(sorted(known_figures(TARGETS).items())).flatmap(
    lambda item: st.tuples(
        st.just(item[0]),
        st.just(item[1]),
        st.integers(0, 50_000).map(lambda hundredths: f"{hundredths / 100:.2f}"),  # percent, two places
    )
)


@settings(max_examples=examples(200), deadline=None)
@given(bounds=st.lists(worse_bounds, min_size=1, max_size=6), spaces=st.booleans())
def test_a_bound_of_the_worse_sign_parses_to_its_relative_change(
    bounds: list[tuple[str, str, str]], spaces: bool
) -> None:
    pad = " " if spaces else ""
    text = ",".join(
        f"{pad}{name.upper() if i % 2 else name}{pad}:{pad}{'-' if better == 'higher' else '+'}{magnitude}%{pad}"
        for i, (name, better, magnitude) in enumerate(bounds)
    )
    gate = parse_gate(text, TARGETS)
    assert [b.figure for b in gate.bounds] == [name for name, _, _ in bounds]
    for bound, (_, better, magnitude) in zip(gate.bounds, bounds, strict=True):
        sign = -1.0 if better == "higher" else 1.0
        assert bound.limit == pytest.approx(sign * float(magnitude) / 100.0)
        assert bound.better == better
        assert parse_gate(bound.text, TARGETS).bounds == [bound]  # the normalized text parses to itself


@settings(max_examples=examples(100), deadline=None)
@given(item=st.sampled_from(sorted(known_figures(TARGETS).items())), magnitude=st.integers(0, 100))
def test_a_bound_of_the_better_sign_is_a_usage_error(item: tuple[str, str], magnitude: int) -> None:
    name, better = item
    wrong = "+" if better == "higher" else "-"
    with pytest.raises(ConfigError, match=f"{better}-is-better"):
        parse_gate(f"{name}:{wrong}{magnitude}%", TARGETS)


@settings(max_examples=examples(100), deadline=None)
@given(text=st.text(max_size=30))
def test_anything_else_is_a_usage_error_or_a_gate(text: str) -> None:
    try:
        gate = parse_gate(text, TARGETS)
    except ConfigError as error:
        assert "figures: ttft_p50" in str(error) or "-is-better" in str(error)
    else:
        assert gate.bounds and all(b.figure in known_figures(TARGETS) for b in gate.bounds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft_p90", "is not FIGURE:BOUND"),
        ("ttft_p90:10%", "is not FIGURE:BOUND"),  # no sign
        ("ttft_p90:+10", "is not FIGURE:BOUND"),  # no percent
        ("ttft_p90:+10%,", "is not FIGURE:BOUND"),
        ("ttft_p95:+10%", "'ttft_p95', which compare does not show"),
        ("tput_per_gpu@60:-3%", "'tput_per_gpu@60', which compare does not show"),  # not among --targets
        ("ttft_p90@50:+1%", "'ttft_p90@50', which compare does not show"),
        ("tput_per_gpu@50:+3%", "higher-is-better, so its bound is -N%"),
    ],
)
def test_malformed_gates_name_the_figures(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_gate(text, TARGETS)


def test_targets_are_read_as_numbers_and_kinds_are_checked() -> None:
    gate = parse_gate("tput_per_gpu@50.0:-3%", TARGETS)
    assert gate.bounds[0].figure == "tput_per_gpu@50" and gate.bounds[0].text == "tput_per_gpu@50:-3%"
    check_kinds(gate, "sweep", TARGETS)
    with pytest.raises(ConfigError, match="not a figure of a comparison of runs"):
        check_kinds(gate, "run", TARGETS)
    with pytest.raises(ConfigError, match="not a figure of a comparison of sweeps"):
        check_kinds(parse_gate("ttft_p90:+5%", TARGETS), "sweep", TARGETS)


# ---------------------------------------------------------------------------------------------
# evaluation on comparisons built by hand


def _side(label: str, gpu_s: float | None = 10.0, usd: float | None = 0.01) -> Side:
    prices = {} if usd is None else {"given": usd}
    return Side(label=label, path=label, kind="run", repeats=1, requests=10, sessions=5, gpus=8, gpu_sku=None,
                findings=[], tasks=5, gpu_s_per_task=gpu_s, usd_per_task=prices)  # fmt: skip


def _row(metric: str, better: str, base: float | None, value: float | None, low: float, high: float,
         verdict: str = "") -> Row:  # fmt: skip
    relative = None if base is None or value is None or base == 0 else value / base - 1
    if not verdict and low <= 0 <= high:
        verdict = "no resolved difference"
    elif not verdict:
        verdict = "better" if (low > 0) == (better == "higher") else "worse"
    return Row(metric=metric, unit="", better=better, baseline=base, value=value, relative=relative, low=low,
               high=high, verdict=verdict)  # fmt: skip


def _comparison(*rows: Row, base: Side | None = None, other: Side | None = None) -> Comparison:
    output = [r for r in rows if r.metric == "output throughput"] or [
        _row("output throughput", "higher", 100.0, 100.0, -0.01, 0.01)
    ]
    rest = [r for r in rows if r.metric != "output throughput"]
    versus = Versus(baseline="base", other="new", paired=True, pairing="", rows=[*output, *rest])
    return Comparison(level=0.95, row_level=0.997, replicates=100, sides=[base or _side("base"), other or _side("new")],
                      differences=[], versus=[versus])  # fmt: skip


def _outcome(gate: str, comparison: Comparison) -> list[tuple[bool, str]]:
    return [(c.passed, c.reason) for c in evaluate(parse_gate(gate, TARGETS), comparison, gate).checks]


def test_a_bound_fails_only_when_the_whole_interval_lies_beyond_it() -> None:
    # TTFT +20 % in [+12 %, +28 %]: beyond +10 % (fails), not wholly beyond +15 % (passes), resolved worse either way.
    comparison = _comparison(_row("TTFT p90", "lower", 100.0, 120.0, 0.12, 0.28))
    assert _outcome("ttft_p90:+10%", comparison)[0][0] is False
    assert "resolved worse than +10.0%" in _outcome("ttft_p90:+10%", comparison)[0][1]
    assert _outcome("ttft_p90:+15%", comparison)[0][0] is True
    assert _outcome("ttft_p90:+0%", comparison)[0][0] is False
    # Throughput −5 % in [−8 %, −2 %]: beyond −1 %, not wholly beyond −3 %.
    down = _comparison(_row("output throughput", "higher", 100.0, 95.0, -0.08, -0.02))
    assert [ok for ok, _ in _outcome("output_throughput:-1%,output_throughput:-3%", down)] == [False, True]
    # A better figure never fails, however far it moved.
    assert _outcome("ttft_p90:+0%", _comparison(_row("TTFT p90", "lower", 100.0, 50.0, -0.6, -0.4)))[0][0] is True


def test_a_missing_figure_or_a_withheld_verdict_fails() -> None:
    lacking = _comparison(_row("TTFT p90", "lower", 100.0, None, -0.01, 0.01))
    assert _outcome("ttft_p90:+10%", lacking) == [
        (False, "new has no ttft_p90 (no completed requests, no tokens, or off the front)")
    ]
    assert "neither side has goodput" in _outcome("goodput:-5%", _comparison())[0][1]
    withheld = _comparison(_row("TTFT p90", "lower", 100.0, 100.0, -0.01, 0.01, "withheld (gpus differs)"))
    assert _outcome("ttft_p90:+10%", withheld) == [(False, "verdict withheld (gpus differs)")]
    audit = _comparison(_row("TPOT p50", "lower", 10.0, 10.0, -0.01, 0.01, "withheld (the audit rejects it)"))
    assert _outcome("tpot_p50:+10%", audit)[0] == (False, "verdict withheld (the audit rejects it)")


def test_a_run_without_output_tokens_never_passes() -> None:
    tokenless = _comparison(
        _row("output throughput", "higher", 100.0, 0.0, -1.0, -1.0),
        _row("TTFT p90", "lower", 100.0, 90.0, -0.2, 0.0),
    )
    outcome = _outcome("ttft_p90:+50%", tokenless)
    assert outcome == [(False, "new produced no output tokens: a run without tokens never passes")]
    assert _outcome("output_throughput:-100%", tokenless)[0][0] is False


def test_usd_per_task_scales_the_gpu_time_interval_by_the_prices() -> None:
    row = _row("GPU time per task", "lower", 10.0, 10.0, -0.02, 0.02)
    same = _comparison(row)
    assert _outcome("usd_per_task:+5%", same)[0][0] is True
    # The candidate's GPU costs 20 % more per hour: $ per task +20 % in [+17.6 %, +22.4 %].
    pricier = _comparison(row, other=_side("new", gpu_s=10.0, usd=0.012))
    check = evaluate(parse_gate("usd_per_task:+5%", TARGETS), pricier).checks[0]
    assert not check.passed and check.relative == pytest.approx(0.2)
    assert check.low == pytest.approx(0.98 * 1.2 - 1) and check.high == pytest.approx(1.02 * 1.2 - 1)
    unpriced = _comparison(row, base=_side("base", usd=None))
    assert "no price common to both sides" in _outcome("usd_per_task:+5%", unpriced)[0][1]


def test_sweep_targets_are_gated_per_target() -> None:
    sweep = SweepVersus(baseline="base", other="new", basis="total", statistic="p90", targets=[
        TargetRow(target_tps=30.0, baseline=1000.0, value=900.0, relative=-0.1, low=-0.15, high=-0.05, verdict="worse"),
        TargetRow(target_tps=50.0, baseline=800.0, value=790.0, relative=-0.0125, low=-0.05, high=0.03,
                  verdict="no resolved difference"),
        TargetRow(target_tps=75.0, baseline=500.0, value=None, relative=None, verdict="outside a front"),
    ])  # fmt: skip
    comparison = Comparison(level=0.95, row_level=0.98, replicates=100, sides=[], differences=[], sweeps=[sweep])
    outcome = _outcome("tput_per_gpu@30:-3%,tput_per_gpu@50:-3%,tput_per_gpu@75:-50%", comparison)
    assert [ok for ok, _ in outcome] == [False, True, False]
    assert outcome[2][1].startswith("new has no tput_per_gpu@75")


def test_junit_has_a_testcase_per_bound_per_side() -> None:
    comparison = _comparison(_row("TTFT p90", "lower", 100.0, 120.0, 0.12, 0.28))
    comparison.versus.append(msgspec.structs.replace(comparison.versus[0], other="third"))
    comparison.sides.append(_side("third"))
    result = evaluate(parse_gate("ttft_p90:+10%,output_throughput:-3%", TARGETS), comparison, "spec")
    root = ElementTree.fromstring(junit_xml(result))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "4" and suite.get("failures") == "2"
    cases = [(case.get("classname"), case.get("name"), case.find("failure")) for case in suite.iter("testcase")]
    assert [(c, n, f is not None) for c, n, f in cases] == [
        ("agentx.compare.new", "ttft_p90:+10%", True),
        ("agentx.compare.new", "output_throughput:-3%", False),
        ("agentx.compare.third", "ttft_p90:+10%", True),
        ("agentx.compare.third", "output_throughput:-3%", False),
    ]
    failure = cases[0][2]
    assert failure is not None and "resolved worse than +10.0%" in (failure.get("message") or "")
    assert "base 100, new 120, change +20.00%, interval [+12.00%, +28.00%]" in (failure.text or "")


def test_an_empty_gate_does_not_pass_silently() -> None:
    assert evaluate(Gate(bounds=[]), _comparison()).passed  # no bound, nothing to fail ...
    with pytest.raises(ConfigError):  # ... which the grammar never gives
        parse_gate("", TARGETS)


# ---------------------------------------------------------------------------------------------
# on the simulator, through the command line


def _engine(step_s: float, **fields: float) -> EngineConfig:
    return EngineConfig(block_size=BLOCK, step_overhead_s=step_s, prefill_s_per_token=0.0, decode_s_per_token=0.0,
                        attention_s_per_kv_token=0.0, **fields)  # type: ignore[arg-type]  # fmt: skip


def _run(out_dir: Path, step_s: float, faults: FaultConfig | None = None) -> Path:
    """A closed-loop run on a simulator whose every step takes `step_s`: TPOT = step_s."""
    with SimServer(_engine(step_s), faults=faults) as server:
        options = replay_options(url=server.url, model=server.model, out_dir=out_dir, mode="closed", concurrency=3,
                                 sessions=10, delay_scale=0.2, grace_s=5.0)  # fmt: skip
        replay_sync(compare_trace(), options, num_gpus=8)
    return out_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate")
    return {
        "fast": _run(root / "fast", 0.010),
        "slow": _run(root / "slow", 0.015),
        "dead": _run(root / "dead", 0.010, FaultConfig(error_500_rate=1.0)),
    }


def _cli(*args: str | Path) -> tuple[int, str]:
    """The exit code and the output, stderr's lines included."""
    result = CliRunner().invoke(main, ["compare", *map(str, args), "--bootstrap", "400"])
    return result.exit_code, result.output


def _cli_stdout(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["compare", *map(str, args), "--bootstrap", "400"])
    return result.exit_code, result.stdout


def test_a_known_slowdown_fails_the_gate_and_a_run_against_itself_passes(runs: dict[str, Path], tmp_path: Path) -> None:
    gate = "tpot_p50:+5%,interactivity_p50:-5%,ttft_p90:+500%"
    page = tmp_path / "same.html"
    code, output = _cli(runs["fast"], runs["fast"], "--fail-on", gate, "--html", page)
    assert code == 0, output
    assert "passed" in output
    # The page holds the comparison's tables and, last, the gate's: one row per bound.
    html = page.read_text()
    assert f"gate --fail-on {gate}: passed" in html and html.count("<td>pass</td>") == 3
    assert html.index("TPOT p50") < html.index("gate --fail-on")
    junit = tmp_path / "gate.xml"
    code, output = _cli(runs["fast"], runs["slow"], "--fail-on", gate, "--junit", junit)
    comparison = compare([runs["fast"], runs["slow"]], CompareOptions(replicates=400))
    tpot = next(row for row in comparison.versus[0].rows if row.metric == "TPOT p50")
    if tpot.verdict.startswith("withheld"):  # a machine too loaded to time the run: the audit says so, and it fails
        assert code == 1 and "verdict withheld" in output
        return
    assert code == 1, output
    assert "gate failed: 2 of 3 bounds (slow: tpot_p50:+5%: resolved worse than +5.0%" in output
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "2"
    failures = {case.get("name"): case.find("failure") for case in suite.iter("testcase")}
    assert failures["ttft_p90:+500%"] is None
    tpot_failure = failures["tpot_p50:+5%"]
    # Both sides' figures and the change (the figures themselves vary with the machine's load).
    assert tpot_failure is not None
    text = tpot_failure.text or ""
    assert re.search(r"tpot_p50: fast [\d.,]+, slow [\d.,]+, change \+[\d.]+%, interval \[", text), text
    # Bounds wider than the 50 % slowdown's interval pass.
    code, output = _cli(runs["fast"], runs["slow"], "--fail-on", "tpot_p50:+80%,interactivity_p50:-50%")
    assert code == 0, output


def test_a_run_without_completed_requests_fails_the_gate(runs: dict[str, Path], tmp_path: Path) -> None:
    junit = tmp_path / "dead.xml"
    page = tmp_path / "dead.html"
    code, output = _cli(runs["fast"], runs["dead"], "--fail-on", "ttft_p90:+1000%", "--junit", junit, "--html", page)
    assert code == 1 and "dead has no completed request" in output
    assert "FAILED" in page.read_text() and "dead has no completed request" in page.read_text()
    case = ElementTree.parse(junit).getroot().find("testsuite/testcase")
    assert case is not None and case.find("failure") is not None
    code, output = _cli_stdout(runs["dead"], runs["fast"], "--fail-on", "ttft_p90:+1000%", "--json")
    assert code == 1
    document = msgspec.json.decode(output)
    assert document["gate"]["passed"] is False and "versus" not in document
    code, output = _cli(runs["fast"], runs["dead"])  # without a gate, compare refuses it as before
    assert code == 2


def test_exit_codes_json_and_markdown(runs: dict[str, Path], tmp_path: Path) -> None:
    code, output = _cli(runs["fast"], runs["fast"], "--fail-on", "ttft_p90:-10%")
    assert code == 2 and "lower-is-better" in output
    code, output = _cli(runs["fast"], runs["fast"], "--fail-on", "tput_per_gpu@50:-3%")
    assert code == 2 and "not a figure of a comparison of runs" in output
    code, output = _cli(runs["fast"], runs["fast"], "--junit", tmp_path / "x.xml")
    assert code == 2 and "pass --fail-on too" in output
    code, output = _cli_stdout(runs["fast"], runs["fast"], "--fail-on", "ttft_p90:+10%", "--json")
    assert code == 0
    document = msgspec.json.decode(output)
    assert document["versus"][0]["rows"] and document["gate"]["passed"] is True
    assert document["gate"]["checks"][0]["bound"] == "ttft_p90:+10%"
    code, output = _cli(runs["fast"], runs["fast"], "--fail-on", "ttft_p90:+10%,goodput:-5%", "--markdown")
    assert code == 1
    assert "### gate --fail-on ttft_p90:+10%,goodput:-5%: FAILED (1 of 2)" in output
    assert "| fast | ttft_p90:+10% |" in output and "| fast | goodput:-5% |" in output


def test_a_withheld_comparison_fails_the_gate_unless_allowed(runs: dict[str, Path], tmp_path: Path) -> None:
    sixteen = tmp_path / "sixteen"
    shutil.copytree(runs["fast"], sixteen)
    run_json = sixteen / "run.json"
    document = msgspec.json.decode(run_json.read_bytes())
    document["summary"]["throughput"]["num_gpus"] = 16
    run_json.write_bytes(msgspec.json.encode(document))
    junit = tmp_path / "withheld.xml"
    code, output = _cli(runs["fast"], sixteen, "--fail-on", "ttft_p90:+10%", "--junit", junit)
    assert code == 3 and "verdicts withheld" in output
    failure = ElementTree.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message") == "verdict withheld (gpus differs)"
    code, output = _cli(runs["fast"], sixteen, "--fail-on", "ttft_p90:+10%", "--allow", "gpus")
    assert code == 0, output
    code, output = _cli(runs["fast"], sixteen, "--fail-on", "ttft_p90:+10%", "--junit", junit)
    assert code == 2 and "exists: pass --overwrite" in output


# ---------------------------------------------------------------------------------------------
# sweeps


def test_a_slower_sweep_fails_at_a_target_and_an_unreached_target_fails(tmp_path: Path) -> None:
    fast, slow = compare_sweep(tmp_path / "fast", 1.0), compare_sweep(tmp_path / "slow", 1.5)
    targets = FrontierOptions(statistic="p50", targets_tps=(46.0, 1000.0))
    comparison = compare([fast, slow], CompareOptions(frontier=targets, replicates=400))
    row = comparison.sweeps[0].targets[0]
    result = evaluate(parse_gate("tput_per_gpu@46:-3%,tput_per_gpu@1000:-50%", targets.targets_tps), comparison)
    assert not result.checks[1].passed and "has no tput_per_gpu@1000" in result.checks[1].reason
    # Interactivity 40-83 tok/s fast, 27-56 slow (tests/results/test_compare.py): 46 is on both fronts.
    assert row.relative is not None and row.low is not None and row.high is not None, row
    assert result.checks[0].passed == (row.verdict != "worse" or row.high >= -0.03)
    code, output = _cli(fast, slow, "--statistic", "p50", "--targets", "46,1000", "--fail-on", "tput_per_gpu@1000:-50%")
    assert code == 1 and "tput_per_gpu@1000" in output
    code, output = _cli(fast, fast, "--statistic", "p50", "--targets", "46", "--fail-on", "tput_per_gpu@46:-3%")
    assert code == 0, output
