"""Running agentx and the AgentX reference (AIPerf 0.13.0) on the same traces, each against its own logging
stand-in server, and comparing what the two servers saw, request by request.

**Keys.** Every logged request is joined to the tool's own record of it by its `X-Request-ID` (the
reference's `profile_export.jsonl`, agentx's `records.arrow`), which names its session, agent and turn.
Both tools' names map to one key `(trace, play, agent, turn)`:

- the reference's `conversation_id` is `trace`, `trace::sa:<agent>`, `trace::fa:NNN`,
  `trace::sa:<agent>:fa:NNN`…; agentx's `session_id` is the trace and `agent_id` is `""` for the root,
  `<agent>` for a subagent, `fa:NNN` / `<agent>:fa:NNN` for split chains. The agent part is the
  reference's suffix without `sa:` (`""` for the root);
- `play` numbers the plays (session trees) of one trace in a tool's run in the order their first request
  reached the server (a play: the reference's `root_correlation_id`, agentx's `play` column), so recycled
  and wrap-filled trees line up.

**Times** are the stand-in's own clock (monotonic ns at arrival and at the end of the response), so the two
runs are compared by their internal gaps, never by absolute times.

**Checks** (`compare`): the keys sent in warmup and in profiling (a key only one tool sent is tolerated in
the last `EDGE_S` seconds of the profiling window), phases, statuses, each key's gap from the end of the
previous turn of its agent session (or, for a subagent's turn 0, from the end of its root's last request
before it): median |diff| ≤ 0.25 s and p90 ≤ 1 s; max tokens asked; message roles; prompt content (the
server's prompt tokens less each tool's own marker and template overhead: the reference sends `in` tokens
of content plus the chat template and a 5-token `[rid:…]` marker, agentx `in` tokens including the
template plus its 4-word marker); the partition of keys by cache-bust marker and by `X-Correlation-ID`
(and `X-Session-Affinity` as the reference sends it: equal to it, or absent); unique request ids; and the
profiling request rate within −20%/+25% of the reference's. A failing check lists the differing rows side by side.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import standin
import wordtok

ROOT: Final = Path(__file__).resolve().parent.parent
MODEL: Final = "standin-model"
EDGE_S: Final = 5.0
"""A key sent by one tool only is not a difference when it was sent this close to the profiling deadline."""
GAP_MEDIAN_S: Final = 0.25
GAP_P90_S: Final = 1.0
GAP_ROW_S: Final = 0.25
"""Gap differences above this are listed."""
RATE_LOW: Final = 0.80
RATE_HIGH: Final = 1.25
REFERENCE_MARKER_TOKENS: Final = wordtok.count_tokens("[rid:0123456789ab]")
MAX_ROWS: Final = 60
DISPATCH_LAG_P99_MAX_S: Final = 0.1
"""A schedule bug's guard: the p99 of agentx's profiling requests' dispatch lag (sent − due) in a case, beyond what
a stall of agentx's own process explains (`stall_bound_s`).

Both tools run at once on the same cores, eight cases at a time, so the machine itself holds agentx's process off
the CPU: CI saw p99 100-230 ms in a few cases, a quiet machine 1-7 ms. A request late because its process could not
run is the machine, and the run's event-loop lag says so; the bugs this guards against put requests due in the past
by seconds while the loop is idle. The precision target (p99 < 5 ms) is a benchmark figure: bench/corpus_replay.py
and bench/replay_overhead.py measure it with agentx alone on the machine (bench/README.md)."""


def stall_bound_s(loop_lag_max_s: float) -> float:
    """The longest stall of agentx's process a run's loop lag allows: the run samples how late a timer due every
    `LOOP_LAG_TICK_S` fires (agentx.replayer.schedule.parts), so a stall that began just after a sample shows that
    much less."""
    from agentx.replayer.schedule.parts import LOOP_LAG_TICK_S

    return loop_lag_max_s + LOOP_LAG_TICK_S


Tool = Literal["reference", "agentx"]
Key = tuple[str, int, str, int]
"""(trace, play, agent, turn)."""


@dataclass(frozen=True)
class Reference:
    """One AgentX reference the suite plays agentx beside: its command, and the rule set agentx plays against it."""

    name: str
    """"agentx-harness" (SemiAnalysis' harness, `agentx profile`, scenario `agentx`) or "aiperf" (AIPerf 0.13.0,
    `aiperf profile --scenario inferencex-agentx-mvp`)."""
    executable: Path
    rules: str
    """agentx's `--rules` for this reference."""
    env: str
    """The environment variable that names the executable (the Makefile sets it)."""

    @property
    def python(self) -> Path:
        """The reference's interpreter (its venv's)."""
        return self.executable.parent / "python"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.rules})"


REFERENCES: Final = (
    ("agentx-harness", "AGENTX_REFERENCE_HARNESS", ROOT / ".venv-harness" / "bin" / "agentx", "agentx-harness-1.0.12"),
    ("aiperf", "AGENTX_REFERENCE_AIPERF", ROOT / ".venv-reference" / "bin" / "aiperf", "aiperf-0.13.0"),
)
"""(name, environment variable, default executable, agentx's --rules) of each reference."""


def references() -> list[Reference]:
    """The references installed here: each from its environment variable, else its default venv when present."""
    found = []
    for name, env, default, rules in REFERENCES:
        configured = os.environ.get(env)
        executable = Path(configured) if configured else default
        if executable.exists():
            found.append(Reference(name, executable, rules, env))
    return found


def agentx_executable() -> Path:
    return Path(sys.executable).parent / "agentx"


def format_key(key: Key) -> str:
    trace, play, agent, turn = key
    return f"{trace}#{play}/{agent or 'root'}/{turn}"


# ---------------------------------------------------------------------------------------------
# processes


@contextmanager
def standin_server(log: Path, tokenizer: Path | None, max_model_len: int | None = None) -> Iterator[str]:
    """A stand-in on a free loopback port while the block runs; yields its base URL."""
    command = [sys.executable, str(Path(__file__).with_name("standin.py")), "--port", "0", "--log", str(log)]
    if tokenizer is not None:
        command += ["--tokenizer", str(tokenizer)]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the stand-in did not start: {line}{process.stdout.read()[-2000:]}")
        yield line.split()[2]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """End `process` and the processes it started (its own process group, made at launch)."""
    for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):  # children left by a finished parent
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Launch:
    tool: Tool
    command: list[str]
    env: dict[str, str]
    out_dir: Path
    console: Path


@dataclass
class Finished:
    launch: Launch
    returncode: int
    seconds: float

    def console_tail(self, chars: int = 3000) -> str:
        try:
            return self.launch.console.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def run_all(launches: Sequence[Launch], timeout_s: float) -> list[Finished]:
    """Start every launch at once (each in its own process group) and wait for all; a launch still running
    after `timeout_s` is stopped and reported with return code -9."""
    started = []
    for launch in launches:
        launch.out_dir.parent.mkdir(parents=True, exist_ok=True)
        console = launch.console.open("wb")
        process = subprocess.Popen(
            launch.command,
            stdout=console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=launch.env,
            start_new_session=True,
        )
        console.close()
        started.append((launch, process, time.monotonic()))
    results = []
    deadline = time.monotonic() + timeout_s
    for launch, process, t0 in started:
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = -9
        _stop_group(process)
        results.append(Finished(launch, code, time.monotonic() - t0))
    return results


# ---------------------------------------------------------------------------------------------
# the two tools


@dataclass(frozen=True)
class Case:
    """One run of both tools: traces, lanes, duration, seed, and options of the stand-in."""

    name: str
    traces: Path
    concurrency: int
    duration: float
    seed: int
    grace: float = 5.0
    max_model_len: int | None = None
    reference_args: tuple[str, ...] = ()
    """Flags of either reference."""
    harness_args: tuple[str, ...] = ()
    """Flags of agentx-harness only."""
    aiperf_args: tuple[str, ...] = ()
    """Flags of AIPerf 0.13.0 only."""
    agentx_args: tuple[str, ...] = ()
    agentx_harness_args: tuple[str, ...] = ()
    """agentx's flags beside agentx-harness only."""


@dataclass(frozen=True)
class Tokenizer:
    """The word-level tokenizer: its folder (the stand-in's vocabulary) and its HF cache (the reference's)."""

    directory: Path
    hf_home: Path
    repo: str


def make_tokenizer(workdir: Path, refs: Sequence[Reference], seeds: Iterable[int]) -> Tokenizer:
    directory = wordtok.build_tokenizer(workdir / "tokenizer", [ref.python for ref in refs], seeds)
    hf_home = workdir / "hf"
    repo = wordtok.install_in_hf_cache(directory, hf_home)
    return Tokenizer(directory, hf_home, repo)


def reference_launch(case: Case, ref: Reference, url: str, out_dir: Path, tokenizer: Tokenizer) -> Launch:
    # The harness's `agentx profile` plays its `agentx` scenario, with that scenario's defaults for every flag not
    # given here (10 cache-pressure requests per lane, a 300 s per-tree idle cap, ...), as agentx's default rules do.
    scenario = [] if ref.name == "agentx-harness" else ["--scenario", "inferencex-agentx-mvp"]
    command = [
        str(ref.executable), "profile",
        "--model", MODEL,
        "--url", url,
        "--endpoint-type", "chat",
        "--streaming",
        "--custom-dataset-type", "weka_trace",
        "--input-file", str(case.traces),
        *scenario,
        "--unsafe-override",
        "--concurrency", str(case.concurrency),
        "--benchmark-duration", str(case.duration),
        "--benchmark-grace-period", str(case.grace),
        "--random-seed", str(case.seed),
        "--tokenizer", tokenizer.repo,
        "--use-server-token-count",
        # The InferenceX t* window (the scenario's own default is 0.0-1.0); the system idle cap (10 s) is the
        # scenario's default.
        "--trajectory-start-min-ratio", "0.25",
        "--trajectory-start-max-ratio", "0.75",
        "--artifact-dir", str(out_dir),
        "--ui", "none",
        "--no-gpu-telemetry",
        "--no-server-metrics",
        "--workers-max", "1",
        "--record-processors", "1",
        *case.reference_args,
        *(case.harness_args if ref.name == "agentx-harness" else case.aiperf_args),
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_HOME": str(tokenizer.hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "AIPERF_DATASET_MMAP_CACHE_ENABLED": "false",
        "AIPERF_DATASET_MMAP_BASE_PATH": str(out_dir.parent),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    return Launch("reference", command, env, out_dir, out_dir.parent / f"{out_dir.name}.console.txt")


def agentx_launch(case: Case, url: str, out_dir: Path, rules: str) -> Launch:
    command = [
        str(agentx_executable()), "replay", str(case.traces),
        "--url", url,
        "--model", MODEL,
        "--api", "chat",
        "--rules", rules,
        "--concurrency", str(case.concurrency),
        "--duration", str(case.duration),
        "--grace", str(case.grace),
        "--seed", str(case.seed),
        "--out", str(out_dir),
        *case.agentx_args,
        *(case.agentx_harness_args if rules == "agentx-harness-1.0.12" else ()),
    ]  # fmt: skip
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return Launch("agentx", command, env, out_dir, out_dir.parent / f"{out_dir.name}.console.txt")


# ---------------------------------------------------------------------------------------------
# what the servers saw


@dataclass
class Sent:
    """One request as its server saw it, named by its tool's record."""

    tool: Tool
    key: Key
    phase: str
    arrive_s: float
    end_s: float | None
    status: int | None
    max_tokens: int | None
    roles: tuple[str, ...]
    prompt_tokens: int
    content_tokens: int
    """Prompt tokens less the tool's own marker and chat-template overhead (comparable across tools)."""
    marker: str | None
    correlation_id: str | None
    affinity: str | None
    request_id: str | None
    play_id: str
    recorded_error: str | None = None
    gap_s: float | None = None
    gap_from: str = ""


@dataclass
class View:
    """One tool's run as its server saw it."""

    tool: Tool
    sent: list[Sent]
    unjoined_log: int
    """Generation requests in the server log that no record names (calibration, probes, …)."""
    unjoined_records: list[str]
    """Records whose request never showed in the server log."""
    join: str
    """How log lines were joined to records ("x-request-id" or a fallback)."""
    profiling_start_s: float | None
    deadline_s: float | None
    notes: list[str] = field(default_factory=list)

    def by_key(self) -> dict[Key, Sent]:
        keyed: dict[Key, Sent] = {}
        for sent in sorted(self.sent, key=lambda s: s.arrive_s):
            keyed.setdefault(sent.key, sent)
        return keyed

    def profiling(self) -> list[Sent]:
        return [s for s in self.sent if s.phase == "profiling"]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def _generation_log(log: Path) -> list[dict[str, Any]]:
    return [
        entry for entry in standin.read_log(log) if entry.get("path") in ("/v1/chat/completions", "/v1/completions")
    ]


def split_reference_id(conversation_id: str) -> tuple[str, str]:
    """(trace, agent) of a reference conversation id: `t` → (t, ""), `t::sa:a` → (t, "a"),
    `t::fa:000` → (t, "fa:000"), `t::sa:a:fa:001` → (t, "a:fa:001")."""
    trace, _, rest = conversation_id.partition("::")
    return trace, rest.removeprefix("sa:")


def split_agentx_id(session_id: str, agent_id: str) -> tuple[str, str]:
    """(trace, agent) of an agentx record (`agent_id` "" for the root; a leading "sa:" is dropped)."""
    return session_id, agent_id.removeprefix("sa:")


@dataclass
class _Identity:
    trace: str
    agent: str
    turn: int
    phase: str
    play_id: str
    error: str | None
    recorded_in: int | None = None
    marker_tokens: int | None = None
    """agentx: the record's cache_bust_tokens."""


def _assign_keys(
    tool: Tool,
    joined: list[tuple[dict[str, Any], _Identity]],
) -> list[Sent]:
    """Number each trace's plays by first arrival and build the `Sent` rows."""
    first_arrival: dict[str, tuple[int, str]] = {}
    for entry, ident in joined:
        arrival = int(entry["arrive_mono_ns"])
        if ident.play_id not in first_arrival or arrival < first_arrival[ident.play_id][0]:
            first_arrival[ident.play_id] = (arrival, ident.trace)
    ordinal: dict[str, int] = {}
    per_trace: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for play_id, (arrival, trace) in first_arrival.items():
        per_trace[trace].append((arrival, play_id))
    for plays in per_trace.values():
        for n, (_, play_id) in enumerate(sorted(plays)):
            ordinal[play_id] = n
    rows = []
    for entry, ident in joined:
        roles = tuple(entry.get("roles") or ())
        prompt = int(entry.get("prompt_tokens") or 0)
        marker = entry.get("marker")
        if tool == "reference":
            template = len(roles) + 1
            marker_tokens = REFERENCE_MARKER_TOKENS if entry.get("marker_kind") == "rid" else 0
            content = prompt - template - marker_tokens
        else:
            # agentx takes the template's tokens out of the content; its marker is the record's cache_bust_tokens.
            marker_tokens = ident.marker_tokens or 0
            content = prompt - marker_tokens
            if marker_tokens == 0:
                marker = None
        end = entry.get("end_mono_ns")
        headers = entry.get("headers") or {}
        rows.append(
            Sent(
                tool=tool,
                key=(ident.trace, ordinal[ident.play_id], ident.agent, ident.turn),
                phase=ident.phase,
                arrive_s=int(entry["arrive_mono_ns"]) / 1e9,
                end_s=None if end is None else int(end) / 1e9,
                status=entry.get("status"),
                max_tokens=entry.get("max_tokens"),
                roles=roles,
                prompt_tokens=prompt,
                content_tokens=content,
                marker=marker,
                correlation_id=_header(headers, "X-Correlation-ID"),
                affinity=_header(headers, "X-Session-Affinity"),
                request_id=_header(headers, "X-Request-ID"),
                play_id=ident.play_id,
                recorded_error=ident.error,
            )
        )
    start, _ = _phase_bounds(rows, 0.0)
    _fill_gaps(rows, start)
    return rows


def _fill_gaps(rows: list[Sent], profiling_start_s: float | None) -> None:
    """Each row's gap, from the end of the request that should set it off:

    - a turn after the first: the previous turn of its agent session;
    - a subagent's turn 0: the latest request of its play's root that ended before it;
    - a root's turn 0 (a recycled tree): the end of the latest whole tree (play) that ended before it;
    - a warmup turn: the profiling start (negative: the spread that aligns every lane's t*, then the cache-pressure
      stage), unless its agent's previous turn went in warmup too: a cache-pressure request goes as that one returns,
      and measured from the profiling start it would carry every later request's time on the server, which the
      reference's own processes stretch on a busy machine (reference_tests/README.md).
    """
    by_key = {row.key: row for row in sorted(rows, key=lambda r: -r.arrive_s)}  # the first arrival wins
    root_ends: dict[tuple[str, int], list[float]] = defaultdict(list)
    play_ends: dict[tuple[str, int], float] = {}
    for row in rows:
        trace, play, agent, _ = row.key
        end = row.end_s if row.end_s is not None else row.arrive_s
        play_ends[(trace, play)] = max(play_ends.get((trace, play), end), end)
        if agent == "" and row.end_s is not None:
            root_ends[(trace, play)].append(row.end_s)
    for row in rows:
        trace, play, agent, turn = row.key
        previous = by_key.get((trace, play, agent, turn - 1)) if turn > 0 else None
        after_warmup_turn = previous is not None and previous.phase == "warmup"
        if row.phase == "warmup" and profiling_start_s is not None and not after_warmup_turn:
            row.gap_s, row.gap_from = row.arrive_s - profiling_start_s, "profiling start"
        elif previous is not None and previous.end_s is not None:
            row.gap_s, row.gap_from = row.arrive_s - previous.end_s, "previous turn"
        elif turn == 0 and agent != "":
            ends = [end for end in root_ends.get((trace, play), []) if end <= row.arrive_s]
            if ends:
                row.gap_s, row.gap_from = row.arrive_s - max(ends), "root's last end"
        elif turn == 0 and agent == "":
            ends = [end for key, end in play_ends.items() if key != (trace, play) and end <= row.arrive_s]
            if ends:
                row.gap_s, row.gap_from = row.arrive_s - max(ends), "previous tree's end"


def _phase_bounds(rows: Sequence[Sent], duration: float) -> tuple[float | None, float | None]:
    """(profiling start, deadline) estimated from the log: the last warmup response's end (else the first
    profiling arrival), plus the duration."""
    warm_ends = [r.end_s for r in rows if r.phase == "warmup" and r.end_s is not None]
    profiling = [r.arrive_s for r in rows if r.phase == "profiling"]
    start = max(warm_ends) if warm_ends else (min(profiling) if profiling else None)
    return start, None if start is None else start + duration


def load_reference(log: Path, artifact_dir: Path, duration: float) -> View:
    """The reference's run: its server log joined to `profile_export.jsonl` by X-Request-ID."""
    records: dict[str, _Identity] = {}
    export = artifact_dir / "profile_export.jsonl"
    notes = []
    if export.exists():
        for line in export.read_text().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            meta = item.get("metadata") or {}
            rid = meta.get("x_request_id")
            if not rid:
                continue
            trace, agent = split_reference_id(str(meta.get("conversation_id", "")))
            error = item.get("error")
            records[rid] = _Identity(
                trace=trace,
                agent=agent,
                turn=int(meta.get("turn_index", -1)),
                phase=str(meta.get("benchmark_phase") or "profiling"),
                play_id=str(meta.get("root_correlation_id") or meta.get("x_correlation_id") or rid),
                error=None if not error else str(error.get("message") or error)[:200],
            )
    else:
        notes.append(f"no {export}")
    joined: list[tuple[dict[str, Any], _Identity]] = []
    orphans: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in _generation_log(log):
        rid = _header(entry.get("headers") or {}, "X-Request-ID")
        ident = records.get(rid) if rid else None
        if ident is None or rid is None:
            orphans.append(entry)
            continue
        seen.add(rid)
        joined.append((entry, ident))
    inferred = _infer_unexported(joined, orphans)
    if inferred:
        notes.append(
            f"{len(inferred)} requests named from their X-Correlation-ID session (the reference exports no record "
            "of a context-overflow request)"
        )
    joined += inferred
    unjoined = len(orphans) - len(inferred)
    rows = _assign_keys("reference", joined)
    start, deadline = _phase_bounds(rows, duration)
    missing = sorted(set(records) - seen)
    return View("reference", rows, unjoined, missing, "x-request-id", start, deadline, notes)


def _infer_unexported(
    joined: Sequence[tuple[dict[str, Any], _Identity]], orphans: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], _Identity]]:
    """Identities for the reference's requests that have no exported record (it drops context-overflow
    records from `profile_export.jsonl`): the agent session of their X-Correlation-ID, the turn after that
    session's last request before them, the phase of the requests around them."""
    sessions: dict[str, list[tuple[int, _Identity]]] = defaultdict(list)
    for entry, ident in joined:
        corr = _header(entry.get("headers") or {}, "X-Correlation-ID")
        if corr:
            sessions[corr].append((int(entry["arrive_mono_ns"]), ident))
    warm_ends = [int(e["end_mono_ns"]) for e, i in joined if i.phase == "warmup" and e.get("end_mono_ns")]
    warm_end = max(warm_ends) if warm_ends else None
    inferred = []
    for entry in sorted(orphans, key=lambda e: int(e["arrive_mono_ns"])):
        corr = _header(entry.get("headers") or {}, "X-Correlation-ID")
        arrival = int(entry["arrive_mono_ns"])
        before = [(t, i) for t, i in sessions.get(corr or "", []) if t < arrival]
        if not before:
            continue
        _, last = max(before, key=lambda item: item[0])
        phase = "warmup" if warm_end is not None and arrival < warm_end else "profiling"
        ident = _Identity(last.trace, last.agent, last.turn + 1, phase, last.play_id, "(no record exported)")
        inferred.append((entry, ident))
        sessions[corr or ""].append((arrival, ident))
    return inferred


def load_agentx(log: Path, run_dir: Path, duration: float) -> View:
    """agentx's run: its server log joined to `records.arrow` by X-Request-ID (the `request_id` column), or,
    for records without one, by X-Correlation-ID, prompt tokens and the nearest arrival to `sent_ns`."""
    import agentx

    path = run_dir / "records.arrow"
    notes: list[str] = []
    rows_in: list[dict[str, Any]] = []
    epoch = 0
    if path.exists():
        table = agentx.read_records(path)
        rows_in = table.to_pylist()
        meta = table.schema.metadata or {}
        epoch = int(meta.get(b"agentx.wall_epoch_ns", b"0"))
    else:
        notes.append(f"no {path}")
    log_entries = _generation_log(log)
    by_rid: dict[str, dict[str, Any]] = {}
    for logged in log_entries:
        rid = _header(logged.get("headers") or {}, "X-Request-ID")
        if rid:
            by_rid.setdefault(rid, logged)
    used: set[int] = set()
    joined: list[tuple[dict[str, Any], _Identity]] = []
    missing: list[str] = []
    fallback = 0
    for record in rows_in:
        trace, agent = split_agentx_id(str(record["session_id"]), str(record.get("agent_id") or ""))
        play_id = str(record.get("root_correlation_id") or f"play-{record.get('play')}")
        ident = _Identity(
            trace=trace,
            agent=agent,
            turn=int(record["turn"]),
            phase=str(record["phase"]),
            play_id=play_id,
            error=None
            if record.get("status") == "ok"
            else f"{record.get('error_kind')}: {record.get('error_message')}",
            recorded_in=record.get("isl_recorded_tokens"),
            marker_tokens=record.get("cache_bust_tokens"),
        )
        entry: dict[str, Any] | None = by_rid.get(str(record.get("request_id") or ""))
        if entry is None:
            entry = _nearest(log_entries, used, record, epoch)
            fallback += entry is not None
        if entry is None:
            missing.append(f"{trace}/{agent or 'root'}/{ident.turn} ({ident.phase})")
            continue
        used.add(int(entry["seq"]))
        joined.append((entry, ident))
    if fallback:
        notes.append(f"{fallback} records joined by correlation id + prompt tokens + time (no request_id)")
    rows = _assign_keys("agentx", joined)
    start, deadline = _phase_bounds(rows, duration)
    unjoined = len(log_entries) - len(used)
    return View("agentx", rows, unjoined, missing, "x-request-id" if not fallback else "mixed", start, deadline, notes)


def _nearest(
    entries: Sequence[dict[str, Any]], used: set[int], record: Mapping[str, Any], epoch: int
) -> dict[str, Any] | None:
    """The unused log entry with the record's correlation id and prompt tokens that arrived nearest its
    send time (within 2 s)."""
    sent_wall = epoch + int(record.get("sent_ns") or 0)
    best, best_d = None, 2e9
    for entry in entries:
        if int(entry["seq"]) in used:
            continue
        headers = entry.get("headers") or {}
        if _header(headers, "X-Correlation-ID") != record.get("correlation_id"):
            continue
        if entry.get("prompt_tokens") != record.get("isl_sent_tokens"):
            continue
        d = abs(int(entry["arrive_wall_ns"]) - sent_wall)
        if d < best_d:
            best, best_d = entry, d
    return best


# ---------------------------------------------------------------------------------------------
# comparison


@dataclass
class Check:
    name: str
    ok: bool
    summary: str
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    """(key, reference, agentx) of the differing rows."""
    tolerated: list[tuple[str, str, str]] = field(default_factory=list)
    """Rows that differ within the check's tolerance (listed, never failing)."""
    show_rows_when_ok: bool = False


@dataclass
class Comparison:
    case: str
    left: View
    right: View
    checks: list[Check]
    raced: list[Key] = field(default_factory=list)
    """Keys that one of the reference's races put in another phase or left unsent: two streams of a play taking a
    lane's last cache-pressure slot in the other order (`_quota_swaps`), the system idle cap's tie (`_cap_cascade`,
    `_join_deadline_tie`)."""

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def report(self, rows: int = MAX_ROWS) -> str:
        left, right = self.left.tool, self.right.tool
        right_label = right if right != left else f"{right} (2nd run)"
        lines = [f"== {self.case}: {left} vs {right_label} =="]
        for view, label in ((self.left, left), (self.right, right_label)):
            counts: dict[str, int] = defaultdict(int)
            for sent in view.sent:
                counts[sent.phase] += 1
            lines.append(
                f"  {label}: {dict(counts)} requests joined ({view.join}); unjoined log lines {view.unjoined_log}; "
                f"records missing from the log {len(view.unjoined_records)}"
                + (f"; notes: {'; '.join(view.notes)}" if view.notes else "")
            )
        for check in self.checks:
            lines.append(f"  [{'ok' if check.ok else 'DIFF'}] {check.name}: {check.summary}")
            if check.rows and (not check.ok or check.show_rows_when_ok):
                lines.extend("      " + line for line in table(check.rows[:rows], ("key", left, right_label)))
                if len(check.rows) > rows:
                    lines.append(f"      … {len(check.rows) - rows} more rows")
            if check.tolerated:
                lines.append("      tolerated:")
                lines.extend("      " + line for line in table(check.tolerated[:rows], ("key", left, right_label)))
        return "\n".join(lines)


def table(rows: Sequence[tuple[str, str, str]], header: tuple[str, str, str]) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(3)] if rows else [len(h) for h in header]
    out = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("-+-".join("-" * w for w in widths))
    out.extend(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return out


def roles_text(roles: Sequence[str]) -> str:
    """Roles, compact: `system user (assistant user)×16`."""
    short = [r[0].upper() if r else "?" for r in roles]
    text = " ".join(short)
    for unit in ("A U",):
        n = text.count(unit)
        if n > 2:
            first = text.index(unit)
            run = 0
            while text.startswith(unit, first + run * (len(unit) + 1)):
                run += 1
            if run > 2:
                text = text[:first] + f"(A U)×{run}" + text[first + run * (len(unit) + 1) - 1 :]
    return f"{text} [{len(roles)}]"


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    f = int(k)
    c = min(f + 1, len(ordered) - 1)
    return ordered[f] + (k - f) * (ordered[c] - ordered[f])


def _fmt(value: float | None, unit: str = "s") -> str:
    return "—" if value is None else f"{value:.3f} {unit}".strip()


def _partition_rows(
    common: Sequence[Key], left: Mapping[Key, Sent], right: Mapping[Key, Sent], label: Callable[[Sent], str | None]
) -> list[tuple[str, str, str]]:
    """Rows where the two partitions of `common` (by `label`) differ: each key's group named by its first
    member (keys without a label form singleton groups "none")."""

    def groups(view: Mapping[Key, Sent]) -> dict[Key, str]:
        first: dict[str, Key] = {}
        for key in common:
            value = label(view[key])
            if value is not None and value not in first:
                first[value] = key
        named = {}
        for key in common:
            value = label(view[key])
            named[key] = "none" if value is None else "with " + format_key(first[value])
        return named

    g_left, g_right = groups(left), groups(right)
    return [(format_key(k), g_left[k], g_right[k]) for k in common if g_left[k] != g_right[k]]


def _quota_swaps(common: Sequence[Key], lk: Mapping[Key, Sent], rk: Mapping[Key, Sent]) -> set[Key]:
    """Keys whose phase differs only because two streams of one play raced for its lane's last cache-pressure slot
    (agentx-harness 1.0.12: 10 requests per lane): one key warmup in the reference and profiling (or not sent) in
    agentx, another of the same play the other way round. Which of two requests in flight at once returns first
    decides which stream's next turn takes the slot: on the stand-in, which ends both in one step, the one sent
    first. At a return that spawns a subagent and sends the parent's next turn, the harness's workers most times put
    the parent's turn on the server first, as agentx does (docs/agentx.md §4d), but now and then the subagent's: a
    race of milliseconds, not a rule."""
    ahead: dict[tuple[str, int], list[Key]] = defaultdict(list)
    behind: dict[tuple[str, int], list[Key]] = defaultdict(list)
    for key in common:
        a, b = lk[key].phase, rk[key].phase
        if (a, b) == ("warmup", "profiling"):
            behind[(key[0], key[1])].append(key)
        elif (a, b) == ("profiling", "warmup"):
            ahead[(key[0], key[1])].append(key)
    for key, sent in lk.items():
        if key not in rk and sent.phase == "warmup":
            behind[(key[0], key[1])].append(key)
    for key, sent in rk.items():
        if key not in lk and sent.phase == "warmup":
            ahead[(key[0], key[1])].append(key)
    return {
        key
        for play in set(ahead) & set(behind)
        if len(ahead[play]) == len(behind[play])
        for key in ahead[play] + behind[play]
    }


CAP_S: Final = 10.0
"""The system idle cap both tools run with (docs/agentx.md §4b)."""
CASCADE_WINDOW_S: Final = 0.05


def _cap_cascade(reference: View, other: Mapping[Key, Sent]) -> set[Key]:
    """Keys of agent sessions that agentx-harness's system idle cap released early by a tie, with their later turns
    that `other` did not send. When the system has been idle for the cap, the harness's idle watchdog and the timer
    the cap moved to that instant are due together; when the timer's callback runs first, the watchdog still sees
    nothing in flight and no budget left and pulls the next pending timer, of any tree, to now
    (`timing/strategies/agentic_replay.py`, `enforce_system_idle_cap`, `_arm_system_idle_watchdog`). Which runs
    first varies from run to run, so one cap event may release two requests at once; agentx releases one
    (docs/agentx.md, "Open points"). Such a request is a reference request arriving within `CASCADE_WINDOW_S` of
    another after the system had been idle for the cap."""
    sent = sorted(reference.sent, key=lambda s: s.arrive_s)
    cascaded: set[Key] = set()
    busy_until = float("-inf")
    for index, request in enumerate(sent):
        idle_before = request.arrive_s - busy_until
        if index > 0 and idle_before >= CAP_S - CASCADE_WINDOW_S:
            first = request
            for later in sent[index + 1 :]:
                if later.arrive_s - first.arrive_s > CASCADE_WINDOW_S:
                    break
                if later.key not in other and later.phase == "profiling":
                    cascaded.add(later.key)
        busy_until = max(busy_until, request.end_s if request.end_s is not None else request.arrive_s)
    # The cascaded session's later turns follow from its early start.
    for key in list(cascaded):
        trace, play, agent, turn = key
        cascaded |= {
            s.key
            for s in sent
            if s.key[:3] == (trace, play, agent) and s.key[3] > turn and s.key not in other and s.phase == "profiling"
        }
    return cascaded


def _join_deadline_tie(reference: View, other: View) -> set[Key]:
    """Reference-only profiling keys that the idle-cap tie of `_cap_cascade` explains when the timer it pulled to now
    was a join's replay deadline (`timing/branch_orchestrator.py`, `_arm_join_replay_deadline`): the pull shows on
    no request, but the join then goes out when its children end, up to a cap earlier than the other tool sends it,
    and every later play of that lane starts as much earlier. A key is tolerated when the reference sent it within
    that lead of the window's end: had the reference waited out the deadline too, it would not have sent it."""
    if reference.deadline_s is None or reference.profiling_start_s is None or other.profiling_start_s is None:
        return set()
    ref_start, other_start = reference.profiling_start_s, other.profiling_start_s
    theirs = other.by_key()
    sent = sorted(reference.sent, key=lambda s: s.arrive_s)
    cap_events: list[float] = []
    busy_until = float("-inf")
    for index, request in enumerate(sent):
        if index > 0 and request.arrive_s - busy_until >= CAP_S - CASCADE_WINDOW_S:
            cap_events.append(request.arrive_s)
        busy_until = max(busy_until, request.end_s if request.end_s is not None else request.arrive_s)
    lead_s = 0.0
    tolerated: set[Key] = set()
    for request in sent:
        if request.phase != "profiling":
            continue
        mine = theirs.get(request.key)
        if mine is None:
            if lead_s > 0.0 and request.arrive_s >= reference.deadline_s - lead_s:
                tolerated.add(request.key)
            continue
        if request.gap_s is None or mine.gap_s is None:
            continue
        earlier_s = mine.gap_s - request.gap_s
        previous_end_s = request.arrive_s - request.gap_s
        pulled = any(previous_end_s < event < request.arrive_s for event in cap_events)
        if pulled and 1.0 <= earlier_s <= CAP_S + 1.0:
            lead_s = max(lead_s, (mine.arrive_s - other_start) - (request.arrive_s - ref_start))
    return tolerated


def compare(case: str, left: View, right: View) -> Comparison:
    """Compare `right` against `left` (the reference) request by request (module docstring)."""
    checks: list[Check] = []
    lk, rk = left.by_key(), right.by_key()
    order = sorted(set(lk) | set(rk), key=lambda k: (k[0], k[1], k[3], k[2]))
    common = [k for k in order if k in lk and k in rk]

    # keys and phases
    rows: list[tuple[str, str, str]] = []
    edge_rows: list[tuple[str, str, str]] = []
    swapped = _quota_swaps(common, lk, rk)
    cascaded = _cap_cascade(left, rk) | _join_deadline_tie(left, right) if left.tool == "reference" else set()
    at_edge: set[Key] = set()
    for key in order:
        a, b = lk.get(key), rk.get(key)
        if a is not None and b is not None:
            if a.phase != b.phase:
                (edge_rows if key in swapped else rows).append((format_key(key), a.phase, b.phase))
            continue
        present = a if a is not None else b
        assert present is not None
        view = left if a is not None else right
        near_end = view.deadline_s is not None and present.arrive_s >= view.deadline_s - EDGE_S
        if key in swapped:
            edge_rows.append(
                (
                    format_key(key),
                    present.phase if a is not None else "— (not sent)",
                    present.phase if b else "— (not sent)",
                )
            )
            continue
        if a is not None and key in cascaded:
            edge_rows.append((format_key(key), f"{present.phase} (released with another by the cap)", "— (not sent)"))
            continue
        since = "" if view.profiling_start_s is None else f" at +{present.arrive_s - view.profiling_start_s:.1f} s"
        text = f"{present.phase}{since}"
        if present.phase == "profiling" and near_end:
            at_edge.add(key)
            edge_rows.append(
                (format_key(key), text if a is not None else "— (not sent)", text if b is not None else "— (not sent)")
            )
            continue
        rows.append(
            (format_key(key), text if a is not None else "— (not sent)", text if b is not None else "— (not sent)")
        )
    for phase in ("warmup", "profiling"):
        n_left = sum(1 for s in lk.values() if s.phase == phase)
        n_right = sum(1 for s in rk.values() if s.phase == phase)
        checks.append(Check(f"{phase} requests", True, f"{n_left} vs {n_right}"))
    checks.append(
        Check(
            "keys and phases",
            not rows,
            f"{len(common)} keys in both, {len(rows)} differ"
            + (
                f" ({len(edge_rows)} tolerated: sent by one tool only in the last {EDGE_S:.0f} s, a play's last "
                "cache-pressure slot taken by another of its streams, or the harness's idle-cap tie)"
                if edge_rows
                else ""
            ),
            rows,
            edge_rows,
        )
    )

    # gaps
    diffs: list[tuple[float, Key]] = []
    gap_rows = []
    one_sided = []
    for key in common:
        a, b = lk[key], rk[key]
        if a.gap_s is not None and b.gap_s is not None:
            d = b.gap_s - a.gap_s
            diffs.append((abs(d), key))
            if abs(d) > GAP_ROW_S:
                gap_rows.append(
                    (abs(d), (format_key(key), f"{a.gap_s:.3f} s ({a.gap_from})", f"{b.gap_s:.3f} s ({b.gap_from})"))
                )
        elif (a.gap_s is None) != (b.gap_s is None):
            one_sided.append((format_key(key), _fmt(a.gap_s), _fmt(b.gap_s)))
    # Each phase on its own: the cache-pressure stage's many turns, each sent as its previous returns, would
    # otherwise outnumber and hide the profiling turns, whose gaps the idle caps and delays set.
    gap_ok = True
    per_phase = []
    for phase in ("warmup", "profiling"):
        values = [d for d, key in diffs if lk[key].phase == phase]
        if not values:
            continue
        median = statistics.median(values)
        p90 = _percentile(values, 0.9)
        gap_ok = gap_ok and median <= GAP_MEDIAN_S and p90 <= GAP_P90_S
        per_phase.append(f"{phase} {len(values)}, median |diff| {median:.3f} s, p90 {p90:.3f} s")
    gap_rows.sort(key=lambda item: -item[0])
    checks.append(
        Check(
            "gaps (arrival − previous end)",
            gap_ok,
            f"{len(diffs)} keys: {'; '.join(per_phase) or 'none'} (each phase: median ≤ {GAP_MEDIAN_S}, p90 ≤ "
            f"{GAP_P90_S}); {len(gap_rows)} above {GAP_ROW_S} s"
            + (f"; {len(one_sided)} with a gap on one side only" if one_sided else ""),
            [row for _, row in gap_rows] + one_sided,
            show_rows_when_ok=True,
        )
    )

    def field_check(
        name: str, get: Callable[[Sent], Any], show: Callable[[Any], str] = str, skip: Iterable[Key] = ()
    ) -> None:
        skipped = set(skip)
        rows = [
            (format_key(k), show(get(lk[k])), show(get(rk[k])))
            for k in common
            if k not in skipped and get(lk[k]) != get(rk[k])
        ]
        checks.append(Check(name, not rows, f"{len(common) - len(rows)}/{len(common)} equal", rows))

    field_check("max tokens asked", lambda s: s.max_tokens, skip=swapped)
    field_check("message roles", lambda s: s.roles, roles_text)
    field_check("HTTP status", lambda s: s.status)
    field_check(
        "prompt content tokens (prompt − own marker − own template)",
        lambda s: s.content_tokens,
        lambda v: str(v),
    )

    # markers
    unmarked = [
        (format_key(k), lk[k].marker or "none", rk[k].marker or "none")
        for k in common
        if not lk[k].marker or not rk[k].marker
    ]
    marker_rows = _partition_rows(common, lk, rk, lambda s: s.marker)
    checks.append(
        Check(
            "cache-bust marker scope (keys sharing one marker)",
            not marker_rows and not unmarked,
            f"{len({s.marker for s in lk.values()})} vs {len({s.marker for s in rk.values()})} markers; "
            f"{len(marker_rows)} keys grouped differently; {len(unmarked)} keys without a marker",
            marker_rows + unmarked,
        )
    )

    # correlation headers
    corr_rows = _partition_rows(common, lk, rk, lambda s: s.correlation_id)

    # X-Session-Affinity: AIPerf 0.13.0 sends the correlation id in it, the harness sends none; agentx must match.
    def affinity_state(sent: Sent) -> str:
        if sent.affinity is None:
            return "absent"
        return "= X-Correlation-ID" if sent.affinity == sent.correlation_id and sent.correlation_id else "other"

    expected_state = {affinity_state(sent) for sent in left.sent} - {"other"}
    affinity_rows = []
    for view, tool_index in ((left, 0), (right, 1)):
        for sent in view.sent:
            state = affinity_state(sent)
            if not sent.correlation_id or state == "other" or (tool_index == 1 and state not in expected_state):
                cells = ["", ""]
                cells[tool_index] = f"X-Correlation-ID {sent.correlation_id} / X-Session-Affinity {sent.affinity}"
                affinity_rows.append((format_key(sent.key), cells[0], cells[1]))
    checks.append(
        Check(
            "X-Correlation-ID grouping (one per agent session) and X-Session-Affinity as the reference's",
            not corr_rows and not affinity_rows,
            f"{len({s.correlation_id for s in lk.values()})} vs {len({s.correlation_id for s in rk.values()})} ids; "
            f"{len(corr_rows)} keys grouped differently; "
            f"{len(affinity_rows)} requests with a missing or different affinity",
            corr_rows + affinity_rows,
        )
    )

    # request ids
    dup_rows = []
    for view, tool_index in ((left, 0), (right, 1)):
        ids: dict[str | None, int] = defaultdict(int)
        for sent in view.sent:
            ids[sent.request_id] += 1
        for rid, n in ids.items():
            if rid is None or n > 1:
                cells = ["", ""]
                cells[tool_index] = f"{rid} ×{n}"
                dup_rows.append(("—", cells[0], cells[1]))
    checks.append(
        Check("X-Request-ID unique per request", not dup_rows, f"{len(dup_rows)} missing/duplicated", dup_rows)
    )

    # rate (less the reference's requests an idle-cap tie released early, and the keys one tool alone sent in the
    # window's last seconds: both are tolerated above)
    n_left = len([sent for sent in left.profiling() if sent.key not in cascaded | at_edge])
    n_right = len([sent for sent in right.profiling() if sent.key not in at_edge])
    ratio = n_right / n_left if n_left else (1.0 if not n_right else float("inf"))
    checks.append(
        Check(
            "profiling request rate",
            RATE_LOW <= ratio <= RATE_HIGH,
            f"{n_left} vs {n_right} requests in the window: ×{ratio:.2f} (allowed ×{RATE_LOW}–×{RATE_HIGH})",
        )
    )

    # joins
    join_rows = [(name, "", "") for name in left.unjoined_records[:5]] + [
        ("", "", name) for name in right.unjoined_records[:5]
    ]
    checks.append(
        Check(
            "every record's request reached the server",
            not join_rows,
            f"{len(left.unjoined_records)} vs {len(right.unjoined_records)} missing",
            join_rows,
        )
    )
    return Comparison(case, left, right, checks, sorted(swapped | cascaded))


# ---------------------------------------------------------------------------------------------
# a case, end to end


@dataclass
class CaseRun:
    case: Case
    comparison: Comparison
    runs: list[Finished]
    seconds: float


def run_case(case: Case, workdir: Path, ref: Reference, tokenizer: Tokenizer, *, against: Tool = "agentx") -> CaseRun:
    """Run the reference `ref` and `against` (agentx with `ref`'s rules, or the reference again to check the harness)
    at once, each against its own stand-in, and compare them."""
    t0 = time.monotonic()
    base = workdir / ref.name / case.name
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    left_log, right_log = base / "reference.server.jsonl", base / f"{against}.server.jsonl"
    if against == "reference":
        right_log = base / "reference2.server.jsonl"
    with (
        standin_server(left_log, tokenizer.directory, case.max_model_len) as left_url,
        standin_server(right_log, tokenizer.directory, case.max_model_len) as right_url,
    ):
        left = reference_launch(case, ref, left_url, base / "reference", tokenizer)
        if against == "agentx":
            right = agentx_launch(case, right_url, base / "agentx", ref.rules)
        else:
            right = reference_launch(case, ref, right_url, base / "reference2", tokenizer)
        finished = run_all([left, right], timeout_s=case.duration + case.grace + 240.0)
    for run in finished:
        if run.returncode != 0:
            raise RuntimeError(
                f"{case.name}: {run.launch.tool} exited {run.returncode} after {run.seconds:.0f} s; "
                f"console {run.launch.console}:\n{run.console_tail()}"
            )
    comparison = load_case(case.name, base, case.duration, against)
    return CaseRun(case, comparison, finished, time.monotonic() - t0)


def load_case(name: str, base: Path, duration: float, against: Tool = "agentx") -> Comparison:
    """Compare the runs saved in `base` (a case's folder) and write its `report.txt`."""
    left_view = load_reference(base / "reference.server.jsonl", base / "reference", duration)
    if against == "agentx":
        right_view = load_agentx(base / "agentx.server.jsonl", base / "agentx", duration)
    else:
        right_view = load_reference(base / "reference2.server.jsonl", base / "reference2", duration)
    comparison = compare(name, left_view, right_view)
    if against == "agentx":
        comparison.checks.append(dispatch_lag_check(base / "agentx" / "records.arrow"))
    (base / "report.txt").write_text(comparison.report(rows=10_000) + "\n")
    return comparison


def dispatch_lag_check(records_path: Path) -> Check:
    """agentx's dispatch lag over its profiling requests: a request sent later than it was due measures the
    client, not the server (docs/agentx.md §4b); p99 must stay within `DISPATCH_LAG_P99_MAX_S` beyond the longest
    stall of its process the run's loop lag allows, a schedule bug's guard (the figures are printed either way)."""
    import agentx

    table = agentx.read_records(records_path)
    lags = sorted(
        lag
        for lag, phase in zip(
            table.column("dispatch_lag_s").to_pylist(), table.column("phase").to_pylist(), strict=True
        )
        if phase == "profiling"
    )
    if not lags:
        return Check("agentx dispatch lag (profiling)", True, "no profiling requests")
    lag_max_s = loop_lag_max_s(records_path.parent / "run.json")
    p50, p99 = _percentile(lags, 0.50), _percentile(lags, 0.99)
    stall_s = stall_bound_s(lag_max_s)
    return Check(
        "agentx dispatch lag (profiling)",
        p99 <= DISPATCH_LAG_P99_MAX_S + stall_s,
        f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (≤ {DISPATCH_LAG_P99_MAX_S * 1e3:g} ms + a stall of up to "
        f"{stall_s * 1e3:.0f} ms: its loop lag's max {lag_max_s * 1e3:.0f} ms + one sample), "
        f"max {lags[-1] * 1e3:.2f} ms",
    )


def loop_lag_max_s(run_json: Path) -> float:
    """The longest event-loop lag agentx measured in its run (0 when run.json has none)."""
    if not run_json.exists():
        return 0.0
    summary = json.loads(run_json.read_text()).get("summary") or {}
    loop_lag = summary.get("loop_lag") or {}
    return float(loop_lag.get("max_s", 0.0))
