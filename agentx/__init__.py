"""agentx: replay agentic LLM workloads against OpenAI-compatible inference servers.

The public API, small on purpose; everything else may change between versions.

Traces:
    load_trace(path, format=None, block_size=None, findings=None) -> Trace
    save_trace(trace, path, format=None)
    validate(trace) -> list[Finding]
    trace_stats(trace, cache_tokens=()) -> TraceStats
and the model they use: Trace, Session, Agent, Request; TraceError for unusable input.

Replaying:
    await replay(trace, ReplayOptions(server=Server(url=..., model=...), out_dir=..., load=AgentxLoad(concurrency=N)))
        -> ReplayResult
The options are parts: Server, Connection, the load (AgentxLoad, ClosedLoad, TraceLoad, RateLoad), Scenario,
Speculative, Runtime (`Runtime(quiet_gc=True, fast_thread_switch=True)` lets the run change process-wide settings,
as the CLI does; off for a library caller; `Runtime(workers=N, ray="auto")` runs N shards as actors on a Ray cluster,
docs/distributed.md).
    replay_sync(trace, options) for code without an event loop; `result.summary`, `result.run.records_path`.
    stream_replay(trace, options) -> ReplayStream, an async iterator of RequestRecord as requests finish
    (`async with ... as stream: async for record in stream`; then `stream.result`), for harnesses.
Every run writes `records.arrow` and, at its end, `run.json` (options without secrets, RunResult, Summary).
An `out_dir` that already holds a run is refused (a ValueError) unless `ReplayOptions(overwrite=True)`; a sweep's
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

Making traces (docs/synth.md):
    from_logs(paths, FromLogsOptions(format="anthropic-proxy"), salt=None) -> Trace, anonymized
    generate(preset("agentic-coding") or fit(trace), sessions=N, seed=S) -> Trace
    compare(a, b) -> Fidelity (KS distances, hit-rate curves, a verdict)

The simulated server, for tests and harnesses without a GPU:
    with SimServer(time_scale=0.01, spec_k=3, acceptance_length=2.5) as sim: sim.url, sim.model
configured by EngineConfig fields and FaultConfig (docs/sim.md).

Errors: one tree, each message one paragraph naming the place (the command line exits 2, or 3 for a RunError):
    AgentxError
      TraceError   a trace that cannot be used
      ConfigError  an option or an input file to change (a bad URL, a folder holding a run); a ValueError too
      ServerError  the server unreachable, not serving the model, failing calibration or a root warmup primer
      RunError     a run that could not complete (a worker process died)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentx.errors import AgentxError, ConfigError, Finding, RunError, ServerError, TraceError
    from agentx.records.record import RequestRecord, read_records
    from agentx.replayer.options.replay import (
        AgentxLoad,
        ClosedLoad,
        Connection,
        DecodeOptions,
        RateLoad,
        ReplayOptions,
        Runtime,
        Scenario,
        Server,
        Speculative,
        TraceLoad,
    )
    from agentx.replayer.run_result import RunResult
    from agentx.results.summary.summarize import Summary, summarize
    from agentx.run.decode import DecodeResult, decode, decode_sync
    from agentx.run.replay import ReplayResult, ReplayStream, replay, replay_sync, stream_replay
    from agentx.run.sweep import LevelSettings, SweepOptions, SweepResult, sweep, sweep_sync
    from agentx.sim.engine.config import EngineConfig
    from agentx.sim.faults import FaultConfig
    from agentx.sim.process import SimServer
    from agentx.synth.compare import Fidelity, compare
    from agentx.synth.fit import fit
    from agentx.synth.generate import generate
    from agentx.synth.logs.from_logs import FromLogsOptions, from_logs
    from agentx.synth.presets import preset
    from agentx.trace.findings import Findings
    from agentx.trace.io import detect_format, load_trace, save_trace
    from agentx.trace.model import Agent, Provenance, Request, Session, Trace
    from agentx.trace.stats import TraceStats, trace_stats
    from agentx.trace.validate import validate

__all__ = [
    "Agent",
    "AgentxError",
    "AgentxLoad",
    "ClosedLoad",
    "ConfigError",
    "Connection",
    "DecodeOptions",
    "DecodeResult",
    "EngineConfig",
    "FaultConfig",
    "Fidelity",
    "Finding",
    "Findings",
    "FromLogsOptions",
    "LevelSettings",
    "Provenance",
    "RateLoad",
    "ReplayOptions",
    "ReplayResult",
    "ReplayStream",
    "Request",
    "RequestRecord",
    "RunError",
    "RunResult",
    "Runtime",
    "Scenario",
    "Server",
    "ServerError",
    "Session",
    "SimServer",
    "Speculative",
    "Summary",
    "SweepOptions",
    "SweepResult",
    "Trace",
    "TraceError",
    "TraceLoad",
    "TraceStats",
    "compare",
    "decode",
    "decode_sync",
    "detect_format",
    "fit",
    "from_logs",
    "generate",
    "load_trace",
    "preset",
    "read_records",
    "replay",
    "replay_sync",
    "save_trace",
    "stream_replay",
    "summarize",
    "sweep",
    "sweep_sync",
    "trace_stats",
    "validate",
]

_HOMES: dict[str, str] = {
    "Agent": "agentx.trace.model",
    "AgentxError": "agentx.errors",
    "AgentxLoad": "agentx.replayer.options.replay",
    "ClosedLoad": "agentx.replayer.options.replay",
    "ConfigError": "agentx.errors",
    "Connection": "agentx.replayer.options.replay",
    "DecodeOptions": "agentx.replayer.options.replay",
    "DecodeResult": "agentx.run.decode",
    "EngineConfig": "agentx.sim.engine.config",
    "FaultConfig": "agentx.sim.faults",
    "Fidelity": "agentx.synth.compare",
    "Finding": "agentx.errors",
    "Findings": "agentx.trace.findings",
    "FromLogsOptions": "agentx.synth.logs.from_logs",
    "LevelSettings": "agentx.run.sweep",
    "Provenance": "agentx.trace.model",
    "RateLoad": "agentx.replayer.options.replay",
    "ReplayOptions": "agentx.replayer.options.replay",
    "ReplayResult": "agentx.run.replay",
    "ReplayStream": "agentx.run.replay",
    "Request": "agentx.trace.model",
    "RequestRecord": "agentx.records.record",
    "RunError": "agentx.errors",
    "RunResult": "agentx.replayer.run_result",
    "Runtime": "agentx.replayer.options.replay",
    "Scenario": "agentx.replayer.options.replay",
    "Server": "agentx.replayer.options.replay",
    "ServerError": "agentx.errors",
    "Session": "agentx.trace.model",
    "SimServer": "agentx.sim.process",
    "Speculative": "agentx.replayer.options.replay",
    "Summary": "agentx.results.summary.summarize",
    "SweepOptions": "agentx.run.sweep",
    "SweepResult": "agentx.run.sweep",
    "Trace": "agentx.trace.model",
    "TraceError": "agentx.errors",
    "TraceLoad": "agentx.replayer.options.replay",
    "TraceStats": "agentx.trace.stats",
    "compare": "agentx.synth.compare",
    "decode": "agentx.run.decode",
    "decode_sync": "agentx.run.decode",
    "detect_format": "agentx.trace.io",
    "fit": "agentx.synth.fit",
    "from_logs": "agentx.synth.logs.from_logs",
    "generate": "agentx.synth.generate",
    "load_trace": "agentx.trace.io",
    "preset": "agentx.synth.presets",
    "read_records": "agentx.records.record",
    "replay": "agentx.run.replay",
    "replay_sync": "agentx.run.replay",
    "save_trace": "agentx.trace.io",
    "stream_replay": "agentx.run.replay",
    "summarize": "agentx.results.summary.summarize",
    "sweep": "agentx.run.sweep",
    "sweep_sync": "agentx.run.sweep",
    "trace_stats": "agentx.trace.stats",
    "validate": "agentx.trace.validate",
}
"""The module each public name lives in. It is imported when the name is first used (module `__getattr__`, PEP 562),
so that `import agentx` (and the command line, which starts with it) does not load the replay engine, pyarrow,
numpy or aiohttp before a command needs them."""


if not TYPE_CHECKING:  # type checkers see the imports above, and an unknown name stays an error for them

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'agentx' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # once: later uses are plain attribute lookups
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
