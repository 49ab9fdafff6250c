"""The plausibility audit of a run: figures that cannot be true, with the evidence and what to do.

A benchmark's numbers can be wrong without any request failing: a server that buffers its output and sends it in one
write makes TPOT ≈ 0 and interactivity absurd; a proxy that sends a first chunk before the prefill makes TTFT
meaningless; a client that fell behind its schedule measures itself. `audit(records, summary)` looks for each such
sign in the run's records and summary and says what it found (`Finding`): its evidence in figures, what it means for
the run's numbers and what to do. A finding of severity "error" *rejects* the figures it names (`affects`): the report
marks them and never shows them as a run's best without the mark (docs/results.md, "Plausibility audit").

The checks and their thresholds:

- `bundled_output` (error; TPOT, ITL, interactivity): requests with ≥ `BUNDLED_MIN_OSL` output tokens streamed at a
  TPOT below `BUNDLED_TPOT_S` (faster than any served model decodes), in ≥ 1 % of the kept requests. A request the
  client's own longest stall could have bundled is not counted: one whose stream, at the median TPOT of the run's
  unbundled requests, would have lasted no longer than that stall, bounded by the event-loop lag's max plus one
  sampling period (a loaded client reads a short, fast stream in one go).
- `chunk_bundling` (warning; ITL): mean tokens per content chunk above `CHUNK_RATIO_MAX` × what the run expects (the
  forced acceptance length, else the realized one, else 1; times `--stream-interval` when given).
- `ttft_faster_than_prefill` (error; TTFT): requests whose uncached prompt tokens (≥ `PREFILL_MIN_TOKENS`) over
  their TTFT exceed `PREFILL_MAX_TPS`, a prefill rate no server reaches for one request: the first chunk came before
  the prefill could have ended (or the clock or unit is wrong).
- `ttft_before_server` (error; TTFT): the client's mean TTFT below half the server's own (`SERVER_TTFT_MARGIN`; its
  time-to-first-token histogram over the profiling phase, `ttft_seconds_total` / `ttft_requests_total` of the
  telemetry), over ≥ `SERVER_TTFT_MIN_REQUESTS` requests on each side: first chunks reached the client before the
  engine produced a token, which only a server or proxy sending something ahead of the engine does.
- `prompt_tokens_differ` (warning; ISL, throughput, cache): the server's `usage.prompt_tokens` differs from what
  agentx sent (`prompt_count_differs` of agentx.replayer.schedule.sanity: by more than 2 % and 8 tokens) in
  ≥ `ISL_MIN_SHARE` of the requests reporting it.
- `output_over_max_tokens` (warning; throughput): a request's answer had more output tokens than its `max_tokens`
  (the records' `server_notices`, counted in the summary).
- `cached_tokens_absent` (warning; cache): no kept request reported `cached_tokens`; it says whether the server's
  counters give the hit rate instead, or why not (a server with no `/metrics`: `metrics_not_served`).
- `kv_cache_full` (warning; TTFT, E2EL, throughput): the server's KV-cache usage peaked at ≥ `KV_FULL_RATIO`.
- `preemptions` (warning; TTFT, E2EL, throughput): the server preempted requests for want of KV cache.
- `client_bound` (warning, error past the validity rule's 1 s): dispatch lag p99 or event-loop lag p99 above
  `CLIENT_LAG_P99_S`: the client, not the server, set part of the pace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

import msgspec
import numpy as np
import pyarrow as pa

from agentx.errors import RecordsError
from agentx.records.record import run_info
from agentx.replayer.schedule.parts import LOOP_LAG_TICK_S
from agentx.replayer.schedule.sanity import PROMPT_SLACK_TOKENS, PROMPT_TOLERANCE
from agentx.results.summary.checks.validity import DISPATCH_LAG_MAX_P99_S
from agentx.results.summary.columns import equals, floats, ints_or
from agentx.results.summary.run_records import RunRecords, request_table

if TYPE_CHECKING:
    from agentx.results.summary.model import Summary

Severity = Literal["error", "warning"]
Figure = Literal["ttft", "tpot", "itl", "e2el", "interactivity", "throughput", "isl", "cache"]

BUNDLED_TPOT_S: Final = 1e-4
"""10,000 tokens/s per user: beyond what any served model decodes, so a stream this fast was buffered."""
BUNDLED_MIN_OSL: Final = 8
BUNDLED_MIN_SHARE: Final = 0.01
CHUNK_RATIO_MAX: Final = 1.5
PREFILL_MAX_TPS: Final = 5e6
"""Uncached prompt tokens per second of TTFT above which a first chunk cannot have followed the prefill: ten times
the fastest single-request prefill of any deployment measured (a small model on a whole node)."""
PREFILL_MIN_TOKENS: Final = 512
SERVER_TTFT_MARGIN: Final = 0.5
"""The client's mean TTFT below this share of the server's own is flagged. Not nearer 1: the two means are over
populations that differ at the window's edges (vLLM counts the requests cut by the run's end), by some 10 % on a real
vLLM run of a few dozen requests."""
SERVER_TTFT_MIN_REQUESTS: Final = 10
ISL_MIN_SHARE: Final = 0.05
KV_FULL_RATIO: Final = 0.99
CLIENT_LAG_P99_S: Final = 0.05
"""A p99 dispatch or loop lag above this (a client sleeping 50 ms late) is the client pacing the run."""


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One implausible sign in a run."""

    code: str
    severity: Severity
    """"error": the `affects` figures cannot be trusted; "warning": read them knowing this."""
    title: str
    """One line: what is wrong."""
    evidence: str
    """The figures that show it."""
    advice: str
    """What it means for the run's numbers and what to do."""
    affects: tuple[Figure, ...]
    requests: int = 0
    """The requests it concerns (0: the run as a whole)."""


class Audit(msgspec.Struct, kw_only=True):
    findings: list[Finding] = []

    def rejects(self, figure: Figure) -> bool:
        """Whether a finding of severity "error" says `figure` cannot be trusted."""
        return any(f.severity == "error" and figure in f.affects for f in self.findings)


def audit(records: pa.Table | RunRecords, summary: Summary, *, metrics_not_served: bool = False) -> Audit:
    """The findings on a run from its records (a table, `read_records`, or `RunRecords`) and its summary
    (`summarize`, with the acceptance and telemetry filled in where known; its tokens per chunk stand for the
    records' chunk lists). `metrics_not_served`: the run's telemetry found the server has no `/metrics` (404 at every
    endpoint; agentx.replayer.telemetry.scrape), which the records cannot tell."""
    records = request_table(records)
    kept_mask = ~equals(records, "phase", "warmup", missing=False) & equals(records, "status", "ok", missing=True)
    table = records.filter(pa.array(kept_mask)) if records.num_rows else records
    findings: list[Finding] = []
    if table.num_rows:
        osl = ints_or(table, "osl_server_tokens", "osl_streamed_tokens")
        findings += _bundled_output(table, osl, summary)
        findings += _chunk_bundling(summary, _stream_interval(records))
        findings += _ttft_faster_than_prefill(table)
        findings += _ttft_before_server(table, summary)
        findings += _prompt_tokens_differ(table)
        findings += _cached_tokens_absent(table, summary, metrics_not_served)
    findings += _output_over_max_tokens(summary)
    findings += _server_pressure(summary)
    findings += _client_bound(summary)
    return Audit(findings=findings)


def _share(count: int, total: int) -> str:
    return f"{count:,} of {total:,} requests ({100.0 * count / total:.1f}%)"


def _where(table: pa.Table, row: int) -> str:
    session = table.column("session_id")[row].as_py()
    agent = table.column("agent_id")[row].as_py()
    turn = table.column("turn")[row].as_py()
    return f"session {session!r} agent {agent!r} turn {turn}" if agent else f"session {session!r} turn {turn}"


def _bundled_output(table: pa.Table, osl: np.ndarray, summary: Summary) -> list[Finding]:
    tpot = floats(table, "tpot_s")
    long_enough = osl >= BUNDLED_MIN_OSL
    bundled = long_enough & np.isfinite(tpot) & (tpot < BUNDLED_TPOT_S)
    streamed = long_enough & np.isfinite(tpot) & ~bundled
    if bundled.any() and streamed.any() and summary.loop_lag is not None:
        # A stall of the client reads a short stream in one go. The loop-lag samples bound the longest stall: their
        # max, plus one sampling period (a stall that began just after a sample shows that much shorter).
        stream_s = (osl - 1) * float(np.median(tpot[streamed]))
        bundled &= stream_s > summary.loop_lag.max_s + LOOP_LAG_TICK_S
    count, population = int(bundled.sum()), int(long_enough.sum())
    if count == 0 or count < BUNDLED_MIN_SHARE * population:
        return []
    median_tpot_s = float(np.median(tpot[bundled]))
    rate = f"{1.0 / median_tpot_s:,.0f} tokens/s per user" if median_tpot_s > 0 else "all at one instant"
    return [
        Finding(
            code="bundled_output",
            severity="error",
            title="the server sent whole responses at once: TPOT ≈ 0, interactivity overstated",
            evidence=(
                f"{_share(count, population)} with ≥ {BUNDLED_MIN_OSL} output tokens streamed them at a TPOT below "
                f"{BUNDLED_TPOT_S * 1e3:g} ms (median {median_tpot_s * 1e6:.1f} µs: {rate}); e.g. "
                f"{_where(table, int(np.flatnonzero(bundled)[0]))}"
            ),
            advice=(
                "Something between the model and the client buffers the output (a tool-call or reasoning parser, a "
                "proxy, a large stream interval): TPOT, ITL and interactivity measure the client reading one write, "
                "not decoding. Stream without the buffering, or judge these runs by E2EL and throughput only."
            ),
            affects=("tpot", "itl", "interactivity"),
            requests=count,
        )
    ]


def _stream_interval(records: pa.Table) -> int:
    try:
        value = run_info(records).options.get("stream_interval")
    except RecordsError:
        return 1
    return value if isinstance(value, int) and value >= 1 else 1


def _chunk_bundling(summary: Summary, stream_interval: int) -> list[Finding]:
    tokens = summary.latency.chunk_tokens  # the kept requests' chunks
    if tokens is None:
        return []
    mean_tokens = tokens.mean
    acceptance = summary.acceptance
    if acceptance is not None and acceptance.forced_al is not None:
        expected, why = acceptance.forced_al, f"the forced acceptance length {acceptance.forced_al:g}"
    elif acceptance is not None and acceptance.realized_al is not None:
        expected, why = acceptance.realized_al, f"the realized acceptance length {acceptance.realized_al:.2f}"
    else:
        expected, why = 1.0, "one token per decode step (no speculative decoding seen)"
    if stream_interval > 1:
        expected, why = expected * stream_interval, f"{why} × --stream-interval {stream_interval}"
    if mean_tokens <= CHUNK_RATIO_MAX * expected:
        return []
    return [
        Finding(
            code="chunk_bundling",
            severity="warning",
            title="the server sends several decode steps per chunk: ITL shows the chunk spacing",
            evidence=(
                f"{mean_tokens:.2f} tokens per content chunk over {tokens.count:,} chunks, against {expected:.2f} "
                f"expected from {why}"
            ),
            advice=(
                "The server streams every few steps (vLLM's or TRT-LLM's stream interval, a parser that holds text "
                "back): ITL is then not comparable with a server that streams every step. TPOT and interactivity "
                "span the whole response and stand. Give --stream-interval when it is deliberate."
            ),
            affects=("itl",),
        )
    ]


def _uncached_tokens(table: pa.Table) -> np.ndarray:
    isl = ints_or(table, "isl_server_tokens", "isl_sent_tokens").astype(np.float64)
    cached = floats(table, "cached_tokens")
    return isl - np.where(np.isfinite(cached), cached, 0.0)


def _ttft_faster_than_prefill(table: pa.Table) -> list[Finding]:
    ttft = floats(table, "ttft_s")
    uncached = _uncached_tokens(table)
    judged = np.isfinite(ttft) & (ttft > 0) & (uncached >= PREFILL_MIN_TOKENS)
    if not judged.any():
        return []
    rate = np.zeros(table.num_rows)
    rate[judged] = uncached[judged] / ttft[judged]
    impossible = judged & (rate > PREFILL_MAX_TPS)
    count = int(impossible.sum())
    if count == 0:
        return []
    worst = int(np.argmax(rate))
    typical = float(np.median(rate[judged & ~impossible])) if (judged & ~impossible).any() else None
    typical_text = f"; the run's other requests: median {typical:,.0f} tokens/s" if typical is not None else ""
    return [
        Finding(
            code="ttft_faster_than_prefill",
            severity="error",
            title="first tokens arrived before the prompt could have been prefilled",
            evidence=(
                f"{_share(count, int(judged.sum()))} with ≥ {PREFILL_MIN_TOKENS} uncached prompt tokens had a TTFT "
                f"implying over {PREFILL_MAX_TPS / 1e6:g}M prefill tokens/s; e.g. {_where(table, worst)}: "
                f"{uncached[worst]:,.0f} uncached tokens, TTFT {ttft[worst] * 1e3:.3f} ms "
                f"({rate[worst] / 1e6:,.1f}M tokens/s){typical_text}"
            ),
            advice=(
                "The server or a proxy sends a content chunk before the prefill ends (a placeholder token, a "
                "keep-alive), or a clock or unit is wrong: TTFT does not measure time to first token. Check the "
                "first chunk's content on the server side; do not compare these TTFTs."
            ),
            affects=("ttft",),
            requests=count,
        )
    ]


def _ttft_before_server(table: pa.Table, summary: Summary) -> list[Finding]:
    telemetry = summary.server_telemetry
    if telemetry is None:
        return []
    seconds, requests = telemetry.series.get("ttft_seconds_total"), telemetry.series.get("ttft_requests_total")
    if seconds is None or requests is None or seconds.counter is None or requests.counter is None:
        return []
    if requests.counter.total < SERVER_TTFT_MIN_REQUESTS:
        return []
    server_mean_s = seconds.counter.total / requests.counter.total
    ttft = floats(table, "ttft_s")
    ttft = ttft[np.isfinite(ttft) & (ttft > 0)]
    if ttft.size < SERVER_TTFT_MIN_REQUESTS:
        return []
    client_mean_s = float(ttft.mean())
    if client_mean_s >= SERVER_TTFT_MARGIN * server_mean_s:
        return []
    return [
        Finding(
            code="ttft_before_server",
            severity="error",
            title="first tokens reached the client before the server's engine produced them",
            evidence=(
                f"mean TTFT {client_mean_s * 1e3:,.2f} ms at the client over {ttft.size:,} requests, against "
                f"{server_mean_s * 1e3:,.2f} ms by the server's own histogram over {requests.counter.total:,.0f}"
            ),
            advice=(
                "Something answers ahead of the engine (a proxy or an API layer sending a first content chunk, a "
                "placeholder token): TTFT measures that, not the prefill. Find what sends the first chunk; do not "
                "compare these TTFTs."
            ),
            affects=("ttft",),
        )
    ]


def _prompt_tokens_differ(table: pa.Table) -> list[Finding]:
    server = floats(table, "isl_server_tokens")
    sent = floats(table, "isl_sent_tokens")
    reported = np.isfinite(server) & np.isfinite(sent)
    if not reported.any():
        return []
    difference = np.abs(server - sent)
    differs = reported & (difference > np.maximum(PROMPT_SLACK_TOKENS, PROMPT_TOLERANCE * sent))
    count, population = int(differs.sum()), int(reported.sum())
    if count < ISL_MIN_SHARE * population or count == 0:
        return []
    ratio = float(np.median(server[differs] / np.maximum(sent[differs], 1.0)))
    return [
        Finding(
            code="prompt_tokens_differ",
            severity="warning",
            title="the server counted prompts differently from what agentx sent",
            evidence=(
                f"{_share(count, population)} reporting usage differ by more than {PROMPT_TOLERANCE:.0%} (and "
                f"{PROMPT_SLACK_TOKENS} tokens); the server's count is {ratio:.2f}× the sent one at the median; e.g. "
                f"{_where(table, int(np.flatnonzero(differs)[0]))}"
            ),
            advice=(
                "The server tokenizes or templates the prompt otherwise than agentx built it (another tokenizer: "
                "--tokenizer; a chat template agentx did not calibrate): input throughput and the hit rate use the "
                "server's counts, and the prompts are not the trace's lengths."
            ),
            affects=("isl", "throughput", "cache"),
            requests=count,
        )
    ]


def _output_over_max_tokens(summary: Summary) -> list[Finding]:
    count = summary.counts.server_notices.get("output_over_max_tokens", 0)
    if count == 0:
        return []
    return [
        Finding(
            code="output_over_max_tokens",
            severity="warning",
            title="the server gave more output tokens than the requests' max_tokens",
            evidence=(
                f"{_share(count, summary.counts.profiling)} answered with more output tokens (usage or streamed) "
                "than their max_tokens (the records' server_notices)"
            ),
            advice=(
                "The server does not honour the output cap (an engine or a proxy that drops or rewrites max_tokens): "
                "the run decoded another workload than the trace's, so its throughput, TPOT and GPU time per task "
                "describe that one. Make the server honour max_tokens (and min_tokens, which forces the length)."
            ),
            affects=("throughput",),
            requests=count,
        )
    ]


def _cached_tokens_absent(table: pa.Table, summary: Summary, metrics_not_served: bool) -> list[Finding]:
    if summary.cache.usage_reported_requests > 0:
        return []
    usage = np.isfinite(floats(table, "isl_server_tokens")).any()
    server = summary.cache.server_hit_rate
    # The counters are read before and after every run, whatever --metrics-interval says: what is left to say is
    # whether they stand in, and why not.
    if server is not None:
        fallback = f"; the server's counters say {server:.1%}"
        counters = "The hit rate from the server's own counters (above) stands in."
    elif metrics_not_served:
        fallback = "; the server exposes no /metrics (404)"
        counters = "The server exposes no /metrics (404), so no counter of its can stand in either."
    else:
        fallback = ""
        counters = (
            "Nor did the server's /metrics give prefix-cache counters to stand in (a read that failed said why on "
            "stderr)."
        )
    return [
        Finding(
            code="cached_tokens_absent",
            severity="warning",
            title="the server reported no cached prompt tokens",
            evidence=(
                f"0 of {table.num_rows:,} requests carried usage.prompt_tokens_details.cached_tokens"
                + ("" if usage else " (the server sent no usage at all)")
                + fallback
            ),
            advice=(
                "Per-request hits, the cache-miss split and the usage hit rate are unavailable. vLLM reports cached "
                f"tokens with --enable-prompt-tokens-details. {counters}"
            ),
            affects=("cache",),
        )
    ]


def _server_pressure(summary: Summary) -> list[Finding]:
    telemetry = summary.server_telemetry
    if telemetry is None:
        return []
    found: list[Finding] = []
    usage = telemetry.kv_cache_usage_ratio
    if usage is not None and usage.peak >= KV_FULL_RATIO:
        found.append(
            Finding(
                code="kv_cache_full",
                severity="warning",
                title="the server's KV cache filled up",
                evidence=f"KV-cache usage peaked at {usage.peak:.1%} (mean {usage.mean:.1%}) over the profiling phase",
                advice=(
                    "Requests queued or were preempted for want of cache: latency and throughput measure the cache's "
                    "size as much as the engine's speed. Compare at a lower concurrency or with more KV memory."
                ),
                affects=("ttft", "e2el", "throughput"),
            )
        )
    preempted = telemetry.series.get("preemptions_total")
    if preempted is not None and preempted.counter is not None and preempted.counter.total > 0:
        found.append(
            Finding(
                code="preemptions",
                severity="warning",
                title="the server preempted running requests",
                evidence=f"{preempted.counter.total:,.0f} preemptions over the profiling phase "
                f"({preempted.counter.rate:.2f}/s)",
                advice=(
                    "A preempted request is recomputed or swapped: its latency includes the server's cache pressure. "
                    "The run is past the deployment's KV capacity at this concurrency."
                ),
                affects=("ttft", "e2el", "throughput"),
            )
        )
    return found


def _client_bound(summary: Summary) -> list[Finding]:
    parts: list[str] = []
    worst_s = 0.0
    if (lag := summary.dispatch_lag) is not None and lag.p99_s > CLIENT_LAG_P99_S:
        parts.append(f"dispatch lag p99 {lag.p99_s * 1e3:,.0f} ms (max {lag.max_s * 1e3:,.0f} ms)")
        worst_s = max(worst_s, lag.p99_s)
    if (loop := summary.loop_lag) is not None and loop.p99_s > CLIENT_LAG_P99_S:
        parts.append(f"event-loop lag p99 {loop.p99_s * 1e3:,.0f} ms over {loop.samples:,} samples")
        worst_s = max(worst_s, loop.p99_s)
    if not parts:
        return []
    return [
        Finding(
            code="client_bound",
            severity="error" if worst_s > DISPATCH_LAG_MAX_P99_S else "warning",
            title="the client fell behind: it, not the server, set part of the pace",
            evidence="; ".join(parts) + f" (above {CLIENT_LAG_P99_S * 1e3:g} ms)",
            advice=(
                "Requests went out late and their responses were read late: the load was lighter than scheduled and "
                "the latency includes the client's own delay (a tail can look better or worse than the server's). "
                "Give the client more cores (--workers), lower the concurrency, or run it nearer the server."
            ),
            affects=("ttft", "tpot", "itl", "e2el", "interactivity", "throughput"),
        )
    ]
