"""A client of the simulator's HTTP surface for the tests: requests, streams read chunk by chunk, its metrics."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
Json = dict[str, Any]
"""A JSON object as the simulator sends and takes it."""


def run(make: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    """Run `make(session)` on a fresh event loop with a fresh client session."""

    async def main() -> T:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await make(session)

    return asyncio.run(main())


@dataclass
class Streamed:
    """What a client saw of one SSE response."""

    status: int
    chunks: list[Json] = field(default_factory=list)
    """Every `data:` payload that parsed as JSON, in order."""
    malformed: list[bytes] = field(default_factory=list)
    """`data:` payloads that did not parse."""
    done: bool = False
    """`data: [DONE]` arrived."""
    arrivals_s: list[float] = field(default_factory=list)
    """perf_counter of every event."""
    headers_s: float = 0.0
    """perf_counter when the headers arrived."""

    @property
    def token_ids(self) -> list[int]:
        return [
            token for chunk in self.chunks for choice in chunk["choices"] for token in choice.get("token_ids") or ()
        ]

    @property
    def text(self) -> str:
        return "".join(
            choice.get("text") or choice.get("delta", {}).get("content") or ""
            for chunk in self.chunks
            for choice in chunk["choices"]
        )

    @property
    def usage(self) -> Json:
        return dict(self.chunks[-1]["usage"])

    @property
    def finish_reason(self) -> str | None:
        reasons = [choice["finish_reason"] for chunk in self.chunks for choice in chunk["choices"]]
        return reasons[-1] if reasons else None


async def stream(session: aiohttp.ClientSession, url: str, body: Json, *, path: str = "/v1/completions") -> Streamed:
    """POST a streaming request and read every event (errors from the connection propagate)."""
    async with session.post(url + path, json={**body, "stream": True}) as response:
        seen = Streamed(status=response.status, headers_s=time.perf_counter())
        if response.status != 200:
            return seen
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            seen.arrivals_s.append(time.perf_counter())
            if payload == b"[DONE]":
                seen.done = True
                continue
            try:
                seen.chunks.append(msgspec.json.decode(payload))
            except msgspec.DecodeError:
                seen.malformed.append(payload)
        return seen


async def post(session: aiohttp.ClientSession, url: str, path: str, body: Json) -> tuple[int, Json]:
    async with session.post(url + path, json=body) as response:
        return response.status, await response.json(content_type=None)


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of /metrics by name plus labels other than model_name and engine, e.g. `x{position="0"}`."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {key: value for key, value in sample.labels.items() if key not in ("model_name", "engine")}
            suffix = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
            samples[f"{sample.name}{{{suffix}}}" if suffix else sample.name] = sample.value
    return samples


def unique_ids(count: int, rng: random.Random) -> list[int]:
    """Token ids of ordinary words, random enough never to share a block with another test's prompt."""
    return [rng.randrange(1000, 30000) for _ in range(count)]
