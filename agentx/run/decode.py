"""Decode-only speed: tokens per second per user with prefill left out, beside the realized acceptance.

`await decode(DecodeOptions(url=..., model=..., isl_tokens=1, osl_tokens=1000, concurrency=1, repetitions=5))`
sends `repetitions` waves of `concurrency` simultaneous streamed requests, each forcing exactly `osl_tokens`
output tokens (`min_tokens`, `ignore_eos`). Per request, decode speed = tokens after the first chunk /
(last token time − first token time): the first chunk holds the token the prefill sampled, so neither the
prompt nor the queueing before it counts (the measurement behind figures like "842 decode tokens per second
per user at batch 1, AL fixed at 6"). p50 / p90 are over all repetitions × concurrency requests, p90 the slow
tail (the speed 90% of requests reached at least). The
realized AL comes from the server's speculative-decoding counters scraped before and after, else from the
stream's tokens per chunk (agentx.results.summary.checks.acceptance).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from agentx.replayer.http.client import Client, Exchange
from agentx.replayer.http.probe import STREAM_OPTIONS, StreamUsage, detect_stream_usage
from agentx.replayer.options.replay import DecodeOptions, checked, flat_options
from agentx.replayer.options.server_client import server_client
from agentx.replayer.plan.bodies import COMPLETIONS_PATH
from agentx.replayer.prompts.chat import CHAT_PATH
from agentx.replayer.prompts.tokens import TokenSpace, completions_body, filler
from agentx.results.summary.checks.acceptance import (
    Acceptance,
    acceptance,
    counter_acceptance,
    stream_acceptance,
)
from agentx.results.summary.stats import rate_percentile
from agentx.run.replay import scrape_counters
from agentx.run.sync import run_sync

_log = logging.getLogger(__name__)
_CHAT_WORD = " hello"
"""`--api chat` prompts repeat this word `isl_tokens` times (about one token each, plus the chat template)."""


class DecodeSample(msgspec.Struct, kw_only=True):
    """One request of one wave."""

    repetition: int
    user: int
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    output_tokens: int = 0
    decode_tokens: int = 0
    """Tokens after the first chunk."""
    decode_s: float | None = None
    """Last token time − first token time."""
    decode_tps: float | None = None
    chunks: int = 0


class DecodeSpeed(msgspec.Struct, kw_only=True):
    """Decode tokens/s per user over the successful requests with at least one token after the first chunk."""

    count: int
    mean: float
    p50: float
    p90: float
    min: float
    max: float


class DecodeResult(msgspec.Struct, kw_only=True):
    options: dict[str, Any]
    """The options, without the API key."""
    stream_usage: str
    decode_tps: DecodeSpeed | None
    acceptance: Acceptance
    samples: list[DecodeSample]
    failed: int


def _body(options: DecodeOptions, repetition: int, user: int, stream_usage: StreamUsage) -> tuple[str, bytes]:
    stream_options = STREAM_OPTIONS[stream_usage]
    if options.server.api == "completions":
        # Distinct prompts per request: no request hits another's prefix cache (prefill is excluded anyway).
        prompt = filler(options.seed, "decode", f"{repetition}:{user}", options.isl_tokens, TokenSpace())
        body = completions_body(
            options.server.model,
            prompt,
            options.osl_tokens,
            stream_options=stream_options,
            extra_body=options.server.extra_body,
        )
        return COMPLETIONS_PATH, body
    payload: dict[str, object] = {
        "model": options.server.model,
        "messages": [{"role": "user", "content": f"{repetition}:{user}" + _CHAT_WORD * options.isl_tokens}],
        "max_tokens": options.osl_tokens,
        "max_completion_tokens": options.osl_tokens,
        "min_tokens": options.osl_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    if stream_options is not None:
        payload["stream_options"] = dict(stream_options)
    payload.update(options.server.extra_body or {})
    return CHAT_PATH, msgspec.json.encode(payload)


def sample(exchange: Exchange, repetition: int, user: int) -> DecodeSample:
    """The decode speed of one exchange (see the module docstring)."""
    if not exchange.ok:
        return DecodeSample(repetition=repetition, user=user, ok=False, error=exchange.error_message)
    tokens = exchange.completion_tokens if exchange.completion_tokens is not None else sum(exchange.chunk_tokens)
    result = DecodeSample(
        repetition=repetition, user=user, ok=True, output_tokens=tokens, chunks=len(exchange.chunk_ns)
    )
    if not exchange.chunk_ns:
        return result
    result.ttft_s = (exchange.first_token_ns - exchange.sent_ns) / 1e9
    result.decode_tokens = tokens - exchange.chunk_tokens[0]
    span_ns = exchange.last_token_ns - exchange.first_token_ns
    if result.decode_tokens > 0 and span_ns > 0:
        result.decode_s = span_ns / 1e9
        result.decode_tps = result.decode_tokens / result.decode_s
    return result


def decode_speed(samples: list[DecodeSample]) -> DecodeSpeed | None:
    """p50 / p90 in the summary's direction (`rate_percentile`: p90 is the speed 90% of requests reached at
    least), mean and range of the samples' decode tokens/s."""
    speeds = [s.decode_tps for s in samples if s.decode_tps is not None]
    if not speeds:
        return None
    return DecodeSpeed(
        count=len(speeds),
        mean=sum(speeds) / len(speeds),
        p50=rate_percentile(speeds, 50.0),
        p90=rate_percentile(speeds, 90.0),
        min=min(speeds),
        max=max(speeds),
    )


async def _stream_usage(client: Client, options: DecodeOptions) -> StreamUsage:
    if options.server.stream_usage != "auto":
        return options.server.stream_usage
    body: dict[str, object] = {"model": options.server.model, "max_tokens": 2, "ignore_eos": True}
    if options.server.api == "chat":
        body["messages"] = [{"role": "user", "content": "ok"}]
        probe = await detect_stream_usage(client, CHAT_PATH, body)
    else:
        body["prompt"] = filler(options.seed, "decode", "probe", 8, TokenSpace())
        probe = await detect_stream_usage(client, COMPLETIONS_PATH, body)
    if probe.assumed is not None:
        _log.warning("stream usage: %s; assuming %r", probe.assumed, probe.usage)
    return probe.usage


async def decode(options: DecodeOptions) -> DecodeResult:
    """Measure decode-only speed at `options.server.url` (module docstring). Raises ServerUnreachable or ModelNotServed
    before any request when the server does not answer or serve the model, ValueError for bad options."""
    options = checked(options)
    limit = options.connection.max_connections or 2 * options.concurrency
    async with server_client(options.server, options.connection, limit=limit) as client:
        await client.probe_models(require=options.server.model)
        stream_usage = await _stream_usage(client, options)
        before = await scrape_counters(client)
        samples: list[DecodeSample] = []
        chunk_tokens: list[list[int]] = []
        estimated = 0
        for repetition in range(options.repetitions):
            bodies = [_body(options, repetition, user, stream_usage) for user in range(options.concurrency)]
            exchanges = await asyncio.gather(*(client.stream(path, body) for path, body in bodies))
            for user, exchange in enumerate(exchanges):
                samples.append(sample(exchange, repetition, user))
                if exchange.ok and exchange.tokens_estimated:
                    estimated += 1
                elif exchange.ok:
                    chunk_tokens.append(exchange.chunk_tokens)
        after = await scrape_counters(client) if before is not None else None
    counters = counter_acceptance(before, after) if before is not None and after is not None else None
    stream = stream_acceptance(
        chunk_tokens, stream_interval=options.speculative.stream_interval, estimated_requests=estimated
    )
    realized = acceptance(
        counters=counters,
        stream=stream,
        forced_al=options.speculative.al,
        spec_k=options.speculative.k,
        tolerance=options.speculative.al_tolerance,
    )
    return DecodeResult(
        options=flat_options(options),
        stream_usage=stream_usage,
        decode_tps=decode_speed(samples),
        acceptance=realized,
        samples=samples,
        failed=sum(not s.ok for s in samples),
    )


def decode_sync(options: DecodeOptions) -> DecodeResult:
    """`decode` for code without an event loop."""
    return run_sync(decode(options), "agentx.decode")
