"""agentx: replay agentic LLM workloads against OpenAI-compatible inference servers.

The public API, small on purpose; everything else may change between versions. The replay flow lives here; traces,
their synthesis and the simulated server are namespaces of their own: `agentx.trace`, `agentx.synth`, `agentx.sim`.

Replaying:
    trace = agentx.trace.load_trace(path)
    await replay(trace, ReplayOptions(server=Server(url=..., model=...), out_dir=..., load=AgentxLoad(concurrency=N)))
        -> ReplayResult
The options are parts: Server, Connection, the load (AgentxLoad, ClosedLoad, TraceLoad, RateLoad), Scenario (its
`slo`: Slos), Speculative, Runtime (`Runtime(quiet_gc=True, fast_thread_switch=True)` lets the run change
process-wide settings, as the CLI does; off for a library caller; `Runtime(workers=N)` runs N processes of this host,
with `ray="auto"` N actors on a Ray cluster, docs/distributed.md).
    await replay(trace, options, RunHooks(on_record=..., on_sent=..., on_profiling=...)) hears of each request as it
    goes (a run over `workers` processes refuses them: its records meet at its end).
    RunHooks(stops=RunStops()): `stops.stop()` ends the run early with its partial result (the first as its deadline
    would, the second ending the grace period; RunStopped if it had not started). Cancelling the task ends the run at
    once, writes its files and raises CancelledError (TimeoutError under `asyncio.timeout`).
    replay_sync(trace, options) for code without an event loop; `result.summary`, `result.run.records_path`.
    stream_replay(trace, options) -> ReplayStream, an async iterator of RequestRecord as requests finish
    (`async with ... as stream: async for record in stream`; then `stream.result`), for harnesses.
    prepare_trace(trace, options) -> PreparedTrace, the trace prepared once for several runs.
Every run writes `records.arrow` and, at its end, `run.json` (options without secrets, RunResult, Summary).
An `out_dir` that already holds a run is refused (RunExists) unless `ReplayOptions(overwrite=True)`; a sweep's
unless `SweepOptions(resume=True)` or `overwrite=True`.

Sweeping concurrency (one replay per level, same seed; OUT/c{N}/ per level, OUT/sweep.json the index):
    await sweep(trace, options, SweepOptions(concurrency=(1, 2, 4, 8), out_dir=OUT, num_gpus=8)) -> SweepResult
    sweep_sync(trace, options, sweep_options) for code without an event loop; `result.levels[i].summary`.
Per-level settings (forced AL/K, extra body) as `SweepOptions.level_settings = {64: LevelSettings(...)}`;
`agentx report OUT` turns a sweep into the frontier, $/M and plots (docs/results.md).

Decode-only speed (tokens/s per user with prefill excluded, beside the realized speculative acceptance):
    await decode(DecodeOptions(server=Server(url=..., model=...), osl_tokens=1000, repetitions=5)) -> DecodeResult
    decode_sync(options) for code without an event loop.

Results:
    read_records(path) -> pyarrow.Table of a run's records (RequestRecord rows, crash-safe)
    summarize(table, num_gpus=None, server_metrics=None, loop_lag_s=None) -> Summary

Traces (`agentx.trace`): load_trace, save_trace, detect_format, validate, trace_stats (TraceStats); the model Trace,
Session, Agent, Request, Provenance; Findings; ChainRules.
Making traces (`agentx.synth`, docs/synth.md): from_logs (FromLogsOptions), generate(preset(...) or fit(trace)) with
SessionModel and its parts, compare -> Fidelity.
The simulated server (`agentx.sim`), for tests and harnesses without a GPU:
    with agentx.sim.SimServer(time_scale=0.01, spec_k=3, acceptance_length=2.5) as sim: sim.url, sim.model
configured by EngineConfig fields and FaultConfig (docs/sim.md).

Errors: one tree (agentx/errors.py), each message one paragraph naming the place (the command line exits 2, 3 for
a RunError, 4 for a WriteFailed):
    AgentxError
      TraceError   a trace that cannot be used (each problem a Finding)
      ConfigError  an option or an input file to change (RunExists, RecordsError, ...); a ValueError too
      ServerError  ServerUnreachable, ModelNotServed, CalibrationError, WarmupFailed
      RunError     a run that could not complete (WorkerFailed, ClusterError, RunStopped)
      StorageError the run's files refused by the OS: OutputUnwritable at the start (nothing sent), WriteFailed
                   once it ran (a RunError too, exit 4: it stopped early; `result` holds what it kept)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentx.exports import lazy_exports

if TYPE_CHECKING:
    from agentx import sim as sim
    from agentx import synth as synth
    from agentx import trace as trace
    from agentx.errors import AgentxError as AgentxError
    from agentx.errors import CalibrationError as CalibrationError
    from agentx.errors import ClusterError as ClusterError
    from agentx.errors import ConfigError as ConfigError
    from agentx.errors import Finding as Finding
    from agentx.errors import ModelNotServed as ModelNotServed
    from agentx.errors import OutputUnwritable as OutputUnwritable
    from agentx.errors import RecordsError as RecordsError
    from agentx.errors import RunError as RunError
    from agentx.errors import RunExists as RunExists
    from agentx.errors import RunStopped as RunStopped
    from agentx.errors import ServerError as ServerError
    from agentx.errors import ServerUnreachable as ServerUnreachable
    from agentx.errors import StorageError as StorageError
    from agentx.errors import TraceError as TraceError
    from agentx.errors import WarmupFailed as WarmupFailed
    from agentx.errors import WorkerFailed as WorkerFailed
    from agentx.errors import WriteFailed as WriteFailed
    from agentx.records.record import RequestRecord as RequestRecord
    from agentx.records.record import read_records as read_records
    from agentx.replayer.options.replay import AgentxLoad as AgentxLoad
    from agentx.replayer.options.replay import ClosedLoad as ClosedLoad
    from agentx.replayer.options.replay import Connection as Connection
    from agentx.replayer.options.replay import DecodeOptions as DecodeOptions
    from agentx.replayer.options.replay import RateLoad as RateLoad
    from agentx.replayer.options.replay import ReplayOptions as ReplayOptions
    from agentx.replayer.options.replay import Runtime as Runtime
    from agentx.replayer.options.replay import Scenario as Scenario
    from agentx.replayer.options.replay import Server as Server
    from agentx.replayer.options.replay import Speculative as Speculative
    from agentx.replayer.options.replay import TraceLoad as TraceLoad
    from agentx.replayer.options.slo import Slos as Slos
    from agentx.replayer.plan.play import PreparedTrace as PreparedTrace
    from agentx.replayer.plan.preparation import prepare_trace as prepare_trace
    from agentx.replayer.run_result import RunResult as RunResult
    from agentx.replayer.schedule.hooks import RunHooks as RunHooks
    from agentx.replayer.schedule.stops import RunStops as RunStops
    from agentx.replayer.telemetry.metrics import ServerMetrics as ServerMetrics
    from agentx.results.summary.summarize import Summary as Summary
    from agentx.results.summary.summarize import summarize as summarize
    from agentx.run.decode import DecodeResult as DecodeResult
    from agentx.run.decode import decode as decode
    from agentx.run.decode import decode_sync as decode_sync
    from agentx.run.replay import ReplayResult as ReplayResult
    from agentx.run.replay import ReplayStream as ReplayStream
    from agentx.run.replay import replay as replay
    from agentx.run.replay import replay_sync as replay_sync
    from agentx.run.replay import stream_replay as stream_replay
    from agentx.run.sweep import LevelSettings as LevelSettings
    from agentx.run.sweep import SweepOptions as SweepOptions
    from agentx.run.sweep import SweepResult as SweepResult
    from agentx.run.sweep import sweep as sweep
    from agentx.run.sweep import sweep_sync as sweep_sync

EXPORTS: dict[str, tuple[str, ...]] = {
    "agentx.errors": (
        "AgentxError",
        "CalibrationError",
        "ClusterError",
        "ConfigError",
        "Finding",
        "ModelNotServed",
        "OutputUnwritable",
        "RecordsError",
        "RunError",
        "RunExists",
        "RunStopped",
        "ServerError",
        "ServerUnreachable",
        "StorageError",
        "TraceError",
        "WarmupFailed",
        "WorkerFailed",
        "WriteFailed",
    ),
    "agentx.records.record": ("RequestRecord", "read_records"),
    "agentx.replayer.options.replay": (
        "AgentxLoad",
        "ClosedLoad",
        "Connection",
        "DecodeOptions",
        "RateLoad",
        "ReplayOptions",
        "Runtime",
        "Scenario",
        "Server",
        "Speculative",
        "TraceLoad",
    ),
    "agentx.replayer.options.slo": ("Slos",),
    "agentx.replayer.plan.play": ("PreparedTrace",),
    "agentx.replayer.plan.preparation": ("prepare_trace",),
    "agentx.replayer.run_result": ("RunResult",),
    "agentx.replayer.schedule.hooks": ("RunHooks",),
    "agentx.replayer.schedule.stops": ("RunStops",),
    "agentx.replayer.telemetry.metrics": ("ServerMetrics",),
    "agentx.results.summary.summarize": ("Summary", "summarize"),
    "agentx.run.decode": ("DecodeResult", "decode", "decode_sync"),
    "agentx.run.replay": ("ReplayResult", "ReplayStream", "replay", "replay_sync", "stream_replay"),
    "agentx.run.sweep": ("LevelSettings", "SweepOptions", "SweepResult", "sweep", "sweep_sync"),
}
"""Every public name, by the module it lives in: `__all__` and the lazy imports are made from it."""
NAMESPACES: tuple[str, ...] = ("sim", "synth", "trace")
"""The sub-packages that are namespaces of the API (`agentx.trace.load_trace`), imported when first used."""
__all__, _getattr, __dir__ = lazy_exports(__name__, EXPORTS, NAMESPACES)

if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error for them
    __getattr__ = _getattr
