"""Soak: does memory stay flat over a long replay at concurrency 256, with and without server faults?

The simulator runs as its own process (`agentx.sim.process.SimServer`) and `agentx replay` as another, at
`--concurrency 256` for `--minutes` of profiling; both processes' RSS (`VmRSS` of /proc/<pid>/status) and CPU
are sampled every `--sample-s` seconds. Targets (bench/README.md): RSS after 10 minutes ≤ 1.2 × RSS after
1 minute, for each process and each mode; and the replay's peak through its end-of-run summary (read back from its
records once the requests are done) ≤ 1.5 × its RSS at the end of the profiling (its steady state): its high-water
mark (`VmHWM`) is read every 50 ms from the end of the profiling until it exits. Never fails on a number. See
bench/README.md.

The load: `traces/sample.arrow` (20 coding-agent sessions, contexts growing to ~55k tokens on average and 140k
at most, ~320 s each as recorded), replayed in the AgentX scenario by 256 lanes, each recycling sessions from
turn 0 once its tree is done (20 sessions for 256 lanes: every session runs on ~13 lanes at once, each play with
its own cache-bust marker), so 256 trees are live for the whole run. The simulator's clock and the trace's
delays both run ×`--scale` (default 0.1). The simulated server, shared by 256 streams, answers a request in ~5 s
(~12 ms a token), so a tree lasts 2–3 minutes and each lane plays ~4 in 10 minutes: ~50 requests/s of
~33k-token prompts, ~21k streamed chunks/s. On 2 cores that keeps the client at ~30–35% of a core and the
simulator at ~40–65%: the load is real and neither process is starved. `--warmup burst` sends every lane's
primers at once, so profiling starts after one round of primers (~40 s of prefill at ×0.1), not after a spread
schedule.

Modes (`--faults`): `none`; `mix`: from the profiling start, 2% of requests each answered 500, 429 and 503,
2% of streams each reset (TCP RST) after a chunk, stalled 1 s, given a malformed event, and 2% of requests with
headers held back 1 s (~13% of requests meet a fault). The faults are switched on at runtime
(`SimServer.set_faults`) once the first profiling record is on disk: in the AgentX scenario a failed root
primer stops the run before profiling, by design, so the warmup runs clean.

Times in the table are seconds since the profiling start (the earliest `scheduled_ns` of the first profiling
records; negative during the warmup). RSS(1 min) is the sample nearest 60 s, RSS(end) the one nearest the end
of `--minutes`. Every sample of each mode is kept as JSON in the work directory.

Usage: .venv/bin/python bench/soak.py [--minutes 10] [--faults none|mix|both] [--concurrency 256]
       [--scale 0.1] [--sample-s 5] [--print-every-s 30] [--trace traces/sample.arrow] [--out bench/out/soak]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from agentx.errors import RecordsError
from agentx.records.record import META_EPOCH, read_records
from agentx.sim.faults import FaultConfig
from agentx.sim.process import SimServer
from agentx.trace.io import load_trace

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.2
"""RSS after `--minutes` ÷ RSS after 1 minute must not exceed this: memory must not grow with the run."""
TARGET_END_RATIO = 1.5
"""The replay's peak RSS through its end-of-run summary ÷ its RSS at the end of the profiling must not exceed this:
summarizing must not cost memory that grows with the run."""
END_POLL_S = 0.05
"""How often the replay's high-water mark is read from the end of the profiling until it exits."""
REFERENCE_S = 60.0
FAULT_MIX = FaultConfig(
    error_500_rate=0.02,
    error_429_rate=0.02,
    error_503_rate=0.02,
    reset_rate=0.02,
    reset_after_chunks=1,
    stall_rate=0.02,
    stall_s=1.0,
    stall_after_chunks=1,
    malformed_rate=0.02,
    malformed_after_chunks=1,
    slow_first_byte_rate=0.02,
    slow_first_byte_s=1.0,
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """Resident set size of `pid` in MB (10⁶ bytes), None once it is gone; `field` "VmHWM": its peak so far."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` (all its threads), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def profiling_start_epoch_s(records_path: Path) -> float | None:
    """Wall time (epoch seconds) of the profiling start, once a profiling record is on disk; else None."""
    try:
        table = read_records(records_path)
    except (RecordsError, OSError):
        return None
    if table.num_rows == 0:
        return None
    profiling = table.filter(pc.equal(table.column("phase"), "profiling"))
    if profiling.num_rows == 0:
        return None
    epoch_ns = int((table.schema.metadata or {})[META_EPOCH])
    first_ns = int(pc.min(profiling.column("scheduled_ns")).as_py())
    return (epoch_ns + first_ns) / 1e9


def soak(args: argparse.Namespace, faults: str) -> dict[str, Any]:
    """One run: the simulator, the replay, samples until the replay exits."""
    work = args.out / faults
    work.mkdir(parents=True, exist_ok=True)
    trace = load_trace(args.trace)
    duration_s = args.minutes * 60.0
    samples: list[dict[str, float | None]] = []
    with SimServer(time_scale=args.scale, block_size=trace.block_size, stop_timeout_s=30.0) as sim:
        command = [
            sys.executable,
            "-m",
            "agentx.cli",
            "replay",
            str(args.trace),
            "--url",
            sim.url,
            "--model",
            sim.model,
            "--concurrency",
            str(args.concurrency),
            "--duration",
            f"{duration_s:g}",
            "--delay-scale",
            f"{args.scale:g}",
            "--warmup",
            "burst",
            "--grace",
            "10",
            "--out",
            str(work / "run"),
            "--overwrite",
            "--json",
        ]
        print(f"[{faults}] {' '.join(command)}", flush=True)
        started_s = time.time()
        with open(work / "replay.out", "wb") as out, open(work / "replay.err", "wb") as err:
            replay = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT)
            profiling_s: float | None = None
            faults_on = False
            next_s = started_s
            # The high-water mark from the end of the profiling on: the last reading before the replay exits is its
            # peak through the end-of-run summary. `end_hwm_mb`: the mark as the profiling ended (before the summary).
            end_hwm_mb: float | None = None
            peak_mb: float | None = None
            try:
                while replay.poll() is None:
                    now_s = time.time()
                    if profiling_s is None:
                        profiling_s = profiling_start_epoch_s(work / "run" / "records.arrow")
                    ended = profiling_s is not None and now_s >= profiling_s + duration_s
                    if ended:
                        peak_mb = rss_mb(replay.pid, "VmHWM") or peak_mb
                        end_hwm_mb = end_hwm_mb or peak_mb
                    if profiling_s is not None and faults == "mix" and not faults_on:
                        sim.set_faults(FAULT_MIX)
                        faults_on = True
                    if now_s >= next_s:
                        samples.append(
                            {
                                "wall_s": now_s,
                                "client_mb": rss_mb(replay.pid),
                                "sim_mb": rss_mb(sim.pid),
                                "client_cpu_s": cpu_s(replay.pid),
                                "sim_cpu_s": cpu_s(sim.pid),
                            }
                        )
                        _show(samples[-1], profiling_s if profiling_s is not None else started_s, faults)
                        next_s += args.sample_s
                    time.sleep(END_POLL_S if ended else min(0.5, max(0.0, next_s - time.time())))
            except BaseException:
                replay.terminate()
                replay.wait()
                raise
        metrics = _scrape(sim.url)
    result: dict[str, Any] = {
        "faults": faults,
        "command": command,
        "exit": replay.returncode,
        "out": str(work / "replay.out"),
        "started_s": started_s,
        "profiling_s": profiling_s,
        "duration_s": duration_s,
        "samples": samples,
        "end_hwm_mb": end_hwm_mb,
        "peak_mb": peak_mb,
        "sim_metrics": metrics,
    }
    (work / "samples.json").write_text(json.dumps(result, indent=1))
    return result


def _scrape(url: str) -> dict[str, float]:
    """The simulator's request and fault counters (what it saw), from /metrics."""
    wanted = ("vllm:request_success_total", "agentx_sim_faults_injected_total", "agentx_sim_steps_total")
    figures: dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(wanted):
                name, _, value = line.rpartition(" ")
                figures[name] = float(value)
    return figures


def _show(sample: dict[str, float | None], origin_s: float, faults: str) -> None:
    at = sample["wall_s"]
    assert at is not None
    print(
        f"  [{faults}] t {at - origin_s:7.1f} s  client {_mb(sample['client_mb'])}  sim {_mb(sample['sim_mb'])}",
        flush=True,
    )


def _mb(value: float | None) -> str:
    return f"{value:7.1f} MB" if value is not None else "      — MB"


def _nearest(samples: list[dict[str, Any]], origin_s: float, at_s: float) -> dict[str, Any]:
    return min(samples, key=lambda s: abs(s["wall_s"] - origin_s - at_s))


def _row(t: float, sample: dict[str, Any], previous: dict[str, Any] | None, note: str) -> str:
    cpu = ["", ""]
    if previous is not None:
        span = sample["wall_s"] - previous["wall_s"]
        cpu = [f"{100 * (sample[key] - previous[key]) / span:.0f}" for key in ("client_cpu_s", "sim_cpu_s")]
    row = f"  {t:7.0f}  {sample['client_mb']:9.1f}  {sample['sim_mb']:7.1f}  {cpu[0]:>11}  {cpu[1]:>8}"
    return f"{row}  {note}".rstrip()


def _shown(samples: list[dict[str, Any]], origin_s: float, every_s: float, marks: list[dict[str, Any]]) -> list[int]:
    """Indices of the table's rows: the first sample, the one nearest each multiple of `every_s`, `marks`, the last."""
    first_t, last_t = samples[0]["wall_s"] - origin_s, samples[-1]["wall_s"] - origin_s
    wanted = {0, len(samples) - 1}
    wanted.update(samples.index(mark) for mark in marks)
    k = math.ceil(first_t / every_s)
    while k * every_s <= last_t:
        wanted.add(samples.index(_nearest(samples, origin_s, k * every_s)))
        k += 1
    return sorted(wanted)


def _client_counts(out: Path) -> str:
    """The replay's own count of requests and errors by kind, from its JSON summary."""
    try:
        counts = json.loads(out.read_text())["counts"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no summary"
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.get("errors_by_kind", {}).items()))
    return f"{counts.get('rows', 0)} records, {counts.get('errors', 0)} errors" + (f" ({kinds})" if kinds else "")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nsoak: {args.trace.name}, concurrency {args.concurrency}, {args.minutes:g} min of profiling, "
        f"simulator clock and trace delays ×{args.scale:g}, RSS sampled every {args.sample_s:g} s (MB = 10⁶ bytes)"
    )
    for result in results:
        samples = [s for s in result["samples"] if s["client_mb"] is not None and s["sim_mb"] is not None]
        origin = result["profiling_s"]
        print(f"\nfaults: {result['faults']}  (replay exit {result['exit']})")
        if origin is None or not samples:
            print("  the run never reached profiling: no figure")
            continue
        minute = _nearest(samples, origin, REFERENCE_S)
        end = _nearest(samples, origin, result["duration_s"])
        # CPU% is over the span since the row above.
        print(f"  {'t (s)':>7}  {'client MB':>9}  {'sim MB':>7}  {'client CPU%':>11}  {'sim CPU%':>8}")
        previous: dict[str, Any] | None = None
        for index in _shown(samples, origin, args.print_every_s, [minute, end]):
            sample = samples[index]
            t = sample["wall_s"] - origin
            note = ""
            if sample is minute:
                note = "← RSS(1 min)"
            elif sample is end:
                note = "← RSS(end)"
            elif t < 0:
                note = "warmup"
            elif t > end["wall_s"] - origin:
                note = "after the end: grace, summary"
            print(_row(t, sample, previous, note))
            previous = sample
        for process in ("client", "sim"):
            at_end, at_minute = end[f"{process}_mb"], minute[f"{process}_mb"]
            ratio = at_end / at_minute
            verdict = "holds" if ratio <= TARGET_RATIO else "MISSED"
            print(
                f"  {process:6s} RSS(end) / RSS(1 min) = {at_end:.1f} / {at_minute:.1f} = {ratio:.2f}"
                f"  (target ≤ {TARGET_RATIO}: {verdict})"
            )
        _end_of_run(result, end)
        metrics = result["sim_metrics"]
        finished = sum(v for k, v in metrics.items() if k.startswith("vllm:request_success_total"))
        injected = sum(v for k, v in metrics.items() if k.startswith("agentx_sim_faults_injected_total"))
        print(f"  replay: {_client_counts(Path(result['out']))}")
        print(f"  simulator: {finished:.0f} requests finished, {injected:.0f} faults injected")


def _end_of_run(result: dict[str, Any], end: dict[str, Any]) -> None:
    """The replay's peak through its end-of-run summary against its steady state, RSS(end)."""
    peak, before = result.get("peak_mb"), result.get("end_hwm_mb")
    if peak is None:
        print("  client end-of-run peak: not read (the replay exited before the end of the profiling)")
        return
    ratio = peak / end["client_mb"]
    verdict = "holds" if ratio <= TARGET_END_RATIO else "MISSED"
    print(
        f"  client end-of-run peak / RSS(end) = {peak:.1f} / {end['client_mb']:.1f} = {ratio:.2f}"
        f"  (target ≤ {TARGET_END_RATIO}: {verdict}; peak as the profiling ended {before:.1f})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0, help="profiling minutes per run (default 10)")
    parser.add_argument("--faults", choices=("none", "mix", "both"), default="both")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--scale", type=float, default=0.1, help="simulator clock and trace delays (default 0.1)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period (default 5 s)")
    parser.add_argument("--print-every-s", type=float, default=30.0, help="table row spacing (default 30 s)")
    parser.add_argument("--trace", type=Path, default=ROOT / "traces" / "sample.arrow")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "soak", help="work directory")
    args = parser.parse_args(argv)
    # SIGTERM (e.g. `timeout`, or `kill` of a run left in the background, where SIGINT is ignored) ends the run
    # as Ctrl-C does: the replay is stopped and the simulator shut down, not left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    modes = ("none", "mix") if args.faults == "both" else (args.faults,)
    results = [soak(args, mode) for mode in modes]
    report(results, args)


if __name__ == "__main__":
    main()
