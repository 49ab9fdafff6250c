"""`--workers N`: one replay sharded over N processes, each with its own event loop, records merged at the end.

For when one core cannot keep up with the load (bench/README.md, Targets). Worker `i` runs `run_replay` with
`shard=(i, N)`: lanes i, i+N, ... and the trees at positions ≡ i (mod N) of the one shared session order,
so the union of the workers is the single-process run's plan (same plays, same lanes, same seed), only
spread over cores. Each worker loads the trace itself (Arrow loads in well under a second), writes
`workers/<i>/records.arrow` as it goes, and leaves its `RunResult` beside it (pickled); the parent then
merges the records into `records.arrow` on one clock (`merge_records`) and sums the results.

Ctrl-C reaches every process of the group: each worker drains like a single run does (grace period,
flush), and the parent merges what they wrote. Per-record callbacks do not cross processes: a sharded
run reports progress by its workers' files only.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import uuid
from pathlib import Path
from typing import Final

import msgspec

from agentx.errors import ServerError, WorkerFailed
from agentx.records.run_folder import RECORDS_FILE, refuse_existing_run
from agentx.records.writer import merge_records
from agentx.replayer.options.limits import check_shards
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.run_replay import run_replay
from agentx.replayer.run_result import RunResult, combined
from agentx.replayer.schedule.clock import loop_factory
from agentx.trace.io import Format, load_trace

WORKERS_DIR: Final = "workers"
RESULT_FILE: Final = "result.pickle"


def _work(
    trace_path: str, trace_format: Format | None, block_size: int | None, options: ReplayOptions, result_path: str
) -> None:
    """A worker process: load the trace, run its shard, leave the result (pickled: it holds paths)."""
    trace = load_trace(trace_path, format=trace_format, block_size=block_size)
    outcome: RunResult | Exception
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            outcome = runner.run(run_replay(trace, options))
    except (ServerError, ValueError) as exc:
        outcome = exc  # a user-facing error: the parent raises it, once, instead of N tracebacks
    Path(result_path).write_bytes(pickle.dumps(outcome))


def run_workers(
    trace_path: str | os.PathLike[str],
    options: ReplayOptions,
    workers: int,
    *,
    trace_format: Format | None = None,
    block_size: int | None = None,
) -> RunResult:
    """Run `options` over `workers` processes (module docstring); returns the merged result. Each worker
    loads `trace_path` with `load_trace(trace_path, format=trace_format, block_size=block_size)`."""
    check_shards(options.load, workers)
    out_dir = Path(options.out_dir)
    refuse_existing_run(out_dir, options.overwrite)
    run_id = options.runtime.run_id or uuid.uuid4().hex
    context = multiprocessing.get_context("spawn")  # no inherited event loop, sockets or threads
    processes: list[tuple[multiprocessing.process.BaseProcess, Path]] = []
    for index in range(workers):
        worker_dir = out_dir / WORKERS_DIR / str(index)
        worker_dir.mkdir(parents=True, exist_ok=True)
        # The shard folders are the run's own scratch space, replaced with it.
        runtime = msgspec.structs.replace(options.runtime, run_id=run_id, shard=(index, workers))
        shard = msgspec.structs.replace(options, out_dir=worker_dir, runtime=runtime, overwrite=True)
        result_path = worker_dir / RESULT_FILE
        result_path.unlink(missing_ok=True)
        args = (os.fspath(trace_path), trace_format, block_size, shard, str(result_path))
        process = context.Process(target=_work, args=args, name=f"agentx-worker-{index}")
        process.start()
        processes.append((process, result_path))
    interrupted = False
    for started, _ in processes:
        while True:
            try:
                started.join()
                break
            except KeyboardInterrupt:
                interrupted = True  # the workers got the same SIGINT and are draining: keep waiting
    results = []
    for index, (finished, result_path) in enumerate(processes):
        if not result_path.exists():
            raise WorkerFailed(
                f"worker {index} exited with code {finished.exitcode} and no result; see its output above "
                f"(its records, if any: {result_path.parent / RECORDS_FILE})"
            )
        outcome = pickle.loads(result_path.read_bytes())
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, RunResult)
        results.append(outcome)
    records_path = out_dir / RECORDS_FILE
    merge_records([result.records_path for result in results], records_path)
    return combined(results, run_id=run_id, records_path=records_path, interrupted=interrupted)
