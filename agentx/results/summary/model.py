"""The summary of a run, as structs: what `summarize` (agentx.results.summary.summarize) computes and run.json holds.

Every figure that needs a population or an optional column is `None` when the run has none (see the fields).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from agentx.results.summary.checks.acceptance import Acceptance
from agentx.results.summary.checks.audit import Audit
from agentx.results.summary.checks.validity import Validity
from agentx.results.summary.energy import Energy
from agentx.results.summary.explain.cache_misses import CacheMisses
from agentx.results.summary.explain.critical_path import CriticalPath
from agentx.results.summary.goodput import Goodput
from agentx.results.summary.server_telemetry import ServerTelemetry
from agentx.results.summary.shards import Shards
from agentx.results.summary.stats import PERCENTILES, SHOWN_PERCENTILES, FloatArray, Stats, percentile_key
from agentx.results.summary.tasks import TaskCosts


class Interactivity(msgspec.Struct, kw_only=True):
    """Tokens/s per user: 1/TPOT at each TPOT statistic (so `p90` is 1/(p90 TPOT), the rate 90% of requests
    reached at least), std of per-request 1/TPOT."""

    mean: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    std: float
    more: dict[str, float] = {}
    """1/TPOT at the percentiles asked for beyond the fields (`--percentiles`), by `percentile_key`."""

    def at(self, p: float) -> float:
        """1/TPOT at its `p`-th percentile: a field's, else one in `more`; KeyError when it was not computed."""
        key = percentile_key(p)
        return float(getattr(self, key)) if p in PERCENTILES else self.more[key]

    @classmethod
    def of(cls, seconds: Stats | None, values: FloatArray) -> Interactivity | None:
        """The interactivity of a seconds-per-token statistic (`values`: its per-request population, > 0)."""
        if seconds is None:
            return None
        return cls(
            mean=1.0 / seconds.mean,
            p50=1.0 / seconds.p50,
            p75=1.0 / seconds.p75,
            p90=1.0 / seconds.p90,
            p95=1.0 / seconds.p95,
            p99=1.0 / seconds.p99,
            std=float(np.std(1.0 / values)),
            more={key: 1.0 / value for key, value in seconds.more.items()},
        )


class Counts(msgspec.Struct, kw_only=True):
    rows: int
    """Every record in the table, warmup included."""
    kept: int
    """Profiling requests without error: the population of the latency and throughput metrics."""
    profiling: int
    errors: int
    """Profiling requests that failed, cancellations excluded."""
    errors_by_kind: dict[str, int]
    errors_by_status: dict[str, int] = {}
    """The `http` errors by their status ("503": 46), in code order."""
    cancelled: int
    """Profiling requests cancelled (run end or Ctrl-C); not counted in `errors`."""
    warmup_excluded: int
    """Warmup-phase records (any status), left out of every metric."""
    server_notices: dict[str, int] = {}
    """Profiling requests whose answer the server got wrong, by kind (`output_over_max_tokens`, `prompt_count_differs`,
    `not_event_stream`, `no_done`, `compressed`; agentx.replayer.schedule.sanity); a request may count under several."""

    def errors_text(self) -> str:
        """The errors by kind, the `http` ones with their statuses: "http 46 (HTTP 503 ×40, 500 ×6), timeout 2"; ""
        when none."""
        statuses = ", ".join(f"{code} ×{count:,}" for code, count in self.errors_by_status.items())
        return ", ".join(
            f"{kind} {count:,}" + (f" (HTTP {statuses})" if kind == "http" and statuses else "")
            for kind, count in self.errors_by_kind.items()
        )


class Latency(msgspec.Struct, kw_only=True):
    """Latency statistics under vLLM's names (`vllm bench serve`; docs/replay.md): a run.json written before
    they were used is read with its keys renamed (agentx.results.folders.run_file)."""

    ttft_s: Stats | None
    tpot_s: Stats | None
    """Per request: (E2EL − TTFT) / (OSL − 1), time per output token after the first."""
    itl_s: Stats | None
    """Gaps between consecutive content chunks of a request (zero gaps kept: chunks read together)."""
    e2el_s: Stats | None
    interactivity_tps: Interactivity | None
    chunk_tokens: Stats | None


class Throughput(msgspec.Struct, kw_only=True):
    duration_s: float
    """Max end − min sent over the kept records."""
    input_tokens: int
    output_tokens: int
    input_tps: float
    output_tps: float
    total_tps: float
    requests_per_s: float
    num_gpus: int | None = None
    input_tps_per_gpu: float | None = None
    output_tps_per_gpu: float | None = None
    total_tps_per_gpu: float | None = None


class Cache(msgspec.Struct, kw_only=True):
    usage_hit_rate: float | None
    """Σ cached tokens / Σ ISL over the kept requests whose usage reported cached tokens."""
    usage_cached_tokens: int
    usage_reported_requests: int
    server_hit_rate: float | None
    """Δ`prefix_cache_hits` / Δ`prefix_cache_queries` of the server (vLLM), when metrics were given."""
    theoretical_hit_rate: float | None
    """Σ hit blocks / Σ blocks of the trace's infinite cache, over kept requests that carry them: the reference's
    figure, fixed per turn whatever the run sent (a recycled play, a play resumed at t*)."""
    replayed_hit_rate: float | None = None
    """Σ replayed hit blocks / Σ blocks: an infinite cache of the prompts the run sent, in send order
    (agentx.replayer.plan.sent_blocks), the bound on what a server's prefix cache can hit in this run; None for records
    before format 1.10."""


class DispatchLag(msgspec.Struct, kw_only=True):
    """How late the client sent requests (sent − scheduled) over the profiling phase: the client's fidelity."""

    p50_s: float
    p99_s: float
    max_s: float


class LoopLag(msgspec.Struct, kw_only=True):
    """How late the client's event loop woke a 100 ms timer (`RunResult.loop_lag_s`): its fidelity."""

    samples: int
    p50_s: float
    p99_s: float
    max_s: float


class Slowdown(msgspec.Struct, kw_only=True):
    """The replay's server times over the trace's recorded ones (> 1: slower than recorded); None when unknown."""

    requests: Stats | None = None
    """Per kept request with a recorded api_time > 0: (end − sent) / `api_time_recorded_s`."""
    sessions: Stats | None = None
    """Per (play, session): Σ observed / Σ recorded over those requests."""
    plays: Stats | None = None
    """Per play (one session tree): Σ observed / Σ recorded over those requests."""
    ttft: Stats | None = None
    """Per kept request with a recorded TTFT > 0: `ttft_s` / `ttft_recorded_s`."""


class PlayRollup(msgspec.Struct, kw_only=True):
    """One play (one replay of a session tree); times over all its records, warmup and errors included."""

    play: int
    lane: int
    root_session_id: str
    sessions: int
    requests: int
    errors: int
    makespan_s: float
    """Last end − first sent of the play's requests."""
    slowdown: float | None = None
    """Σ (end − sent) / Σ recorded api_time over the play's kept requests with a recorded api_time > 0."""


class Rollups(msgspec.Struct, kw_only=True):
    plays: list[PlayRollup]
    play_makespan_s: Stats | None
    session_makespan_s: Stats | None
    """Per (play, session): last end − first sent of that session's requests."""


class QpsWindows(msgspec.Struct, kw_only=True):
    """Completed requests per second over back-to-back 1 s windows from the first completion (InferenceX's QPS):
    `p90` is a busy second. Without one full window only `mean` (requests over the completions' span) is set."""

    window_s: float
    samples: int
    mean: float
    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p95: float | None = None
    std: float | None = None


class InferencexMetrics(msgspec.Struct, kw_only=True):
    """What InferenceX's AgentX aggregation adds beside TTFT, TPOT and E2EL (agentx.results.summary.inferencex)."""

    full_response_tpot_s: Stats | None
    """Per request: (end of the response − first content chunk) / (OSL − 1), the trailing usage chunk and the
    stream's end included (the harness's full-response ITL); OSL ≥ 2."""
    full_response_interactivity_tps: Interactivity | None
    """1 / each full-response TPOT statistic: the interactivity InferenceX's dashboard shows for AgentX."""
    e2el_per_osl_s: Stats | None
    """Per request: E2EL / OSL, time to first token included; OSL ≥ 1."""
    e2e_norm_interactivity_tps: Interactivity | None
    """1 / each E2EL/OSL statistic (`p90` = 1 / p90(E2EL/OSL))."""
    qps: QpsWindows | None


class Summary(msgspec.Struct, kw_only=True):
    run_id: str | None
    counts: Counts
    latency: Latency
    throughput: Throughput | None
    cache: Cache
    dispatch_lag: DispatchLag | None
    loop_lag: LoopLag | None = None
    """Event-loop lag samples of the run, when the caller passed them (`summarize(..., loop_lag_s=...)`)."""
    percentiles: list[float] = msgspec.field(default_factory=lambda: list(SHOWN_PERCENTILES))
    """The percentiles the summary shows (`--percentiles`); each latency's `Stats` has them."""
    rollups: Rollups
    slowdown: Slowdown = msgspec.field(default_factory=Slowdown)
    stream_usage: str | None = None
    """What the run's request bodies asked for in `stream_options` ("continuous", "final", "none"), when known."""
    calibration: dict[str, Any] | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start, when known."""
    validity: Validity | None = None
    """Whether the run is a valid AgentX submission, and why not (agentx.results.summary.checks.validity), when
    known."""
    goodput: Goodput | None = None
    """The requests meeting every `--slo` target, per second and as a share (goodput.py); None without."""
    acceptance: Acceptance | None = None
    """Forced and realized speculative acceptance (acceptance.py), when forced or seen on the server."""
    server_telemetry: ServerTelemetry | None = None
    """The server's `/metrics` over the profiling phase (server_telemetry.py), when it was scraped."""
    shards: Shards | None = None
    """A `--ray` run's shards, nodes, losses and clock bounds (agentx.results.summary.shards); None otherwise."""
    inferencex: InferencexMetrics | None = None
    """The metrics InferenceX's aggregation adds (agentx.results.summary.inferencex), None for an empty run."""
    rules: str | None = None
    """The AgentX rule set the run played (agentx.replayer.options.rules), when its options say."""
    audit: Audit | None = None
    """The plausibility audit (agentx.results.summary.checks.audit): what in the run cannot be true; None before it
    ran."""
    energy: Energy | None = None
    """The GPUs' energy over the run and per token and task (agentx.results.summary.energy), when `--gpu-metrics`
    scraped them."""
    tasks: TaskCosts | None = None
    """What one agent task (a root session's play, subagents included) costs (agentx.results.summary.tasks)."""
    critical_path: CriticalPath | None = None
    """Where each play's time went along its critical path (agentx.results.summary.explain.critical_path); None for
    records before format 1.11."""
    cache_misses: CacheMisses | None = None
    """Why the prefix cache missed: the uncached prompt tokens by cause (agentx.results.summary.explain.cache_misses);
    None for records before format 1.11 or when no request reported cached tokens."""
