"""The simulator's server process: logging, the listening socket (TLS when asked), the engine's task, signals.

The HTTP application is `agentx.sim.app`; `serve` runs both until SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
import ssl
from collections.abc import Callable

import msgspec
from aiohttp import web

from agentx.sim.app import SimApp
from agentx.sim.engine.loop import SimEngine
from agentx.sim.http_log import AccessLog, OneLineClientErrors
from agentx.sim.options import SimOptions
from agentx.sim.tokenizer import FIRST_WORD_ID

_access_log = logging.getLogger("agentx.sim.access")
_http_log = logging.getLogger("agentx.sim.http")
_one_line_client_errors = OneLineClientErrors()

_SHUTDOWN_GRACE_S = 0.25
_LISTEN_BACKLOG = 4096
"""A burst of thousands of connects must not overflow the accept queue (SYN retries cost a second)."""


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


async def _serve(options: SimOptions, engine: SimEngine, on_ready: Ready) -> None:
    tls = _server_ssl(options)
    sock = _listen(options.host, options.port)
    sim = SimApp(options, engine)
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
        access_log_class=AccessLog,
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
    engine = SimEngine(msgspec.structs.replace(options.engine, first_output_token_id=FIRST_WORD_ID))
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        asyncio.run(_serve(options, engine, on_ready))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(options, engine, on_ready))
