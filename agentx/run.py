"""Replay and summarize in one call: the public API's composition of replay/ and results/."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from agentx.replay.engine import OnRecord, ReplayOptions, RunResult, run_replay
from agentx.replay.records import read_records
from agentx.results.summary import ServerMetrics, Summary, parse_counters, summarize
from agentx.trace.model import Trace

_METRICS_TIMEOUT_S = 5.0


class ReplayResult(msgspec.Struct, kw_only=True):
    """A finished (or interrupted) run: where its records are, and their summary."""

    run: RunResult
    summary: Summary


async def scrape_counters(url: str) -> dict[str, float] | None:
    """The server's prefix-cache counters from `/metrics`, or None when it has none to give."""
    try:
        timeout = aiohttp.ClientTimeout(total=_METRICS_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url.rstrip("/") + "/metrics") as response,
        ):
            if response.status != 200:
                return None
            counters = parse_counters(await response.text())
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
    return counters or None


async def replay(
    trace: Trace, options: ReplayOptions, *, num_gpus: int | None = None, on_record: OnRecord | None = None
) -> ReplayResult:
    """Drive the server at `options.url` with `trace`, then summarize the records it wrote.

    The server's prefix-cache counters are scraped before and after, so the summary carries its own hit
    rate next to the one from usage.
    """
    before = await scrape_counters(options.url)
    run = await run_replay(trace, options, on_record=on_record)
    after = await scrape_counters(options.url) if before is not None else None
    metrics = ServerMetrics(before=before, after=after) if before is not None and after is not None else None
    summary = summarize(read_records(run.records_path), num_gpus=num_gpus, server_metrics=metrics)
    return ReplayResult(run=run, summary=summary)


def replay_sync(trace: Trace, options: ReplayOptions, *, num_gpus: int | None = None) -> ReplayResult:
    """`replay` for code without an event loop."""
    return asyncio.run(replay(trace, options, num_gpus=num_gpus))
