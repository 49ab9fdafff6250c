"""End-of-run summary and `agentx report` on a 1-hour run's records: peak RSS and time, whatever the run's length.

Writes a synthetic records.arrow of a 1-hour AgentX run at concurrency 256 (`--records` requests, ~`--chunks`
content chunks each: 160k requests and ~160M chunk timestamps by default, 0.6 GB on disk) with the real schema and
writer (agentx.records.record, agentx.records.writer: the stream a run writes, finalized into the zstd IPC file a
clean end leaves), a batch of rows at a time, so the generator never holds the chunk lists of the whole run. Then,
each in a fresh subprocess (so that its peak RSS, `VmHWM`, is its own):

- **end-of-run summary**: what a replay does once its requests are done (agentx.run.replay's `_finish`: the
  records read back and summarized, the acceptance, the validity, the audit, run.json written);
- **`agentx report RUN`**: the report of the folder (run.json read);
- **`agentx report RUN --plots`**: the same with its plots, which read the records;
- **`agentx report RECORDS_ONLY`**: a folder with records.arrow alone (a run that never wrote run.json): the report
  summarizes the records itself.

Targets (bench/README.md): the end-of-run summary < 1 GB peak RSS and < 30 s on the 1-hour file. Prints figures
beside the targets; never fails on a number.

Usage: .venv/bin/python bench/summary_memory.py [--records 160000] [--chunks 1000] [--repeat 1]
       [--out bench/out/summary_memory] [--keep] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
LANES = 256
DURATION_S = 3600.0
TRACE_BLOCK = 64
SERVER_BLOCK = 16
SEED = 1_733
BATCH_ROWS = 2048
TARGET_SUMMARY_RSS_MB = 1_000.0
TARGET_SUMMARY_S = 30.0
NS = 1_000_000_000

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# ---------------------------------------------------------------------------------------------
# the synthetic run


def _uuids(rng: np.random.Generator, count: int) -> list[str]:
    return [str(uuid.UUID(bytes=bytes(row))) for row in rng.integers(0, 256, size=(count, 16), dtype=np.uint8)]


class _Rows:
    """Every request of the run without its chunk lists, in completion order: the per-request columns are small
    (what the summary itself holds); the chunk lists are drawn a batch at a time when written."""

    def __init__(self, records: int, chunks: int, rng: np.random.Generator) -> None:
        per_lane = -(-records // LANES)
        shape = (LANES, per_lane)
        # Chunks per request: lognormal around `chunks`, 1 for the warmup primers (each lane's first request).
        n_chunks = np.clip(rng.lognormal(np.log(chunks) - 0.125, 0.5, shape), 1, 16 * chunks).astype(np.int64)
        n_chunks[:, 0] = 1
        think_ns = (rng.lognormal(np.log(0.4), 0.8, shape) * NS).astype(np.int64)
        lag_ns = rng.exponential(150e3, shape).astype(np.int64)
        ttft_ns = (rng.lognormal(np.log(0.25), 0.6, shape) * NS).astype(np.int64)
        # The mean gap that makes each lane's requests last the run's hour.
        gap_ns = (DURATION_S / per_lane - 0.4 - 0.3) / chunks * NS
        decode_ns = ((n_chunks - 1) * gap_ns * rng.lognormal(0, 0.25, shape)).astype(np.int64)
        tail_ns = rng.integers(200_000, 2_000_000, shape)
        steps = think_ns + lag_ns + ttft_ns + decode_ns + tail_ns
        end = np.cumsum(steps, axis=1) + rng.integers(0, NS // 2, (LANES, 1))
        scheduled = end - steps + think_ns
        sent = scheduled + lag_ns
        first = sent + ttft_ns
        last = first + decode_ns
        lane = np.broadcast_to(np.arange(LANES, dtype=np.int64)[:, None], shape)
        position = np.broadcast_to(np.arange(per_lane, dtype=np.int64)[None, :], shape)
        # Plays of 10-60 turns along each lane (a tree: its root's turns, a few as a subagent's).
        new_play = (rng.random(shape) < 1 / 30) | (position <= 1)
        play_in_lane = np.cumsum(new_play, axis=1) - 1
        play = play_in_lane * LANES + lane
        turn_start = np.maximum.accumulate(np.where(new_play, position, 0), axis=1)
        turn = position - turn_start
        warmup = position == 0
        # Errors: 1% of the profiling requests; the run's end cancels each lane's last request.
        error = (rng.random(shape) < 0.01) & ~warmup
        cancelled = position == per_lane - 1
        order = np.argsort((end + np.where(cancelled, NS, 0)).ravel(), kind="stable")[:records]

        def flat(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.asarray(values).ravel()[order]

        self.count = order.size
        self.lane, self.play, self.turn = flat(lane), flat(play), flat(turn)
        self.warmup, self.error, self.cancelled = flat(warmup), flat(error), flat(cancelled)
        self.scheduled, self.sent, self.first, self.last = flat(scheduled), flat(sent), flat(first), flat(last)
        self.end = flat(end) + np.where(self.cancelled, NS, 0)
        self.n_chunks = flat(n_chunks)
        self.think_s = flat(think_ns) / 1e9
        self.depth = np.where((self.turn % 7 == 3) & ~self.warmup, 1, 0)
        self.isl = 2_000 + self.turn * 1_400 + rng.integers(0, 400, self.count)
        self.request_id = _uuids(rng, self.count)
        # The request that released each one: the one before it in its lane (same play), as the chain of turns.
        lane_order = np.lexsort((flat(position), self.lane))
        released = [""] * self.count
        same_play = self.play[lane_order][1:] == self.play[lane_order][:-1]
        for previous, row in zip(lane_order[:-1][same_play].tolist(), lane_order[1:][same_play].tolist(), strict=True):
            released[row] = self.request_id[previous]
        self.released_by = released
        self.play_ids = _uuids(rng, int(self.play.max()) + 1)


def _batch(rows: _Rows, start: int, stop: int, run_id: str, rng: np.random.Generator) -> dict[str, Any]:
    """Rows [start, stop) as the records' columns, their chunk lists drawn now."""
    index = np.arange(start, stop)
    n = index.size
    error, cancelled, warmup = rows.error[index], rows.cancelled[index], rows.warmup[index]
    failed = error | cancelled
    chunks = rows.n_chunks[index].copy()
    # A failed request streamed part of its answer (or nothing, for an HTTP error).
    chunks = np.where(failed, (chunks * rng.random(n)).astype(np.int64), chunks)
    first, last = rows.first[index], rows.last[index].copy()
    # The chunk times: the first at the first token, the others spaced by gamma-distributed gaps (some 0: chunks read
    # together; a few long stalls), scaled to end at the last token.
    total = int(chunks.sum())
    weights = rng.gamma(4.0, 1.0, total)
    weights[rng.random(total) < 0.015] = 0.0
    weights[rng.random(total) < 0.0005] *= 60.0
    starts = np.concatenate(([0], np.cumsum(chunks)[:-1]))
    has = chunks > 0
    weights[starts[has]] = 0.0  # no gap before a request's first chunk
    cumulative = np.cumsum(weights)
    base = np.repeat(cumulative[starts[has]], chunks[has])
    owner = np.repeat(np.arange(n), chunks)
    row_total = np.add.reduceat(weights, starts[has]) if has.any() else np.zeros(0)
    span = np.zeros(n)
    span[has] = row_total
    decode = np.where(failed, ((last - first) * rng.random(n)).astype(np.int64), last - first)
    scale = np.where(span > 0, decode / np.where(span > 0, span, 1.0), 0.0)
    times = first[owner] + ((cumulative - base) * scale[owner]).astype(np.int64)
    last = np.where(has, first + np.where(span > 0, decode, 0), 0)
    if times.size:
        ends = starts[has] + chunks[has] - 1
        times[ends] = last[has]
    tokens = np.where(rng.random(total) < 0.08, rng.integers(2, 5, total), 1).astype(np.int32)
    tokens[starts[has]] = 1
    streamed = np.bincount(owner, weights=tokens, minlength=n).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(chunks))).astype(np.int32)
    sent, scheduled, end = rows.sent[index], rows.scheduled[index], rows.end[index]
    end = np.where(has, np.maximum(end, last), end)
    first_token: list[int | None] = [int(t) if h else None for t, h in zip(first.tolist(), has.tolist(), strict=True)]
    last_token: list[int | None] = [int(t) if h else None for t, h in zip(last.tolist(), has.tolist(), strict=True)]
    isl = rows.isl[index]
    blocks = isl // TRACE_BLOCK
    hit = np.where(rows.turn[index] == 0, 0, np.maximum(blocks - 25, 0))
    osl_server = [None if f else int(s) for f, s in zip(failed.tolist(), streamed.tolist(), strict=True)]
    osl = streamed
    ttft = np.where(has, (first - sent) / 1e9, np.nan)
    e2el = np.where(has, (last - sent) / 1e9, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(has & (osl >= 2), (last - first) / 1e9 / (osl - 1), np.nan)
    plays = rows.play[index]
    kinds = np.where(cancelled, "cancelled", np.where(error, "http", ""))
    return {
        "run_id": [run_id] * n,
        "phase": np.where(warmup, "warmup", "profiling").tolist(),
        "lane": rows.lane[index].astype(np.int32),
        "play": plays,
        "session_id": [f"session_{p % 20:03d}" for p in plays.tolist()],
        "agent_id": np.where(rows.depth[index] == 1, "task:1", "").tolist(),
        "depth": rows.depth[index].astype(np.int32),
        "turn": rows.turn[index].astype(np.int32),
        "model": ["bench-model"] * n,
        "correlation_id": [rows.play_ids[p] for p in plays.tolist()],
        "root_correlation_id": [rows.play_ids[p] for p in plays.tolist()],
        "parent_correlation_id": [""] * n,
        "request_id": rows.request_id[start:stop],
        "scheduled_ns": scheduled,
        "queued_ns": sent - 20_000,
        "sent_ns": sent,
        "response_ns": np.minimum(sent + (first - sent) * 9 // 10, end),
        "first_token_ns": first_token,
        "last_token_ns": last_token,
        "end_ns": end,
        "chunk_times_ns": _lists(offsets, times, np.int64),
        "chunk_tokens": _lists(offsets, tokens, np.int32),
        "isl_recorded_tokens": isl,
        "isl_sent_tokens": isl + 8,
        "cache_bust_tokens": np.full(n, 8),
        "isl_server_tokens": isl + 8,
        "osl_recorded_tokens": rows.n_chunks[index],
        "osl_server_tokens": osl_server,
        "osl_streamed_tokens": streamed,
        "tokens_estimated": np.zeros(n, dtype=bool),
        "cached_tokens": [
            None if f else int(h * TRACE_BLOCK) for f, h in zip(failed.tolist(), hit.tolist(), strict=True)
        ],
        "theoretical_hit_blocks": hit,
        "theoretical_total_blocks": blocks,
        "replayed_hit_blocks": hit,
        "api_time_recorded_s": (end - sent) / 1e9 * 0.8,
        "ttft_recorded_s": np.where(has, ttft * 0.9, 0.3),
        "status": np.where(failed, "error", "ok").tolist(),
        "error_kind": [k or None for k in kinds.tolist()],
        "timeout_kind": [None] * n,
        "error_message": [("HTTP 500: internal error" if k == "http" else None) for k in kinds.tolist()],
        "http_status": [None if k == "cancelled" else (500 if k == "http" else 200) for k in kinds.tolist()],
        "connection_retries": np.zeros(n, dtype=np.int32),
        "dispatch_lag_s": (sent - scheduled) / 1e9,
        "ttft_s": _nullable(ttft),
        "e2el_s": _nullable(e2el),
        "tpot_s": _nullable(tpot),
        "slo_met": [None] * n,
        "worker": np.zeros(n, dtype=np.int32),
        "node": ["bench"] * n,
        "released_by_request_id": rows.released_by[start:stop],
        "think_s": _nullable(np.where(warmup, np.nan, rows.think_s[index])),
        "idle_cut_s": _nullable(np.where(warmup, np.nan, 0.0)),
        "join_wait_s": _nullable(np.where(warmup, np.nan, 0.0)),
        "seen_any_scope_blocks": hit,
        "lru_hit_blocks": np.maximum(hit - 3, 0),
    }


def _lists(offsets: npt.NDArray[np.int32], values: npt.NDArray[Any], dtype: type) -> Any:
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values.astype(dtype)))


def _nullable(values: FloatArray) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.float64(), mask=~np.isfinite(values))


def _default(name: str, rows: int) -> list[Any]:
    """A column the generator does not set (one added since): `RequestRecord`'s default for every row."""
    import msgspec

    from agentx.records.record import RequestRecord

    field = next(f for f in msgspec.structs.fields(RequestRecord) if f.name == name)
    if field.default_factory is not msgspec.NODEFAULT:
        return [field.default_factory() for _ in range(rows)]
    return [None if field.default is msgspec.NODEFAULT else field.default] * rows


def _options(folder: Path) -> tuple[Any, dict[str, Any]]:
    from agentx.replayer.options.replay import AgentxLoad, ReplayOptions, Runtime, Scenario, Server, flat_options

    options = ReplayOptions(
        server=Server(url="http://127.0.0.1:8000", model="bench-model"),
        out_dir=folder,
        overwrite=True,
        load=AgentxLoad(concurrency=LANES),
        scenario=Scenario(duration_s=DURATION_S, seed=SEED),
        runtime=Runtime(quiet_gc=True, fast_thread_switch=True),
    )
    metadata = flat_options(options)
    metadata["trace"] = {"dropped_sessions": [], "block_size": TRACE_BLOCK}
    metadata["locks_broken"] = []
    metadata["unsafe_override"] = False
    metadata["detected"] = {
        "stream_usage": "continuous",
        "stream_usage_assumed": None,
        "calibration": None,
        "server_cache": {"block_size": SERVER_BLOCK, "num_gpu_blocks": 200_000},
    }
    return options, metadata


def generate(folder: Path, records: int, chunks: int) -> dict[str, Any]:
    """Write `folder/records.arrow` (and `folder/run.json.in`: what the summary needs besides) batch by batch."""
    import msgspec
    import pyarrow as pa

    from agentx.records.record import SCHEMA, RunInfo
    from agentx.records.writer import RecordWriter
    from agentx.replayer.run_result import RunResult

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    run_id = uuid.UUID(int=SEED).hex
    started = time.perf_counter()
    rows = _Rows(records, chunks, rng)
    _, metadata = _options(folder)
    stamps = 0
    path = folder / "records.arrow"
    with RecordWriter(path, RunInfo(run_id=run_id, wall_epoch_ns=1_750_000_000 * NS, options=metadata)) as writer:
        for start in range(0, rows.count, BATCH_ROWS):
            columns = _batch(rows, start, min(start + BATCH_ROWS, rows.count), run_id, rng)
            n = len(columns["run_id"])
            table = pa.table({f.name: columns.get(f.name, _default(f.name, n)) for f in SCHEMA}, schema=SCHEMA)
            stamps += len(columns["chunk_times_ns"].values)
            writer.write_table(table)
    profiling_start = int(rows.scheduled[~rows.warmup].min())
    run = RunResult(
        run_id=run_id,
        records_path=path,
        requests=rows.count,
        errors=int(rows.error.sum()),
        trees_started=int(np.unique(rows.play).size),
        trees_finished=int(np.unique(rows.play).size) - LANES,
        interrupted=False,
        elapsed_s=float(rows.end.max()) / 1e9,
        cancelled=int(rows.cancelled.sum()),
        loop_lag_s=rng.exponential(0.0005, int(DURATION_S * 10)).tolist(),
        stream_usage="continuous",
        warmup_requests=int(rows.warmup.sum()),
        profiling_start_ns=profiling_start,
    )
    (folder / "run.json.in").write_bytes(msgspec.json.encode(run, enc_hook=str))
    return {
        "rows": rows.count,
        "stamps": stamps,
        "bytes": path.stat().st_size,
        "span_s": (float(rows.end.max()) - profiling_start) / 1e9,
        "seconds": time.perf_counter() - started,
    }


# ---------------------------------------------------------------------------------------------
# measurements, each in a fresh subprocess (`--worker`)


def _peak_rss_mb() -> float:
    """This process's peak RSS since it started (exec), in MB."""
    # ru_maxrss would do, but Linux carries the parent's RSS at fork over to the child's: VmHWM is this process's own.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB  # KiB on Linux


def _worker(kind: str, paths: Sequence[str]) -> dict[str, Any]:
    """One measurement in this (fresh) process; returns its figures."""
    import contextlib
    import io

    import msgspec

    from agentx.replayer.run_result import RunResult

    figures: dict[str, Any] = {}
    if kind == "summary":
        from agentx.run import replay as run_replay

        folder = Path(paths[0])
        options, _ = _options(folder)
        run = msgspec.json.decode((folder / "run.json.in").read_bytes(), type=RunResult, dec_hook=_path)
        figures["baseline_rss_mb"] = _peak_rss_mb()
        start = time.perf_counter()
        result = run_replay._finish(options, run, None, None, 8, None)
        figures["duration_s"] = time.perf_counter() - start
        itl = result.summary.latency.itl_s
        figures["itl_count"] = itl.count if itl is not None else 0
    elif kind == "report":
        from agentx.cli import main

        figures["baseline_rss_mb"] = _peak_rss_mb()
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["report", *paths])
        figures["duration_s"] = time.perf_counter() - start
    else:
        raise ValueError(kind)
    figures["rss_mb"] = _peak_rss_mb()
    return figures


def _path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(kind)


def _measure(kind: str, *arguments: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", kind, json.dumps(arguments)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


# ---------------------------------------------------------------------------------------------
# report


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:8.1f}"
    return f"{statistics.median(values):8.1f} ({min(values):.1f}–{max(values):.1f})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=160_000, help="requests in the run (default 160,000)")
    parser.add_argument("--chunks", type=int, default=1_000, help="mean content chunks a request (default 1,000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (default 1)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "summary_memory", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--reuse", action="store_true", help="reuse the files a --keep run left")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker[0], json.loads(args.worker[1]))))
        return
    run_dir, records_only, plots = args.out / "run", args.out / "records-only", args.out / "plots"
    if not (args.reuse and (run_dir / "run.json.in").is_file()):
        shutil.rmtree(args.out, ignore_errors=True)
        free = shutil.disk_usage(args.out.parent if args.out.parent.exists() else ROOT).free
        needed = args.records * args.chunks * 20
        if free < needed:
            sys.exit(f"{needed / 1e9:.1f} GB free needed in {args.out.parent}, {free / 1e9:.1f} GB found")
        print(f"writing a {args.records:,}-request run of ~{args.chunks:,} chunks a request into {run_dir} …")
        made = generate(run_dir, args.records, args.chunks)
        print(
            f"  {made['rows']:,} records, {made['stamps']:,} chunk timestamps, {made['span_s'] / 60:.0f} min of "
            f"profiling, records.arrow {made['bytes'] / MB:,.0f} MB, written in {made['seconds']:.0f} s"
        )
    records_only.mkdir(parents=True, exist_ok=True)
    if not (records_only / "records.arrow").exists():
        os.link(run_dir / "records.arrow", records_only / "records.arrow")
    measured: dict[str, list[dict[str, Any]]] = {}
    steps: list[tuple[str, str, list[str]]] = [
        ("end-of-run summary", "summary", [str(run_dir)]),
        ("agentx report RUN", "report", [str(run_dir)]),
        ("agentx report RUN --plots", "report", [str(run_dir), "--plots", str(plots)]),
        ("agentx report RECORDS_ONLY", "report", [str(records_only)]),
    ]
    for _ in range(args.repeat):
        for label, kind, arguments in steps:
            measured.setdefault(label, []).append(_measure(kind, *arguments))
    print(f"\n{args.repeat} run(s) of each, every run in a fresh subprocess; the records are in the page cache.\n")
    print(f"{'':28s} {'peak RSS (MB)':>22s} {'time (s)':>22s}  target")
    for label, runs in measured.items():
        rss = _spread([r["rss_mb"] for r in runs])
        seconds = _spread([r["duration_s"] for r in runs])
        target = ""
        if label == "end-of-run summary":
            peak, took = statistics.median(r["rss_mb"] for r in runs), statistics.median(r["duration_s"] for r in runs)
            holds = peak < TARGET_SUMMARY_RSS_MB and took < TARGET_SUMMARY_S
            target = f"< {TARGET_SUMMARY_RSS_MB:,.0f} MB and < {TARGET_SUMMARY_S:g} s: {'holds' if holds else 'MISSED'}"
        print(f"{label:28s} {rss:>22s} {seconds:>22s}  {target}")
    base = statistics.median(r["baseline_rss_mb"] for r in measured["end-of-run summary"])
    print(f"\n(the worker's RSS before it starts, imports included: {base:.0f} MB)")
    if not args.keep:
        shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
