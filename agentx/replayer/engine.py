"""Running a replay: lanes of session trees over one client, records streamed to disk.

- `ReplayOptions`: one immutable options object for a run.
- `await run_replay(trace, options, *, on_record=None, on_sent=None) -> RunResult`: drives the server with
  the trace's (or a `prepare_trace` result's) sessions and returns where the records went; `on_sent()` is
  called as each request goes out and `on_record(record)` as it finishes (progress displays, harnesses).
  Raises `ServerUnreachable` / `ModelNotServed` (agentx.replayer.client) or `CalibrationError`
  (agentx.replayer.calibrate) before any request when the server cannot be used.
- `RunResult`: the run id, the records file, counts, whether the run was interrupted, and what the run
  detected (stream usage, chat calibration, event-loop lag samples).

How a run goes (docs/agentx.md §4d–§4e, §8; docs/replay.md):

- `GET /v1/models` first; nothing is created on disk if it fails. Then the stream-usage probe
  (agentx.replayer.probe) unless `stream_usage` is forced, for `api="chat"` the calibration, and the trace as
  replayed (`prepare_trace`, unless given one): over-long sessions dropped; flattened agents are split and
  plans built per session when a tree first draws it (agentx.replayer.sessions).
- agentx mode: each lane draws its first tree and its snapshot at t* (agentx.replayer.tstar), the primers go
  out (spread so that every t* coincides), then the optional cache-pressure stage; the profiling start is
  when that ends. Open-loop modes (`trace`, `rate`) start trees at their arrival times instead of on lanes.
- `concurrency` lanes draw trees from one shared `session_order(...)` stream (lane i waits
  `i/concurrency × ramp_s` first). A lane plans its session (cached per session index, with every step's
  full hash ids), then runs one task per step inside a TaskGroup: a step waits for its anchor and joins,
  sleeps `delay_s × delay_scale` (agentx.replayer.idle: a timer that idle caps move earlier and the stop
  event wakes early), and POSTs a
  streamed request forcing `out` output tokens (at least 1). Its body is built while its anchor is still in
  flight. The lane recycles only when every step of the tree, background subagents included, has
  settled; the next tree starts at turn 0.
- End: after `sessions` trees have started (default with no duration: one pass, `len(trace.sessions)` trees)
  the lanes drain and stop. At `duration_s` (or on cancellation of `run_replay`) no new tree or step starts,
  in-flight requests get `grace_s`, then are cancelled and recorded as errors of kind `cancelled`; steps never
  sent are counted in `RunResult.skipped`, not recorded.
- A failed request still completes its step: its dependents go on (the error is in its record).
- Records stream to `out_dir/records.arrow`; a ticker lets the writer flush every 0.2 s, and
  the writer is closed on every exit path. In agentx mode every play carries its own cache-bust marker.
- `shard=(i, n)` runs lanes i, i+n, ... and the trees at positions ≡ i (mod n) of the order: one process of
  a `--workers n` run (agentx.replayer.workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from agentx.errors import ConfigError, ServerError
from agentx.replayer.arrivals import rate_arrivals, trace_arrivals
from agentx.replayer.calibrate import ChatCalibration, LocalCounter, ServerCounter, TokenCounter, calibrate
from agentx.replayer.chat import CHAT_PATH, MARKER_WORDS, ChatRenderer, chat_body
from agentx.replayer.client import CONTEXT_OVERFLOW_SUBSTRINGS, Client, Exchange, ModelNotServed
from agentx.replayer.clock import DispatchClock
from agentx.replayer.collector import QUIET_SPAN_NS, collect_on_clock, freeze_new, quiet_gc
from agentx.replayer.conversation import ChatTurn, Conversation
from agentx.replayer.http1 import check_header
from agentx.replayer.identity import ServerIdentity, identify_server
from agentx.replayer.idle import IdleCaps
from agentx.replayer.locks import locks_broken
from agentx.replayer.offloop import OFF_LOOP_REQUESTS, OFF_LOOP_TOKENS, OffLoop
from agentx.replayer.plan import Step, join_due, session_order
from agentx.replayer.play import Play, PreparedSession, PreparedTrace, marker_hex
from agentx.replayer.probe import STREAM_OPTIONS, UsageProbe, detect_stream_usage
from agentx.replayer.prompts import BlockTokens, TokenSpace, completions_body, filler, prompt_token_ids
from agentx.replayer.record_writer import RecordWriter
from agentx.replayer.records import Phase, RequestRecord, RunInfo
from agentx.replayer.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.replayer.secrets import redact, secret_free_repr
from agentx.replayer.sessions import ReplaySessions
from agentx.replayer.tstar import DEFAULT_WINDOW, Snapshot, snapshot, t_star
from agentx.replayer.url import base_url as parse_base_url
from agentx.trace.chains import DEFAULT_RULES, ChainRules
from agentx.trace.model import Trace

SessionOrder = Literal["sequential", "shuffle", "random"]

AFFINITY_HEADERS = ("X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID")
"""Headers a router may key session affinity on; `ReplayOptions.affinity_headers` picks among them."""
FLUSH_EVERY_S = 0.05
"""Records reach disk this often, in small batches (a flush holds the loop ~0.1 ms + ~10 µs a row), each
written in a gap between due requests (`QUIET_SPAN_NS`), so at most 0.1 s after they ended."""
COMPLETIONS_PATH = "/v1/completions"
LOOP_LAG_TICK_S = 0.1
"""How often the event-loop lag is sampled."""
FAILURE_THRESHOLD_MIN_REQUESTS = 10
"""The failure threshold is judged only once max(this, concurrency) profiling requests have ended, the reference's
grace floor (`records/records_manager.py`): one early error must not cancel a run."""
ARRIVAL_LEAD_NS = 20_000_000
"""Open-loop trees are set up this long before their arrival, so a late wake-up of the arrivals loop or a
long first body (~100k tokens) does not delay the send (setup C: dispatch lag p99 2.7 → 1.9 ms)."""
LATE_NOTICE_S = 1.0
"""The first profiling request sent more than this late is announced: the run fell behind its schedule."""
WARMUP_NOTICE_S = 120.0
"""A warmup expected to take longer than this is announced (on the "agentx" logger, and in `RunResult.notices`)."""
_log = logging.getLogger(__name__)
MARKER_TOKENS = 8
"""Token ids of a cache-bust marker on `--api completions` (drawn from the filler range, per tree)."""


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000."""
    model: str
    """The served model requests name (the first of the §2f mapping: a session's main model maps to it)."""
    models: tuple[str, ...] = ()
    """More served models for the §2f mapping: a session's i-th distinct recorded model (main model first)
    maps to `(model, *models)[i % n]`."""
    max_context_length: int | None = None
    """Sessions whose peak `in + out` (any agent, output uncapped) exceeds this are dropped before the run (§4f)."""
    max_output_tokens: int | None = None
    """Caps `out` of the root's and flat chains' turns; subagent turns are never capped (§2d)."""
    chain_rules: ChainRules = DEFAULT_RULES
    """The thresholds of flattened-agent detection (agentx.trace.chains.ChainRules, the reference's defaults)."""
    context_overflow_substrings: tuple[str, ...] = CONTEXT_OVERFLOW_SUBSTRINGS
    """An error answer (any HTTP status, or an in-stream error event) whose text holds one of these (case-insensitive)
    is a context overflow (§5); () disables."""
    split_flattened_agents: bool = True
    """Split agents recorded flattened into their parent's request list into their own agents first
    (agentx.trace.chains, §3b; on in the reference)."""
    out_dir: Path | str
    """Where records.arrow (and run metadata) are written."""
    overwrite: bool = False
    """Replace a run already in `out_dir`; without it, a folder holding records.arrow is refused (RunExists)."""
    api: Literal["completions", "chat"] = "completions"
    """`completions`: token-id prompts (exact by construction); `chat`: message arrays of calibrated text."""
    concurrency: int = 1
    """Lanes: each runs one whole session tree at a time (background subagents included)."""
    duration_s: float | None = None
    """Stop starting new requests after this long; None: until `sessions` trees are done."""
    sessions: int | None = None
    """Stop after this many session trees have been started (None with no duration: one pass)."""
    grace_s: float = 30.0
    """After the deadline, in-flight requests may finish within this; then they are cancelled."""
    request_timeout_s: float | None = None
    """A request still running this long after it was handed to the client fails as a timeout of kind
    "request"; None: no limit."""
    idle_timeout_s: float | None = 300.0
    """A request that receives no byte for this long fails as a timeout of kind "idle"; None: no limit."""
    connect_timeout_s: float = 10.0
    """Opening a connection that takes longer fails the request as a timeout of kind "connect"."""
    session_order: SessionOrder = "sequential"
    seed: int = 0
    child_offset: Literal["branch_start", "anchor_end"] = "branch_start"
    api_key: str | None = msgspec.field(default=None)
    """Bearer token; never written to records, logs or reports."""
    headers: tuple[tuple[str, str], ...] = ()
    extra_body: dict[str, object] | None = None
    token_low: int = 1000
    token_high: int = 30000
    """Token ids of synthetic prompts are drawn from [token_low, token_high)."""
    max_connections: int | None = None
    """Connection pool size (default: 2 × concurrency; unbounded in the open-loop modes)."""
    delay_scale: float = 1.0
    """Multiplies every planned delay (think times, subagent offsets): 1.0 replays the recorded timing,
    0.01 runs a trace's idle gaps 100x faster (tests, demos, a simulator with a fast `time_scale`), 0 sends
    each request as soon as its dependencies complete. Joins and anchors are always honoured."""
    affinity_headers: tuple[str, ...] = ()
    """Extra headers (names from `AFFINITY_HEADERS`) that carry the play's X-Correlation-ID value too,
    for routers that keep a session on one worker by another header."""
    stream_usage: Literal["auto", "continuous", "final", "none"] = "auto"
    """What `stream_options` asks for: `auto` probes the server once before the run (continuous usage if it
    takes it, else final usage only, else no stream_options); the others force one choice."""
    tokenizer: str | None = None
    """`--api chat`: a local `tokenizer.json` to calibrate words with, instead of the server's `/tokenize`."""
    ramp_s: float = 0.0
    """Lane i starts its first tree i/concurrency × ramp_s after the run start, so lanes do not stay in step."""
    mode: Literal["agentx", "closed", "trace", "rate"] = "agentx"
    """`agentx` (docs/agentx.md §4d–§4e): each lane's first tree resumes at its t* after a warmup, recycled trees
    start at turn 0, and every tree carries a cache-bust marker; `closed`: every tree from turn 0, no warmup,
    no marker. The open-loop modes have no lanes: `trace` starts each session at its recorded start (÷
    `speedup`), `rate` starts sessions at `rate` per second (agentx.replayer.arrivals); turns still follow
    each tree's DAG, and records have `lane = -1`."""
    speedup: float = 1.0
    """`trace` mode: divides the recorded arrival times and, with `delay_scale`, every delay within a tree."""
    rate: float | None = None
    """`rate` mode: session arrivals per second."""
    burstiness: float = 1.0
    """`rate` mode: the gamma shape of the gaps between arrivals (1: Poisson)."""
    tstar_window: tuple[float, float] = DEFAULT_WINDOW
    """Where in a session's span t* falls (fractions); InferenceX runs 0.25–0.75, the scenario file 0–1."""
    warmup: Literal["spread", "burst"] = "spread"
    """`spread`: each primer goes out so that every lane's t* coincides at the profiling start; `burst` (the
    reference's `--burst-phase-starts`): all primers at once, and each lane's earliest live turn at the profiling
    start (the others keep their spacing after it)."""
    warmup_requests_per_lane: int = 0
    """agentx mode: after the primers, keep replaying from t* with idle delays removed and warmup-sized
    outputs for this many requests per lane (InferenceX: 10), then hand over to profiling (§4d)."""
    warmup_max_tokens: int | None = 1
    """Output tokens of a warmup primer (the reference's code sends 1); None: the recorded output."""
    cache_bust: Literal["marker", "salt", "off"] = "marker"
    """agentx mode: a per-tree marker at the start of every prompt (`marker`), or the tree's marker as
    vLLM's `cache_salt` body field (`salt`; the prompt is left untouched), or nothing."""
    system_idle_cap_s: float | None = 10.0
    """When nothing is in flight anywhere, every pending timer moves earlier so that the earliest fires at
    most this long after the system went idle (docs/agentx.md §4b; AgentX locks it at 10 s). None: off."""
    tree_idle_cap_s: float | None = None
    """The same per tree (§4c; InferenceX passes 300); it also caps warmup leads and a lane's first offset."""
    tree_idle_cap_mode: Literal["runtime", "warp"] = "warp"
    """How the per-tree cap acts (§4c, version-dependent): by cutting each tree's recorded idle gaps before the run
    (`warp`: `agentx.trace.warp`, what the reference, AIPerf 0.13.0, does), or on the live schedule when a tree has
    gone idle (`runtime`, as InferenceX describes a newer version)."""
    benchmark_id: str | None = None
    """The run-level key of the cache-bust markers (§2e); None: the run id, fresh every run, so a rerun never
    hits the previous run's cache (the reference's behaviour). Pass one to get identical markers across runs."""
    failed_request_threshold: float | None = None
    """Cancel the run once more than this fraction of profiling requests failed (InferenceX: 0.10); judged
    from max(`FAILURE_THRESHOLD_MIN_REQUESTS`, concurrency) requests on; context overflows are not failures here."""
    quiet_gc: bool = True
    """During the run, freeze what exists at its start out of the garbage collector's sight and collect only
    the young generations, on a 0.1 s clock (restored at the end): automatic collections otherwise stall the
    event loop for up to tens of milliseconds (bench/replay_overhead.py, setup C at 200/s: dispatch lag
    p99 / max 6.8 / 45 ms → 1.5 / 6–8 ms)."""
    run_id: str | None = None
    """The run's id (default: a fresh UUID); the workers of one `--workers` run share theirs."""
    shard: tuple[int, int] = (0, 1)
    """(index, count): this process runs lanes index, index+count, ... and the trees at positions ≡ index
    (mod count) of the shared session order (`--workers`; (0, 1) is the whole run)."""
    spec_al: float | None = None
    """The speculative acceptance length the server was forced to (bonus token included, in [1, spec_k + 1]):
    run metadata, checked against the realized one after the run (agentx.results.acceptance)."""
    spec_k: int | None = None
    """Draft tokens per step the server was configured with, for the same check."""
    spec_al_tolerance: float = 0.05
    """Largest |realized − forced| AL that still counts as the forced one (absolute)."""
    stream_interval: int = 1
    """Decode steps the server merges into one streamed chunk (vLLM's --stream-interval): the stream's
    tokens-per-chunk estimate of AL is divided by it."""

    def __repr__(self) -> str:
        return secret_free_repr(self)  # the API key, header values and a URL's password never show


class RunResult(msgspec.Struct, kw_only=True):
    run_id: str
    records_path: Path
    requests: int
    """Records written (every request sent, cancelled ones included)."""
    errors: int
    """Records with status "error" (cancelled ones included)."""
    trees_started: int
    trees_finished: int
    interrupted: bool
    elapsed_s: float
    cancelled: int = 0
    """Requests cancelled after the grace period (also counted in `errors`)."""
    skipped: int = 0
    """Steps of started trees never sent because the run stopped first."""
    loop_lag_s: list[float] = []
    """Event-loop lag samples: how late a 100 ms timer fired, every 100 ms of the run."""
    stream_usage: str = ""
    """What the run's bodies asked for: "continuous", "final" or "none" (after the `auto` probe)."""
    calibration: dict[str, Any] | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start."""
    cancel_reason: str | None = None
    """Why the run stopped early: "interrupted" (Ctrl-C, cancellation) or "failure_threshold"; None otherwise."""
    skipped_context_overflow: int = 0
    """Steps not sent because their session had ended on a context overflow (docs/agentx.md §5)."""
    warmup_requests: int = 0
    """Warmup primers sent (their records have `phase = "warmup"`)."""
    tstar: list[dict[str, Any]] = []
    """agentx mode: each lane's first tree at its t* (session, t*, live and skipped agents, primers, waiting)."""
    dropped_sessions: int = 0
    """Sessions left out by `max_context_length`."""
    flattened_chains: int = 0
    """Agents split out of the flattened request lists of the sessions played (`split_flattened_agents`)."""
    flattened_by_session: dict[str, int] = {}
    """The same per session played (0: nothing flattened); sessions never played are not split."""
    server: ServerIdentity = ServerIdentity()
    """The engine serving the run, as the server says itself (agentx.replayer.identity)."""
    idle_jumps: int = 0
    """Times an idle cap moved timers earlier."""
    idle_skipped_s: float = 0.0
    """Idle time the system cap removed in all (the per-tree cap's shifts are not summed here)."""
    warmup_expected_s: float = 0.0
    """agentx mode: how long the primers' spread schedule was expected to take, idle caps applied."""
    notices: list[str] = []
    """What the run announced as it went (e.g. a warmup of many minutes), as logged."""


class WarmupFailed(ServerError):  # noqa: N818 (reads as a sentence: "warmup failed")
    """A root agent's warmup primer failed: the run stops before profiling (docs/agentx.md §5)."""


OnRecord = Callable[[RequestRecord], None]
OnSent = Callable[[], None]
"""Called once per request that will be recorded, as it goes out (before its record's `OnRecord`)."""


def options_metadata(options: ReplayOptions) -> dict[str, Any]:
    """`options` as JSON-ready builtins without credentials (no API key, header values redacted)."""
    raw = msgspec.to_builtins(options, enc_hook=str)
    assert isinstance(raw, dict)
    raw.pop("api_key", None)
    result: dict[str, Any] = redact(raw)
    return result


def _validate(options: ReplayOptions) -> None:
    parse_base_url(options.url)  # BadURLError (a ValueError) names what is wrong with it
    for name, value in options.headers:
        check_header(name, value)
    for name in ("delay_scale", "grace_s", "ramp_s", "duration_s", "speedup", "burstiness", "rate"):
        value = getattr(options, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    for name in ("request_timeout_s", "idle_timeout_s", "connect_timeout_s"):
        value = getattr(options, name)
        if value is not None and not value > 0:  # NaN too
            raise ValueError(f"{name} must be positive, got {value}")
    if options.seed < 0:
        raise ValueError(f"seed must be non-negative, got {options.seed}")
    if options.concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {options.concurrency}")
    if options.duration_s is not None and options.duration_s < 0:
        raise ValueError(f"duration_s must be non-negative, got {options.duration_s}")
    if options.sessions is not None and options.sessions < 0:
        raise ValueError(f"sessions must be non-negative, got {options.sessions}")
    if options.grace_s < 0:
        raise ValueError(f"grace_s must be non-negative, got {options.grace_s}")
    if options.delay_scale < 0:
        raise ValueError(f"delay_scale must be non-negative, got {options.delay_scale}")
    if options.ramp_s < 0:
        raise ValueError(f"ramp_s must be non-negative, got {options.ramp_s}")
    shard_index, shard_count = options.shard
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {options.shard}")
    low, high = options.tstar_window
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"tstar_window must satisfy 0 <= low <= high <= 1, got {options.tstar_window}")
    if options.warmup_requests_per_lane < 0:
        raise ValueError(f"warmup_requests_per_lane must be non-negative, got {options.warmup_requests_per_lane}")
    if options.warmup_max_tokens is not None and options.warmup_max_tokens < 1:
        raise ValueError(f"warmup_max_tokens must be at least 1, got {options.warmup_max_tokens}")
    if options.tree_idle_cap_mode not in ("runtime", "warp"):
        raise ValueError(f"tree_idle_cap_mode must be 'runtime' or 'warp', got {options.tree_idle_cap_mode!r}")
    for name in ("system_idle_cap_s", "tree_idle_cap_s"):
        cap = getattr(options, name)
        if cap is not None and cap < 0:
            raise ValueError(f"{name} must be non-negative, got {cap}")
    threshold = options.failed_request_threshold
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"failed_request_threshold must be within [0, 1], got {threshold}")
    if options.mode == "rate" and (options.rate is None or options.rate <= 0):
        raise ValueError(f"mode 'rate' needs a positive rate, got {options.rate}")
    if options.speedup <= 0 or options.burstiness <= 0:
        raise ValueError(f"speedup and burstiness must be positive, got {options.speedup}, {options.burstiness}")
    if options.api not in ("completions", "chat"):
        raise ValueError(f"unsupported api {options.api!r}")
    for name in options.affinity_headers:
        if name not in AFFINITY_HEADERS:
            raise ValueError(f"unsupported affinity header {name!r} (allowed: {', '.join(AFFINITY_HEADERS)})")
    _validate_spec(options)


def _validate_spec(options: ReplayOptions) -> None:
    al, k = options.spec_al, options.spec_k
    if k is not None and k < 1:
        raise ValueError(f"spec_k (draft tokens per step) must be at least 1, got {k}")
    if al is not None:
        high = math.inf if k is None else k + 1
        if not (math.isfinite(al) and 1.0 <= al <= high):
            bound = f"[1, K+1] = [1, {k + 1}] for K={k}" if k is not None else "at least 1"
            raise ValueError(f"spec_al (acceptance length, bonus token included) must be {bound}, got {al}")
    if not (math.isfinite(options.spec_al_tolerance) and options.spec_al_tolerance > 0):
        raise ValueError(f"spec_al_tolerance must be positive, got {options.spec_al_tolerance}")
    if options.stream_interval < 1:
        raise ValueError(f"stream_interval must be at least 1, got {options.stream_interval}")


async def run_replay(
    trace: Trace | PreparedTrace,
    options: ReplayOptions,
    *,
    on_record: OnRecord | None = None,
    on_sent: OnSent | None = None,
    on_profiling: OnSent | None = None,
) -> RunResult:
    """Replay `trace` against `options.url` (see the module docstring and docs/agentx.md §4d–§4e, §8);
    `on_profiling()` is called once, as the profiling phase starts (after the warmup).

    Cancelling the calling task (Ctrl-C under `asyncio.run`) acts like reaching the deadline: no new
    request starts, in-flight ones get `grace_s`, the records are flushed, and the result says
    `interrupted=True`. A second cancellation shrinks the grace period to zero: the requests in flight are
    cancelled at once and recorded with what had arrived. Only a third propagates, losing those records.
    `trace` may be a `prepare_trace` result made for options that agree with these on what it depends on.
    """
    _validate(options)
    refuse_existing_run(Path(options.out_dir), options.overwrite)
    if isinstance(trace, PreparedTrace) and trace.made_for != _preparation(options):
        raise ValueError(
            "the prepared trace was made for other options (split rules, context limit, load-time idle cap, child "
            "offset or models): prepare it again with these options"
        )
    space = TokenSpace(options.token_low, options.token_high)  # validates the range before any I/O
    # Lanes bound the requests in flight; an open loop does not, so neither may its connection pool (0: none).
    lanes_limit = 0 if options.mode in ("trace", "rate") else 2 * options.concurrency
    limit = options.max_connections or lanes_limit
    async with Client(
        options.url,
        api_key=options.api_key,
        headers=dict(options.headers),
        limit=limit,
        connect_timeout_s=options.connect_timeout_s,
        idle_timeout_s=options.idle_timeout_s,
        total_timeout_s=options.request_timeout_s,
        context_overflow_substrings=options.context_overflow_substrings,
    ) as client:
        served = await client.probe_models(require=options.model)
        missing = [model for model in options.models if model not in served]
        if missing:
            raise ModelNotServed(f"models {missing} are not served by {options.url} (served: {', '.join(served)})")
        server = await identify_server(client, options.model)
        prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, options)
        sessions = prepared.sessions
        trace = sessions.trace
        notices = _dropped_notices(sessions, options)
        probe = await _stream_usage(client, options, space)
        stream_usage = probe.usage
        if probe.assumed is not None:
            notices.append(f"stream usage: {probe.assumed}; assuming {stream_usage!r}")
            _log.warning(notices[-1])
        calibration = await _calibrate(client, options, trace.block_size) if options.api == "chat" else None
        out_dir = Path(options.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        run_id = options.run_id or uuid.uuid4().hex
        # Read the two clocks back to back: wall time = epoch + offset must hold to the microsecond.
        start_ns, wall_epoch_ns = time.perf_counter_ns(), time.time_ns()
        metadata = options_metadata(options)
        metadata["trace"] = {"dropped_sessions": sessions.dropped}
        broken = locks_broken(options)
        metadata["locks_broken"] = broken
        metadata["unsafe_override"] = bool(broken)
        metadata["detected"] = {
            "stream_usage": stream_usage,
            "stream_usage_assumed": probe.assumed,
            "calibration": calibration.summary() if calibration is not None else None,
        }
        info = RunInfo(run_id=run_id, wall_epoch_ns=wall_epoch_ns, options=metadata)
        records_path = out_dir / RECORDS_FILE
        with (
            # Flushed by the runner's ticker, in gaps between due requests (`_tick`), not as records arrive.
            RecordWriter(records_path, info, flush_interval_s=math.inf) as writer,
            DispatchClock() as clock,
        ):
            runner = _Runner(prepared, options, client, writer, space, run_id, start_ns, on_record, clock)
            runner.on_sent = on_sent
            runner.on_profiling = on_profiling
            runner.stream_options = STREAM_OPTIONS[stream_usage]
            runner.notices.extend(notices)
            if calibration is not None:
                runner.renderer = ChatRenderer(calibration, options.seed, trace.block_size)
            # Frozen after the runner is built: its long-lived tables (block cache, plans) are never walked.
            with quiet_gc(options.quiet_gc):
                main = asyncio.create_task(runner.run())
                interrupts = 0
                while True:
                    try:
                        await asyncio.shield(main)
                        break
                    except asyncio.CancelledError:
                        current = asyncio.current_task()
                        if main.done() or current is None:
                            raise
                        interrupts += 1
                        if interrupts > 2:  # a third: give up on the records of the requests in flight
                            main.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await main
                            raise
                        current.uncancel()
                        runner.cancel_reason = runner.cancel_reason or "interrupted"
                        runner.stop()
                        if interrupts == 2:  # the grace period shrinks to zero; the records are still written
                            runner.hard_stop("a second interrupt ended the grace period")
                interrupted = interrupts > 0
                elapsed_s = (time.perf_counter_ns() - start_ns) / 1e9
    played_ids = {trace.sessions[index].session_id for index in runner.played}
    flattened = {sid: chains for sid, chains in sessions.chains_by_session.items() if sid in played_ids}
    return RunResult(
        run_id=run_id,
        records_path=records_path,
        requests=runner.requests,
        errors=runner.errors,
        trees_started=runner.trees_started,
        trees_finished=runner.trees_finished,
        interrupted=interrupted,
        elapsed_s=elapsed_s,
        cancelled=runner.cancelled,
        skipped=runner.skipped,
        loop_lag_s=runner.loop_lag_s,
        stream_usage=stream_usage,
        calibration=calibration.summary() if calibration is not None else None,
        cancel_reason=runner.cancel_reason,
        skipped_context_overflow=runner.skipped_context_overflow,
        warmup_requests=runner.warmup_requests,
        tstar=runner.tstar,
        dropped_sessions=len(sessions.dropped),
        flattened_chains=sum(flattened.values()),
        flattened_by_session=flattened,
        server=server,
        idle_jumps=len(runner.idle.jumps),
        idle_skipped_s=runner.idle.skipped_ns / 1e9,
        warmup_expected_s=runner.warmup_expected_s,
        notices=runner.notices,
    )


def expected_warmup_s(offsets_s: list[float], system_idle_cap_s: float | None) -> float:
    """How long primers sent at `offsets_s` take to go out when the system idle cap shortens every gap between
    them to at most the cap (primers are 1-token requests: the system is idle between them)."""
    if not offsets_s:
        return 0.0
    ordered = sorted(offsets_s)
    if system_idle_cap_s is None:
        return ordered[-1]
    return min(ordered[0], system_idle_cap_s) + sum(
        min(later - earlier, system_idle_cap_s) for earlier, later in itertools.pairwise(ordered)
    )


def _duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _describe_snapshot(lane: int, prepared: PreparedSession, state: Snapshot) -> dict[str, Any]:
    steps = prepared.plan.steps

    def agents(indices: Iterable[int]) -> list[str]:
        return sorted({steps[i].agent_id for i in indices})

    return {
        "lane": lane,
        "session_id": prepared.plan.session_id,
        "t_star_s": state.t_star,
        "live_agents": agents(state.first_live),
        "skipped_agents": agents(state.skipped),
        "done_steps": len(state.done),
        "primers": len(state.primers),
        "waiting_on_join": agents(state.waiting),
    }


def prepare_trace(trace: Trace, options: ReplayOptions) -> PreparedTrace:
    """The trace as runs with `options` replay it: over-long sessions dropped (§4f) now; flattened agents split
    out (§3b), idle gaps cut when the per-tree cap is the load-time kind (§4c) and plans built per session when
    first played. Pass it to several `run_replay` calls (a sweep) to prepare the trace once."""
    cap = options.tree_idle_cap_s
    sessions = ReplaySessions(
        trace,
        chain_rules=options.chain_rules if options.split_flattened_agents else None,
        max_context_length=options.max_context_length,
        warp_cap_s=cap if cap is not None and options.tree_idle_cap_mode == "warp" else None,
    )
    return PreparedTrace(sessions, options.child_offset, (options.model, *options.models), _preparation(options))


class NothingToReplay(ConfigError):  # noqa: N818 (reads as what happened)
    """Every session of the trace was left out (`max_context_length`): there is nothing to replay."""


def _dropped_notices(sessions: ReplaySessions, options: ReplayOptions) -> list[str]:
    """The sessions `max_context_length` left out, said (logged, and returned for `RunResult.notices`); raises
    NothingToReplay when none is left."""
    dropped = sessions.dropped
    if not dropped:
        return []
    total = len(dropped) + len(sessions.trace.sessions)
    shown = ", ".join(repr(session_id) for session_id in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
    what = (
        f"{len(dropped):,} of {total:,} sessions need more than max_context_length {options.max_context_length:,} "
        f"tokens (peak in + out) and are left out: {shown}"
    )
    if len(dropped) == total:
        raise NothingToReplay(f"nothing to replay: {what}")
    _log.warning(what)
    return [what]


def _preparation(options: ReplayOptions) -> tuple[object, ...]:
    """The options a `PreparedTrace` depends on: runs that agree on them can share one."""
    warp = options.tree_idle_cap_s if options.tree_idle_cap_mode == "warp" else None
    rules = options.chain_rules if options.split_flattened_agents else None
    return (rules, options.max_context_length, warp, options.child_offset, options.model, options.models)


async def _stream_usage(client: Client, options: ReplayOptions, space: TokenSpace) -> UsageProbe:
    if options.stream_usage != "auto":
        return UsageProbe(options.stream_usage)
    body: dict[str, object] = {"model": options.model, "max_tokens": 2, "ignore_eos": True}
    if options.api == "chat":
        body["messages"] = [{"role": "user", "content": "ok"}]
        return await detect_stream_usage(client, CHAT_PATH, body)
    body["prompt"] = [space.low] * 8
    return await detect_stream_usage(client, COMPLETIONS_PATH, body)


async def _calibrate(client: Client, options: ReplayOptions, block_size: int) -> ChatCalibration:
    counter: TokenCounter
    if options.tokenizer is not None:
        counter, source = LocalCounter(options.tokenizer, client, options.model), Path(options.tokenizer).name
    else:
        counter, source = ServerCounter(client, options.model), "server"
    return await calibrate(counter, block_size=block_size, source=source)


class _Runner:
    def __init__(
        self,
        prepared: PreparedTrace,
        options: ReplayOptions,
        client: Client,
        writer: RecordWriter,
        space: TokenSpace,
        run_id: str,
        start_ns: int,
        on_record: OnRecord | None,
        clock: DispatchClock,
    ) -> None:
        self.prepared = prepared
        self.trace = trace = prepared.trace
        self.played: set[int] = set()
        self.off_loop = OffLoop()
        """Sessions this run has drawn (a shared `PreparedTrace` may hold others, from earlier runs)."""
        self.options = options
        self.client = client
        self.writer = writer
        self.run_id = run_id
        self.start_ns = start_ns
        self.on_record = on_record
        self.blocks = BlockTokens(options.seed, trace.block_size, space)
        self.session_scope = trace.hash_id_scope == "session"
        shard_index, shard_count = options.shard
        # Positions in the shared order, not session indices, are dealt round-robin to the shards, so every
        # worker of a `--workers` run sees the same stream and `play` (= position) is unique across them.
        self.order = itertools.islice(
            enumerate(session_order(len(trace.sessions), options.session_order, options.seed)),
            shard_index,
            None,
            shard_count,
        )
        if trace.request_count == 0:
            self.tree_limit: int | None = 0
        elif options.sessions is not None:
            self.tree_limit = options.sessions
        elif options.duration_s is None:
            self.tree_limit = len(trace.sessions)
        else:
            self.tree_limit = None
        if self.tree_limit is not None:
            # This shard's share of the positions below the global limit.
            self.tree_limit = max(0, -(-(self.tree_limit - shard_index) // shard_count))
        self.lanes = range(shard_index, options.concurrency, shard_count)
        self.loop_lag_s: list[float] = []
        self.extra_body = options.extra_body
        self.stream_options: Mapping[str, object] | None = STREAM_OPTIONS["continuous"]
        self.renderer: ChatRenderer | None = None
        self.on_sent: OnSent | None = None
        self.on_profiling: OnSent | None = None
        self.path = CHAT_PATH if options.api == "chat" else COMPLETIONS_PATH
        self.delay_scale = options.delay_scale / (options.speedup if options.mode == "trace" else 1.0)
        self._stop = asyncio.Event()
        # The load-time cap already cut the gaps; the runtime one acts on the live schedule (§4c).
        runtime_tree_cap = options.tree_idle_cap_s if options.tree_idle_cap_mode == "runtime" else None
        self.clock = clock
        self.idle = IdleCaps(options.system_idle_cap_s, runtime_tree_cap, clock)
        self._hard_stopped = False
        self._cancel_message = f"cancelled after the {options.grace_s:g} s grace period"
        self._in_flight: set[asyncio.Timeout] = set()
        self.requests = 0
        self.errors = 0
        self.warmup_requests = 0
        self.pressure_left = 0
        """agentx mode: cache-pressure requests still to send before profiling starts."""
        self.pressure_in_flight = 0
        self.profiling_started = asyncio.Event()
        self.profiling_start_ns = 0
        self.tstar: list[dict[str, Any]] = []
        self.profiling_requests = 0
        self.profiling_errors = 0
        self.skipped_context_overflow = 0
        self.cancel_reason: str | None = None
        self.passes: dict[int, int] = {}
        """Per session index: plays so far (the marker's recycle pass)."""
        self.marker_tokens = MARKER_WORDS if options.api == "chat" else MARKER_TOKENS
        self.cancelled = 0
        self.warmup_expected_s = 0.0
        self.notices: list[str] = []
        self.fell_behind = False
        self.skipped = 0
        self.trees_started = 0
        self.trees_finished = 0

    # -- run control

    def stop(self) -> None:
        """No new tree or request starts from now on; in-flight requests get the grace period."""
        self._stop.set()
        self.idle.wake_all()

    def hard_stop(self, why: str | None = None) -> None:
        """Cancel every in-flight request: the grace period is over, or `why` it was cut short (said in records)."""
        if not self._hard_stopped and why is not None:
            self._cancel_message = f"cancelled: {why}"
        self._hard_stopped = True
        now = asyncio.get_running_loop().time()
        for timeout in self._in_flight:
            timeout.reschedule(now)

    async def run(self) -> None:
        failure: WarmupFailed | None = None
        async with asyncio.TaskGroup() as services:
            background = [
                services.create_task(self._tick()),
                services.create_task(self._stopper()),
                services.create_task(self._watch_loop()),
            ]
            if self.options.quiet_gc:
                background.append(services.create_task(collect_on_clock(self.clock)))
            try:
                firsts: dict[int, Play] = {}
                if self.options.mode == "agentx":
                    firsts = self._first_plays()
                    if self.options.quiet_gc:
                        freeze_new()  # the lanes' first plans: built once, walked by no collection
                    await self._warmup(list(firsts.values()))
                    primed_ns = time.perf_counter_ns()
                    for play in firsts.values():
                        play.start_ns = primed_ns
                    self.pressure_left = self.options.warmup_requests_per_lane * len(self.lanes)
                if self.pressure_left <= 0:
                    self._start_profiling()
                if self.options.mode in ("trace", "rate"):
                    await self._arrivals()
                else:
                    async with asyncio.TaskGroup() as lanes:
                        for lane in self.lanes:
                            lanes.create_task(self._lane(lane, firsts.get(lane)))
            except WarmupFailed as exc:
                failure = exc  # raised out of the group below, as itself rather than inside an ExceptionGroup
            finally:
                for task in background:
                    task.cancel()
                self.idle.close()
                self.off_loop.close()
        if failure is not None:
            raise failure

    # -- the agentx start: t*, snapshot, warmup (docs/agentx.md §4d)

    def _first_plays(self) -> dict[int, Play]:
        """Each lane's first tree, resumed at the lane's t*; a session with nothing to send from its t* is
        passed over for the next one (at most concurrency + 2 × sessions draws in all, as the reference)."""
        firsts: dict[int, Play] = {}
        attempts = self.options.concurrency + 2 * len(self.trace.sessions)
        for lane in self.lanes:
            while attempts > 0 and (drawn := self._next_tree()) is not None:
                attempts -= 1
                position, index = drawn
                prepared = self._prepared(index)
                at = t_star(self.options.seed, prepared.plan.session_id, lane, prepared.plan, self.options.tstar_window)
                state = snapshot(prepared.plan, at)
                if not state.sendable:
                    continue
                self.trees_started += 1
                firsts[lane] = self._play(prepared, lane, position, self._marker(index, lane), state)
                self.tstar.append(_describe_snapshot(lane, prepared, state))
                break
        return firsts

    async def _warmup(self, plays: list[Play]) -> None:
        """Send every first tree's primers (the turn before each live agent's t*) and wait for all of them.

        Spread: a primer with lead `t* − t` goes out `max_lead − lead` after the warmup starts, so that every
        lane's t* falls at the profiling start. A failed root primer stops the run (`WarmupFailed`).
        """
        primers = [
            (play, index, lead) for play in plays if play.snapshot for index, lead in play.snapshot.primers.items()
        ]
        if not primers:
            return
        cap = self.options.tree_idle_cap_s
        if cap is not None:
            primers = [(play, index, min(lead, cap)) for play, index, lead in primers]
        max_lead = max(lead for _, _, lead in primers)
        if self.options.warmup == "spread":
            self.warmup_expected_s = expected_warmup_s(
                [(max_lead - lead) * self.delay_scale for _, _, lead in primers], self.options.system_idle_cap_s
            )
            if self.warmup_expected_s > WARMUP_NOTICE_S:
                cap = self.options.system_idle_cap_s
                self._notice(
                    f"the warmup will take about {_duration(self.warmup_expected_s)}: {len(primers)} primers spread "
                    f"over leads of up to {_duration(max_lead * self.delay_scale)} before t*"
                    + (" (--system-idle-cap is off)" if cap is None else f", idle gaps capped at {cap:g} s")
                    + "; profiling starts when it ends"
                )
        start_ns = time.perf_counter_ns()
        failures: list[RequestRecord] = []

        async def prime(play: Play, index: int, lead: float) -> None:
            step = play.prepared.plan.steps[index]
            sent_tokens, body = self._build(play, step, phase="warmup")
            offset_s = (max_lead - lead) * self.delay_scale if self.options.warmup == "spread" else 0.0
            stopped, due_ns = await self.idle.wait(play, start_ns + int(offset_s * 1e9), self._stop)
            if stopped:
                return
            record = await self._send(play, step, due_ns, sent_tokens, body, phase="warmup")
            if record.status == "error" and step.depth == 0 and not failures and not self._stop.is_set():
                # The first failed root primer ends the run at once, in-flight primers cancelled (reference:
                # `credit/callback_handler.py`, `_handle_warmup_failure`).
                failures.append(record)
                self.stop()
                self.hard_stop("a root agent's warmup primer failed")

        async with asyncio.TaskGroup() as group:
            for play, index, lead in primers:
                group.create_task(prime(play, index, lead))
        if failures:
            first = failures[0]
            raise WarmupFailed(
                f"the warmup primer of session {first.session_id!r} (turn {first.turn}) failed with "
                f"{first.error_kind}: {first.error_message}; the run stopped before profiling, as AgentX does, and "
                "cancelled the other primers in flight"
            )

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        _log.warning(message)

    async def _sleep_until(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (perf_counter) unless the run stops first; True if it stopped."""
        remaining_s = (due_ns - time.perf_counter_ns()) / 1e9
        if remaining_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self._stop.wait()
        return self._stop.is_set()

    def _prepared(self, index: int) -> PreparedSession:
        self.played.add(index)
        return self.prepared.prepared(index)

    async def _prepared_off_loop(self, index: int) -> PreparedSession:
        """`_prepared`, a large session not planned yet planned off the loop (agentx.replayer.offloop)."""
        self.played.add(index)
        cached = self.prepared.cached(index)
        if cached is not None:
            return cached
        if self.trace.sessions[index].request_count < OFF_LOOP_REQUESTS:
            return self.prepared.prepared(index)
        prepared = await self.off_loop.run("plan", self.prepared.prepared, index)
        if self.options.quiet_gc:
            freeze_new()
        return prepared

    async def _build_off_loop(self, tree: Play, step: Step, phase: Phase) -> tuple[int, bytes]:
        """`_build`, a large completions prompt built off the loop (agentx.replayer.offloop; a chat body
        advances its play's conversation, which stays on the loop)."""
        if self.renderer is not None or step.request.in_tokens < OFF_LOOP_TOKENS:
            return self._build(tree, step, phase)
        return await self.off_loop.run("body", self._build, tree, step, phase)

    def _marker(self, index: int, lane: int) -> str | None:
        """The cache-bust marker of the next play of session `index` on `lane` (None: no cache-bust)."""
        if self.options.mode != "agentx" or self.options.cache_bust == "off":
            return None
        recycle_pass = self.passes[index] = self.passes.get(index, -1) + 1
        key = self.options.benchmark_id or self.run_id
        return marker_hex(key, recycle_pass, lane, self.trace.sessions[index].session_id)

    def _play(
        self, prepared: PreparedSession, lane: int, position: int, marker: str | None, state: Snapshot | None = None
    ) -> Play:
        return Play(
            prepared,
            lane,
            position,
            time.perf_counter_ns(),
            self.options.affinity_headers,
            snapshot=state,
            marker=marker,
        )

    async def _watch_loop(self) -> None:
        """Sample how late a timer fires: the event loop's own lag, which every timestamp inherits."""
        loop = asyncio.get_running_loop()
        samples = self.loop_lag_s
        while True:
            due = loop.time() + LOOP_LAG_TICK_S
            await asyncio.sleep(LOOP_LAG_TICK_S)
            samples.append(max(0.0, loop.time() - due))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.clock.until_quiet(QUIET_SPAN_NS, FLUSH_EVERY_S)
            self.writer.flush()

    async def _stopper(self) -> None:
        """End the run `duration_s` after the profiling start (the warmup is not counted, as in the reference),
        or when it is stopped; in-flight requests then get `grace_s`, pending timers none."""
        duration = self.options.duration_s
        if duration is None:
            await self._stop.wait()
        else:
            await self._wait_for_profiling()
            if not self._stop.is_set():
                end_ns = self.profiling_start_ns + int(duration * 1e9)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9)):
                        await self._stop.wait()
        self.stop()
        await asyncio.sleep(self.options.grace_s)
        self.hard_stop()

    # -- lanes and trees

    def _next_tree(self) -> tuple[int, int] | None:
        """(play = position in the shared order, session index), or None when no tree may start."""
        if self._stop.is_set():
            return None
        if self.tree_limit is not None and self.trees_started >= self.tree_limit:
            return None
        return next(self.order, None)

    async def _lane(self, lane: int, first: Play | None = None) -> None:
        ramp_s = self.options.ramp_s * lane / self.options.concurrency
        if ramp_s > 0 and await self._sleep_until(time.perf_counter_ns() + int(ramp_s * 1e9)):
            return
        if first is not None:
            await self._run_play(first)
        while (drawn := self._next_tree()) is not None:
            position, index = drawn
            self.trees_started += 1
            marker = self._marker(index, lane)  # drawn in draw order, whichever plan is ready first
            prepared = await self._prepared_off_loop(index)
            play = self._play(prepared, lane, position, marker)
            await self._prebuild(play)
            await self._run_play(play)

    async def _prebuild(self, tree: Play) -> None:
        """Build the bodies of a new tree's turns due at its start before its clock starts: they go out at once,
        and a 100k-token prompt takes milliseconds to build, which would otherwise be dispatch lag."""
        phase: Phase = "profiling" if self.profiling_started.is_set() else "warmup"
        steps = tree.prepared.plan.steps
        for index in tree.prepared.plan.roots:
            if steps[index].delay_s == 0 and not self._stop.is_set():
                tree.prebuilt[index] = (phase, *await self._build_off_loop(tree, steps[index], phase))

    async def _arrivals(self) -> None:
        """Open loop: start each tree at its arrival time, whatever is still in flight (no lanes)."""
        options = self.options
        shard_index, shard_count = options.shard
        if options.mode == "trace":
            schedule: Iterator[tuple[float, int]] = iter(trace_arrivals(self.trace, options.speedup))
        else:
            assert options.rate is not None
            order = session_order(len(self.trace.sessions), options.session_order, options.seed)
            schedule = zip(rate_arrivals(options.rate, options.burstiness, options.seed), order, strict=False)
        # The schedule starts one lead from now, so that the first trees' bodies are built before they are due too.
        origin_ns = time.perf_counter_ns() + ARRIVAL_LEAD_NS
        async with asyncio.TaskGroup() as trees:
            for position, (offset_s, index) in itertools.islice(enumerate(schedule), shard_index, None, shard_count):
                if self.tree_limit is not None and self.trees_started >= self.tree_limit:
                    break
                due_ns = origin_ns + int(offset_s * 1e9)
                # Wake a little early: the tree's first body is built before its due time, not after.
                if await self._sleep_until(due_ns - ARRIVAL_LEAD_NS):
                    break
                self.trees_started += 1
                play = self._play(self._prepared(index), -1, position, self._marker(index, -1))
                play.start_ns = due_ns
                trees.create_task(self._run_play(play, started=True))

    async def _run_play(self, tree: Play, *, started: bool = False) -> None:
        if tree.snapshot is None and not started:
            tree.start_ns = time.perf_counter_ns()
        async with asyncio.TaskGroup() as steps:
            for step in tree.prepared.plan.steps:
                steps.create_task(self._step(tree, step))
        self.trees_finished += 1
        await asyncio.sleep(0)  # a tree without steps must not starve the loop

    async def _step(self, tree: Play, step: Step) -> None:
        state = tree.snapshot
        try:
            if state is not None and step.index in state.not_sent:
                tree.completed_ns[step.index] = tree.start_ns  # happened before t*: settled, never sent
                return
            # Build the body while the anchor is in flight (it needs nothing from the server), so a
            # step due right at its anchor's completion does not pay for it then; waiting for the
            # anchor's dispatch keeps at most ~2 bodies per agent alive.
            if step.anchor is not None:
                await tree.sent[step.anchor].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            phase: Phase = "profiling" if self.profiling_started.is_set() else "warmup"
            prebuilt = tree.prebuilt.pop(step.index, None)
            if prebuilt is not None and prebuilt[0] == phase:
                _, sent_tokens, body = prebuilt
            else:
                sent_tokens, body = await self._build_off_loop(tree, step, phase)
            for dependency in step.depends_on:
                await tree.done[dependency].wait()
            if self._stop.is_set():
                self.skipped += 1
                return
            if self._ended(tree, step):
                return
            if not self.profiling_started.is_set():
                if self.pressure_left > 0:
                    await self._press(tree, step, sent_tokens, body, phase)
                    return
                await self._wait_for_profiling()
                if self._stop.is_set():
                    self.skipped += 1
                    return
                if phase != "profiling":
                    sent_tokens, body = await self._build_off_loop(tree, step, "profiling")
            first_live = state is not None and step.index in state.first_live
            if step.anchor is None:
                base_ns = tree.start_ns
            else:
                base_ns = (tree.sent_ns if step.from_anchor_send else tree.completed_ns)[step.anchor]
            if state is not None and first_live:
                offset_s = state.first_live[step.index] - self._first_offset_cut(state)
                due_ns = self.profiling_start_ns + int(offset_s * self.delay_scale * 1e9)
            else:
                due_ns = base_ns + int(step.delay_s * self.delay_scale * 1e9)
            # A join whose last subagent completed after the agent's previous turn goes out at once (§3a).
            due_ns = int(join_due(base_ns, due_ns - base_ns, [tree.completed_ns[joined] for joined in step.joins]))
            for barrier in step.barriers:
                due_ns = max(due_ns, tree.completed_ns[barrier])
            # After a cache-pressure stage, a turn due before the profiling start goes out at it (§4d).
            due_ns = max(due_ns, self.profiling_start_ns)
            if step.depth > 0 and step.turn == 0 and not first_live:
                # A subagent's first turn waits a plain sleep that no idle cap moves, as the reference's
                # (`timing/branch_orchestrator.py`, `_dispatch_first_turn_after_offset`) does (§3a).
                stopped = await self._sleep_until(due_ns)
            else:
                stopped, due_ns = await self.idle.wait(tree, due_ns, self._stop)
            if stopped:
                self.skipped += 1
                return
            if self._ended(tree, step):
                return
            await self._send(tree, step, due_ns, sent_tokens, body)
        finally:
            if not tree.completed_ns[step.index]:
                tree.completed_ns[step.index] = time.perf_counter_ns()
            tree.sent[step.index].set()
            tree.done[step.index].set()

    async def _press(self, tree: Play, step: Step, sent_tokens: int, body: bytes, phase: Phase) -> None:
        """A cache-pressure request: sent at once (idle delays removed), recorded as warmup (§4d)."""
        self.pressure_left -= 1
        if phase != "warmup":
            sent_tokens, body = self._build(tree, step, "warmup")
        self.pressure_in_flight += 1
        try:
            await self._send(tree, step, time.perf_counter_ns(), sent_tokens, body, phase="warmup")
        finally:
            self.pressure_in_flight -= 1
            if self.pressure_left <= 0 and self.pressure_in_flight == 0:
                self._start_profiling()

    async def _wait_for_profiling(self) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        started = asyncio.ensure_future(self.profiling_started.wait())
        try:
            await asyncio.wait({stop, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            started.cancel()

    def _start_profiling(self) -> None:
        if not self.profiling_started.is_set():
            self.profiling_start_ns = time.perf_counter_ns()
            self.profiling_started.set()
            if self.on_profiling is not None:
                self.on_profiling()

    def _first_offset_cut(self, state: Snapshot) -> float:
        """How much earlier a lane's first live turns all go (§4c, §4d; reference `agentic_replay.py`,
        `_dispatch_snapshot_for_profiling`): with a per-tree idle cap, so that the earliest is due at most the cap
        after the profiling start; with `warmup="burst"`, so that it is due at the start. Turns waiting on a
        join are not dispatched at an offset and take no part."""
        offsets = [offset for index, offset in state.first_live.items() if index not in state.waiting]
        if not offsets:
            return 0.0
        if self.options.warmup == "burst":
            return min(offsets)
        cap = self.options.tree_idle_cap_s
        return 0.0 if cap is None else max(0.0, min(offsets) - cap)

    def _ended(self, tree: Play, step: Step) -> bool:
        """Whether `step`'s session ended on a context overflow (its agent's, or the root's for the whole
        tree, docs/agentx.md §5); counts it as skipped for that reason."""
        if "" in tree.ended_agents or step.agent_id in tree.ended_agents:
            self.skipped_context_overflow += 1
            return True
        return False

    def _max_tokens(self, tree: Play, step: Step, phase: Phase) -> int:
        if phase == "warmup" and self.options.warmup_max_tokens is not None:
            return self.options.warmup_max_tokens
        out = step.request.out_tokens
        cap = self.options.max_output_tokens
        if cap is not None and tree.prepared.top_level[step.index]:
            out = min(out, cap)
        return max(1, out)

    def _build(self, tree: Play, step: Step, phase: Phase = "profiling") -> tuple[int, bytes]:
        """The request body of `step` and the prompt tokens it carries (as the server will count them)."""
        if self.renderer is not None:
            return self._build_chat(tree, step, self.renderer, phase)
        session_id = tree.prepared.plan.session_id
        marker_ids: list[int] = []
        if tree.marker is not None and self.options.cache_bust == "marker":
            marker_ids = filler(self.options.seed, f"marker:{tree.marker}", 0, MARKER_TOKENS, self.blocks.space)
        prompt = prompt_token_ids(
            step.request,
            tree.prepared.hash_ids[step.index],
            self.trace.block_size,
            self.blocks,
            session_id,
            f"{step.agent_id}:{step.turn}",
            session_id if self.session_scope else "",
            prefix_ids=marker_ids,
        )
        out = self._max_tokens(tree, step, phase)
        body = completions_body(
            tree.prepared.models[step.index],
            prompt,
            out,
            min_tokens=out,
            stream_options=self.stream_options,
            extra_body=self.extra_body,
            cache_salt=tree.marker if self.options.cache_bust == "salt" else None,
        )
        return len(prompt), body

    def _build_chat(self, tree: Play, step: Step, renderer: ChatRenderer, phase: Phase) -> tuple[int, bytes]:
        session_id = tree.prepared.plan.session_id
        request = step.request
        agent = step.agent_id
        conversation = tree.conversations.get(agent)
        if conversation is None:
            prefix_blocks = -(-tree.prepared.prefix_tokens.get(agent, 0) // self.trace.block_size)
            conversation = tree.conversations[agent] = Conversation(
                self.trace.block_size, prefix_blocks=prefix_blocks, filler_key=agent
            )
        cached = tree.chat_turns.get(agent)
        if cached is not None and cached[0] == step.turn:
            turn = cached[1]  # the same step's body again (its phase changed): the conversation has moved on
        else:
            # A play resumed at t* starts mid-conversation: first replay the turns before it, unsent (§2c).
            steps = tree.prepared.plan.steps
            for earlier in tree.prepared.agent_steps[agent][tree.conversation_turn.get(agent, -1) + 1 : step.turn]:
                self._advance(tree, conversation, steps[earlier])
            turn = self._advance(tree, conversation, step)
            tree.chat_turns[agent] = (step.turn, turn)
        marker = ("", 0)
        if tree.marker is not None and self.options.cache_bust == "marker":
            marker = renderer.marker_text(tree.marker)
        messages, sent_tokens = renderer.render(
            turn.segments,
            target_tokens=request.in_tokens,
            scope_key=session_id if self.session_scope else "",
            session_id=session_id,
            marker=marker,
        )
        body = chat_body(
            tree.prepared.models[step.index],
            messages,
            self._max_tokens(tree, step, phase),
            stream_options=self.stream_options,
            extra_body=self.extra_body,
            cache_salt=tree.marker if self.options.cache_bust == "salt" else None,
        )
        return sent_tokens, body

    def _advance(self, tree: Play, conversation: Conversation, step: Step) -> ChatTurn:
        turn = conversation.next_turn(
            tree.prepared.hash_ids[step.index], step.request.in_tokens, tree.last_out_tokens.get(step.agent_id)
        )
        tree.last_out_tokens[step.agent_id] = step.request.out_tokens
        tree.conversation_turn[step.agent_id] = step.turn
        return turn

    async def _send(
        self, tree: Play, step: Step, scheduled_ns: int, sent_tokens: int, body: bytes, phase: Phase = "profiling"
    ) -> RequestRecord:
        tree.sent_ns[step.index] = time.perf_counter_ns()
        tree.sent[step.index].set()
        request_id = str(uuid.uuid4())
        headers = {**tree.headers(step.agent_id), "X-Request-ID": request_id}
        if self.on_sent is not None:
            self.on_sent()
        sent_ns = time.perf_counter_ns()
        # Filled by the client as the response arrives, so a request cancelled after the grace period keeps its
        # status, headers time and chunks.
        exchange = Exchange()
        if self._hard_stopped:
            self._cancelled(exchange)
        else:
            self.idle.started(tree)
            try:
                async with asyncio.timeout(None) as timeout:
                    self._in_flight.add(timeout)
                    try:
                        await self.client.stream(self.path, body, extra_headers=headers, into=exchange)
                    finally:
                        self._in_flight.discard(timeout)
            except TimeoutError:
                self._cancelled(exchange)
            finally:
                self.idle.finished(tree)
        end_ns = exchange.end_ns or time.perf_counter_ns()
        tree.completed_ns[step.index] = end_ns
        if exchange.error_kind == "context_overflow" and phase == "profiling":
            tree.ended_agents.add(step.agent_id)  # the root's ends the whole tree (`_ended`)
        return self._record(tree, step, scheduled_ns, sent_ns, end_ns, sent_tokens, exchange, phase, request_id)

    def _cancelled(self, exchange: Exchange) -> None:
        """End `exchange` as cancelled after the grace period, keeping whatever of the response had arrived."""
        exchange.end_ns = time.perf_counter_ns()
        exchange.error_kind = "cancelled"
        exchange.timeout_kind = None
        exchange.error_message = self._cancel_message

    def _record(
        self,
        tree: Play,
        step: Step,
        scheduled_ns: int,
        sent_ns: int,
        end_ns: int,
        sent_tokens: int,
        exchange: Exchange,
        phase: Phase,
        request_id: str,
    ) -> RequestRecord:
        origin = self.start_ns
        request = step.request

        def offset(ns: int) -> int | None:
            return ns - origin if ns else None

        common: dict[str, Any] = {
            "run_id": self.run_id,
            "phase": phase,
            "lane": tree.lane,
            "play": tree.play,
            "session_id": tree.prepared.plan.session_id,
            "agent_id": step.agent_id,
            "depth": step.depth,
            "turn": step.turn,
            "model": tree.prepared.models[step.index],
            "correlation_id": tree.correlation_id(step.agent_id),
            "root_correlation_id": tree.root_correlation_id,
            "parent_correlation_id": tree.parent_correlation_id(step.agent_id),
            "request_id": request_id,
            "scheduled_ns": scheduled_ns - origin,
            "isl_recorded_tokens": request.in_tokens,
            "isl_sent_tokens": sent_tokens,
            "cache_bust_tokens": self.marker_tokens if tree.marker is not None else 0,
            "osl_recorded_tokens": request.out_tokens,
            "theoretical_hit_blocks": tree.prepared.hit_blocks[step.index],
            "theoretical_total_blocks": tree.prepared.total_blocks[step.index],
            "api_time_recorded_s": request.api_time,
            "ttft_recorded_s": request.ttft,
        }
        if exchange.error_kind == "cancelled":
            self.cancelled += 1
        record = RequestRecord(
            **common,
            queued_ns=offset(exchange.queued_ns),
            sent_ns=(exchange.sent_ns or sent_ns) - origin,
            response_ns=offset(exchange.headers_ns),
            first_token_ns=offset(exchange.first_token_ns),
            last_token_ns=offset(exchange.last_token_ns),
            end_ns=end_ns - origin,
            chunk_times_ns=[ns - origin for ns in exchange.chunk_ns],
            chunk_tokens=list(exchange.chunk_tokens),
            isl_server_tokens=exchange.prompt_tokens,
            osl_server_tokens=exchange.completion_tokens,
            osl_streamed_tokens=sum(exchange.chunk_tokens),
            tokens_estimated=exchange.tokens_estimated,
            cached_tokens=exchange.cached_tokens,
            connection_retries=exchange.connection_retries,
            status="ok" if exchange.ok else "error",
            error_kind=exchange.error_kind,
            timeout_kind=exchange.timeout_kind,
            error_message=exchange.error_message,
            http_status=exchange.status or None,
        )
        self.requests += 1
        if record.status == "error":
            self.errors += 1
        if phase == "warmup":
            self.warmup_requests += 1
        else:
            self._judge_failures(record)
            if record.dispatch_lag_s > LATE_NOTICE_S and not self.fell_behind:
                self.fell_behind = True
                self._notice(
                    f"the run fell behind its schedule: session {record.session_id!r} agent {record.agent_id!r} "
                    f"turn {record.turn} went out {record.dispatch_lag_s:.3f} s after it was due (the client, not "
                    "the server, set the pace; see the summary's dispatch lag)"
                )
        self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def _judge_failures(self, record: RequestRecord) -> None:
        """Cancel the run once the profiling error ratio crosses `failed_request_threshold` (docs/agentx.md §5)."""
        self.profiling_requests += 1
        if record.status == "error" and record.error_kind not in ("cancelled", "context_overflow"):
            self.profiling_errors += 1
        threshold = self.options.failed_request_threshold
        if (
            threshold is not None
            and self.cancel_reason is None
            and self.profiling_requests >= max(FAILURE_THRESHOLD_MIN_REQUESTS, self.options.concurrency)
            and self.profiling_errors > threshold * self.profiling_requests
        ):
            self.cancel_reason = "failure_threshold"
            self.stop()
