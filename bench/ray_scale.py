"""Scaling out: one process vs `--workers 2` vs `--ray` with 2 actors, open loop at rising rates (docs/distributed.md).

The server is the mock of bench/replay_overhead.py, pinned to core 0 at a higher priority: 1,000-token prompts
(~6 KB of JSON each), 32 output tokens, TTFT 50 ms, ITL 10 ms. Each setup replays a trace of one-request sessions
through the CLI, `--mode rate --rate R` (Poisson), at every rate given. The Ray setup runs on a local cluster the
benchmark starts once (`ray.cluster_utils.Cluster`, every process on 127.0.0.1): one node of two CPUs (`--nodes 1`,
the default: one client host of a cluster, running both actors), or two one-CPU worker nodes (`--nodes 2`).

Per setup and rate it prints:
- dispatch lag p50 / p99 (the CLI's summary, sent − due over every request) and the share of requests it sent;
- client CPU per request: the marginal cost, (CPU of a long run − CPU of a short one) / (their request counts'
  difference), so process start-up, Ray's actor start-up and the trace load cancel out. Client CPU is the CLI
  process and its children (`--workers`), plus for Ray the actors' CPU (run.json's `shards[].cpu_s`) and what the
  Ray processes of the cluster (raylets, GCS, object stores) used meanwhile;
- the Ray path's overhead against `--workers` at the same rate (target ≤ 10%, bench/README.md).
Then per setup the highest rate held with dispatch lag p99 < 2 ms. Never fails on a number.

Usage: .venv/bin/python bench/ray_scale.py [--rates 100,200,400,800,1600] [--seconds 8] [--setups one,workers,ray]
       [--nodes 1|2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_overhead import MODEL, SERVER_CPU, SERVER_NICE, _tree, _wait_ready, one_request_sessions
from sim_throughput import HOST, _cpu_s, _free_port, _pin_and_raise

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LAG_TARGET_S = 0.002
SHORT_S = 1.5
"""The short run's length, whose CPU is taken off the long run's (start-up and set-up costs cancel)."""
BLOCK = 16
IN_TOKENS = 1000
OUT_TOKENS = 32
SETUPS = ("one", "workers", "ray")


@dataclass
class Run:
    requests: int
    sent: int
    cpu_s: float
    """The client's: the CLI (with its `--workers` children), plus the Ray actors."""
    daemons_cpu_s: float
    """The Ray cluster's own processes (raylets, GCS, object stores) meanwhile; 0 without Ray."""
    lag_p50_s: float | None
    lag_p99_s: float | None
    wall_s: float


def _trace(path: Path, sessions: int) -> None:
    """`sessions` one-request sessions with distinct blocks (no shared prefix: the mock ignores the prompt)."""
    from agentx.trace.io import save_trace

    blocks = IN_TOKENS // BLOCK
    trace = one_request_sessions(
        sessions, IN_TOKENS, OUT_TOKENS, lambda i: tuple(range(i * blocks, (i + 1) * blocks)), block_size=BLOCK
    )
    save_trace(trace, path)


@contextlib.contextmanager
def _mock_server() -> Iterator[tuple[int, int]]:
    """The mock's port and process id."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(BENCH / "replay_overhead.py"), "--worker-server", str(port), "0.05", "0.01"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_pin_and_raise(SERVER_CPU, SERVER_NICE),
    )
    try:
        _wait_ready(port, server)
        yield port, server.pid
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextlib.contextmanager
def _ray_cluster(nodes: int) -> Iterator[str]:
    """One node of 2 CPUs (a client host running both actors), or a head without CPUs and `nodes` of one CPU each
    (each pays its own raylet and agents: on one host, more than a real cluster's hosts each would)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray process on 127.0.0.1, read as Ray loads
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the host
    from ray import cluster_utils

    head = {"num_cpus": 2 if nodes == 1 else 0, "include_dashboard": False}
    cluster: Any = cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(nodes if nodes > 1 else 0):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        cluster.shutdown()


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cluster_cpu(exclude: set[int]) -> dict[int, float]:
    """CPU seconds of each live descendant of this process (the Ray cluster's processes), but `exclude`'s trees."""
    cpu: dict[int, float] = {}
    for pid in _tree(os.getpid())[1:]:
        if pid in exclude:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            cpu[pid] = _cpu_s(pid)
    return cpu


def _replay(setup: str, rate: float, sessions: int, port: int, address: str, out: Path, exclude: set[int]) -> Run:
    trace = out.with_suffix(".arrow")
    trace.parent.mkdir(parents=True, exist_ok=True)
    _trace(trace, sessions)
    command = [
        sys.executable, "-m", "agentx.cli", "replay", str(trace), "--url", f"http://{HOST}:{port}", "--model", MODEL,
        "--mode", "rate", "--rate", str(rate), "--sessions", str(sessions), "--stream-usage", "continuous",
        "--metrics-interval", "off", "--out", str(out), "--json",
    ]  # fmt: skip
    if setup == "workers":
        command += ["--workers", "2"]
    elif setup == "ray":
        command += ["--ray", address, "--workers", "2"]
    before_children = _children_cpu_s()
    before_cluster = _cluster_cpu(exclude) if setup == "ray" else {}
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{setup} at {rate:g}/s failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu_s = _children_cpu_s() - before_children
    run = json.loads((out / "run.json").read_text())
    daemons_cpu_s = 0.0
    if setup == "ray":
        after_cluster = _cluster_cpu(exclude)
        # Processes alive before and after: the daemons (an actor's process ends with its run; its CPU is below).
        daemons_cpu_s = sum(after_cluster[pid] - was for pid, was in before_cluster.items() if pid in after_cluster)
        cpu_s += sum(shard["cpu_s"] or 0.0 for shard in run["run"]["shards"])
    summary = json.loads(done.stdout)
    lag = summary["dispatch_lag"]
    return Run(
        requests=sessions,
        sent=summary["counts"]["rows"],
        cpu_s=cpu_s,
        daemons_cpu_s=daemons_cpu_s,
        lag_p50_s=lag["p50_s"],
        lag_p99_s=lag["p99_s"],
        wall_s=wall_s,
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,200,400,800,1600", help="Requests per second, comma-separated.")
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of the measured (long) run at each rate.")
    parser.add_argument("--setups", default=",".join(SETUPS), help="Any of one, workers, ray.")
    parser.add_argument("--nodes", type=int, default=1, help="Ray nodes on this host (1: both actors on one).")
    args = parser.parse_args(argv)
    rates = [float(rate) for rate in args.rates.split(",")]
    setups = [setup for setup in args.setups.split(",") if setup]
    print(f"load avg {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; mock on core {SERVER_CPU}", flush=True)
    per_request: dict[tuple[str, float], float] = {}
    with_daemons: dict[tuple[str, float], float] = {}
    lag_p99: dict[tuple[str, float], float | None] = {}
    with tempfile.TemporaryDirectory(prefix="agentx-ray-scale-") as scratch, _mock_server() as (port, mock_pid):
        cluster = _ray_cluster(args.nodes) if "ray" in setups else contextlib.nullcontext("")
        with cluster as address:
            exclude = set(_tree(mock_pid))
            header = (
                f"{'setup':8} {'rate/s':>7} {'sent':>11} {'lag p50':>8} {'lag p99':>8} {'CPU/req':>9} "
                f"{'+daemons':>9} {'wall':>6}"
            )
            print(header + "\n" + "-" * len(header), flush=True)
            for rate in rates:
                for setup in setups:
                    out = Path(scratch) / f"{setup}-{rate:g}"
                    short = _replay(setup, rate, max(2, int(rate * SHORT_S)), port, address, out / "short", exclude)
                    long = _replay(setup, rate, int(rate * args.seconds), port, address, out / "long", exclude)
                    more = max(1, long.requests - short.requests)
                    cpu_per_request_s = (long.cpu_s - short.cpu_s) / more
                    daemons_per_request_s = (long.daemons_cpu_s - short.daemons_cpu_s) / more
                    per_request[setup, rate] = cpu_per_request_s
                    with_daemons[setup, rate] = cpu_per_request_s + daemons_per_request_s
                    lag_p99[setup, rate] = long.lag_p99_s
                    print(
                        f"{setup:8} {rate:7g} {long.sent:>5}/{long.requests:<5} {_ms(long.lag_p50_s):>8} "
                        f"{_ms(long.lag_p99_s):>8} {cpu_per_request_s * 1e6:7.0f}µs "
                        f"{daemons_per_request_s * 1e6:7.0f}µs {long.wall_s:5.1f}s",
                        flush=True,
                    )
    print(
        "\nlags in ms; CPU/req: the client's marginal CPU per request (the CLI, its --workers children, the Ray "
        "actors); +daemons: what Ray's own processes added per request (module docstring)"
    )
    if "ray" in setups and "workers" in setups:
        print("\nRay path vs --workers, CPU per request (target ≤ +10%): client processes | with Ray's daemons")
        for rate in rates:
            workers_s = per_request["workers", rate]
            ray_s, ray_all_s = per_request["ray", rate], with_daemons["ray", rate]
            clients, overall = 100 * (ray_s / workers_s - 1), 100 * (ray_all_s / workers_s - 1)
            print(
                f"  {rate:6g}/s: {ray_s * 1e6:.0f} vs {workers_s * 1e6:.0f} µs, {clients:+.0f}% | "
                f"{ray_all_s * 1e6:.0f} µs, {overall:+.0f}%"
            )
    print(f"\nhighest rate held with dispatch lag p99 < {LAG_TARGET_S * 1e3:g} ms:")
    for setup in setups:
        held = [rate for rate in rates if (p99 := lag_p99[setup, rate]) is not None and p99 < LAG_TARGET_S]
        print(f"  {setup:8} {max(held):g}/s" if held else f"  {setup:8} none of the rates tried")


if __name__ == "__main__":
    main()
