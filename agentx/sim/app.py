"""The simulator's OpenAI-compatible HTTP application over the engine, shaped like vLLM's: its routes, the fault
and API-key middlewares, generation and the other endpoints. A stream is written by `agentx.sim.streaming`
from the engine's callback; its handler only waits, and takes over when the socket pushes back, a fault holds
output, or the stream ends. docs/sim.md describes the surface, the tokenizer, the metrics and the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from agentx.distribution import installed_version
from agentx.sim import protocol
from agentx.sim.engine.loop import SimEngine
from agentx.sim.engine.sequence import FinishReason, GenerationRequest, SequenceHandle
from agentx.sim.faults import NO_FAULTS, FaultConfig, FaultInjector, FaultPlan, reset_connection
from agentx.sim.http_log import OutcomeResponse, ended, log_cancelled, one_line, parse_error
from agentx.sim.metrics import CONTENT_TYPE, ServerCounters, metrics_registry, render
from agentx.sim.options import SimOptions
from agentx.sim.power import PowerMeter
from agentx.sim.protocol import DONE, ClientError, error_body
from agentx.sim.streaming import Collector, Stream, next_fault
from agentx.sim.tokenizer import get_tokenizer

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_MAX_BODY_BYTES = 512 * 1024**2
"""Long prompts as token-id lists run to megabytes; aiohttp's 1 MiB default would answer 413."""


def _error(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, param), content_type=_JSON, headers=headers)


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except ConnectionError as exc:
        raise ClientError(f"The request body was cut short: {exc}") from None
    except web.RequestPayloadError as exc:  # e.g. a bad chunk size or a gzip body that is not gzip
        cause = parse_error(exc)
        raise ClientError(f"The request body could not be read: {one_line(cause) if cause else exc}") from None


class SimApp:
    """The application: routes, the engine, the tokenizer, the faults and the counters."""

    def __init__(self, options: SimOptions, engine: SimEngine) -> None:
        self.options = options
        self.config = options.engine
        self.engine = engine
        self.tokenizer = get_tokenizer(options.engine.vocab_size)
        self.faults = FaultInjector(options.faults, seed=options.engine.seed)
        self.counters = ServerCounters()
        self.counters.faults = self.faults.counts
        self.registry = metrics_registry(
            lambda: engine.counters, self.counters, model_name=self.config.model_name, spec_k=self.config.spec_k
        )
        self.started = int(time.time())
        self.power = PowerMeter(options.power, self._processed_tokens)

    def app(self) -> web.Application:
        middlewares = [self._refuse_middleware]
        if self.options.api_key:
            middlewares.append(self._auth_middleware)
        app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=middlewares)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/dcgm/metrics", self.dcgm_metrics)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/sim/faults", self.get_faults)
        app.router.add_post("/sim/faults", self.set_faults)
        return app

    @web.middleware
    async def _refuse_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        # Refusing means down for everyone: any connection, new or kept alive, is reset (RST) as soon as a
        # request arrives on it, before any response. The control endpoint is spared so that a harness
        # can watch or end the window; at accept time the path is unknown, hence the reset happens here.
        if request.method == "POST" and request.path in self.counters.received:
            self.counters.received[request.path] += 1
        if self.faults.refusing() and request.path != "/sim/faults" and request.transport is not None:
            self.faults.count("refused")
            reset_connection(request.transport)
            return ended("refused")
        response: web.StreamResponse = await handler(request)
        return response

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        # Every path but the health check, the metrics included: what a gateway in front of a server does.
        if request.path != "/health":
            expected = f"Bearer {self.options.api_key}".encode()
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return _error(401, "Unauthorized: a valid 'Authorization: Bearer' API key is required")
        response: web.StreamResponse = await handler(request)
        return response

    # Generation.

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()
        try:
            try:
                body = await _read(request)
                plan = protocol.plan_generation(body, chat=chat, config=self.config, tokenizer=self.tokenizer)
            except ClientError as exc:
                return _error(exc.status, exc.message, param=exc.param)
            faults = self.faults.plan(stream=plan.stream)
            if faults is not NO_FAULTS:
                if faults.slow_first_byte_s:
                    self.faults.count("slow_first_byte")
                    await asyncio.sleep(faults.slow_first_byte_s)
                if faults.status is not None:
                    return self._status_fault(faults)
            if not plan.stream:
                return await self._complete(plan, faults)
        except asyncio.CancelledError:
            log_cancelled(request, started)
            raise
        return await self._stream(request, plan, faults, started)

    def _status_fault(self, faults: FaultPlan) -> web.Response:
        status = faults.status
        self.faults.count(f"error_{status}")
        if status == 429:
            retry_after = str(self.faults.config.retry_after_s)
            return _error(429, "Too many requests (injected fault).", headers={"Retry-After": retry_after})
        if status == 503:
            return _error(503, "The server is temporarily unavailable (injected fault).")
        return _error(500, "Internal server error (injected fault).")

    def _submit(
        self,
        plan: protocol.Plan,
        on_output: Callable[[list[int], FinishReason | None], None],
        *,
        tokens_sent_early: int = 0,
        output_scale: float = 1.0,
    ) -> SequenceHandle:
        """Queue the request's sequence, which owes the client `tokens_sent_early` fewer tokens (and generates
        `output_scale` times what it asked for: the `output_scale` fault)."""
        generation = GenerationRequest(
            prompt_ids=plan.prompt_ids,
            max_tokens=round(plan.max_tokens * output_scale) - tokens_sent_early,
            min_tokens=max(0, round(plan.min_tokens * output_scale) - tokens_sent_early),
            ignore_eos=plan.ignore_eos,
            cache_salt=plan.cache_salt,
        )
        return self.engine.submit(generation, on_output)

    def _abort(self, handle: SequenceHandle | None) -> None:
        if handle is not None and not handle.finished:
            self.engine.abort(handle)
            self.counters.finished["abort"] += 1

    async def _complete(self, plan: protocol.Plan, faults: FaultPlan) -> web.StreamResponse:
        collector = Collector(asyncio.get_running_loop().create_future())
        handle: SequenceHandle | None = None
        try:
            handle = self._submit(plan, collector.on_output, output_scale=faults.output_scale)
            await collector.done
        except ValueError as exc:
            return _error(400, str(exc))
        finally:
            if collector.finish_reason is None:
                self._abort(handle)
        assert collector.finish_reason is not None and handle is not None
        self.counters.finished[collector.finish_reason] += 1
        text = self.tokenizer.decode(collector.token_ids)
        cached = None if faults.drop_cached_tokens else handle.num_cached_tokens
        body = protocol.full_response(
            plan,
            text,
            collector.token_ids,
            collector.finish_reason,
            cached,
            self.config.model_name,
            prompt_tokens=round(len(plan.prompt_ids) * faults.prompt_tokens_scale),
        )
        return web.Response(body=body, content_type=_JSON)

    async def _stream(
        self, request: web.Request, plan: protocol.Plan, faults: FaultPlan, started: float
    ) -> web.StreamResponse:
        response = OutcomeResponse(headers=_SSE_HEADERS)
        try:
            writer = await response.prepare(request)
        except ConnectionError:  # the client left before the headers went out
            response.outcome = "disconnected"
            return response
        except asyncio.CancelledError:
            log_cancelled(request, started, response)
            raise
        transport = request.transport
        if writer is None or transport is None or transport.is_closing():
            response.outcome = "disconnected"
            return response
        stream = Stream(
            plan,
            model_name=self.config.model_name,
            tokenizer=self.tokenizer,
            transport=transport,
            http_protocol=request.protocol,
            chunked=request.version >= (1, 1),
            faults=faults,
            count_fault=self.faults.count,
        )
        # A single-token request has nothing left for the engine after the early token: spared.
        early = faults.early_first_token and plan.max_tokens > 1
        try:
            stream.handle = self._submit(
                plan, stream.on_output, tokens_sent_early=int(early), output_scale=faults.output_scale
            )
            if faults is not NO_FAULTS:
                self._stream_faults_at_start(stream, faults, early=early)
            await stream.drive(writer.drain)
        except asyncio.CancelledError:
            if stream.reset:
                response.outcome = "reset"
            log_cancelled(request, started, response)
            raise
        except ValueError as exc:
            # The engine refused the request after the headers went out: end the stream with an in-band
            # error event, as vLLM does for errors raised mid-generation.
            stream.send(b"data: " + error_body(400, str(exc), None) + b"\n\n" + DONE)
        finally:
            if stream.finish_reason is None:
                self._abort(stream.handle)
        if stream.finish_reason is not None:
            self.counters.finished[stream.finish_reason] += 1
        if stream.gone:
            response.outcome = "reset" if stream.reset else "disconnected"
        else:
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        return response

    def _stream_faults_at_start(self, stream: Stream, faults: FaultPlan, *, early: bool) -> None:
        """Apply what happens before the engine's first output: faults due after 0 chunks, then the early token
        (written at once: its stream is submitted but not yet prefilled), then the bundling of the rest."""
        if next_fault(faults, -1) == 0:
            stream.faults_due()
        if early and not stream.gone:
            self.faults.count("early_first_token")
            self.counters.early_tokens += 1
            stream.on_output([self.engine.config.first_output_token_id], None)
        if faults.bundle and not stream.gone:
            stream.bundle()

    # Everything else.

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        body = msgspec.json.encode({"version": f"agentx-sim {installed_version()}"})
        return web.Response(body=body, content_type=_JSON)

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=protocol.model_list(self.config, self.started), content_type=_JSON)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE})

    async def dcgm_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.power.render(), headers={"Content-Type": CONTENT_TYPE})

    def _processed_tokens(self) -> int:
        """Tokens the engine computed: prompt tokens not served from the prefix cache, and generated ones."""
        c = self.engine.counters
        return c.prompt_tokens - c.prefix_cache_hits + c.generation_tokens + self.counters.early_tokens

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = protocol.tokenize(await _read(request), config=self.config, tokenizer=self.tokenizer)
        except ClientError as exc:
            return _error(exc.status, exc.message, param=exc.param)
        return web.Response(body=body, content_type=_JSON)

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = protocol.detokenize(await _read(request), config=self.config, tokenizer=self.tokenizer)
        except ClientError as exc:
            return _error(exc.status, exc.message, param=exc.param)
        return web.Response(body=body, content_type=_JSON)

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.Response(body=msgspec.json.encode(self.faults.current()), content_type=_JSON)

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            config = msgspec.json.decode(await _read(request), type=FaultConfig)
        except ClientError as exc:
            return _error(exc.status, exc.message)
        except msgspec.DecodeError as exc:
            return _error(400, f"Invalid fault settings: {exc}")
        self.faults.apply(config)
        return web.Response(body=msgspec.json.encode(self.faults.current()), content_type=_JSON)
