"""Per-request metrics of the AIPerf exports, computed once for both files (docs/agentx.md §6).

`record_metrics` turns a records table into one float array per AIPerf metric tag (NaN where the metric is
undefined for the row) plus the inter-chunk latencies, in AIPerf's display units (ms, tokens, tokens/sec/user,
%). `profile_export.jsonl` writes a row's defined values; `profile_export_aiperf.json` aggregates them. Each
definition is the reference's (AIPerf 0.13.0, `aiperf/metrics/types/*.py`), stated on the tag in `DEFINITIONS`; the
columns are `agentx.records.record`' (times in ns from the run start):

- Only successful rows (`status == "ok"`, AIPerf's valid records) get metrics; a failed row gets
  `error_isl` alone (AIPerf computes only its ERROR_ONLY metrics for an error record).
- ISL = `isl_server_tokens` (`usage.prompt_tokens`) else `isl_sent_tokens`; OSL = `osl_server_tokens`
  (`usage.completion_tokens`) else `osl_streamed_tokens`: AIPerf's counts under `--use-server-token-count`,
  as InferenceX runs it, with agentx's own counts where the server reports none.
- The client-side counts the two `usage_*_diff_pct` metrics compare the usage with are `isl_sent_tokens`
  (the prompt agentx built) and `osl_streamed_tokens` (the per-chunk counts). The latter is reconciled to the
  usage whenever the server streams running usage, so its diff is 0 there; it differs only for counts
  estimated at one token per chunk.
- `requested_osl` (the `max_tokens` sent, for `osl_mismatch_*`) is rebuilt as the engine chooses it: the
  trace's `out`, at least 1, capped by `max_output_tokens` on top-level turns (the root and the chains split
  out of it); a warmup request asks for `warmup_max_tokens` (1 by default; `null` = the trace's `out`).
- agentx does not tell reasoning chunks from output chunks, nor read `completion_tokens_details`:
  `time_to_first_output_token` equals `time_to_first_token` and `output_token_count` equals the OSL, exact for
  a model that streams no reasoning and an under-/over-estimate otherwise.
- `usage_total_tokens` = prompt + completion tokens (the OpenAI definition of `usage.total_tokens`, which
  agentx does not record).
- HTTP timings (AIPerf's aiohttp trace, k6 names). AIPerf times the response body's first and last network
  chunks; agentx records the first content chunk and the end of the body. So `http_req_waiting` = first
  content chunk − sent (AIPerf: first body chunk − request written; the same for a server whose first
  streamed event carries the first token), `http_req_receiving` = end − first content chunk,
  `http_req_duration` = end − sent, `http_req_connection_overhead` = sent − queued (AIPerf: pool wait + DNS +
  connect, which agentx records only as that sum), `http_req_total` = end − queued (the sum of the parts).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agentx.records.record import run_info
from agentx.replayer.options.rules import RuleSet
from agentx.results.summary.checks.validity import rules_of
from agentx.results.summary.columns import equals, strings
from agentx.results.summary.stats import BoolArray, FloatArray, IntArray

NS_PER_MS: Final = 1e6
NS_PER_S: Final = 1e9
CHAIN_KINDS: Final = frozenset({"fa", "aux", "wg"})
"""First `:`-separated word of the agent id of a chain split out of the root (agentx.trace.chains)."""

DEFINITIONS: Final[dict[str, tuple[str, str]]] = {
    "request_latency": ("ms", "last content chunk − sent"),
    "time_to_first_token": ("ms", "first content chunk − sent"),
    "time_to_second_token": ("ms", "second content chunk − first (≥ 2 chunks)"),
    "time_to_first_output_token": ("ms", "first non-reasoning chunk − sent (= TTFT, see the docstring)"),
    "inter_chunk_latency": ("ms", "gaps between consecutive content chunks (a list per request)"),
    "inter_token_latency": ("ms", "(request_latency − TTFT) / (OSL − 1), OSL ≥ 2"),
    "output_token_throughput_per_user": ("tokens/sec/user", "1 / ITL, ITL > 0"),
    "output_sequence_length": ("tokens", "OSL"),
    "output_token_count": ("tokens", "non-reasoning output tokens (= OSL), when > 0"),
    "input_sequence_length": ("tokens", "ISL"),
    "decode_duration": ("ms", "request_latency − TTFT"),
    "e2e_output_token_throughput": ("tokens/sec/user", "OSL / request_latency, latency > 0"),
    "prefill_throughput_per_user": ("tokens/sec/user", "ISL / TTFT, TTFT > 0"),
    "usage_prompt_tokens": ("tokens", "usage.prompt_tokens"),
    "usage_completion_tokens": ("tokens", "usage.completion_tokens"),
    "usage_total_tokens": ("tokens", "usage prompt + completion tokens"),
    "usage_prompt_cache_read_tokens": ("tokens", "usage.prompt_tokens_details.cached_tokens"),
    "usage_prompt_tokens_diff_pct": ("%", "|usage prompt − sent| / sent · 100"),
    "usage_completion_tokens_diff_pct": ("%", "|usage completion − streamed| / streamed · 100"),
    "osl_mismatch_diff_pct": ("%", "(OSL − requested) / requested · 100 (signed)"),
    "http_req_waiting": ("ms", "first body chunk (first content chunk) − sent"),
    "http_req_receiving": ("ms", "end − first content chunk"),
    "http_req_duration": ("ms", "end − sent"),
    "http_req_connection_overhead": ("ms", "sent − queued"),
    "http_req_total": ("ms", "end − queued"),
    "error_isl": ("tokens", "ISL of a failed request"),
    "full_decode_duration": ("ms", "end − first content chunk (the harness's)"),
    "full_response_inter_token_latency": ("ms", "full_decode_duration / (OSL − 1), OSL ≥ 2 (the harness's)"),
    "full_response_output_token_throughput_per_user": (
        "tokens/sec/user",
        "1 / full_response_inter_token_latency, > 0 (the harness's)",
    ),
}
"""Tag → (display unit, definition) of every per-request metric, in the order the JSONL writes them."""
HARNESS_TAGS: Final = frozenset(
    {"full_decode_duration", "full_response_inter_token_latency", "full_response_output_token_throughput_per_user"}
)
"""The metrics agentx-harness 1.0.12 adds to AIPerf 0.13.0's: written only for a run of its rules."""

UNITS: Final = {tag: unit for tag, (unit, _) in DEFINITIONS.items()}
INTEGER_TAGS: Final = frozenset(tag for tag, unit in UNITS.items() if unit == "tokens")
LIST_TAGS: Final = frozenset({"inter_chunk_latency"})


@dataclass(frozen=True)
class RunContext:
    """What the exports need to know about the run besides its rows."""

    run_id: str
    epoch_ns: int
    options: Mapping[str, Any]
    run: Mapping[str, Any]
    """run.json's `run` section (empty without a run.json)."""
    has_run_file: bool

    @property
    def mode(self) -> str:
        mode = self.options.get("mode")
        return mode if isinstance(mode, str) else "agentx"  # the default mode, also for files that predate it

    @property
    def agentic(self) -> bool:
        """An agentx-mode run: AIPerf's AGENTIC_REPLAY timing under the scenario `inferencex-agentx-mvp`."""
        return self.mode == "agentx"

    @property
    def rules(self) -> RuleSet:
        """The rule set the run played (AIPerf 0.13.0's for a run that predates rule sets)."""
        return rules_of(self.options)

    @property
    def scenario(self) -> str | None:
        """The reference's scenario the run played, as its exports name it (`agentx` under agentx-harness
        1.0.12, `inferencex-agentx-mvp` under AIPerf 0.13.0); None outside agentx mode."""
        return self.rules.scenario if self.agentic else None

    @property
    def interrupted(self) -> bool:
        """The run was stopped early (Ctrl-C, the failure threshold) or never wrote its run.json."""
        return not self.has_run_file or bool(self.run.get("interrupted", False))


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    return dict(value) if isinstance(value, Mapping) else {}


def run_context(table: pa.Table, run_file: Mapping[str, Any] | msgspec.Struct | None) -> RunContext:
    """The run's context: its options from run.json, else from the records' schema metadata."""
    info = run_info(table)
    document = _as_dict(run_file)
    options = _as_dict(document.get("options")) or dict(info.options)
    return RunContext(
        run_id=info.run_id,
        epoch_ns=info.wall_epoch_ns,
        options=options,
        run=_as_dict(document.get("run")),
        has_run_file=run_file is not None,
    )


# ---------------------------------------------------------------------------------------------
# columns


def column(table: pa.Table, name: str) -> FloatArray:
    """A numeric column as float64, nulls (and a column an older file lacks) as NaN."""
    if name not in table.schema.names:
        return np.full(table.num_rows, np.nan)
    return np.asarray(pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def coalesce(first: FloatArray, second: FloatArray) -> FloatArray:
    return np.where(np.isnan(first), second, first)


def top_level_chain(agent_id: str, depth: int) -> bool:
    """A chain split out of the root (agent id `fa:NNN`, `aux:NNN`, `aux:red:NNN`, `wg:GGG_MMM` at depth 1)."""
    return depth == 1 and agent_id.split(":", 1)[0] in CHAIN_KINDS


# ---------------------------------------------------------------------------------------------
# the metrics


@dataclass
class RecordMetrics:
    """Per-row metric values in display units (NaN: undefined) and the inter-chunk latencies."""

    values: dict[str, FloatArray]
    icl_ms: FloatArray
    """Inter-chunk latencies of the successful rows, row after row."""
    icl_rows: IntArray
    """The row of each value of `icl_ms` (non-decreasing)."""
    icl_offsets: IntArray
    """`icl_ms[icl_offsets[i]:icl_offsets[i + 1]]` are row i's."""
    ok: BoolArray
    requested_osl: FloatArray
    isl: FloatArray
    osl: FloatArray

    def rows(self) -> Iterator[dict[str, dict[str, Any]]]:
        """Each row's defined metrics as AIPerf writes them: `{tag: {"value", "unit"}}`, in row order."""
        scalars = [
            (tag, unit, self.values[tag].tolist(), tag in INTEGER_TAGS)
            for tag, unit in UNITS.items()
            if tag not in LIST_TAGS
        ]
        gaps, offsets = self.icl_ms.tolist(), self.icl_offsets.tolist()
        for i in range(len(self.ok)):
            result: dict[str, dict[str, Any]] = {}
            for tag, unit, values, integer in scalars:
                value = values[i]
                if value == value:  # not NaN
                    result[tag] = {"value": int(value) if integer else value, "unit": unit}
            if offsets[i + 1] > offsets[i]:
                result["inter_chunk_latency"] = {"value": gaps[offsets[i] : offsets[i + 1]], "unit": "ms"}
            yield result


def _requested_osl(table: pa.Table, ctx: RunContext) -> FloatArray:
    """The `max_tokens` the run sent each row (agentx.replayer.plan.bodies, `BodyBuilder.max_tokens`)."""
    recorded = column(table, "osl_recorded_tokens")
    cap = ctx.options.get("max_output_tokens")
    if isinstance(cap, int | float) and not isinstance(cap, bool):
        depths = column(table, "depth")
        agents = strings(table, "agent_id")
        top = np.array(
            [d == 0 or top_level_chain(a, int(d)) for a, d in zip(agents, np.nan_to_num(depths), strict=True)],
            dtype=bool,
        )
        recorded = np.where(top, np.minimum(recorded, float(cap)), recorded)
    requested = np.maximum(1.0, recorded)
    warmup_tokens = ctx.options.get("warmup_max_tokens", 1)
    if isinstance(warmup_tokens, int | float) and not isinstance(warmup_tokens, bool):
        requested = np.where(equals(table, "phase", "warmup"), float(warmup_tokens), requested)
    return requested


def _chunk_gaps(table: pa.Table, ok: BoolArray) -> tuple[FloatArray, IntArray, FloatArray]:
    """(gaps in ns, their rows, time to second chunk in ns per row) of the successful rows."""
    n = table.num_rows
    if "chunk_times_ns" not in table.schema.names or n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.full(n, np.nan)
    lists = table.column("chunk_times_ns").combine_chunks()
    counts = np.asarray(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    times = np.asarray(pc.cast(lists.flatten(), pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    if times.size < 2:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.full(n, np.nan)
    gaps = np.diff(times)
    same_row = rows[:-1] == rows[1:]
    keep = same_row & ok[rows[:-1]]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    second = np.full(n, np.nan)
    two = (counts >= 2) & ok
    second[two] = times[starts[two] + 1] - times[starts[two]]
    return gaps[keep], rows[:-1][keep], second


def record_metrics(table: pa.Table, ctx: RunContext) -> RecordMetrics:
    """Every per-request metric of every row of `table` (see the module docstring for the definitions)."""
    n = table.num_rows
    ok = equals(table, "status", "ok") if "status" in table.schema.names else np.ones(n, dtype=bool)
    nan = np.full(n, np.nan)

    def when(condition: BoolArray | bool, values: FloatArray) -> FloatArray:
        """`values` on the successful rows where `condition` holds, NaN elsewhere."""
        return np.where(condition & ok & ~np.isnan(values), values, nan)

    def duration_ms(end: FloatArray, start: FloatArray) -> FloatArray:
        delta = end - start
        return when(delta >= 0, delta / NS_PER_MS)  # AIPerf rejects a negative span (ValueError: no value)

    sent, end = column(table, "sent_ns"), column(table, "end_ns")
    first, last = column(table, "first_token_ns"), column(table, "last_token_ns")
    queued = column(table, "queued_ns")
    isl_server, isl_sent = column(table, "isl_server_tokens"), column(table, "isl_sent_tokens")
    osl_server, osl_streamed = column(table, "osl_server_tokens"), column(table, "osl_streamed_tokens")
    isl, osl = coalesce(isl_server, isl_sent), coalesce(osl_server, osl_streamed)
    tpot_s = column(table, "tpot_s")  # AIPerf's per-request inter_token_latency
    requested = _requested_osl(table, ctx)
    gaps_ns, gap_rows, second_ns = _chunk_gaps(table, ok)

    ttft_ns, latency_ns = first - sent, last - sent
    values: dict[str, FloatArray] = {
        "request_latency": duration_ms(last, sent),
        "time_to_first_token": duration_ms(first, sent),
        "time_to_second_token": when(second_ns >= 0, second_ns / NS_PER_MS),
        "time_to_first_output_token": duration_ms(first, sent),
        "inter_token_latency": when(tpot_s >= 0, tpot_s * 1e3),
        "output_token_throughput_per_user": when(tpot_s > 0, 1.0 / np.where(tpot_s > 0, tpot_s, 1.0)),
        "output_sequence_length": when(True, osl),
        "output_token_count": when(osl > 0, osl),
        "input_sequence_length": when(True, isl),
        "decode_duration": duration_ms(last, first),
        "e2e_output_token_throughput": when(latency_ns > 0, osl / np.where(latency_ns > 0, latency_ns, 1.0) * NS_PER_S),
        "prefill_throughput_per_user": when(ttft_ns > 0, isl / np.where(ttft_ns > 0, ttft_ns, 1.0) * NS_PER_S),
        "usage_prompt_tokens": when(True, isl_server),
        "usage_completion_tokens": when(True, osl_server),
        "usage_total_tokens": when(True, isl_server + osl_server),
        "usage_prompt_cache_read_tokens": when(True, column(table, "cached_tokens")),
        "usage_prompt_tokens_diff_pct": when(
            isl_sent > 0, np.abs(isl_server - isl_sent) / np.where(isl_sent > 0, isl_sent, 1.0) * 100.0
        ),
        "usage_completion_tokens_diff_pct": when(
            osl_streamed > 0,
            np.abs(osl_server - osl_streamed) / np.where(osl_streamed > 0, osl_streamed, 1.0) * 100.0,
        ),
        "osl_mismatch_diff_pct": when(requested > 0, (osl - requested) / requested * 100.0),
        "http_req_waiting": duration_ms(first, sent),
        "http_req_receiving": duration_ms(end, first),
        "http_req_duration": duration_ms(end, sent),
        "http_req_connection_overhead": duration_ms(sent, queued),
        "http_req_total": duration_ms(end, queued),
        "error_isl": np.where(~ok, isl, nan),
    }
    full_ms = duration_ms(end, first)
    full_itl_ms = when(osl >= 2, full_ms / np.where(osl >= 2, osl - 1, 1.0))
    values["full_decode_duration"] = full_ms
    values["full_response_inter_token_latency"] = full_itl_ms
    values["full_response_output_token_throughput_per_user"] = when(
        full_itl_ms > 0, 1e3 / np.where(full_itl_ms > 0, full_itl_ms, 1.0)
    )
    if not ctx.rules.export_harness_metrics:
        for tag in HARNESS_TAGS:
            values[tag] = nan
    counts = np.bincount(gap_rows, minlength=n) if n else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return RecordMetrics(
        values=values,
        icl_ms=gaps_ns / NS_PER_MS,
        icl_rows=gap_rows,
        icl_offsets=offsets,
        ok=ok,
        requested_osl=requested,
        isl=isl,
        osl=osl,
    )
