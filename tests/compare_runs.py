"""The trace and the simulated sweep that the compare and gate tests measure (tests/results/test_compare.py and
tests/results/test_compare_gate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flat import replay_options

from agentx.run.sweep import SweepOptions, sweep_sync
from agentx.sim.engine.config import EngineConfig
from agentx.sim.process import SimServer
from agentx.trace.model import Agent, Request, Session, Trace

BLOCK = 16


def compare_trace() -> Trace:
    """Ten sessions of four turns, each its own: prompt growth, output length and think times drawn per session."""
    rng = np.random.default_rng(3)
    sessions = []
    for s in range(10):
        requests, kept, t = [], 0, 0.0
        for _ in range(4):
            blocks = kept + int(rng.integers(4, 24))
            out = int(rng.integers(8, 48))
            requests.append(
                Request(t=t, model="m", in_tokens=blocks * BLOCK, out_tokens=out, api_time=0.2, hash_ids_kept=kept,
                        hash_ids_added=tuple(range(1000 * s + kept, 1000 * s + blocks)))
            )  # fmt: skip
            kept, t = blocks, t + 0.2 + float(rng.exponential(0.4))
        sessions.append(Session(session_id=f"s{s}", root=Agent(requests=requests)))
    return Trace(sessions=sessions, block_size=BLOCK)


def compare_sweep(out_dir: Path, time_scale: float) -> Path:
    """`compare_trace` at levels 1, 2, 4, 8 on a simulator whose step takes 10 ms + 2 ms per sequence in it
    (× `time_scale`)."""
    engine = EngineConfig(block_size=BLOCK, step_overhead_s=0.010, decode_s_per_token=0.002, prefill_s_per_token=0.0,
                          attention_s_per_kv_token=0.0, time_scale=time_scale)  # fmt: skip
    with SimServer(engine) as server:
        base = replay_options(url=server.url, model=server.model, out_dir=out_dir, mode="closed", delay_scale=0.0,
                              duration_s=2.0, grace_s=5.0)  # fmt: skip
        sweep_sync(compare_trace(), base, SweepOptions(concurrency=(1, 2, 4, 8), out_dir=out_dir, num_gpus=1))
    return out_dir
