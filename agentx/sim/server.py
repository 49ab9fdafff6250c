"""The simulator's OpenAI-compatible HTTP surface over the engine, shaped like vLLM's.

Streams are written from the engine's synchronous `on_output` callback straight to the socket: one
pre-rendered SSE event per sequence per step, framed as an HTTP chunk by hand, no await per chunk.
The request handler only waits, and takes over when the socket pushes back, a fault holds output, or
the stream ends. docs/sim.md describes the surface, the tokenizer, the metrics and the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import hmac
import logging
import resource
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from agentx.sim import protocol
from agentx.sim.engine import Engine, FinishReason, GenerationRequest, SequenceHandle
from agentx.sim.faults import NO_FAULTS, FaultConfig, FaultInjector, FaultPlan, reset_connection
from agentx.sim.metrics import CONTENT_TYPE, ServerCounters, metrics_registry, render
from agentx.sim.options import SimOptions
from agentx.sim.protocol import DONE, ClientError, error_body
from agentx.sim.tokenizer import FIRST_WORD_ID, Tokenizer, get_tokenizer

_access_log = logging.getLogger("agentx.sim.access")
_http_log = logging.getLogger("agentx.sim.http")

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_MAX_BODY_BYTES = 512 * 1024**2
"""Long prompts as token-id lists run to megabytes; aiohttp's 1 MiB default would answer 413."""
_SHUTDOWN_GRACE_S = 0.25
_LISTEN_BACKLOG = 4096
"""A burst of thousands of connects must not overflow the accept queue (SYN retries cost a second)."""


def _error(
    status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, param), content_type=_JSON, headers=headers)


class _Response(web.StreamResponse):
    """A response that may not end as its status says."""

    outcome: str | None = None
    """How it ended otherwise, for the access log in place of the status: "refused" (reset before any
    response), "reset" (by a fault, after the headers went out), "disconnected" (the client left),
    "cancelled" (the server stopped)."""


def _ended(outcome: str) -> _Response:
    response = _Response()
    response.outcome = outcome
    return response


def _log_cancelled(request: web.Request, started: float, response: _Response | None = None) -> None:
    """aiohttp cancels the handler of a connection it lost, or of a server that stops, and then logs nothing."""
    lost = request.transport is None or request.transport.is_closing()
    if response is None:
        response = _Response()
    if response.outcome is None:
        response.outcome = "disconnected" if lost else "cancelled"
    request.protocol.log_access(request, response, started)


class _AccessLog(AbstractAccessLogger):
    """One line per request. A status alone would say 200 for a stream that was reset after its headers
    went out, and for a refused request whose connection was reset with no response at all."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        outcome = getattr(response, "outcome", None) or response.status
        started = datetime.datetime.now().astimezone() - datetime.timedelta(seconds=time)
        version = request.version
        self.logger.info(
            '%s [%s] "%s %s HTTP/%d.%d" %s %.3f s',
            request.remote or "-",
            started.strftime("%d/%b/%Y:%H:%M:%S %z"),
            request.method,
            request.path_qs,
            version.major,
            version.minor,
            outcome,
            time,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class _OneLineClientErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a header name with a space, a bad request line) with a
    traceback, as if the server had failed; the client did, and one line says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = _parse_error(record.exc_info[1] if record.exc_info else None)
        if exc is not None:
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg = "agentx sim: answered %d to a malformed request from %s: %s"
            record.args = (exc.code, remote or "a client", _one_line(exc))
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def _parse_error(exc: BaseException | None) -> HttpProcessingError | None:
    """The client's mistake behind an exception aiohttp logs, if that is what it is."""
    if isinstance(exc, web.RequestPayloadError):  # a body that does not parse, raised again from a read
        exc = exc.__cause__
    return exc if isinstance(exc, HttpProcessingError) else None


def _one_line(exc: HttpProcessingError) -> str:
    # aiohttp's message is the complaint, the offending bytes, then a caret under them.
    return " ".join(line for line in map(str.strip, exc.message.splitlines()) if line.strip("^ "))


_one_line_client_errors = _OneLineClientErrors()


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except ConnectionError as exc:
        raise ClientError(f"The request body was cut short: {exc}") from None
    except web.RequestPayloadError as exc:  # e.g. a bad chunk size or a gzip body that is not gzip
        cause = _parse_error(exc)
        raise ClientError(f"The request body could not be read: {_one_line(cause) if cause else exc}") from None


class _Collector:
    """A non-streaming request: gathers the output ids until the finish reason arrives."""

    __slots__ = ("done", "finish_reason", "token_ids")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.token_ids: list[int] = []
        self.finish_reason: FinishReason | None = None

    def on_output(self, token_ids: list[int], finish_reason: FinishReason | None) -> None:
        self.token_ids.extend(token_ids)
        if finish_reason is not None and not self.done.done():
            self.finish_reason = finish_reason
            self.done.set_result(None)


class _Stream:
    """One SSE response. `on_output` renders and writes; `drive` (the handler) waits, drains, stalls."""

    __slots__ = (
        "_chunked",
        "_count_fault",
        "_delta_head",
        "_envelope",
        "_fast_tail",
        "_fault_at",
        "_faults",
        "_json_text",
        "_loop",
        "_protocol",
        "_tails",
        "_transport",
        "_waiter",
        "chunks",
        "finish_reason",
        "gone",
        "handle",
        "held",
        "num_tokens",
        "plan",
        "reset",
        "stalling",
    )

    def __init__(
        self,
        plan: protocol.Plan,
        *,
        model_name: str,
        tokenizer: Tokenizer,
        transport: asyncio.Transport,
        http_protocol: Any,
        chunked: bool,
        faults: FaultPlan,
        count_fault: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self._envelope = protocol.envelope(plan, model_name)
        self._delta_head = self._envelope + protocol.DELTA_HEADS[plan.chat]
        self._tails = protocol.FINISH_TAILS[plan.chat]
        plain = not plan.return_token_ids and not plan.continuous_usage
        # Most chunks need nothing but the text between two constant parts.
        self._fast_tail = self._tails[None] + b"}]}\n\n" if plain else None
        self._json_text = tokenizer.json_text
        self._transport = transport
        self._protocol = http_protocol
        self._chunked = chunked
        self._faults = faults
        self._count_fault = count_fault
        self._fault_at = _next_fault(faults, -1)
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self.handle: SequenceHandle | None = None
        self.chunks = 0
        self.num_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.gone = False
        """The client is gone or the connection was reset: write nothing more."""
        self.reset = False
        """A reset fault cut the stream (rather than the client leaving)."""
        self.held: list[bytes] | None = None
        """Framed output waiting for the socket to drain or a stall to end; None when writing through."""
        self.stalling = False

    # The engine's side: synchronous, at most one call per sequence per step.

    def on_output(self, token_ids: list[int], finish_reason: FinishReason | None) -> None:
        if self.gone:
            return
        if self._transport.is_closing():
            self.gone = True
            self._wake()
            return
        try:
            if finish_reason is None and self._fast_tail is not None and (self.chunks or not self.plan.chat):
                text = self._json_text(token_ids, continued=self.num_tokens > 0)
                payload = self._delta_head + text + self._fast_tail
                self.num_tokens += len(token_ids)
            else:
                payload = self._render(token_ids, finish_reason)
            self.chunks += 1
            self.send(payload)
            if finish_reason is not None:
                self.finish_reason = finish_reason
                self._wake()
            elif self.chunks == self._fault_at:
                self.faults_due()
        except BaseException:
            # The engine logs the error and drops the sequence without another call: end the response.
            self.gone = True
            self._wake()
            raise

    def send(self, payload: bytes) -> None:
        """Write SSE bytes as one HTTP chunk, or hold them while the socket pushes back or a stall lasts."""
        if self._chunked:
            payload = b"%x\r\n%b\r\n" % (len(payload), payload)
        if self.held is not None:
            self.held.append(payload)
        elif self._protocol.writing_paused:
            self.held = [payload]
            self._wake()
        else:
            self._transport.write(payload)

    def _render(self, token_ids: list[int], finish_reason: FinishReason | None) -> bytes:
        plan = self.plan
        parts = [protocol.role_event(plan, self._envelope)] if plan.chat and self.chunks == 0 else []
        parts += (
            self._delta_head,
            self._json_text(token_ids, continued=self.num_tokens > 0),
            self._tails[finish_reason],
        )
        self.num_tokens += len(token_ids)
        prompt_tokens = len(plan.prompt_ids)
        if plan.return_token_ids:
            if self.chunks == 0 and not plan.chat:
                parts += (b',"prompt_token_ids":', msgspec.json.encode(plan.prompt_ids.tolist()))
            parts += (b',"token_ids":', msgspec.json.encode(token_ids))
        parts.append(b"}]")
        if plan.continuous_usage:
            parts.append(protocol.usage_field(prompt_tokens, self.num_tokens))
        parts.append(b"}\n\n")
        if finish_reason is not None:
            if plan.include_usage:
                cached = self.handle.num_cached_tokens if self.handle is not None else 0
                parts += (self._envelope, b"]", protocol.usage_field(prompt_tokens, self.num_tokens, cached), b"}\n\n")
            parts.append(DONE)
        return b"".join(parts)

    def faults_due(self) -> None:
        """Apply the faults planned for after `chunks` chunks (never after the last one)."""
        faults, sent = self._faults, self.chunks
        if faults.malformed_after_chunks == sent:
            self._count_fault("malformed")
            self.send(protocol.malformed_event(self._envelope))
        if faults.stall_after_chunks == sent and faults.stall_s > 0:
            self._count_fault("stall")
            self.stalling = True
            if self.held is None:
                self.held = []
            self._wake()
        if faults.reset_after_chunks == sent:
            self._count_fault("reset")
            self.gone = self.reset = True
            reset_connection(self._transport)
            self._wake()
        self._fault_at = _next_fault(faults, sent)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # The handler's side.

    async def drive(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Wait for the end of the stream, sending what was held back (slow reader, stall) meanwhile."""
        while not self.gone:
            if self.stalling:
                await asyncio.sleep(self._faults.stall_s)
                self.stalling = False
            if self.held is not None:
                if self._protocol.writing_paused:
                    try:
                        await drain()
                    except OSError:  # the connection went away while we waited
                        self.gone = True
                        return
                held, self.held = self.held, None
                if self.gone or self._transport.is_closing():
                    self.gone = True
                    return
                self._transport.write(b"".join(held))
                continue
            if self.finish_reason is not None:
                return
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


def _next_fault(plan: FaultPlan, after: int) -> int:
    due = [
        at
        for at in (plan.malformed_after_chunks, plan.stall_after_chunks, plan.reset_after_chunks)
        if at is not None and at > after
    ]
    return min(due) if due else -1


class _Sim:
    """The application: routes, the engine, the tokenizer, the faults and the counters."""

    def __init__(self, options: SimOptions, engine: Engine) -> None:
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
            return _ended("refused")
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
                return await self._complete(plan)
        except asyncio.CancelledError:
            _log_cancelled(request, started)
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
        self, plan: protocol.Plan, on_output: Callable[[list[int], FinishReason | None], None]
    ) -> SequenceHandle:
        generation = GenerationRequest(
            prompt_ids=plan.prompt_ids,
            max_tokens=plan.max_tokens,
            min_tokens=plan.min_tokens,
            ignore_eos=plan.ignore_eos,
            cache_salt=plan.cache_salt,
        )
        return self.engine.submit(generation, on_output)

    def _abort(self, handle: SequenceHandle | None) -> None:
        if handle is not None and not handle.finished:
            self.engine.abort(handle)
            self.counters.finished["abort"] += 1

    async def _complete(self, plan: protocol.Plan) -> web.StreamResponse:
        collector = _Collector(asyncio.get_running_loop().create_future())
        handle: SequenceHandle | None = None
        try:
            handle = self._submit(plan, collector.on_output)
            await collector.done
        except ValueError as exc:
            return _error(400, str(exc))
        finally:
            if collector.finish_reason is None:
                self._abort(handle)
        assert collector.finish_reason is not None and handle is not None
        self.counters.finished[collector.finish_reason] += 1
        text = self.tokenizer.decode(collector.token_ids)
        body = protocol.full_response(
            plan, text, collector.token_ids, collector.finish_reason, handle.num_cached_tokens, self.config.model_name
        )
        return web.Response(body=body, content_type=_JSON)

    async def _stream(
        self, request: web.Request, plan: protocol.Plan, faults: FaultPlan, started: float
    ) -> web.StreamResponse:
        response = _Response(headers=_SSE_HEADERS)
        try:
            writer = await response.prepare(request)
        except ConnectionError:  # the client left before the headers went out
            response.outcome = "disconnected"
            return response
        except asyncio.CancelledError:
            _log_cancelled(request, started, response)
            raise
        transport = request.transport
        if writer is None or transport is None or transport.is_closing():
            response.outcome = "disconnected"
            return response
        stream = _Stream(
            plan,
            model_name=self.config.model_name,
            tokenizer=self.tokenizer,
            transport=transport,
            http_protocol=request.protocol,
            chunked=request.version >= (1, 1),
            faults=faults,
            count_fault=self.faults.count,
        )
        try:
            stream.handle = self._submit(plan, stream.on_output)
            if faults is not NO_FAULTS and _next_fault(faults, -1) == 0:
                stream.faults_due()
            await stream.drive(writer.drain)
        except asyncio.CancelledError:
            if stream.reset:
                response.outcome = "reset"
            _log_cancelled(request, started, response)
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

    # Everything else.

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        body = msgspec.json.encode({"version": f"agentx-sim {_agentx_version()}"})
        return web.Response(body=body, content_type=_JSON)

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=protocol.model_list(self.config, self.started), content_type=_JSON)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE})

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


def _agentx_version() -> str:
    try:
        return package_version("agentx")
    except PackageNotFoundError:
        return "unknown"


def _raise_fd_limit() -> None:
    # Thousands of concurrent streams need thousands of sockets; the soft limit is often 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(_LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


Ready = Callable[[str, str], None]
"""Called once listening, with the base URL and the served model name."""


def _server_ssl(options: SimOptions) -> ssl.SSLContext | None:
    """The https context of `options` (None: plain http); ValueError when the certificate or key do not load."""
    if options.tls_cert is None or options.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise ValueError(
            f"cannot load the TLS certificate {options.tls_cert} and key {options.tls_key}: {reason}"
        ) from None
    return context


async def _serve(options: SimOptions, engine: Engine, on_ready: Ready) -> None:
    tls = _server_ssl(options)
    sock = _listen(options.host, options.port)
    sim = _Sim(options, engine)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    _http_log.addFilter(_one_line_client_errors)
    runner = web.AppRunner(
        sim.app(),
        handle_signals=False,
        handler_cancellation=True,
        logger=_http_log,
        access_log=_access_log if options.access_log else None,
        access_log_class=_AccessLog,
        shutdown_timeout=_SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    protocol_factory = runner.server
    assert protocol_factory is not None
    server = await loop.create_server(protocol_factory, sock=sock, backlog=_LISTEN_BACKLOG, ssl=tls)
    engine_task = loop.create_task(engine.run())
    engine_task.add_done_callback(lambda _: stop.set())
    host, port = sock.getsockname()[:2]
    scheme = "https" if tls is not None else "http"
    on_ready(f"{scheme}://{_url_host(host)}:{port}", options.engine.model_name)
    # Everything built so far lives until exit: keep the collector from rescanning it on every cycle.
    gc.freeze()
    try:
        await stop.wait()
    finally:
        server.close()
        await runner.cleanup()
        engine.stop()
        if not engine_task.done():
            await engine_task
    if not engine_task.cancelled() and (exc := engine_task.exception()) is not None:
        raise RuntimeError(f"the engine stopped with an error: {exc!r}") from exc


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(options: SimOptions, on_ready: Ready) -> None:
    """Run the simulator until SIGINT or SIGTERM. Raises OSError (cannot listen) or ValueError (bad config)."""
    logging.basicConfig(level=logging.INFO if options.access_log else logging.WARNING, format="%(message)s")
    if options.access_log:
        # The command line holds the "agentx" logger at WARNING, which would silence the access log.
        _access_log.setLevel(logging.INFO)
    _raise_fd_limit()
    # Generated text is ordinary words only: no role markers or single characters inside a reply.
    engine = Engine(msgspec.structs.replace(options.engine, first_output_token_id=FIRST_WORD_ID))
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        asyncio.run(_serve(options, engine, on_ready))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(options, engine, on_ready))
