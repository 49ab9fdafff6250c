"""What the simulator logs about HTTP: one access-log line per request, saying how a response ended when its
status would not (a reset stream, a refused connection, a client gone), and one line, not a traceback, for a
request aiohttp cannot parse."""

from __future__ import annotations

import datetime
import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError


class OutcomeResponse(web.StreamResponse):
    """A response that may not end as its status says."""

    outcome: str | None = None
    """How it ended otherwise, for the access log in place of the status: "refused" (reset before any
    response), "reset" (by a fault, after the headers went out), "disconnected" (the client left),
    "cancelled" (the server stopped)."""


def ended(outcome: str) -> OutcomeResponse:
    response = OutcomeResponse()
    response.outcome = outcome
    return response


def log_cancelled(request: web.Request, started: float, response: OutcomeResponse | None = None) -> None:
    """aiohttp cancels the handler of a connection it lost, or of a server that stops, and then logs nothing."""
    lost = request.transport is None or request.transport.is_closing()
    if response is None:
        response = OutcomeResponse()
    if response.outcome is None:
        response.outcome = "disconnected" if lost else "cancelled"
    request.protocol.log_access(request, response, started)


class AccessLog(AbstractAccessLogger):
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


class OneLineClientErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a header name with a space, a bad request line) with a
    traceback, as if the server had failed; the client did, and one line says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = parse_error(record.exc_info[1] if record.exc_info else None)
        if exc is not None:
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg = "agentx sim: answered %d to a malformed request from %s: %s"
            record.args = (exc.code, remote or "a client", one_line(exc))
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def parse_error(exc: BaseException | None) -> HttpProcessingError | None:
    """The client's mistake behind an exception aiohttp logs, if that is what it is."""
    if isinstance(exc, web.RequestPayloadError):  # a body that does not parse, raised again from a read
        exc = exc.__cause__
    return exc if isinstance(exc, HttpProcessingError) else None


def one_line(exc: HttpProcessingError) -> str:
    # aiohttp's message is the complaint, the offending bytes, then a caret under them.
    return " ".join(line for line in map(str.strip, exc.message.splitlines()) if line.strip("^ "))
