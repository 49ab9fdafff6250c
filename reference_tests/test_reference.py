"""agentx against the AgentX references: SemiAnalysis' agentx-harness 1.0.12 (`agentx profile`, scenario `agentx`)
with agentx's default rules, and AIPerf 0.13.0 (scenario `inferencex-agentx-mvp`) with `--rules aiperf-0.13.0`.
Each case replays the same Weka traces with a reference and agentx at once, each against its own logging stand-in
server, and compares what the servers saw per (session, agent, turn) (harness.py says how). A case that differs
fails with a side-by-side table of the differing rows; every report also lands in `$AGENTX_REFERENCE_OUT`
(default `runs/reference/`), one folder per reference and case, plus `summary.txt` (under `make test-reference`,
`summary.<part>.<worker>.txt`).

The references come from `$AGENTX_REFERENCE_HARNESS` and `$AGENTX_REFERENCE_AIPERF` (`make test-reference`
installs them into `.venv-harness` and `.venv-reference`); a reference that is absent has its cases skipped.
Cases on the real sample traces skip when `../shared/data/weka-sample` (beside the repository) is absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import pytest
import tracegen
from tracegen import Sub, Turn, even_turns, trace

OUT = Path(os.environ.get("AGENTX_REFERENCE_OUT", str(harness.ROOT / "runs" / "reference")))


# ---------------------------------------------------------------------------------------------
# synthetic traces, one edge case each (times in seconds on the trace clock)


def join_late(trace_id: str, shift: float = 0.0) -> dict[str, Any]:
    """A subagent spawned after turn 1 that ends after turn 2 has started: it joins turn 3 (a tiered join)."""
    return trace(
        trace_id,
        even_turns(0.0 + shift, 7, 4.0),
        [Sub("late", after=1, turns=even_turns(5.0 + shift, 4, 2.0))],
    )


def background(trace_id: str, shift: float = 0.0) -> dict[str, Any]:
    """A subagent that outlives the root's last turn: nobody joins it, but it holds its tree's lane."""
    return trace(
        trace_id,
        even_turns(0.0 + shift, 5, 3.0),
        [Sub("bg", after=2, turns=even_turns(7.0 + shift, 5, 3.0))],
    )


def fan_out() -> dict[str, Any]:
    """Three subagents of one anchor joining the same turn (one branch), then two of another anchor that join
    different turns (two branches)."""
    return trace(
        "fanout",
        even_turns(0.0, 6, 5.0),
        [
            Sub("w1", after=1, turns=even_turns(5.5, 3, 1.5)),
            Sub("w2", after=1, turns=even_turns(5.6, 4, 1.0)),
            Sub("w3", after=1, turns=even_turns(6.0, 2, 2.0)),
            Sub("early", after=3, turns=even_turns(15.5, 3, 1.0)),
            Sub("late", after=3, turns=even_turns(16.0, 4, 2.0)),
        ],
    )


def spawn_at_t_star() -> dict[str, Any]:
    """Turn 2 (t=20) runs 20 s and spawns a subagent at t=30 that the root joins at turn 3 (t=45)."""
    turns = [Turn(0.0), Turn(2.0), Turn(20.0, api_time=20.0), Turn(45.0), Turn(50.0)]
    return trace("tstar_spawn", turns, [Sub("inside", after=2, turns=even_turns(30.0, 3, 3.0, api_time=1.5))])


def idle_gaps() -> dict[str, Any]:
    """Gaps of 30 s between pairs of turns, and a subagent with a 25 s gap: above the 10 s system idle cap."""
    turns = [Turn(t) for t in (0.0, 1.0, 31.0, 32.0, 62.0, 63.0, 93.0)]
    return trace("idle", turns, [Sub("slow", after=3, turns=[Turn(33.0), Turn(58.0)])])


def busy_subagent() -> dict[str, Any]:
    """The root waits 59 s for its turn 2 while a subagent sends a turn every 2 s (it ends after turn 2, so
    turn 2 is a plain timer, not a join): every time the subagent's request returns nothing is in flight, but
    its own next turn is due in 2 s, so the 10 s system idle cap has nothing to shorten."""
    turns = [Turn(0.0), Turn(1.0), Turn(60.0), Turn(61.0), Turn(90.0)]
    return trace("busy", turns, [Sub("ticker", after=1, turns=even_turns(2.0, 31, 2.0, api_time=0.3))])


def short(trace_id: str, turns: int, every: float) -> dict[str, Any]:
    return trace(trace_id, even_turns(0.0, turns, every, api_time=0.3))


def growing(trace_id: str) -> dict[str, Any]:
    """Prompts of 512, 1024, … 3072 tokens (8 new blocks a turn): a 1,800-token server overflows at turn 3."""
    return trace(trace_id, even_turns(0.0, 6, 2.0, new_blocks=8))


def nested() -> dict[str, Any]:
    return trace(
        "nested",
        even_turns(0.0, 5, 4.0),
        [Sub("outer", 0, even_turns(1.0, 4, 2.0), subagents=[Sub("inner", 1, even_turns(3.5, 2, 1.0))])],
    )


def join_delay_longer_than_children() -> dict[str, Any]:
    """Turn 1 (t=1) ends at 1.5; its subagent (t=2, 3 turns 1.5 s apart) ends at 5.5; the join turn is recorded at
    t=20. AIPerf 0.13.0 sends it when the subagent ends; the harness waits its recorded 18.5 s after turn 1 (cut
    by the 10 s system idle cap once nothing is in flight)."""
    turns = [Turn(0.0), Turn(1.0), Turn(20.0), Turn(21.0)]
    return trace("join_wait", turns, [Sub("quick", after=1, turns=even_turns(2.0, 3, 1.5))])


def join_children_last() -> dict[str, Any]:
    """A subagent that outruns the root's next recorded turn: its join goes out when it ends, under both rules."""
    turns = [Turn(0.0), Turn(1.0), Turn(4.0), Turn(5.0)]
    return trace("join_last", turns, [Sub("slow", after=1, turns=even_turns(1.5, 4, 2.0, api_time=1.5))])


def tree_cap_busy_neighbour() -> tuple[dict[str, Any], dict[str, Any]]:
    """Lane 0's tree waits 40 s between turn pairs while lane 1's sends every 2 s, so the system is never idle and
    only the per-tree idle cap (8 s in this case) shortens lane 0's gaps, inside profiling."""
    gappy = trace("gappy", [Turn(t) for t in (0.0, 1.0, 41.0, 42.0, 82.0, 83.0, 123.0, 124.0)])
    busy = trace("busy_nb", even_turns(0.0, 60, 2.0, api_time=0.5))
    return gappy, busy


def long_leads() -> list[dict[str, Any]]:
    """Turns 60 s apart: a lane's primer (the turn before t*) leads t* by up to 60 s; the harness clamps each lead
    to the 10 s system idle cap, AIPerf 0.13.0 (no per-tree cap) spreads the primers over the whole leads."""
    return [trace(f"lead_{i}", [Turn(60.0 * k + 7.0 * i) for k in range(6)]) for i in range(3)]


def staggered() -> list[dict[str, Any]]:
    """Three traces whose turns are 9, 6 and 4 s apart: each lane's first live turn sits at a different offset after
    its t*; the harness measures them all from one phase-wide start, AIPerf 0.13.0 from each lane's t*."""
    return [trace(f"stag_{every}", even_turns(0.0, 12, float(every))) for every in (9, 6, 4)]


def pressure_lengths() -> list[dict[str, Any]]:
    """Lanes of very different lengths (4 and 30 turns) under the harness's 10 cache-pressure requests per lane:
    the short lane's trees recycle during the pressure stage."""
    return [short("press_short", 4, 1.0), short("press_long", 30, 1.0)]


def delayed_child_in_idle() -> dict[str, Any]:
    """Two subagents of one branch (spawned after turn 1, joined by turn 2): the second's first turn is recorded 25 s
    after the branch starts, with nothing else in flight once the first has ended. The harness's idle caps move
    that timer (the system one here, after 10 s idle); AIPerf 0.13.0 sleeps it out."""
    turns = [Turn(0.0), Turn(1.0), Turn(40.0), Turn(41.0)]
    return trace(
        "late_child",
        turns,
        [Sub("first", after=1, turns=[Turn(2.0)]), Sub("second", after=1, turns=even_turns(27.0, 3, 1.0))],
    )


TSTAR_SPAWN = spawn_at_t_star()
TSTAR_SEED = tracegen.seed_with_t_star_in(TSTAR_SPAWN, lane=0, low=20.0, high=30.0)
"""Lane 0's t* inside the spawning turn [20, 40) and before the subagent's first turn (t=30)."""
BUSY = busy_subagent()
BUSY_SEED = tracegen.seed_with_t_star_in(BUSY, lane=0, low=25.0, high=35.0)
"""t* in [25, 35): root turn 2 is due 25–35 s into profiling, the subagent is live throughout."""
OVERFLOW = growing("overflow")
OVERFLOW_SEED = tracegen.seed_with_t_star_in(OVERFLOW, lane=0, low=2.01, high=4.0)
"""t* in (2, 4]: the warmup primer is turn 1 (1,024 tokens, fits); profiling overflows at turn 3."""


# ---------------------------------------------------------------------------------------------
# cases


@dataclass(frozen=True)
class Spec:
    name: str
    build: Callable[[Path], Path]
    concurrency: int
    duration: float
    seed: int
    max_model_len: int | None = None
    real: bool = False
    large_prompts: bool = False
    """Prompts of tens of thousands of tokens, whose timing (each stand-in's answers, each tool's phase change) bends
    when several other cases share the cores: marked `large_prompts`, which `make test-reference` runs three at a time,
    after the others ran eight at a time."""
    alone: bool = False
    """Bends even beside one other case (`real_all`: its harness side's trees changed with a second case beside
    it, 2026-12-06): marked `alone`, run one at a time, last."""
    agentx_args: tuple[str, ...] = ()
    reference_args: tuple[str, ...] = ()
    harness_args: tuple[str, ...] = ()
    """Flags of agentx-harness, and of agentx beside it (the same names)."""

    def case(self, directory: Path) -> harness.Case:
        return harness.Case(
            self.name,
            directory,
            self.concurrency,
            self.duration,
            self.seed,
            max_model_len=self.max_model_len,
            agentx_args=self.agentx_args,
            reference_args=self.reference_args,
            harness_args=self.harness_args,
            agentx_harness_args=self.harness_args,
        )


def _synthetic(*items: dict[str, Any]) -> Callable[[Path], Path]:
    return lambda directory: tracegen.write_dir(directory, items)


def _real(names: list[str] | None = None) -> Callable[[Path], Path]:
    return lambda directory: tracegen.copy_real(directory, names)


def _sample(directory: Path) -> Path:
    folder, dropped = tracegen.convert_sample(harness.agentx_executable(), directory)
    print(f"sample corpus: left out {dropped} (nested subagents, which the reference cannot load)")
    return folder


def _held_out_seed() -> int:
    configured = os.environ.get("AGENTX_REFERENCE_HELD_OUT_SEED")
    if configured:
        return int(configured)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one per run, the same in all its workers (pytest -n)
    if run_id:
        return 100 + int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 999_900
    return random.SystemRandom().randrange(100, 1_000_000)


HELD_OUT_SEED = _held_out_seed()
"""A fresh seed per suite run unless `AGENTX_REFERENCE_HELD_OUT_SEED` names one: the held-out case plays sessions no
earlier run saw (its report names the seed, to replay a difference)."""


def _held_out(directory: Path) -> Path:
    folder, dropped = tracegen.synthesize(harness.agentx_executable(), directory, sessions=6, seed=HELD_OUT_SEED)
    print(f"held-out trace: agentic-coding seed {HELD_OUT_SEED}; left out {dropped} (nested subagents)")
    return folder


SPECS = [
    Spec("real_all", _real(), concurrency=3, duration=50, seed=42, real=True, alone=True),
    Spec("real_trace_0277", _real(["trace_0277"]), concurrency=1, duration=45, seed=7, real=True, large_prompts=True),
    Spec("real_trace_0014", _real(["trace_0014"]), concurrency=1, duration=45, seed=3, real=True, large_prompts=True),
    Spec("sample_corpus", _sample, concurrency=4, duration=50, seed=11, large_prompts=True),
    Spec("join_after_next_turn", _synthetic(join_late("join_a"), join_late("join_b", 0.7)), 2, 45, seed=5),
    Spec("background_subagent", _synthetic(background("bg_a"), background("bg_b", 0.4)), 2, 45, seed=5),
    Spec("fan_out", _synthetic(fan_out()), concurrency=1, duration=45, seed=9),
    Spec("t_star_inside_spawning_turn", _synthetic(TSTAR_SPAWN), concurrency=1, duration=45, seed=TSTAR_SEED),
    Spec("idle_gaps_above_cap", _synthetic(idle_gaps()), concurrency=1, duration=60, seed=2),
    Spec("idle_cap_while_subagent_busy", _synthetic(BUSY), concurrency=1, duration=45, seed=BUSY_SEED),
    Spec("wrap_fill_one_trace_three_lanes", _synthetic(join_late("wrap")), concurrency=3, duration=45, seed=6),
    Spec("recycling", _synthetic(short("rec_a", 3, 1.0), short("rec_b", 4, 1.5)), 2, 40, seed=4),
    # One cache-pressure request (turn 2; the harness takes no 0): ten would reach the overflowing turn in warmup,
    # where a failed root request aborts the run (§5); the case is about an overflow in profiling.
    Spec(
        "context_overflow",
        _synthetic(OVERFLOW),
        concurrency=1,
        duration=40,
        seed=OVERFLOW_SEED,
        max_model_len=1800,
        harness_args=("--warmup-requests-per-lane", "1"),
    ),
    Spec("join_delay_longer_than_children", _synthetic(join_delay_longer_than_children()), 1, 50, seed=12),
    Spec("join_children_finish_last", _synthetic(join_children_last()), concurrency=1, duration=40, seed=13),
    Spec(
        "tree_idle_cap_inside_profiling",
        _synthetic(*tree_cap_busy_neighbour()),
        concurrency=2,
        duration=45,
        seed=14,
        agentx_args=("--tree-idle-cap", "8"),
        reference_args=("--trace-idle-gap-cap-seconds", "8"),
    ),
    Spec("warmup_leads_over_10s", _synthetic(*long_leads()), concurrency=3, duration=45, seed=15),
    Spec("lanes_with_different_tstar_offsets", _synthetic(*staggered()), concurrency=3, duration=45, seed=16),
    Spec("pressure_lanes_of_different_lengths", _synthetic(*pressure_lengths()), concurrency=2, duration=40, seed=17),
    Spec("delayed_child_turn0_in_idle", _synthetic(delayed_child_in_idle()), concurrency=1, duration=45, seed=18),
    Spec("held_out_synthetic", _held_out, concurrency=3, duration=50, seed=HELD_OUT_SEED, large_prompts=True),
]
SELF_CHECK = Spec("harness_self_check", _synthetic(join_late("self_a"), fan_out()), concurrency=2, duration=40, seed=5)
NEGATIVE_CONTROL = Spec(
    "harness_negative_control",
    _synthetic(idle_gaps()),
    concurrency=1,
    duration=60,
    seed=2,
    agentx_args=("--system-idle-cap", "off", "--warmup-max-tokens", "recorded"),
)
"""agentx made to differ on purpose: no system idle cap, primers asking for the recorded output."""
SEEDS = sorted({spec.seed for spec in [*SPECS, SELF_CHECK, NEGATIVE_CONTROL]})


# ---------------------------------------------------------------------------------------------
# fixtures


@dataclass
class Suite:
    references: dict[str, harness.Reference]
    workdir: Path
    tokenizer: harness.Tokenizer
    summary: Path

    def reference(self, name: str) -> harness.Reference:
        found = self.references.get(name)
        if found is None:
            variable = next(env for ref, env, _, _ in harness.REFERENCES if ref == name)
            pytest.skip(f"the reference {name} is not installed: set {variable} (`make test-reference` does)")
        return found

    def record(self, ref: harness.Reference, run: harness.CaseRun) -> str:
        report = run.comparison.report()
        timing = ", ".join(f"{f.launch.tool} {f.seconds:.0f} s" for f in run.runs)
        artifacts = self.workdir / ref.name / run.case.name
        text = f"[{ref.label}] {report}\n  (case {run.seconds:.0f} s: {timing}; artifacts {artifacts})\n"
        with self.summary.open("a") as f:
            f.write(text + "\n")
        return text


@pytest.fixture(scope="session")
def suite() -> Iterator[Suite]:
    found = {ref.name: ref for ref in harness.references()}
    if not found:
        variables = " and ".join(env for _, env, _, _ in harness.REFERENCES)
        pytest.skip(f"no reference is installed: set {variables} (`make test-reference` installs both)")
    # Each worker of `pytest -n` writes a summary of its own cases and builds its own tokenizer; each part of
    # `make test-reference` (`AGENTX_REFERENCE_PART`) its own summaries.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    summary = OUT / ".".join(filter(None, ["summary", os.environ.get("AGENTX_REFERENCE_PART"), worker, "txt"]))
    OUT.mkdir(parents=True, exist_ok=True)
    against = ", ".join(f"{ref.label} at {ref.executable}" for ref in found.values())
    summary.write_text(
        f"agentx {_revision()} vs {against}, {time.strftime('%Y-%m-%d %H:%M:%S')}; held-out seed {HELD_OUT_SEED} "
        f"(AGENTX_REFERENCE_HELD_OUT_SEED={HELD_OUT_SEED} replays it)\n\n"
    )
    t0 = time.monotonic()
    tokenizer = harness.make_tokenizer(OUT / "tokenizers" / (worker or "main"), list(found.values()), SEEDS)
    print(f"tokenizer for seeds {SEEDS} in {time.monotonic() - t0:.1f} s")
    yield Suite(found, OUT, tokenizer, summary)
    with summary.open("a") as f:
        f.write(f"suite: {time.monotonic() - t0:.0f} s\n")


def _run(suite: Suite, ref: harness.Reference, spec: Spec, against: harness.Tool = "agentx") -> harness.CaseRun:
    if spec.real and not tracegen.REAL_TRACES.is_dir():
        pytest.skip(f"the real Weka sample traces are absent ({tracegen.REAL_TRACES})")
    directory = spec.build(suite.workdir / "traces" / ref.name / spec.name)  # each reference's worker its own
    return harness.run_case(spec.case(directory), suite.workdir, ref, suite.tokenizer, against=against)


REFERENCE_NAMES = [name for name, _, _, _ in harness.REFERENCES]


# ---------------------------------------------------------------------------------------------
# tests


def _case(spec: Spec) -> Any:
    marks = [pytest.mark.large_prompts] if spec.large_prompts else [pytest.mark.alone] if spec.alone else []
    return pytest.param(spec, id=spec.name, marks=marks)


@pytest.mark.timeout(1800)  # a case may run twice
@pytest.mark.parametrize("spec", [_case(spec) for spec in SPECS])
@pytest.mark.parametrize("reference", REFERENCE_NAMES)
def test_agentx_matches_reference(suite: Suite, reference: str, spec: Spec) -> None:
    ref = suite.reference(reference)
    run = _run(suite, ref, spec)
    report = suite.record(ref, run)
    if not run.comparison.ok and run.comparison.raced:
        # One of the reference's races went the way agentx does not (`Comparison.raced`): a lane's last cache-pressure
        # slot taken by the other stream hands other turns over to profiling and moves its start; the idle cap's tie
        # releases a turn early that keeps the system busy from then on. What follows is not comparable turn by
        # turn, so the case runs once more; a rule that differs fails both times.
        raced = ", ".join(map(harness.format_key, run.comparison.raced))
        print(f"{spec.name}: the reference raced ({raced}); the case runs once more")
        run = _run(suite, ref, spec)
        report += "\n" + suite.record(ref, run)
    if not run.comparison.ok:
        pytest.fail(f"agentx differs from {ref.label} (all cases: {suite.summary}):\n{report}", pytrace=False)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("reference", REFERENCE_NAMES)
def test_nested_subagents(suite: Suite, reference: str) -> None:
    """Nested subagents: agentx replays them; the references' Weka schema allows none (a subagent's requests
    are `n`/`s` only), so the case is skipped when the reference rejects the trace."""
    ref = suite.reference(reference)
    directory = tracegen.write_dir(suite.workdir / "traces" / ref.name / "nested_subagents", [nested()])
    reason = tracegen.reference_rejects(ref.python, directory / "nested.json")
    if reason is not None:
        pytest.skip(f"{ref.name} rejects nested subagents: {reason[:300]}")
    spec = Spec("nested_subagents", lambda d: d, concurrency=1, duration=45, seed=1)
    run = harness.run_case(spec.case(directory), suite.workdir, ref, suite.tokenizer)
    report = suite.record(ref, run)
    if not run.comparison.ok:
        pytest.fail(f"agentx differs from {ref.label} (all cases: {suite.summary}):\n{report}", pytrace=False)


@pytest.mark.timeout(900)
def test_harness_self_check(suite: Suite) -> None:
    """The harness itself: two runs of the default rules' reference with the same seed must agree on every check."""
    ref = suite.reference(REFERENCE_NAMES[0])
    run = _run(suite, ref, SELF_CHECK, against="reference")
    report = suite.record(ref, run)
    if not run.comparison.ok:
        pytest.fail(f"two runs of the reference disagree (the harness is not measuring well):\n{report}", pytrace=False)


@pytest.mark.timeout(900)
def test_harness_negative_control(suite: Suite) -> None:
    """The harness itself: an agentx run made to differ (no idle cap, full-length primers) must fail the gap,
    max-tokens and rate checks."""
    ref = suite.reference(REFERENCE_NAMES[0])
    run = _run(suite, ref, NEGATIVE_CONTROL)
    report = suite.record(ref, run)
    failed = {check.name.split(" (")[0] for check in run.comparison.failed()}
    expected = {"gaps", "max tokens asked", "profiling request rate"}
    if not expected <= failed:
        pytest.fail(f"the harness missed a deliberate difference ({sorted(expected - failed)}):\n{report}")


def test_key_names() -> None:
    """Both tools' session names map to one key format."""
    assert harness.split_reference_id("tr") == ("tr", "")
    assert harness.split_reference_id("tr::sa:agent_001") == ("tr", "agent_001")
    assert harness.split_reference_id("tr::fa:000") == ("tr", "fa:000")
    assert harness.split_reference_id("tr::sa:agent_001:fa:002") == ("tr", "agent_001:fa:002")
    assert harness.split_agentx_id("tr", "") == ("tr", "")
    assert harness.split_agentx_id("tr", "agent_001:fa:002") == ("tr", "agent_001:fa:002")
    assert harness.format_key(("tr", 0, "", 3)) == "tr#0/root/3"


def test_trace_shapes() -> None:
    """The synthetic traces are what their docstrings say (on the reference's rules)."""
    item = json.loads(json.dumps(TSTAR_SPAWN))
    t = tracegen.t_star(TSTAR_SEED, "tstar_spawn", 0, tracegen.request_starts(item))
    assert 20.0 <= t < 30.0
    assert tracegen.has_nested_subagents(nested())
    assert not tracegen.has_nested_subagents(fan_out())
    overflow_ins = [r["in"] for r in OVERFLOW["requests"]]
    assert overflow_ins == [512, 1024, 1536, 2048, 2560, 3072]


def _sent(key: harness.Key, phase: str, arrive_s: float, end_s: float) -> harness.Sent:
    return harness.Sent(
        tool="reference",
        key=key,
        phase=phase,
        arrive_s=arrive_s,
        end_s=end_s,
        status=200,
        max_tokens=1,
        roles=("user",),
        prompt_tokens=1,
        content_tokens=1,
        marker=None,
        correlation_id="c",
        affinity=None,
        request_id=f"{key}",
        play_id="p",
    )


def test_the_tolerances_for_the_reference_s_races() -> None:
    """Two streams of one play swapping phases at the last cache-pressure slot are tolerated as a pair only; a
    request the harness's idle-cap tie released with another (after the cap's idle time), and its session's later
    turns agentx did not send, are tolerated; a request alone after the same idle time is not."""
    a0, b0, c0 = ("t", 0, "", 3), ("t", 0, "sub", 1), ("t", 1, "", 3)
    left = {a0: _sent(a0, "warmup", 0, 1), b0: _sent(b0, "profiling", 0, 1), c0: _sent(c0, "warmup", 0, 1)}
    right = {a0: _sent(a0, "profiling", 0, 1), b0: _sent(b0, "warmup", 0, 1), c0: _sent(c0, "profiling", 0, 1)}
    assert harness._quota_swaps([a0, b0, c0], left, right) == {a0, b0}  # play 1's lone change is no swap
    released = _sent(("t", 0, "", 5), "profiling", 20.0, 20.1)
    together = _sent(("u", 0, "", 8), "profiling", 20.02, 20.3)
    later = _sent(("u", 0, "", 9), "profiling", 25.0, 25.1)
    alone = _sent(("v", 0, "", 1), "profiling", 40.0, 40.1)
    view = harness.View(
        "reference",
        [_sent(("t", 0, "", 4), "profiling", 9.0, 10.0), released, together, later, alone],
        0,
        [],
        "x",
        0.0,
        60.0,
    )
    agentx_keys = {released.key: released}
    assert harness._cap_cascade(view, agentx_keys) == {together.key, later.key}


def test_a_cache_pressure_turn_is_measured_from_its_previous_turn_and_a_primer_from_the_profiling_start() -> None:
    """A warmup turn whose agent's previous turn went in warmup too is measured from that turn's end (the stage sends
    it as that one returns); the primer, whose previous turn was never sent, from the profiling start."""
    primer = _sent(("t", 0, "", 4), "warmup", 1.0, 1.2)
    pressed = _sent(("t", 0, "", 5), "warmup", 1.25, 1.4)
    first = _sent(("t", 0, "", 6), "profiling", 3.0, 3.5)
    harness._fill_gaps([primer, pressed, first], profiling_start_s=1.4)
    assert primer.gap_from == "profiling start" and primer.gap_s == pytest.approx(-0.4)
    assert pressed.gap_from == "previous turn" and pressed.gap_s == pytest.approx(0.05)
    assert first.gap_from == "previous turn" and first.gap_s == pytest.approx(1.6)


def test_the_gap_check_holds_in_each_phase_and_a_failed_race_is_named() -> None:
    """Thirty warmup turns that agree cannot hide two profiling turns 5 s off: pooled, their median and p90 pass;
    per phase, profiling's fail. A comparison names the keys a race of the reference explains (`raced`)."""

    def views(profiling_shift_s: float) -> tuple[harness.View, harness.View]:
        sides = []
        tools: tuple[tuple[harness.Tool, float], ...] = (("reference", 0.0), ("agentx", profiling_shift_s))
        for tool, shift in tools:
            sent = [_sent(("t", 0, "", turn), "warmup", turn * 0.1, turn * 0.1 + 0.05) for turn in range(30)]
            sent += [
                _sent(("t", 0, "", 30 + i), "profiling", 10.0 * (i + 1) + shift, 10.0 * (i + 1) + shift + 1)
                for i in range(2)
            ]
            for row in sent:
                row.tool = tool
                row.gap_s = 0.05 if row.phase == "warmup" else 9.0 + shift
            sides.append(harness.View(tool, sent, 0, [], "x", 2.0, 60.0))
        return sides[0], sides[1]

    gaps = {
        shift: next(c for c in harness.compare("case", *views(shift)).checks if c.name.startswith("gaps"))
        for shift in (0.0, 5.0)
    }
    assert gaps[0.0].ok and not gaps[5.0].ok
    assert "profiling 2, median |diff| 5.000 s" in gaps[5.0].summary
    pooled = [0.0] * 30 + [5.0] * 2
    assert statistics.median(pooled) <= harness.GAP_MEDIAN_S and harness._percentile(pooled, 0.9) <= harness.GAP_P90_S
    swapped_left, swapped_right = views(0.0)
    swapped_right.sent[29].phase, swapped_right.sent[30].phase = "profiling", "warmup"
    assert harness.compare("case", swapped_left, swapped_right).raced == [("t", 0, "", 29), ("t", 0, "", 30)]


def test_the_tolerance_for_a_join_deadline_the_cap_pulled() -> None:
    """The idle-cap tie pulling a join's deadline: the reference's join goes out at its children's end, ~10 s before
    agentx's, after a cap event; its reference-only keys within that lead of the window's end are tolerated, earlier
    ones are not, and with no cap event before the join nothing is."""
    parent = _sent(("t", 1, "", 1), "profiling", 11.7, 11.79)
    first = _sent(("t", 1, "first", 0), "profiling", 11.79, 11.87)
    second = _sent(("t", 1, "second", 0), "profiling", 21.88, 23.14)  # after the cap's 10 s of idle
    join = dataclasses.replace(_sent(("t", 1, "", 2), "profiling", 23.14, 23.23), gap_s=11.35)
    early_only = _sent(("t", 2, "", 0), "profiling", 30.0, 30.1)
    late_only = _sent(("t", 2, "second", 2), "profiling", 35.77, 35.85)
    common = [parent, first, second, join]
    reference = harness.View("reference", [*common, early_only, late_only], 0, [], "x", 0.0, 45.0)
    agentx_join = dataclasses.replace(join, tool="agentx", arrive_s=33.19, gap_s=21.33)
    agentx = harness.View("agentx", [*common[:3], agentx_join], 0, [], "x", 0.0, 45.0)
    assert harness._join_deadline_tie(reference, agentx) == {late_only.key}
    busy = _sent(("u", 0, "", 0), "profiling", 12.0, 21.0)  # no idle stretch: no cap event, no tie
    reference_busy = harness.View("reference", [*reference.sent, busy], 0, [], "x", 0.0, 45.0)
    assert harness._join_deadline_tie(reference_busy, agentx) == set()


def _revision() -> str:
    """The commit agentx runs from, and whether agentx/ has uncommitted changes."""

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=harness.ROOT, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    dirty = git("status", "--porcelain", "--", "agentx")
    return f"{git('rev-parse', '--short', 'HEAD') or '(no git)'}{' + uncommitted agentx/ changes' if dirty else ''}"
