"""Concurrency sweeps over real HTTP against the simulator: levels, index, resume, before-level, CLI errors."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from small_sweep import ENGINE, GPUS, LEVELS, base_options, run_small_sweep, small_trace

import agentx
from agentx.cli import main
from agentx.errors import SweepError
from agentx.records.run_folder import RUN_FILE, SWEEP_FILE
from agentx.replayer.options.replay import ReplayOptions, Server, Speculative
from agentx.results.report.frontier import point
from agentx.run.sweep import (
    LevelSettings,
    SweepOptions,
    SweepResult,
    before_level_command,
    load_level_settings,
    parse_levels,
    sweep_sync,
)
from agentx.sim.process import SimServer
from agentx.trace.io import save_trace
from agentx.trace.model import Session

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    return run_small_sweep(tmp_path_factory.mktemp("sweep") / "out")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(ENGINE) as server:
        yield server


def test_throughput_rises_and_interactivity_falls_with_concurrency(swept: SweepResult) -> None:
    assert [level.entry.status for level in swept.levels] == ["ok", "ok", "ok"]
    index = json.loads((swept.out_dir / SWEEP_FILE).read_text())
    assert index["concurrency"] == list(LEVELS) and index["gpu_sku"] == "h100" and index["num_gpus"] == GPUS
    assert [(e["concurrency"], e["dir"], e["status"]) for e in index["levels"]] == [
        (1, "c1", "ok"),
        (2, "c2", "ok"),
        (4, "c4", "ok"),
    ]
    seeds = set()
    points = []
    for level in swept.levels:
        run_dir = swept.out_dir / f"c{level.entry.concurrency}"
        run_file = json.loads((run_dir / RUN_FILE).read_text())
        assert run_file["options"]["concurrency"] == level.entry.concurrency
        assert (run_dir / "records.arrow").is_file()
        seeds.add(run_file["options"]["seed"])
        assert level.summary is not None and level.summary.counts.errors == 0
        found = point(level.summary, f"c{level.entry.concurrency}")
        assert found is not None and found.gpus_known and found.num_gpus == GPUS
        points.append(found)
    assert seeds == {0}
    throughput = [p.total_tps_per_gpu for p in points]
    output = [p.output_tps_per_gpu for p in points]
    interactivity = [p.interactivity_tps for p in points]
    assert throughput == sorted(throughput) and len(set(throughput)) == len(throughput), throughput
    assert output == sorted(output), output
    assert interactivity == sorted(interactivity, reverse=True), interactivity
    # Well apart, not merely ordered: about 1.6× the throughput and 0.6× the speed per user from 1 to 4.
    assert throughput[-1] > 1.3 * throughput[0] and interactivity[-1] < 0.8 * interactivity[0]


def test_resume_skips_finished_levels_and_reruns_the_rest(swept: SweepResult, sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "again"
    shutil.copytree(swept.out_dir, out)
    (out / "c2" / RUN_FILE).unlink()  # a level that never finished
    interrupted = json.loads((out / "c4" / RUN_FILE).read_text())
    interrupted["run"]["interrupted"] = True  # a level stopped by Ctrl-C
    (out / "c4" / RUN_FILE).write_text(json.dumps(interrupted))
    kept = json.loads((out / "c1" / RUN_FILE).read_text())
    kept["options"]["extra_body"] = {"temperature": 0.0, "top_k": 50}  # as the resumed sweep's own
    (out / "c1" / RUN_FILE).write_text(json.dumps(kept))
    kept_records = (out / "c1" / "records.arrow").stat().st_mtime_ns
    log = tmp_path / "levels.log"
    options = SweepOptions(
        concurrency=LEVELS,
        out_dir=out,
        num_gpus=GPUS,
        resume=True,
        before_level=f"echo {{concurrency}} {{spec_al}} {{spec_k}} >> {log}",
        level_settings={2: LevelSettings(spec_al=1.0, spec_k=1, extra_body={"top_k": 1})},
    )
    base = base_options(sim, out)
    server = msgspec.structs.replace(base.server, extra_body={"temperature": 0.0, "top_k": 50})
    base = msgspec.structs.replace(base, server=server)
    result = sweep_sync(small_trace(), base, options)
    assert [level.entry.status for level in result.levels] == ["kept", "ok", "ok"]
    assert result.levels[0].summary is not None  # read back from the kept run.json
    assert (out / "c1" / "records.arrow").stat().st_mtime_ns == kept_records
    # The command ran before the two replayed levels only, with the level's settings substituted.
    assert log.read_text().split("\n") == ["2 1.0 1", "4", ""]
    rerun = json.loads((out / "c2" / RUN_FILE).read_text())
    assert rerun["options"]["spec_al"] == 1.0 and rerun["options"]["spec_k"] == 1
    assert rerun["options"]["extra_body"] == {"temperature": 0.0, "top_k": 1}  # the level's merged over the sweep's
    other = json.loads((out / "c4" / RUN_FILE).read_text())["options"]
    assert other["extra_body"] == {"temperature": 0.0, "top_k": 50} and other["spec_al"] is None
    assert not json.loads((out / "c4" / RUN_FILE).read_text())["run"]["interrupted"]
    index = json.loads((out / SWEEP_FILE).read_text())
    assert [e["status"] for e in index["levels"]] == ["kept", "ok", "ok"]


def test_resume_refuses_levels_run_with_other_settings(swept: SweepResult, sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "again"
    shutil.copytree(swept.out_dir, out)
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    base = base_options(sim, out)
    changed = msgspec.structs.replace(
        base, scenario=msgspec.structs.replace(base.scenario, seed=7, duration_s=3.0, delay_scale=0.5)
    )
    with pytest.raises(SweepError) as raised:
        sweep_sync(small_trace(), changed, SweepOptions(concurrency=LEVELS, out_dir=out, num_gpus=GPUS, resume=True))
    message = str(raised.value)
    for level in ("c1", "c2", "c4"):
        assert f"{level} ran with delay_scale 0, not 0.5, duration_s 1.2, not 3, seed 0, not 7" in message
    assert "--overwrite" in message and "--resume-anyway" in message
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before  # nothing replayed or rewritten
    other_trace = SweepOptions(concurrency=(1,), out_dir=out, num_gpus=GPUS, resume=True)
    with pytest.raises(SweepError, match="c1 ran with another trace"):
        sweep_sync(small_trace(sessions=3), base, other_trace)
    # Asked to, the resume keeps them all the same.
    anyway = SweepOptions(concurrency=LEVELS, out_dir=out, num_gpus=GPUS, resume=True, resume_anyway=True)
    result = sweep_sync(small_trace(), changed, anyway)
    assert [level.entry.status for level in result.levels] == ["kept", "kept", "kept"]


def test_resume_refuses_levels_another_servers_url_answered(swept: SweepResult, sim: SimServer, tmp_path: Path) -> None:
    # `swept` ran against a simulator of its own, on another port than `sim`: the built-in simulator's URL changes at
    # every start, so a level it answered is kept whatever its URL (the other resume tests); a real server's is not.
    out = tmp_path / "again"
    shutil.copytree(swept.out_dir, out)
    urls = set()
    for level in ("c1", "c2", "c4"):
        document = json.loads((out / level / RUN_FILE).read_text())
        document["run"]["server"] = {"engine": "vLLM", "version": "0.11.0"}
        urls.add(document["options"]["url"])
        (out / level / RUN_FILE).write_text(json.dumps(document))
    (earlier_url,) = urls
    assert earlier_url != sim.url
    with pytest.raises(SweepError) as raised:
        sweep_sync(small_trace(), base_options(sim, out), SweepOptions(concurrency=LEVELS, out_dir=out, resume=True))
    for level in ("c1", "c2", "c4"):
        assert f"{level} ran with url {earlier_url}, not {sim.url}" in str(raised.value)


def test_resuming_some_levels_keeps_the_others_in_the_index(swept: SweepResult, sim: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "again"
    shutil.copytree(swept.out_dir, out)
    index = json.loads((out / SWEEP_FILE).read_text())
    for level in index["levels"]:
        level["status"] = "skipped"  # as an older agentx wrote a level --resume kept
    (out / SWEEP_FILE).write_text(json.dumps(index))
    (out / "c2" / RUN_FILE).unlink()
    options = SweepOptions(concurrency=(2,), out_dir=out, num_gpus=GPUS, resume=True)
    result = sweep_sync(small_trace(), base_options(sim, out), options)
    assert [(level.entry.concurrency, level.entry.status) for level in result.levels] == [(2, "ok")]
    written = json.loads((out / SWEEP_FILE).read_text())
    assert written["concurrency"] == list(LEVELS)
    assert [(e["concurrency"], e["status"]) for e in written["levels"]] == [(1, "kept"), (2, "ok"), (4, "kept")]


def test_a_failing_before_level_fails_that_level_and_the_sweep_goes_on(tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(small_trace(sessions=2, turns=2, out_tokens=8), trace_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(trace_path), "--concurrency", "1,2", "--duration", "0.4", "--mode", "closed"]
    args += ["--delay-scale", "0", "--sim-time-scale", "0.02", "--out", str(out)]
    args += ["--before-level", "echo restarting at {concurrency}; test {concurrency} != 1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    assert "error: 1 of 2 level(s) failed (c1: the before-level command" in result.output
    index = json.loads((out / SWEEP_FILE).read_text())
    first, second = index["levels"]
    assert first["status"] == "failed" and second["status"] == "ok"
    assert "`echo restarting at 1; test 1 != 1` exited with status 1" in first["error"]
    assert "restarting at 1" in first["error"]  # the command's output, to see why
    assert not (out / "c1" / RUN_FILE).exists() and (out / "c2" / RUN_FILE).exists()
    assert "c1: failed" in result.output and "1 failed" in result.output


def test_the_library_refuses_to_sweep_over_a_sweep_unless_told(swept: SweepResult, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(swept.out_dir, out)
    kept = (out / "c1" / "records.arrow").read_bytes()
    options = SweepOptions(concurrency=(1,), out_dir=out)
    base = ReplayOptions(server=Server(url="http://127.0.0.1:9", model="m"), out_dir=out)
    with pytest.raises(SweepError, match=r"already holds a sweep \(c1/records.arrow, c2/records.arrow, c4/records"):
        sweep_sync(small_trace(), base, options)
    assert (out / "c1" / "records.arrow").read_bytes() == kept


def test_before_level_substitution_quotes_values_and_leaves_other_braces() -> None:
    base = ReplayOptions(
        server=Server(url="http://x", model="m"), out_dir=Path("o"), speculative=Speculative(al=2.5, k=3)
    )
    command = before_level_command(
        "restart --al {spec_al} --k {spec_k} -c {concurrency} '{x}'", 8, LevelSettings(), base
    )
    assert command == "restart --al 2.5 --k 3 -c 8 '{x}'"
    assert before_level_command("{spec_al}", 1, LevelSettings(spec_al=1.5), base) == "1.5"


def test_level_settings_and_levels_parse_or_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "levels.json"
    path.write_text(json.dumps({"1": {"spec_al": 3.2, "spec_k": 3}, "64": {"extra_body": {"top_k": 1}}}))
    settings = load_level_settings(path)
    assert settings[1] == LevelSettings(spec_al=3.2, spec_k=3) and settings[64].extra_body == {"top_k": 1}
    for content, message in (
        ("[1]", "not a level-settings table"),
        ('{"x": {}}', "not a concurrency level"),
        ('{"1": {"spec_al": "high"}}', "not a level-settings table"),
        ('{"1": {"al": 2}}', "not a level-settings table"),
    ):
        path.write_text(content)
        with pytest.raises(SweepError, match=message):
            load_level_settings(path)
    assert parse_levels("1, 2,4") == (1, 2, 4)
    for text in ("", "1,x", "0,1", "2,2"):
        with pytest.raises(SweepError, match="--concurrency"):
            parse_levels(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "1,two"], "comma-separated list of positive integers"),
        (["--concurrency", "4,4"], "distinct positive integers"),
        (["--concurrency", "1", "--gpu-sku", "tpu9"], "--gpu-sku 'tpu9' is not one of"),
        (["--concurrency", "1", "--level-settings", "missing.json"], "cannot read the level settings"),
        (["--concurrency", "1", "--extra-body", "[1]"], "--extra-body must be a JSON object"),
        (["--concurrency", "1", "--spec-al", "9", "--spec-k", "1"], "[1, K+1] = [1, 2] for K=1"),
    ],
)
def test_sweep_mistakes_exit_2_with_one_paragraph(tmp_path: Path, args: list[str], message: str) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(small_trace(sessions=1, turns=1), trace_path)
    result = CliRunner().invoke(main, ["sweep", str(trace_path), "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1
    assert not (tmp_path / "out").exists()


def test_the_index_round_trips(swept: SweepResult) -> None:
    from agentx.results.folders.sweep_index import SweepIndex

    index = msgspec.json.decode((swept.out_dir / SWEEP_FILE).read_bytes(), type=SweepIndex)
    assert [level.concurrency for level in index.levels] == list(LEVELS) and index.trace == "small"
    assert agentx.sweep_sync is sweep_sync and agentx.SweepOptions is SweepOptions  # the public API


def test_the_trace_is_prepared_once_for_every_level(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentx.replayer.plan import sessions as sessions_module
    from agentx.trace.chains import split_flattened_agents as real_split

    split_calls: list[str] = []

    def counting_split(session: Session, *args: object, **kwargs: object) -> Session:
        split_calls.append(session.session_id)
        return real_split(session, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sessions_module, "split_flattened_agents", counting_split)
    trace = small_trace(sessions=3, turns=2, out_tokens=4)
    base = base_options(sim, tmp_path)
    base = msgspec.structs.replace(base, scenario=msgspec.structs.replace(base.scenario, duration_s=None))  # one pass
    result = sweep_sync(trace, base, SweepOptions(concurrency=(1, 3), out_dir=tmp_path / "out"))
    assert [level.entry.status for level in result.levels] == ["ok", "ok"]
    for level in result.levels:
        assert level.summary is not None and level.summary.counts.kept == 6  # both levels played all three
    assert sorted(split_calls) == ["s0", "s1", "s2"]  # split once, for the first level


def test_a_prepared_trace_is_refused_by_a_run_with_other_preparation_options(sim: SimServer, tmp_path: Path) -> None:
    from agentx.replayer.plan.preparation import prepare_trace
    from agentx.replayer.run_replay import run_replay

    base = base_options(sim, tmp_path)
    prepared = prepare_trace(small_trace(sessions=1), base)
    other = msgspec.structs.replace(base, scenario=msgspec.structs.replace(base.scenario, max_context_length=10_000))
    with pytest.raises(ValueError, match="prepared trace was made for other options"):
        asyncio.run(run_replay(prepared, other))


def test_without_url_each_level_runs_on_a_simulator_forced_to_its_acceptance(tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(small_trace(sessions=2, turns=3, out_tokens=60), trace_path)
    settings = tmp_path / "levels.json"
    settings.write_text(json.dumps({"1": {"spec_al": 1.5, "spec_k": 3}, "2": {"spec_al": 3.5, "spec_k": 3}}))
    out = tmp_path / "sweep"
    args = ["sweep", str(trace_path), "--concurrency", "1,2", "--duration", "0.6", "--mode", "closed"]
    args += ["--delay-scale", "0", "--sim-time-scale", "0.02", "--out", str(out), "--level-settings", str(settings)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "restarting the simulator for c2: AL 3.5, K 3" in result.output
    for level, forced in ((1, 1.5), (2, 3.5)):
        run_file = json.loads((out / f"c{level}" / RUN_FILE).read_text())
        acceptance = run_file["summary"]["acceptance"]
        assert acceptance["forced_al"] == forced and not acceptance["mismatch"], acceptance
        assert acceptance["counters"]["acceptance_length"] == pytest.approx(forced, abs=0.3)


def test_a_sweep_into_an_existing_sweep_is_refused_unless_resumed_or_overwritten(tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(small_trace(sessions=2, turns=2, out_tokens=8), trace_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(trace_path), "--concurrency", "1", "--duration", "0.4", "--mode", "closed"]
    args += ["--delay-scale", "0", "--sim-time-scale", "0.02", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    records = (out / "c1" / "records.arrow").read_bytes()
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "already holds a sweep" in again.output and "c1/records.arrow" in again.output
    assert (out / "c1" / "records.arrow").read_bytes() == records
    assert CliRunner().invoke(main, [*args, "--overwrite"]).exit_code == 0
