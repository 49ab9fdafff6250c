"""Why the cache missed: each request's uncached prompt tokens split into four causes, summed over the run
(docs/results.md, "Why the cache missed").

Over the kept requests whose usage reports `cached_tokens`: uncached = ISL − cached (ISL: the server's prompt tokens,
else those sent; cached held within [0, ISL]). The prompt is taken as the replay lays it out: the play's cache-bust
marker (`cache_bust_tokens`), then `m = min(theoretical_total_blocks, isl_recorded_tokens // B)` whole trace blocks of
B tokens, then the rest (the partial last block's tokens, the chat template's). With R = `replayed_hit_blocks` and
A = `seen_any_scope_blocks` (both at most m), it is cut at

- the replayed bound: the marker and the R leading blocks, rounded down to whole server blocks of S tokens, at most
  the whole server blocks before the prompt's last token (which a server always computes);
- marker + R·B, the end of the blocks the run had sent under this marker and scope;
- marker + A·B, the end of the blocks whose ids it had sent under any marker;
- marker + m·B, the end of the whole blocks;

(a cut of no block, R, A or m being 0, is at 0: the marker then belongs to what follows), and the uncached tokens,
[cached, ISL), fall in four parts that add up to them exactly:

- **seen before but not hit**: [cached, bound): content the run had sent in this scope, which an infinite cache on the
  server's grid would have hit: evicted, or routed to another replica;
- **block-boundary remainder**: [bound, marker + R·B) and [marker + m·B, ISL): the part of the bound that does not
  fill a server block, and the tokens past the last whole trace block;
- **cache-bust scope**: [marker + R·B, marker + A·B): ids the run had sent, but under another marker;
- **first seen**: [marker + A·B, marker + m·B): from the first block whose ids the run never sent, on.

Beside them, as shares of the same requests' prompt tokens: the achieved hit (Σ cached), the trace's theoretical
hit (its hit blocks × B), the replayed bound and an LRU cache of the server's capacity (its leading blocks with the
marker, rounded down to server blocks). B is the trace's block size and S the server's, both from the records'
metadata (`trace.block_size`, `detected.server_cache`; S is B when the server did not say). Chat prompts hold the
template's tokens between messages; they are counted at the prompt's end, so there the parts are approximate by
that much (their sum is exact either way). Records before format 1.11 give None.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from agentx.errors import RecordsError
from agentx.records.record import run_info
from agentx.results.summary.columns import floats, has, ints_or
from agentx.results.summary.stats import IntArray


class CacheMisses(msgspec.Struct, kw_only=True):
    """The run's uncached prompt tokens by cause (module docstring); the four parts add up to `uncached_tokens`."""

    requests: int
    """Kept requests whose usage reported cached tokens (and that carry the replay's block counts)."""
    prompt_tokens: int
    uncached_tokens: int
    seen_not_hit_tokens: int
    block_boundary_tokens: int
    cache_bust_scope_tokens: int
    first_seen_tokens: int
    trace_block_size: int
    server_block_size: int
    server_block_size_known: bool
    """The server's block size came from its `/metrics` (else it is the trace's)."""
    achieved_hit_rate: float | None
    """Σ cached / Σ ISL."""
    theoretical_hit_rate: float | None
    """The trace's own hit: Σ its hit blocks × B / Σ ISL."""
    replayed_hit_rate: float | None
    """The infinite cache's bound on the server's grid: Σ bound / Σ ISL."""
    lru_hit_rate: float | None
    """An LRU cache of the server's capacity fed the same prompts, on the server's grid, over the requests it judged;
    None when the capacity was not known."""
    lru_capacity_tokens: int | None


class MissSplit(NamedTuple):
    """Per request, its uncached tokens by cause (module docstring), in tokens."""

    seen_not_hit: IntArray
    block_boundary: IntArray
    cache_bust_scope: IntArray
    first_seen: IntArray


def grid_tokens(marker: IntArray, blocks: IntArray, isl: IntArray, trace_block: int, server_block: int) -> IntArray:
    """The marker and `blocks` leading trace blocks, rounded down to whole server blocks (0 without a block), at most
    the whole server blocks before a prompt's last token, which a server always computes (vLLM, the simulator)."""
    before_last = np.maximum(isl - 1, 0) // server_block * server_block
    held = np.where(blocks > 0, (marker + blocks * trace_block) // server_block * server_block, 0)
    return np.asarray(np.minimum(held, before_last), dtype=np.int64)


def split_uncached(
    isl: IntArray,
    cached: IntArray,
    marker: IntArray,
    whole_blocks: IntArray,
    replayed: IntArray,
    seen_any: IntArray,
    trace_block: int,
    server_block: int,
) -> MissSplit:
    """Each request's uncached tokens, `isl − clip(cached, 0, isl)`, in the four parts of the module docstring; they
    add up to it exactly. `whole_blocks` is m, `replayed` R and `seen_any` A, each held to 0 ≤ R ≤ A ≤ m."""
    isl = np.maximum(isl, 0)
    hit = np.clip(cached, 0, isl)
    blocks = np.maximum(whole_blocks, 0)
    same = np.clip(replayed, 0, blocks)
    any_scope = np.clip(seen_any, same, blocks)
    marker = np.maximum(marker, 0)

    def cut(blocks_before: IntArray) -> IntArray:
        return np.where(blocks_before > 0, marker + blocks_before * trace_block, 0)

    # Each cut no earlier than the one before and no later than the prompt's end: a partition of [0, ISL).
    cuts = [grid_tokens(marker, same, isl, trace_block, server_block), cut(same), cut(any_scope), cut(blocks)]
    bounds = [np.zeros_like(isl)]
    for position in cuts:
        bounds.append(np.clip(position, bounds[-1], isl))
    bounds.append(isl)

    def uncached(start: IntArray, stop: IntArray) -> IntArray:
        return np.maximum(0, stop - np.maximum(start, hit))

    seen_not_hit = uncached(bounds[0], bounds[1])
    remainder = uncached(bounds[1], bounds[2]) + uncached(bounds[4], bounds[5])
    return MissSplit(
        seen_not_hit=seen_not_hit,
        block_boundary=remainder,
        cache_bust_scope=uncached(bounds[2], bounds[3]),
        first_seen=uncached(bounds[3], bounds[4]),
    )


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _block_sizes(table: pa.Table) -> tuple[int | None, int | None, int | None]:
    """(trace block size, server block size, server capacity in tokens) from the records' metadata."""
    try:
        options = run_info(table).options
    except RecordsError:
        return None, None, None
    trace = options.get("trace")
    detected = options.get("detected")
    trace_block = _positive(trace.get("block_size")) if isinstance(trace, dict) else None
    cache = detected.get("server_cache") if isinstance(detected, dict) else None
    if not isinstance(cache, dict):
        return trace_block, None, None
    server_block = _positive(cache.get("block_size"))
    server_blocks = _positive(cache.get("num_gpu_blocks"))
    capacity = server_blocks * server_block if server_blocks is not None and server_block is not None else None
    return trace_block, server_block, capacity


_COLUMNS = (
    "isl_server_tokens",
    "isl_sent_tokens",
    "cache_bust_tokens",
    "isl_recorded_tokens",
    "theoretical_hit_blocks",
    "theoretical_total_blocks",
    "replayed_hit_blocks",
    "seen_any_scope_blocks",
    "lru_hit_blocks",
)
"""The columns the split reads beside `cached_tokens`."""


def _counts(table: pa.Table, name: str) -> IntArray:
    """A count column as int64, nulls as 0."""
    return np.nan_to_num(floats(table, name), nan=0.0).astype(np.int64)


def cache_misses(kept: pa.Table, metadata: pa.Table | None = None) -> CacheMisses | None:
    """The uncached tokens of the `kept` requests by cause (module docstring); `metadata`: a table carrying the run's
    schema metadata when `kept` does not. None without the 1.11 columns, the trace's block size in the metadata, or a
    request that reports cached tokens."""
    trace_block, server_block, capacity = _block_sizes(metadata if metadata is not None else kept)
    needed = ("cached_tokens", "isl_recorded_tokens", "theoretical_total_blocks", "seen_any_scope_blocks")
    if trace_block is None or kept.num_rows == 0 or any(not has(kept, name) for name in needed):
        return None
    cached_or_nan = floats(kept, "cached_tokens")
    # Rows without the counts (written by something other than a replay) say nothing of why their cache missed.
    reporting = np.flatnonzero(np.isfinite(cached_or_nan) & np.isfinite(floats(kept, "seen_any_scope_blocks")))
    if reporting.size == 0:
        return None
    columns = [name for name in _COLUMNS if has(kept, name)]
    table = kept.select(columns).take(pa.array(reporting))  # not the chunk lists: a take copies what it keeps
    grid = server_block or trace_block
    isl = np.maximum(ints_or(table, "isl_server_tokens", "isl_sent_tokens"), 0)
    cached = cached_or_nan[reporting].astype(np.int64)
    marker = _counts(table, "cache_bust_tokens")
    whole = np.minimum(_counts(table, "theoretical_total_blocks"), _counts(table, "isl_recorded_tokens") // trace_block)
    replayed = np.minimum(_counts(table, "replayed_hit_blocks"), whole)
    split = split_uncached(
        isl, cached, marker, whole, replayed, _counts(table, "seen_any_scope_blocks"), trace_block, grid
    )
    lru = floats(table, "lru_hit_blocks")
    judged = np.isfinite(lru)
    lru_blocks = np.minimum(np.nan_to_num(lru, nan=0.0).astype(np.int64), whole)
    theoretical = np.minimum(_counts(table, "theoretical_hit_blocks"), whole) * trace_block
    return CacheMisses(
        requests=int(reporting.size),
        prompt_tokens=int(isl.sum()),
        uncached_tokens=int((isl - np.clip(cached, 0, isl)).sum()),
        seen_not_hit_tokens=int(split.seen_not_hit.sum()),
        block_boundary_tokens=int(split.block_boundary.sum()),
        cache_bust_scope_tokens=int(split.cache_bust_scope.sum()),
        first_seen_tokens=int(split.first_seen.sum()),
        trace_block_size=trace_block,
        server_block_size=grid,
        server_block_size_known=server_block is not None,
        achieved_hit_rate=_share(cached, isl),
        theoretical_hit_rate=_share(theoretical, isl) if has(table, "theoretical_hit_blocks") else None,
        replayed_hit_rate=_share(grid_tokens(marker, replayed, isl, trace_block, grid), isl),
        lru_hit_rate=_share(
            grid_tokens(marker[judged], lru_blocks[judged], isl[judged], trace_block, grid), isl[judged]
        )
        if judged.any()
        else None,
        lru_capacity_tokens=capacity,
    )


def _share(tokens: IntArray, isl: IntArray) -> float | None:
    """Σ tokens (each held within its prompt) / Σ prompt tokens; None without prompt tokens."""
    prompt = int(isl.sum())
    return float(np.clip(tokens, 0, isl).sum()) / prompt if prompt > 0 else None
