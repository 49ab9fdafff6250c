"""A small sweep on the simulator (levels 1, 2, 4 on 2 GPUs of H100) that the sweep, report and page tests read."""

from __future__ import annotations

from pathlib import Path

from builders import make_request, make_session, make_trace

from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Runtime, Scenario, Server
from agentx.run.sweep import (
    SweepOptions,
    SweepResult,
    sweep_sync,
)
from agentx.sim.engine.loop import EngineConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Trace

BLOCK = 16
LEVELS = (1, 2, 4)
GPUS = 2
# A step costs 4 ms + 2 ms per running sequence (simulated): batching raises throughput (b / (4 + 2b) tokens per
# ms) and lowers each user's speed (1 / (4 + 2b)) by margins no scheduling noise on a busy machine can hide.
ENGINE = EngineConfig(step_overhead_s=0.004, decode_s_per_token=0.002, time_scale=0.25, block_size=BLOCK)


def small_trace(sessions: int = 6, turns: int = 4, out_tokens: int = 40) -> Trace:
    """Sessions of growing-context turns, short enough for a level to recycle trees many times."""
    result = []
    for s in range(sessions):
        requests = [
            make_request(
                float(i), 48 + 16 * i, out_tokens, api_time=0.5, added=tuple(range(1000 * s, 1000 * s + 3 + i))
            )
            for i in range(turns)
        ]
        result.append(make_session(f"s{s}", requests))
    return make_trace(*result, block_size=BLOCK)


def base_options(sim: SimServer, out_dir: Path) -> ReplayOptions:
    return ReplayOptions(
        server=Server(url=sim.url, model=sim.model),
        out_dir=out_dir,
        load=ClosedLoad(),
        scenario=Scenario(delay_scale=0.0, duration_s=1.2),
        runtime=Runtime(grace_s=5.0),
    )


def run_small_sweep(out_dir: Path) -> SweepResult:
    """The sweep the report tests read too: levels 1, 2, 4 on 2 GPUs of H100."""
    with SimServer(ENGINE) as sim:
        options = SweepOptions(concurrency=LEVELS, out_dir=out_dir, num_gpus=GPUS, gpu_sku="h100", trace_label="small")
        return sweep_sync(small_trace(), base_options(sim, out_dir), options)
