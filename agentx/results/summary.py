"""The summary of a replay run, computed from its records table with the InferenceX conventions.

Records kept for latency and throughput: `phase = "profiling"` and `status = "ok"` (a missing phase column
counts as profiling, as in InferenceX). Latency statistics drop non-finite and ≤ 0 values; percentiles use
linear interpolation at `k = (n − 1)·p/100` (`percentile`); std is the population standard deviation.
Interactivity is 1/ITL *per statistic*, so `p90` interactivity = 1/(p90 ITL), the slow tail; its std is the
pstdev of per-request 1/ITL. Duration = max `end_ns` − min `sent_ns` over the kept rows; throughput divides
ΣISL, ΣOSL and Σ(ISL + OSL) by it, with ISL = server prompt tokens else sent and OSL = server completion
tokens else streamed (the OSL `itl_s` uses).

Slowdown compares the replay with the trace: a request's observed server time is `end_ns − sent_ns`, its
recorded one `api_time_recorded_s`; per request the ratio, per (play, session) and per play Σ observed /
Σ recorded over the kept requests with a recorded time > 0. TTFT slowdown is `ttft_s / ttft_recorded_s` per
kept request where both are known and > 0.

Everything is read from the table's columns, so a file written by an older or newer minor version works:
optional columns that are absent yield `None` for the quantities that need them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from agentx.replayer.server_metrics import (
    LLAMACPP_CACHED_TOKENS,
    LLAMACPP_PROMPT_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    ServerMetrics,
)
from agentx.results.acceptance import Acceptance
from agentx.results.validity import Validity

FloatArray = npt.NDArray[np.float64]

PERCENTILES: Final = (50.0, 75.0, 90.0, 95.0, 99.0)
"""InferenceX reports p50…p95; p99 is ours."""


# ---------------------------------------------------------------------------------------------
# result structs


class Stats(msgspec.Struct, kw_only=True):
    """One quantity over a population; `None` replaces a `Stats` whose population is empty."""

    count: int
    mean: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    std: float
    """Population standard deviation (`statistics.pstdev`)."""
    min: float
    max: float


class Interactivity(msgspec.Struct, kw_only=True):
    """Tokens/s per user: 1/ITL at each ITL statistic (so `p90` is 1/(p90 ITL)), std of per-request 1/ITL."""

    mean: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    std: float


class Counts(msgspec.Struct, kw_only=True):
    rows: int
    """Every record in the table, warmup included."""
    kept: int
    """Profiling requests without error: the population of the latency and throughput metrics."""
    profiling: int
    errors: int
    """Profiling requests that failed, cancellations excluded."""
    errors_by_kind: dict[str, int]
    cancelled: int
    """Profiling requests cancelled (run end or Ctrl-C); not counted in `errors`."""
    warmup_excluded: int
    """Warmup-phase records (any status), left out of every metric."""


class Latency(msgspec.Struct, kw_only=True):
    ttft_s: Stats | None
    e2e_s: Stats | None
    itl_s: Stats | None
    interactivity_tps: Interactivity | None
    chunk_itl_s: Stats | None
    """Gaps between consecutive content chunks of a request (zero gaps kept: chunks read together)."""
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
    """Σ hit blocks / Σ blocks of the trace's infinite causal cache, over kept requests that carry them."""


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


class Summary(msgspec.Struct, kw_only=True):
    run_id: str | None
    counts: Counts
    latency: Latency
    throughput: Throughput | None
    cache: Cache
    dispatch_lag: DispatchLag | None
    loop_lag: LoopLag | None = None
    """Event-loop lag samples of the run, when the caller passed them (`summarize(..., loop_lag_s=...)`)."""
    rollups: Rollups
    slowdown: Slowdown = msgspec.field(default_factory=Slowdown)
    stream_usage: str | None = None
    """What the run's request bodies asked for in `stream_options` ("continuous", "final", "none"), when known."""
    calibration: dict[str, Any] | None = None
    """`--api chat`: the words, separator and chat-template overhead calibrated at the start, when known."""
    validity: Validity | None = None
    """Whether the run is a valid AgentX submission, and why not (agentx.results.validity), when known."""
    acceptance: Acceptance | None = None
    """Forced and realized speculative acceptance (agentx.results.acceptance), when forced or seen on the server."""


# ---------------------------------------------------------------------------------------------
# statistics


def _percentiles_sorted(data: FloatArray, ps: Sequence[float]) -> list[float]:
    # InferenceX: k = (n−1)p/100, f = floor(k), v[f] + (k−f)(v[f+1] − v[f]); at the top f+1 is past the end.
    n = data.size
    result: list[float] = []
    for p in ps:
        k = (n - 1) * p / 100.0
        f = math.floor(k)
        c = min(f + 1, n - 1)
        result.append(float(data[f] + (k - f) * (data[c] - data[f])))
    return result


def percentile(values: Sequence[float] | FloatArray, p: float) -> float:
    """The `p`-th percentile (0 ≤ p ≤ 100) by linear interpolation, exactly as InferenceX computes it.

    Sort, `k = (n − 1)·p/100`, `f = ⌊k⌋`, value `v[f] + (k − f)(v[f+1] − v[f])`. Raises `ValueError` on an
    empty input or `p` outside [0, 100].
    """
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} outside [0, 100]")
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        raise ValueError("percentile of no values")
    return _percentiles_sorted(data, [p])[0]


def _stats(values: FloatArray) -> Stats | None:
    if values.size == 0:
        return None
    data = np.sort(values)
    p50, p75, p90, p95, p99 = _percentiles_sorted(data, PERCENTILES)
    return Stats(
        count=int(data.size),
        mean=float(data.mean()),
        p50=p50,
        p75=p75,
        p90=p90,
        p95=p95,
        p99=p99,
        std=float(data.std()),  # ddof=0: pstdev
        min=float(data[0]),
        max=float(data[-1]),
    )


def _positive(values: FloatArray) -> FloatArray:
    # InferenceX drops non-finite and non-positive latencies before every statistic.
    return values[np.isfinite(values) & (values > 0)]


def _interactivity(itl: Stats | None, itl_values: FloatArray) -> Interactivity | None:
    if itl is None:
        return None
    return Interactivity(
        mean=1.0 / itl.mean,
        p50=1.0 / itl.p50,
        p75=1.0 / itl.p75,
        p90=1.0 / itl.p90,
        p95=1.0 / itl.p95,
        p99=1.0 / itl.p99,
        std=float(np.std(1.0 / itl_values)),
    )


# ---------------------------------------------------------------------------------------------
# column access (tolerant of absent optional columns)


def _has(table: pa.Table, name: str) -> bool:
    return name in table.schema.names


def _floats(table: pa.Table, name: str) -> FloatArray:
    """The column as float64 with nulls as NaN; all NaN when absent."""
    if not _has(table, name):
        return np.full(table.num_rows, np.nan)
    column = pc.cast(table.column(name), pa.float64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def _ints_or(table: pa.Table, name: str, fallback: str) -> npt.NDArray[np.int64]:
    """Column `name`, its nulls (or the whole column, when absent) filled from column `fallback`."""
    base = table.column(fallback)
    column = pc.coalesce(table.column(name), base) if _has(table, name) else base
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _equals(table: pa.Table, name: str, value: str, *, missing: bool) -> npt.NDArray[np.bool_]:
    """Row mask: the string column equals `value` (null → False); all `missing` when the column is absent."""
    if not _has(table, name):
        return np.full(table.num_rows, missing, dtype=bool)
    mask = pc.fill_null(pc.equal(table.column(name), value), False)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def _strings(table: pa.Table, name: str, default: str | None) -> list[str | None]:
    if not _has(table, name):
        return [default] * table.num_rows
    return [default if value is None else str(value) for value in table.column(name).to_pylist()]


def _flat(table: pa.Table, name: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A list column flattened, and the row index of each value."""
    if not _has(table, name) or table.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    column = table.column(name)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.int64), np.asarray(parents, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# the summary


def summarize(
    records: pa.Table,
    *,
    num_gpus: int | None = None,
    server_metrics: ServerMetrics | None = None,
    loop_lag_s: Sequence[float] | None = None,
) -> Summary:
    """The summary of a run from its records table (`read_records`); an empty table gives zero counts.

    `loop_lag_s`: the run's event-loop lag samples (`RunResult.loop_lag_s`), summarized next to dispatch lag.
    """
    if num_gpus is not None and num_gpus < 1:
        raise ValueError(f"num_gpus must be ≥ 1, got {num_gpus}")
    # A missing phase counts as profiling (InferenceX), a missing status as ok.
    profiling = ~_equals(records, "phase", "warmup", missing=False)
    ok = _equals(records, "status", "ok", missing=True)
    kept_mask = profiling & ok

    errors_by_kind: dict[str, int] = {}
    cancelled = 0
    failed_rows = np.flatnonzero(profiling & ~ok)
    kinds = _strings(records.take(pa.array(failed_rows)), "error_kind", None) if failed_rows.size else []
    for kind in kinds:
        if kind == "cancelled":
            cancelled += 1
        else:
            errors_by_kind[kind or "unknown"] = errors_by_kind.get(kind or "unknown", 0) + 1
    kept = int(kept_mask.sum())
    counts = Counts(
        rows=records.num_rows,
        kept=kept,
        profiling=int(profiling.sum()),
        errors=sum(errors_by_kind.values()),
        errors_by_kind=dict(sorted(errors_by_kind.items())),
        cancelled=cancelled,
        warmup_excluded=int((~profiling).sum()),
    )
    table = records.filter(pa.array(kept_mask)) if records.num_rows else records

    itl_values = _positive(_floats(table, "itl_s"))
    itl = _stats(itl_values)
    chunk_gaps_s, chunk_tokens = _chunks(table)
    latency = Latency(
        ttft_s=_stats(_positive(_floats(table, "ttft_s"))),
        e2e_s=_stats(_positive(_floats(table, "e2e_s"))),
        itl_s=itl,
        interactivity_tps=_interactivity(itl, itl_values),
        chunk_itl_s=_stats(chunk_gaps_s),
        chunk_tokens=_stats(chunk_tokens),
    )
    return Summary(
        run_id=_run_id(records),
        counts=counts,
        latency=latency,
        throughput=_throughput(table, num_gpus),
        cache=_cache(table, server_metrics),
        dispatch_lag=_dispatch_lag(records.filter(pa.array(profiling)) if records.num_rows else records),
        loop_lag=_loop_lag(loop_lag_s),
        rollups=_rollups(records, kept_mask),
        slowdown=_slowdown(table),
    )


def _run_id(table: pa.Table) -> str | None:
    metadata = table.schema.metadata or {}
    if b"agentx.run_id" in metadata:
        return bytes(metadata[b"agentx.run_id"]).decode()
    if _has(table, "run_id") and table.num_rows:
        return str(table.column("run_id")[0].as_py())
    return None


def _chunks(table: pa.Table) -> tuple[FloatArray, FloatArray]:
    times_ns, parents = _flat(table, "chunk_times_ns")
    same_request = parents[1:] == parents[:-1]
    gaps_s = (np.diff(times_ns)[same_request] / 1e9).astype(np.float64)
    tokens, _ = _flat(table, "chunk_tokens")
    return gaps_s[np.isfinite(gaps_s)], tokens.astype(np.float64)


def _throughput(table: pa.Table, num_gpus: int | None) -> Throughput | None:
    if table.num_rows == 0:
        return None
    duration_s = (int(pc.max(table.column("end_ns")).as_py()) - int(pc.min(table.column("sent_ns")).as_py())) / 1e9
    if duration_s <= 0:
        return None
    isl = int(_ints_or(table, "isl_server_tokens", "isl_sent_tokens").sum())
    osl = int(_ints_or(table, "osl_server_tokens", "osl_streamed_tokens").sum())
    result = Throughput(
        duration_s=duration_s,
        input_tokens=isl,
        output_tokens=osl,
        input_tps=isl / duration_s,
        output_tps=osl / duration_s,
        total_tps=(isl + osl) / duration_s,
        requests_per_s=table.num_rows / duration_s,
    )
    if num_gpus is not None:
        result.num_gpus = num_gpus
        result.input_tps_per_gpu = result.input_tps / num_gpus
        result.output_tps_per_gpu = result.output_tps / num_gpus
        result.total_tps_per_gpu = result.total_tps / num_gpus
    return result


def _cache(table: pa.Table, server_metrics: ServerMetrics | None) -> Cache:
    cached = _floats(table, "cached_tokens")
    reported = np.isfinite(cached)
    isl = _ints_or(table, "isl_server_tokens", "isl_sent_tokens") if table.num_rows else np.zeros(0, np.int64)
    isl_reported = int(isl[reported].sum())
    cached_sum = int(cached[reported].sum())
    usage_rate = cached_sum / isl_reported if isl_reported > 0 else None

    server_rate: float | None = None
    if server_metrics is not None:
        hits, queries = server_metrics.delta(PREFIX_CACHE_HITS), server_metrics.delta(PREFIX_CACHE_QUERIES)
        if hits is None or queries is None:
            hits, computed = server_metrics.delta(LLAMACPP_CACHED_TOKENS), server_metrics.delta(LLAMACPP_PROMPT_TOKENS)
            queries = None if hits is None or computed is None else hits + computed
        if hits is not None and queries is not None and queries > 0:
            server_rate = hits / queries

    hit_blocks = _floats(table, "theoretical_hit_blocks")
    total_blocks = _floats(table, "theoretical_total_blocks")
    both = np.isfinite(hit_blocks) & np.isfinite(total_blocks)
    total = float(total_blocks[both].sum())
    theoretical = float(hit_blocks[both].sum()) / total if total > 0 else None
    return Cache(
        usage_hit_rate=usage_rate,
        usage_cached_tokens=cached_sum,
        usage_reported_requests=int(reported.sum()),
        server_hit_rate=server_rate,
        theoretical_hit_rate=theoretical,
    )


def _dispatch_lag(table: pa.Table) -> DispatchLag | None:
    # Every profiling request counts, failed ones too: the lag is the client's, not the server's.
    lag = _floats(table, "dispatch_lag_s")
    lag = np.sort(lag[np.isfinite(lag)])
    if lag.size == 0:
        return None
    p50, p99 = _percentiles_sorted(lag, (50.0, 99.0))
    return DispatchLag(p50_s=p50, p99_s=p99, max_s=float(lag[-1]))


def _loop_lag(samples: Sequence[float] | None) -> LoopLag | None:
    if samples is None:
        return None
    lag = np.asarray(samples, dtype=np.float64)
    lag = np.sort(lag[np.isfinite(lag)])
    if lag.size == 0:
        return None
    p50, p99 = _percentiles_sorted(lag, (50.0, 99.0))
    return LoopLag(samples=int(lag.size), p50_s=p50, p99_s=p99, max_s=float(lag[-1]))


def _observed_recorded(table: pa.Table) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """Per row: observed server time (end − sent, s), recorded api_time, and whether the pair counts."""
    if table.num_rows == 0 or not _has(table, "api_time_recorded_s"):
        return np.zeros(table.num_rows), np.zeros(table.num_rows), np.zeros(table.num_rows, dtype=bool)
    observed = (_floats(table, "end_ns") - _floats(table, "sent_ns")) / 1e9
    recorded = _floats(table, "api_time_recorded_s")
    usable = np.isfinite(observed) & np.isfinite(recorded) & (recorded > 0)
    return observed, recorded, usable


def _ratio_by_group(keys: list[Any], observed: FloatArray, recorded: FloatArray) -> FloatArray:
    sums: dict[Any, list[float]] = {}
    for key, obs, rec in zip(keys, observed.tolist(), recorded.tolist(), strict=True):
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += obs
        acc[1] += rec
    return np.array([obs / rec for obs, rec in sums.values()], dtype=np.float64)


def _slowdown(table: pa.Table) -> Slowdown:
    """Slowdown vs the trace over the kept rows (`table` is already filtered to them)."""
    observed, recorded, usable = _observed_recorded(table)
    result = Slowdown()
    if usable.any():
        rows = np.flatnonzero(usable)
        obs, rec = observed[rows], recorded[rows]
        result.requests = _stats(obs / rec)
        if _has(table, "play"):
            plays = [int(p) for p in np.asarray(table.column("play").to_numpy(zero_copy_only=False))[rows]]
            sessions = _strings(table, "session_id", "")
            result.plays = _stats(_ratio_by_group(plays, obs, rec))
            result.sessions = _stats(
                _ratio_by_group([(p, sessions[i]) for p, i in zip(plays, rows, strict=True)], obs, rec)
            )
    if _has(table, "ttft_recorded_s"):
        ttft, ttft_recorded = _floats(table, "ttft_s"), _floats(table, "ttft_recorded_s")
        both = np.isfinite(ttft) & (ttft > 0) & np.isfinite(ttft_recorded) & (ttft_recorded > 0)
        result.ttft = _stats(ttft[both] / ttft_recorded[both])
    return result


class _PlayAcc:
    """Running totals of one play while the rows stream by."""

    def __init__(self, lane: int, sent_ns: int, end_ns: int) -> None:
        self.lane = lane
        self.root_session_id = ""
        self.sessions: set[str] = set()
        self.requests = 0
        self.errors = 0
        self.first_sent_ns = sent_ns
        self.last_end_ns = end_ns
        self.observed_s = 0.0
        self.recorded_s = 0.0


def _rollups(table: pa.Table, kept: npt.NDArray[np.bool_]) -> Rollups:
    if table.num_rows == 0 or not _has(table, "play"):
        return Rollups(plays=[], play_makespan_s=None, session_makespan_s=None)
    # All the play's rows, warmup and errors included: the play's span is wall time the tree held its lane.
    n = table.num_rows
    rows = table.select([c for c in ("play", "lane", "session_id", "sent_ns", "end_ns") if _has(table, c)]).to_pydict()
    lanes = rows.get("lane", [0] * n)
    sessions = [s or "" for s in _strings(table, "session_id", "")]
    failed = ~_equals(table, "status", "ok", missing=True)
    depths = table.column("depth").to_pylist() if _has(table, "depth") else [0] * n
    observed, recorded, usable = _observed_recorded(table)
    usable = usable & kept
    plays: dict[int, _PlayAcc] = {}
    session_spans: dict[tuple[int, str], tuple[int, int]] = {}
    for i in range(n):
        play, sent, end, session = int(rows["play"][i]), int(rows["sent_ns"][i]), int(rows["end_ns"][i]), sessions[i]
        acc = plays.get(play)
        if acc is None:
            acc = plays[play] = _PlayAcc(int(lanes[i]), sent, end)
        acc.first_sent_ns, acc.last_end_ns = min(acc.first_sent_ns, sent), max(acc.last_end_ns, end)
        acc.sessions.add(session)
        acc.requests += 1
        acc.errors += int(failed[i])
        if usable[i]:
            acc.observed_s += float(observed[i])
            acc.recorded_s += float(recorded[i])
        if depths[i] == 0 and not acc.root_session_id:
            acc.root_session_id = session
        first, last = session_spans.get((play, session), (sent, end))
        session_spans[play, session] = (min(first, sent), max(last, end))
    rollups = [
        PlayRollup(
            play=play,
            lane=acc.lane,
            root_session_id=acc.root_session_id,
            sessions=len(acc.sessions),
            requests=acc.requests,
            errors=acc.errors,
            makespan_s=(acc.last_end_ns - acc.first_sent_ns) / 1e9,
            slowdown=acc.observed_s / acc.recorded_s if acc.recorded_s > 0 else None,
        )
        for play, acc in sorted(plays.items())
    ]
    session_makespans = np.array([(last - first) / 1e9 for first, last in session_spans.values()], dtype=np.float64)
    return Rollups(
        plays=rollups,
        play_makespan_s=_stats(np.array([p.makespan_s for p in rollups], dtype=np.float64)),
        session_makespan_s=_stats(session_makespans),
    )
