"""Embed an agentx replay in another harness: react to each request as it finishes, then read the summary.

    .venv/bin/python examples/embed_in_harness.py                 # the built-in simulator, 4 sample sessions
    .venv/bin/python examples/embed_in_harness.py --url http://127.0.0.1:8000 --model my-model

Without --url it starts `agentx.sim.SimServer` (a simulated vLLM-like server, no GPU) for the duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path

import agentx

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "sample.arrow"


async def run(trace: agentx.trace.Trace, options: agentx.ReplayOptions) -> agentx.ReplayResult | None:
    # `async with` makes sure the run stops (gracefully, records flushed) if this harness leaves the loop early.
    async with agentx.stream_replay(trace, options) as stream:
        async for record in stream:  # one RequestRecord per finished request, as it finishes
            ttft = "–" if record.ttft_s is None else f"{record.ttft_s * 1000:.1f} ms"
            print(
                f"record lane={record.lane} play={record.play} session={record.session_id[:12]} "
                f"agent={record.agent_id or 'root'} turn={record.turn} status={record.status} "
                f"in={record.isl_tokens} out={record.osl_tokens} ttft={ttft}",
                flush=True,
            )
    return stream.result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=SAMPLE)
    parser.add_argument("--url", help="an OpenAI-compatible server (default: start the simulator)")
    parser.add_argument("--model", help="the model to name (default: the simulator's)")
    parser.add_argument("--sessions", type=int, default=4, help="session trees to replay")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.05, help="simulator clock, wall s per simulated s")
    parser.add_argument("--delay-scale", type=float, default=0.05, help="multiplies the trace's think times")
    parser.add_argument("--out", type=Path, help="run directory (default: a temporary one)")
    args = parser.parse_args()

    trace = agentx.trace.load_trace(args.trace)
    with contextlib.ExitStack() as stack:
        url, model = args.url, args.model
        if url is None:
            sim = stack.enter_context(agentx.sim.SimServer(time_scale=args.time_scale, block_size=trace.block_size))
            url, model = sim.url, model or sim.model
            print(f"simulator at {url}")
        if model is None:
            parser.error("--model is required with --url")
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentx-")))
        options = agentx.ReplayOptions(
            server=agentx.Server(url=url, model=model),
            out_dir=out,
            # Every turn from the start of each session; the default load, AgentxLoad, resumes each lane
            # mid-session at its t* after a warmup, as the AgentX benchmark does.
            load=agentx.ClosedLoad(concurrency=args.concurrency),
            scenario=agentx.Scenario(sessions=args.sessions, delay_scale=args.delay_scale),
        )
        result = asyncio.run(run(trace, options))
    if result is None:
        raise SystemExit("the run ended without a result")
    summary = result.summary
    print(f"requests: {summary.counts.kept} ok, {summary.counts.errors} errors")
    throughput = summary.throughput
    if throughput is not None:
        print(f"throughput: {throughput.output_tps:,.1f} output tok/s, {throughput.total_tps:,.1f} total tok/s")
    if summary.latency.ttft_s is not None:
        print(f"ttft p50/p90: {summary.latency.ttft_s.p50:.4f} / {summary.latency.ttft_s.p90:.4f} s")
    if summary.latency.interactivity_tps is not None:
        print(f"p90 interactivity: {summary.latency.interactivity_tps.p90:,.1f} tok/s per user")
    if summary.cache.usage_hit_rate is not None:
        print(f"prefix-cache hit (usage): {100 * summary.cache.usage_hit_rate:.1f}%")


if __name__ == "__main__":
    main()
