"""Realized speculative acceptance of a run, measured two independent ways, against the forced one.

AL (acceptance length) is the mean number of tokens one verification step emits, the bonus token included.

**Server counters** (`/metrics` scraped as the profiling phase starts and after the run, read by
agentx.replayer.telemetry.metrics; counters are deltas over that window, gauges are their value after the run):

- vLLM: `vllm:spec_decode_num_drafts` (steps), `..._num_draft_tokens`, `..._num_accepted_tokens` and
  `..._num_accepted_tokens_per_pos{position}`: AL = 1 + Δaccepted / Δdrafts, the rate at position i is
  Δaccepted_per_pos[i] / Δdrafts, the draft acceptance rate Δaccepted / Δdraft_tokens.
- ATOM: `atom:mtp_accepted_tokens`, `atom:mtp_draft_tokens` and `atom:mtp_decode_steps{accepted_tokens}`
  (steps by accepted drafts): the same formulas with Δsteps as drafts; without the step counter, its gauge
  `atom:mtp_average_tokens_per_forward` (already an AL, since the server started).
- SGLang: only gauges of its last logging interval, `sglang:spec_accept_length` (an AL) and
  `sglang:spec_accept_rate`.
- llama.cpp (`llama-server --metrics`): vLLM's four counters under its own prefix,
  `llamacpp:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
  `..._num_accepted_tokens_per_pos{position}`, read the same way.

**The stream** (no server access needed): the tokens of each content chunk (`chunk_tokens`) of the kept
requests whose counts were reported, not estimated. Each request's first chunk is dropped (the token the
prefill sampled, before any draft) and so is its last (the step `max_tokens` cut short, tokens the final
usage reported after the last content chunk, and with a stream interval a partial group of steps). A
server with stream interval N sends one chunk per N steps, so tokens per step = mean tokens per chunk / N.
A server that streams one token per event even when it speculates (llama.cpp: a step's accepted drafts leave
as a burst of events) shows its steps only by time: when the run speculates (a forced AL above 1, or the
counters say so) and nearly every chunk carries one token, a request's chunks closer than `BURST_GAP_SHARE`
of its gaps between steps are first grouped into one step.

The realized AL is the counters' when they give one, else the stream's. With a forced AL, a difference over
`tolerance` (absolute) is a mismatch (and with a forced K, counters showing another K per step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.replayer.telemetry.metrics import (
    ATOM_ACCEPTANCE_RATE,
    ATOM_ACCEPTED,
    ATOM_DRAFT_TOKENS,
    ATOM_STEPS,
    ATOM_TOKENS_PER_FORWARD,
    LLAMACPP_ACCEPTED,
    LLAMACPP_ACCEPTED_PER_POS,
    LLAMACPP_DRAFT_TOKENS,
    LLAMACPP_DRAFTS,
    SGLANG_ACCEPT_LENGTH,
    SGLANG_ACCEPT_RATE,
    VLLM_ACCEPTED,
    VLLM_ACCEPTED_PER_POS,
    VLLM_DRAFT_TOKENS,
    VLLM_DRAFTS,
    counter_delta,
    labelled,
)
from agentx.results.summary.columns import equals, flat_lists
from agentx.results.summary.population import IntCounts
from agentx.results.summary.run_records import RunRecords, kept_rows, middle_chunks

BURST_GAP_SHARE: Final = 0.25
"""One-token events of a request closer than this share of its long gaps (the 95th percentile of its gaps:
the time between steps, even at AL 8) are one step's burst; the events of one step leave back to back."""
ONE_TOKEN_SHARE: Final = 0.95
"""A stream counts as one token per event when at least this share of its middle chunks carry one token."""
DEFAULT_TOLERANCE: Final = 0.05
"""Largest |realized − forced| AL accepted as the forced one (absolute, tokens per step)."""

Source = Literal["counters", "stream"]
CountingEngine = Literal["vllm", "atom", "sglang", "llamacpp"]
"""The engines (of `agentx.engines.ENGINES`) whose `/metrics` count speculative acceptance."""


class CounterAcceptance(msgspec.Struct, kw_only=True):
    """Acceptance from the server's metrics."""

    engine: CountingEngine
    window: Literal["run", "gauge"]
    """`run`: counter deltas over the run; `gauge`: the server's own running figure, read after the run."""
    acceptance_length: float | None
    draft_acceptance_rate: float | None
    """Accepted draft tokens / draft tokens proposed."""
    per_position_rates: list[float] = []
    """Fraction of steps that accepted the draft at position i (0-based), i.e. unconditional."""
    steps: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    draft_tokens_per_step: float | None = None
    """The K the server ran with (Δdraft_tokens / Δsteps), when it tells."""


class StreamAcceptance(msgspec.Struct, kw_only=True):
    """Acceptance estimated from tokens per content chunk."""

    stream_interval: int
    requests: int
    """Requests whose middle chunks were counted."""
    chunks: int
    tokens_per_chunk_mean: float
    tokens_per_step: float
    """`tokens_per_chunk_mean / stream_interval`: the estimated AL."""
    tokens_per_chunk: dict[int, int]
    """The distribution: tokens in a chunk → chunks with that many."""
    estimated_requests: int = 0
    """Requests left out because their per-chunk counts were estimated (no usage nor token ids)."""
    grouped_by_gap: bool = False
    """The stream had one token per event, so steps were told apart by arrival gaps (`BURST_GAP_SHARE`): a
    server such as llama.cpp's streams a step's accepted drafts as a burst of one-token events."""


class Acceptance(msgspec.Struct, kw_only=True):
    """Forced and realized acceptance of a run, and whether they agree."""

    forced_al: float | None
    spec_k: int | None
    tolerance: float
    counters: CounterAcceptance | None
    stream: StreamAcceptance | None
    realized_al: float | None
    """The counters' AL when they give one, else the stream's."""
    realized_source: Source | None
    mismatch: bool
    """A forced AL (or K) that the realized one contradicts beyond `tolerance`."""
    mismatch_reasons: list[str] = []


# ---------------------------------------------------------------------------------------------
# counters


def _series_delta(before: Mapping[str, float], after: Mapping[str, float], key: str) -> float | None:
    """`counter_delta` of one labelled series; a series absent before the run counts from 0 (Prometheus shows
    a label value only once it has been counted, e.g. the first step that accepted that many drafts)."""
    if key not in after:
        return None
    return max(after[key] - before.get(key, 0.0), 0.0)


def _labels(after: Mapping[str, float], name: str, label: str) -> list[str]:
    prefix = f'{name}{{{label}="'
    return [key[len(prefix) : -2] for key in after if key.startswith(prefix)]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _vllm(before: Mapping[str, float], after: Mapping[str, float]) -> CounterAcceptance | None:
    return _step_counters(before, after, "vllm", (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED, VLLM_ACCEPTED_PER_POS))


def _llamacpp(before: Mapping[str, float], after: Mapping[str, float]) -> CounterAcceptance | None:
    names = (LLAMACPP_DRAFTS, LLAMACPP_DRAFT_TOKENS, LLAMACPP_ACCEPTED, LLAMACPP_ACCEPTED_PER_POS)
    return _step_counters(before, after, "llamacpp", names)


def _step_counters(
    before: Mapping[str, float], after: Mapping[str, float], engine: CountingEngine, names: tuple[str, str, str, str]
) -> CounterAcceptance | None:
    """vLLM's counter set, which llama.cpp's server copies under its own prefix: verification steps, draft
    tokens, accepted tokens, and accepted tokens per (0-based) draft position."""
    drafts_name, draft_tokens_name, accepted_name, per_position_name = names
    drafts = counter_delta(before, after, drafts_name)
    if drafts is None:
        return None
    draft_tokens = counter_delta(before, after, draft_tokens_name)
    accepted = counter_delta(before, after, accepted_name)
    positions = sorted(_labels(after, per_position_name, "position"), key=lambda p: int(p) if p.isdigit() else 0)
    per_position: list[float] = []
    if drafts > 0:
        for position in positions:
            count = _series_delta(before, after, labelled(per_position_name, "position", position))
            per_position.append((count or 0.0) / drafts)
    mean_accepted = _ratio(accepted, drafts)
    return CounterAcceptance(
        engine=engine,
        window="run",
        acceptance_length=None if mean_accepted is None else 1.0 + mean_accepted,
        draft_acceptance_rate=_ratio(accepted, draft_tokens),
        per_position_rates=per_position,
        steps=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        draft_tokens_per_step=_ratio(draft_tokens, drafts),
    )


def _atom(before: Mapping[str, float], after: Mapping[str, float]) -> CounterAcceptance | None:
    accepted = counter_delta(before, after, ATOM_ACCEPTED)
    draft_tokens = counter_delta(before, after, ATOM_DRAFT_TOKENS)
    histogram: dict[int, float] = {}
    for value in _labels(after, ATOM_STEPS, "accepted_tokens"):
        count = _series_delta(before, after, labelled(ATOM_STEPS, "accepted_tokens", value))
        if value.isdigit() and count is not None:
            histogram[int(value)] = count
    steps = sum(histogram.values()) if histogram else None
    if steps:
        if accepted is None:
            accepted = sum(n * count for n, count in histogram.items())
        k = max(histogram)
        # Position i (0-based) was accepted in every step that accepted more than i drafts.
        per_position = [sum(c for n, c in histogram.items() if n > i) / steps for i in range(k)]
        return CounterAcceptance(
            engine="atom",
            window="run",
            acceptance_length=1.0 + accepted / steps,
            draft_acceptance_rate=_ratio(accepted, draft_tokens),
            per_position_rates=per_position,
            steps=steps,
            draft_tokens=draft_tokens,
            accepted_tokens=accepted,
            draft_tokens_per_step=_ratio(draft_tokens, steps),
        )
    if ATOM_TOKENS_PER_FORWARD in after:
        rate = _ratio(accepted, draft_tokens)
        return CounterAcceptance(
            engine="atom",
            window="gauge",
            acceptance_length=after[ATOM_TOKENS_PER_FORWARD] or None,
            draft_acceptance_rate=rate if rate is not None else after.get(ATOM_ACCEPTANCE_RATE),
            draft_tokens=draft_tokens,
            accepted_tokens=accepted,
        )
    return None


def _sglang(after: Mapping[str, float]) -> CounterAcceptance | None:
    if SGLANG_ACCEPT_LENGTH not in after:
        return None
    # SGLang reports 0 until it has run a speculative step.
    return CounterAcceptance(
        engine="sglang",
        window="gauge",
        acceptance_length=after[SGLANG_ACCEPT_LENGTH] or None,
        draft_acceptance_rate=after.get(SGLANG_ACCEPT_RATE),
    )


def counter_acceptance(before: Mapping[str, float], after: Mapping[str, float]) -> CounterAcceptance | None:
    """Acceptance from two `/metrics` scrapes (`parse_counters` with `SPEC_METRICS` and `METRIC_LABELS`,
    agentx.replayer.telemetry.metrics);
    None when the server exports none of the known metrics (or ran no speculative step)."""
    for found in (_vllm(before, after), _atom(before, after), _sglang(after), _llamacpp(before, after)):
        if found is not None and (found.steps is None or found.steps > 0):
            return found
    return None


# ---------------------------------------------------------------------------------------------
# stream


def stream_acceptance(
    chunk_tokens: Sequence[Sequence[int]], *, stream_interval: int = 1, estimated_requests: int = 0
) -> StreamAcceptance | None:
    """Tokens per step from each request's tokens per content chunk (first and last chunk dropped, see
    the module docstring); None when no request has a chunk in between."""
    if stream_interval < 1:
        raise ValueError(f"stream_interval must be at least 1, got {stream_interval}")
    middles = [np.asarray(tokens[1:-1], dtype=np.int64) for tokens in chunk_tokens if len(tokens) > 2]
    if not middles:
        return None
    counted = IntCounts()
    counted.add(np.concatenate(middles))
    return _stream(counted, len(middles), stream_interval, estimated_requests)


def _stream(counted: IntCounts, requests: int, stream_interval: int, estimated_requests: int) -> StreamAcceptance:
    mean = counted.mean()
    return StreamAcceptance(
        stream_interval=stream_interval,
        requests=requests,
        chunks=counted.count,
        tokens_per_chunk_mean=mean,
        tokens_per_step=mean / stream_interval,
        tokens_per_chunk=counted.as_dict(),
        estimated_requests=estimated_requests,
    )


def table_stream_acceptance(
    records: pa.Table | RunRecords, *, stream_interval: int = 1, group_bursts: bool = False
) -> StreamAcceptance | None:
    """`stream_acceptance` over the profiling requests that ended ok of a records table (or `RunRecords`), its chunk
    lists read a slice at a time. With `group_bursts` (the server speculates) and nearly every middle chunk carrying
    one token (`ONE_TOKEN_SHARE`), the chunks are then grouped into steps by arrival gap (`BURST_GAP_SHARE`),
    reading the lists once more, since one-token events cannot show a step's size otherwise. (Without speculation,
    events are steps: gaps would only mislead, e.g. reads merged.)"""
    run = RunRecords.of(records)
    if run.table.num_rows == 0 or not run.scan.tokens_column:
        return None
    middles, counted_rows, middle_rows, estimated_rows = IntCounts(), 0, 0, 0
    for rows in run.slices():
        kept = kept_rows(rows)
        estimated = equals(rows, "tokens_estimated", True, missing=False)
        counted = kept & ~estimated
        estimated_rows += int((kept & estimated).sum())
        counted_rows += int(counted.sum())
        tokens, offsets = flat_lists(rows.column("chunk_tokens"))
        middles.add(tokens[middle_chunks(offsets, counted)])
        middle_rows += int((counted & (np.diff(offsets) > 2)).sum())
    if not counted_rows or not middle_rows:
        return None
    found = _stream(middles, middle_rows, stream_interval, estimated_rows)
    if not group_bursts or not run.scan.times:
        return found
    if found.tokens_per_chunk.get(1, 0) < ONE_TOKEN_SHARE * found.chunks:
        return found
    steps, requests = IntCounts(), 0
    for rows in run.slices():
        counted = kept_rows(rows) & ~equals(rows, "tokens_estimated", True, missing=False)
        if not counted.any():
            continue
        counted_rows_table = rows.filter(pa.array(counted))
        tokens, offsets = flat_lists(counted_rows_table.column("chunk_tokens"))
        times, _ = flat_lists(counted_rows_table.column("chunk_times_ns"))
        step_tokens, step_offsets = _steps_by_gap(tokens, times, offsets)
        steps.add(step_tokens[middle_chunks(step_offsets, np.ones(step_offsets.size - 1, dtype=bool))])
        requests += int((np.diff(step_offsets) > 2).sum())
    if not requests:
        return None
    grouped = _stream(steps, requests, stream_interval, found.estimated_requests)
    grouped.grouped_by_gap = True
    return grouped


def _steps_by_gap(
    tokens: npt.NDArray[np.int64], times_ns: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each list's chunks grouped into steps (a chunk closer to the previous one than `BURST_GAP_SHARE` of
    the list's 95th-percentile gap joins its step): the tokens per step, and each list's offsets into them."""
    lists = offsets.size - 1
    owner = np.repeat(np.arange(lists), np.diff(offsets))
    new_step = np.ones(tokens.size, dtype=bool)
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        if end - start > 1:
            gaps = np.diff(times_ns[start:end])
            new_step[start + 1 : end] = gaps >= BURST_GAP_SHARE * np.percentile(gaps, 95)
    step_of_chunk = np.cumsum(new_step) - 1
    step_tokens = np.bincount(step_of_chunk, weights=tokens).astype(np.int64)
    step_offsets = np.searchsorted(owner[new_step], np.arange(lists + 1)).astype(np.int64)
    return step_tokens, step_offsets


# ---------------------------------------------------------------------------------------------
# the verdict


K_SLACK: Final = 0.01
"""Draft tokens per step within this of K are K."""


def acceptance(
    *,
    counters: CounterAcceptance | None,
    stream: StreamAcceptance | None,
    forced_al: float | None = None,
    spec_k: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Acceptance:
    """The realized AL (counters, else stream) and whether it contradicts the forced AL or K."""
    realized: float | None = None
    source: Source | None = None
    if counters is not None and counters.acceptance_length is not None:
        realized, source = counters.acceptance_length, "counters"
    elif stream is not None:
        realized, source = stream.tokens_per_step, "stream"
    reasons: list[str] = []
    if forced_al is not None and realized is not None and abs(realized - forced_al) > tolerance:
        reasons.append(
            f"realized AL {realized:.3f} ({source}) differs from the forced {forced_al:g} by more than {tolerance:g}"
        )
    k_run = counters.draft_tokens_per_step if counters is not None else None
    if spec_k is not None and k_run is not None:
        # A drafter that finds no continuation proposes fewer than K (vLLM's n-gram does, EAGLE/MTP never): that
        # is the same K, and matters only through the AL it lowers. A step average nearest another K is another K.
        if round(k_run) != spec_k or k_run > spec_k + K_SLACK:
            reasons.append(f"the server proposed {k_run:.2f} draft tokens per step, not K = {spec_k}")
        elif reasons and k_run < spec_k - K_SLACK:
            reasons.append(
                f"its drafter proposed {k_run:.2f} of K = {spec_k} draft tokens per step: forced acceptance applies "
                "to the drafts proposed, so it needs a drafter that always proposes K (EAGLE, MTP; not n-gram)"
            )
    return Acceptance(
        forced_al=forced_al,
        spec_k=spec_k,
        tolerance=tolerance,
        counters=counters,
        stream=stream,
        realized_al=realized,
        realized_source=source,
        mismatch=bool(reasons),
        mismatch_reasons=reasons,
    )


def run_acceptance(
    records: pa.Table | RunRecords,
    before: Mapping[str, float] | None,
    after: Mapping[str, float] | None,
    *,
    forced_al: float | None = None,
    spec_k: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    stream_interval: int = 1,
) -> Acceptance | None:
    """A run's `Acceptance` from its records and its `/metrics` scrapes; None when nothing was forced and the
    server shows no speculative decoding (a plain run gets no acceptance section)."""
    counters = counter_acceptance(before, after) if before is not None and after is not None else None
    if forced_al is None and spec_k is None and counters is None:
        return None
    speculates = (forced_al is not None and forced_al > 1.0) or (
        counters is not None and (counters.acceptance_length or 1.0) > 1.0
    )
    stream = table_stream_acceptance(records, stream_interval=stream_interval, group_bursts=speculates)
    return acceptance(counters=counters, stream=stream, forced_al=forced_al, spec_k=spec_k, tolerance=tolerance)
