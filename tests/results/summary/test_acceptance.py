"""Realized speculative acceptance over HTTP against the simulator: counters, stream, mismatch, CLI errors."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
from builders import make_request, make_session, make_trace
from click.testing import CliRunner
from flat import replay_options
from rich.console import Console

from agentx.cli import main
from agentx.cli.display.summary_tables import summary_table
from agentx.records.record import read_records
from agentx.replayer.options.replay import Speculative
from agentx.replayer.telemetry.metrics import METRIC_LABELS, parse_counters
from agentx.replayer.telemetry.metrics import SPEC_METRICS as METRIC_NAMES
from agentx.results.summary.checks.acceptance import (
    CounterAcceptance,
    acceptance,
    counter_acceptance,
    stream_acceptance,
    table_stream_acceptance,
)
from agentx.results.summary.checks.validity import ACCEPTANCE_MISMATCH, validity
from agentx.run.replay import ReplayResult, replay
from agentx.sim.engine.speculative import acceptance_schedule
from agentx.sim.process import SimServer
from agentx.trace.io import save_trace
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BLOCK = 16
TOLERANCE = 0.05
PAIRS = [(al, k) for k in (1, 3, 7) for al in (1.0, 1.84, 3.0, 3.78, 6.0) if al <= k + 1]


def _trace(requests: int = 6, out_tokens: int = 700) -> Trace:
    """Two sessions of growing-context turns: ~4000 output tokens each, thousands of decode steps in all."""
    sessions = []
    for s in range(2):
        turns = [
            make_request(
                float(i), 40 + 16 * i, out_tokens, api_time=0.5, added=tuple(range(1000 * s, 1000 * s + 3 + i))
            )
            for i in range(requests)
        ]
        sessions.append(make_session(f"s{s}", turns))
    return make_trace(*sessions, block_size=BLOCK)


def _replay(sim: SimServer, out_dir: Path, trace: Trace | None = None, **fields: object) -> ReplayResult:
    settings: dict[str, object] = {"mode": "closed", "delay_scale": 0.0, "concurrency": 2, **fields}
    options = replay_options(url=sim.url, model=sim.model, out_dir=out_dir, **settings)
    return asyncio.run(replay(trace or _trace(), options))


@pytest.mark.parametrize(("al", "k"), PAIRS, ids=[f"AL{al}-K{k}" for al, k in PAIRS])
def test_realized_al_from_counters_and_stream_matches_the_simulator(al: float, k: int, tmp_path: Path) -> None:
    with SimServer(time_scale=0.0, block_size=BLOCK, spec_k=k, acceptance_length=al, seed=7) as sim:
        result = _replay(sim, tmp_path, spec_al=al, spec_k=k)
    found = result.summary.acceptance
    assert found is not None
    assert found.counters is not None and found.stream is not None
    assert found.counters.engine == "vllm" and found.counters.window == "run"
    assert found.counters.acceptance_length == pytest.approx(al, abs=TOLERANCE)
    assert found.stream.tokens_per_step == pytest.approx(al, abs=TOLERANCE)
    assert found.stream.chunks > 1000
    assert found.realized_source == "counters" and found.realized_al == found.counters.acceptance_length
    assert found.counters.draft_tokens_per_step == k
    assert found.counters.draft_acceptance_rate == pytest.approx((al - 1) / k, abs=TOLERANCE / k)
    # Unconditional per-position rates: the survival of vLLM's minimum-variance schedule.
    expected = [math.prod(acceptance_schedule(al, k)[: i + 1]) for i in range(k)]
    assert found.counters.per_position_rates == pytest.approx(expected, abs=TOLERANCE)
    assert not found.mismatch and found.forced_al == al and found.spec_k == k
    assert result.summary.validity is not None and ACCEPTANCE_MISMATCH not in result.summary.validity.reasons
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert run_json["options"]["spec_al"] == al and run_json["options"]["spec_k"] == k
    assert run_json["summary"]["acceptance"]["realized_al"] == pytest.approx(al, abs=TOLERANCE)


def test_stream_interval_divides_tokens_per_chunk(tmp_path: Path) -> None:
    """A server merging 2 steps per chunk: the stream estimate needs the interval to recover AL."""
    with SimServer(time_scale=0.0, block_size=BLOCK, spec_k=7, acceptance_length=3.78, stream_interval=2) as sim:
        merged = _replay(sim, tmp_path / "merged", spec_al=3.78, spec_k=7, stream_interval=2)
        table = read_records(merged.run.records_path)
    found = merged.summary.acceptance
    assert found is not None and found.stream is not None and found.stream.stream_interval == 2
    assert found.stream.tokens_per_chunk_mean == pytest.approx(2 * 3.78, abs=2 * TOLERANCE)
    assert found.stream.tokens_per_step == pytest.approx(3.78, abs=TOLERANCE)
    # Read as one step per chunk, the same records would claim twice the AL.
    naive = table_stream_acceptance(table, stream_interval=1)
    assert naive is not None and naive.tokens_per_step == pytest.approx(2 * 3.78, abs=2 * TOLERANCE)


def test_per_chunk_itl_is_al_times_per_token_itl(tmp_path: Path) -> None:
    """AL 3, K 3: every step emits exactly 3 tokens in one chunk, so a chunk gap is 3 token gaps.

    (Means, not medians: the simulator catches up a late step at once, so single gaps jitter around the step. Steps
    of ~8 ms, at time scale 1: a request's TPOT is its decode time over its tokens, and one late last chunk moves
    it by its lateness over ~100 steps, which on a busy machine exceeded 3% of 0.8 ms steps.)
    """
    with SimServer(
        time_scale=1.0, block_size=BLOCK, spec_k=3, acceptance_length=3.0, attention_s_per_kv_token=0.0
    ) as sim:
        result = _replay(sim, tmp_path, trace=_trace(requests=2, out_tokens=301), concurrency=1, spec_al=3.0, spec_k=3)
    latency = result.summary.latency
    assert latency.tpot_s is not None and latency.itl_s is not None and latency.chunk_tokens is not None
    assert latency.itl_s.mean / latency.tpot_s.mean == pytest.approx(3.0, rel=0.03)
    assert latency.chunk_tokens.mean == pytest.approx(3.0, rel=0.01)
    step_s = 0.008 + 60e-6 * 4
    assert latency.tpot_s.p50 == pytest.approx(step_s / 3, rel=0.03)


def _rendered(result: ReplayResult) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    for table in summary_table(result.summary):
        console.print(table)
    return console.export_text()


def test_a_forced_al_the_server_does_not_realize_is_flagged(tmp_path: Path) -> None:
    with SimServer(time_scale=0.0, block_size=BLOCK, spec_k=3, acceptance_length=2.0) as sim:
        result = _replay(sim, tmp_path / "api", trace=_trace(requests=3, out_tokens=300), spec_al=3.0, spec_k=3)
        trace_path = tmp_path / "trace.arrow"
        save_trace(_trace(requests=2, out_tokens=200), trace_path)
        cli = CliRunner().invoke(
            main,
            [
                "replay",
                str(trace_path),
                "--url",
                sim.url,
                "--mode",
                "closed",
                "--delay-scale",
                "0",
                "--spec-al",
                "3",
                "--spec-k",
                "3",
                "--out",
                str(tmp_path / "cli"),
            ],
        )
    found = result.summary.acceptance
    assert found is not None and found.mismatch
    assert found.realized_al == pytest.approx(2.0, abs=TOLERANCE)
    assert "differs from the forced 3" in found.mismatch_reasons[0]
    assert result.summary.validity is not None and not result.summary.validity.valid
    assert ACCEPTANCE_MISMATCH in result.summary.validity.reasons
    assert "MISMATCH" in _rendered(result)
    # Recomputed from the files alone (as `agentx export` does), the verdict stands.
    run_json = json.loads((tmp_path / "api" / "run.json").read_text())
    again = validity(read_records(result.run.records_path), run_json)
    assert ACCEPTANCE_MISMATCH in again.reasons
    assert cli.exit_code == 3, cli.output  # the run does not stand
    assert "MISMATCH" in cli.output and "the realized speculative acceptance disagrees" in cli.output
    assert "error: the realized speculative acceptance disagrees with the forced one: realized AL" in cli.output


def test_the_realized_al_within_tolerance_is_not_flagged_and_a_plain_run_has_no_section(tmp_path: Path) -> None:
    with SimServer(time_scale=0.0, block_size=BLOCK) as sim:
        plain = _replay(sim, tmp_path / "plain", trace=_trace(requests=2, out_tokens=50))
        forced = _replay(sim, tmp_path / "forced", trace=_trace(requests=2, out_tokens=50), spec_al=1.0)
    assert plain.summary.acceptance is None
    assert forced.summary.acceptance is not None and forced.summary.acceptance.counters is None
    assert forced.summary.acceptance.realized_source == "stream"
    assert forced.summary.acceptance.realized_al == pytest.approx(1.0) and not forced.summary.acceptance.mismatch


def test_other_engines_metrics() -> None:
    """ATOM counters (steps by accepted drafts), SGLang gauges, llama.cpp draft counters."""
    atom_before = "atom:mtp_accepted_tokens_total 0\natom:mtp_draft_tokens_total 0\n"
    atom_after = (
        "atom:mtp_accepted_tokens_total 278\natom:mtp_draft_tokens_total 700\n"
        'atom:mtp_decode_steps_total{accepted_tokens="2"} 22\natom:mtp_decode_steps_total{accepted_tokens="3"} 78\n'
        "atom:mtp_average_tokens_per_forward 3.1\n"
    )
    before = parse_counters(atom_before, METRIC_NAMES, METRIC_LABELS)
    after = parse_counters(atom_after, METRIC_NAMES, METRIC_LABELS)
    atom = counter_acceptance(before, after)
    assert atom is not None and atom.engine == "atom" and atom.window == "run"
    assert atom.acceptance_length == pytest.approx(3.78)
    assert atom.per_position_rates == pytest.approx([1.0, 1.0, 0.78])
    assert atom.draft_acceptance_rate == pytest.approx(278 / 700) and atom.draft_tokens_per_step == 7
    gauge_only = parse_counters("atom:mtp_average_tokens_per_forward 3.77\n", METRIC_NAMES, METRIC_LABELS)
    atom_gauge = counter_acceptance({}, gauge_only)
    assert atom_gauge is not None and atom_gauge.window == "gauge" and atom_gauge.acceptance_length == 3.77

    sglang = parse_counters(
        'sglang:spec_accept_length{model_name="m"} 2.5\nsglang:spec_accept_rate{model_name="m"} 0.5\n',
        METRIC_NAMES,
        METRIC_LABELS,
    )
    found = counter_acceptance(sglang, sglang)
    assert found is not None and found.engine == "sglang" and found.acceptance_length == 2.5
    assert found.draft_acceptance_rate == 0.5

    # llama-server's text (tools/server/server-task.cpp): vLLM's counters under "llamacpp:", positions 0-based.
    def llama(steps: int, drafted: int, accepted: int, per_position: list[int]) -> dict[str, float]:
        text = (
            f"llamacpp:spec_decode_num_drafts_total {steps}\n"
            f"llamacpp:spec_decode_num_draft_tokens_total {drafted}\n"
            f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n"
            "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        )
        for position, count in enumerate(per_position):
            text += f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{position}"}} {count}\n'
        return parse_counters(text, METRIC_NAMES, METRIC_LABELS)

    found = counter_acceptance(llama(10, 30, 20, [10, 8, 2]), llama(110, 330, 220, [110, 88, 22]))
    assert found is not None and found.engine == "llamacpp"
    assert found.acceptance_length == pytest.approx(3.0) and found.draft_acceptance_rate == pytest.approx(2 / 3)
    assert found.per_position_rates == pytest.approx([1.0, 0.8, 0.2])
    assert counter_acceptance({}, {}) is None


def test_stream_rule_drops_first_and_last_chunks() -> None:
    # First chunk: the prefill's token; last: a step cut short by max_tokens. Short streams give nothing.
    found = stream_acceptance([[1, 3, 3, 3, 1], [1, 3, 2], [1, 5]], stream_interval=1)
    assert found is not None and found.chunks == 4 and found.requests == 2
    assert found.tokens_per_step == 3.0 and found.tokens_per_chunk == {3: 4}
    merged = stream_acceptance([[1, 6, 6, 2]], stream_interval=2)
    assert merged is not None and merged.tokens_per_chunk_mean == 6.0 and merged.tokens_per_step == 3.0
    assert stream_acceptance([[1], [1, 2]]) is None
    table = pa.table(
        {
            "chunk_tokens": pa.array([[9, 9, 9], [1, 3, 3, 1], [1, 4, 4, 2], [1, 2], [1, 7, 1]], pa.list_(pa.int32())),
            "phase": ["warmup", "profiling", "profiling", "profiling", "profiling"],
            "status": ["ok", "ok", "ok", "ok", "error"],
            "tokens_estimated": [False, False, False, False, False],
        }
    )
    for rows in (table, table.slice(1)):
        from_table = table_stream_acceptance(rows)
        assert from_table is not None and from_table.tokens_per_chunk == {3: 2, 4: 2} and from_table.requests == 2
    verdict = acceptance(counters=None, stream=found, forced_al=3.04, tolerance=0.05)
    assert not verdict.mismatch and verdict.realized_source == "stream"
    assert acceptance(counters=None, stream=found, forced_al=3.06).mismatch


def _burst_stream(steps: list[int], step_gap_ns: int, event_gap_ns: int) -> tuple[list[int], list[int]]:
    """A stream of one-token events: the prefill token, then each step's tokens as a burst."""
    times, tokens, now = [0], [1], 0
    for size in steps:
        now += step_gap_ns
        for i in range(size):
            times.append(now + i * event_gap_ns)
            tokens.append(1)
    return times, tokens


def test_one_token_bursts_are_grouped_into_steps_by_arrival_gap() -> None:
    """llama.cpp streams each accepted draft as its own event, back to back: grouped by gap, the steps show
    the AL; spaced events (no speculation) stay one token per step."""
    bursty = [_burst_stream([3, 2, 4, 3, 3, 1], 16_000_000, 20_000), _burst_stream([2, 4, 3, 1], 16_000_000, 5_000)]
    plain = [_burst_stream([1] * 8, 10_000_000, 0), _burst_stream([1] * 8, 20_000, 0)]  # any pace

    def table(streams: list[tuple[list[int], list[int]]]) -> pa.Table:
        return pa.table(
            {
                "chunk_times_ns": pa.array([t for t, _ in streams], pa.list_(pa.int64())),
                "chunk_tokens": pa.array([k for _, k in streams], pa.list_(pa.int32())),
                "phase": ["profiling"] * len(streams),
                "status": ["ok"] * len(streams),
            }
        )

    grouped = table_stream_acceptance(table(bursty), group_bursts=True)
    # Steps without the first (prefill) and last of each request: 3,2,4,3,3 and 2,4,3.
    assert grouped is not None and grouped.grouped_by_gap
    assert grouped.tokens_per_step == pytest.approx(24 / 8) and grouped.requests == 2
    one = table_stream_acceptance(table(plain), group_bursts=True)
    assert one is not None and one.tokens_per_step == 1.0 and one.grouped_by_gap
    # Multi-token chunks are read as they are: no grouping.
    multi = table_stream_acceptance(table([([0, 10, 20, 30], [1, 3, 3, 1])]), group_bursts=True)
    ungrouped = table_stream_acceptance(table(bursty))  # a run that does not speculate: events are steps
    assert ungrouped is not None and ungrouped.tokens_per_step == 1.0 and not ungrouped.grouped_by_gap
    assert multi is not None and not multi.grouped_by_gap and multi.tokens_per_step == 3.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--spec-al", "5", "--spec-k", "3"], "must be [1, K+1] = [1, 4] for K=3, got 5.0"),
        (
            ["--spec-al", "0.5"],
            "--spec-al/--spec-k: the acceptance length (bonus token included) must be at least 1, got 0.5",
        ),
        (["--spec-k", "0"], "'--spec-k': 0 is not in the range x>=1"),
        (["--spec-golden", "kimi-k3"], "--spec-golden needs --spec-k K"),
        (["--spec-golden", "no-such-model", "--spec-k", "3"], "no golden AL for model 'no-such-model'"),
        (["--spec-golden", "kimi-k3", "--spec-al", "3", "--spec-k", "3"], "not both"),
    ],
)
def test_spec_flag_mistakes_are_one_clear_error(tmp_path: Path, args: list[str], message: str) -> None:
    trace_path = tmp_path / "trace.arrow"
    save_trace(_trace(requests=1, out_tokens=5), trace_path)
    for command in (
        ["replay", str(trace_path), "--url", "http://127.0.0.1:9"],
        ["decode", "--url", "http://127.0.0.1:9"],
    ):
        result = CliRunner().invoke(main, [*command, *args])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split()), result.output
        assert "Traceback" not in result.output


def test_spec_golden_resolves_the_published_al(tmp_path: Path) -> None:
    from agentx.spec.golden import golden_al

    expected = golden_al("kimi-k3", 7).acceptance_length
    with SimServer(time_scale=0.0, block_size=BLOCK, spec_k=7, acceptance_length=expected) as sim:
        trace_path = tmp_path / "trace.arrow"
        save_trace(_trace(requests=2, out_tokens=100), trace_path)
        args = ["replay", str(trace_path), "--url", sim.url, "--mode", "closed", "--delay-scale", "0"]
        result = CliRunner().invoke(
            main, [*args, "--spec-golden", "kimi-k3", "--spec-k", "7", "--out", str(tmp_path / "r")]
        )
    assert result.exit_code == 0, result.output
    run_json = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run_json["options"]["spec_al"] == expected and run_json["options"]["spec_k"] == 7


def test_replay_options_refuse_an_al_outside_its_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"must be \[1, K\+1\] = \[1, 4\] for K=3, got 4.5"):
        Speculative(al=4.5, k=3)  # refused as it is made, before any run


def _counters(al: float, draft_tokens_per_step: float) -> CounterAcceptance:
    return CounterAcceptance(
        engine="vllm", window="run", acceptance_length=al, draft_acceptance_rate=None,
        draft_tokens_per_step=draft_tokens_per_step,
    )  # fmt: skip


def test_a_drafter_that_proposes_short_is_the_same_k_and_named_when_it_lowers_the_al() -> None:
    """vLLM's n-gram drafter proposes fewer than K when it finds no continuation (2.98 of 3 seen against vLLM):
    the same K, fine while the AL holds; a step average nearest another K is that K; a short drafter that moved
    the AL is named as the cause."""
    assert not acceptance(counters=_counters(2.49, 2.98), stream=None, forced_al=2.5, spec_k=3).mismatch
    other_k = acceptance(counters=_counters(2.49, 2.0), stream=None, forced_al=2.5, spec_k=3)
    assert other_k.mismatch
    assert other_k.mismatch_reasons == ["the server proposed 2.00 draft tokens per step, not K = 3"]
    assert acceptance(counters=_counters(2.5, 3.2), stream=None, forced_al=2.5, spec_k=3).mismatch
    short = acceptance(counters=_counters(2.385, 2.53), stream=None, forced_al=2.5, spec_k=3)
    assert short.mismatch and len(short.mismatch_reasons) == 2
    assert "drafter proposed 2.53 of K = 3" in short.mismatch_reasons[1]
