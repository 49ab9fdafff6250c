"""The server calls whose whole answer is read at once: the model listing and `/version`, the stream-usage probe,
`/tokenize` and `/detokenize`, and the `/metrics` scrapes. They go over the same `http1` pool as the streamed
requests, with the same headers, credentials and TLS context.

Each call has a total timeout (the client's probe timeout unless the call says otherwise), and its connect has the
client's connect timeout. A connection that fails, a timeout, or an answer that is not HTTP raises
`ServerUnreachable`, naming the URL and why in one line (a refused TLS certificate as `tls.describe_tls_error` says
it); an error status is the caller's to read. A GET follows the server's redirects (301, 302, 303, 307, 308; at
most `MAX_REDIRECTS`), a POST only 307 and 308, which keep its body, and only on the same server: a redirect to
another scheme, host or port is not followed, since the credentials would go with it (and the streamed requests,
which follow none, would not go there anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Final
from urllib.parse import urljoin, urlsplit

import msgspec

from agentx.errors import ModelNotServed, ModelsNotListed, ServerUnreachable
from agentx.replayer.http.exchange import describe, error_message
from agentx.replayer.http.http1 import HTTPProtocolError, WholeBody, encode_headers, encode_request
from agentx.replayer.http.pool import Pool, send

METRICS_TIMEOUT_S: Final = 5.0
"""How long a `/metrics` scrape may take."""
MAX_REDIRECTS: Final = 5
BODY_MAX_BYTES: Final = 64 * 1024 * 1024
"""The largest answer a call reads (a model list or `/metrics` is kilobytes)."""
_GET_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_BODY_REDIRECTS: Final = frozenset({307, 308})
_log = logging.getLogger(__name__)


BASE_URL_HINT: Final = "is the base URL right? agentx adds /v1/... to it itself"
"""What a server that answers, but not at the model list's path, most often means: a base URL with a path of too
many or too few parts."""


def _refusal(url: str, status: int, reason: str, body: bytes) -> str:
    """What a server that answered `GET url` (the model list) with an error status said, for a user to act on."""
    said = f"the server answered {status} {reason or _phrase(status)}".rstrip()
    if status == 404:
        # The body of a 404 is the web framework's page or its "Not Found" again: the path is what to check.
        return f"{said} for GET {url}: {BASE_URL_HINT}"
    message = error_message(body)
    return f"{said} for GET {url}: {message}" if message else f"{said} for GET {url}"


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class _Model(msgspec.Struct):
    id: str
    max_model_len: int | None = None
    """vLLM's and SGLang's context length of the model (absent elsewhere)."""


class _ModelList(msgspec.Struct):
    data: list[_Model]


_models_decoder: Final = msgspec.json.Decoder(_ModelList)


class Calls:
    """Whole-answer calls to the server at `base_url` through `pool`. `head` is every call's constant header lines
    (`Host`, the caller's headers and the credentials; no `Accept`, each call sets its own), `scrub` hides secrets
    from messages."""

    def __init__(
        self,
        pool: Pool,
        base_url: str,
        *,
        head: bytes,
        scrub: Callable[[str], str],
        probe_timeout_s: float,
        content_type: bool = True,
    ) -> None:
        self.pool = pool
        self.base_url = base_url
        self.head = head
        self.scrub = scrub
        self.probe_timeout_s = probe_timeout_s
        self.content_type = content_type
        """Whether a call with a body says `Content-Type: application/json` (False: the caller's headers do)."""
        origin = urlsplit(base_url)
        self._origin = (origin.scheme, origin.hostname, _port(origin.scheme, origin.port))
        self._root = f"{origin.scheme}://{origin.netloc}"
        """The server's URL without a path: a request target (the base URL's path included) goes after it."""

    async def probe_models(self, require: str | None = None) -> list[str]:
        """The model ids of `GET /v1/models`; raises ServerUnreachable (ModelsNotListed when the server answered
        with something else than its model list), or ModelNotServed if `require` is absent."""
        return list(await self.served_models(require))

    async def served_models(self, require: str | None = None) -> dict[str, int | None]:
        """`probe_models` with each model's context length, where the server says it (`max_model_len`)."""
        url = self.base_url + "/v1/models"
        status, reason, body = await self.call("GET", "/v1/models", None, timeout_s=None, accept="application/json")
        if status != 200:
            raise ModelsNotListed(self.scrub(_refusal(url, status, reason, body)))
        try:
            models = {model.id: model.max_model_len for model in _models_decoder.decode(body).data}
        except msgspec.DecodeError as exc:
            said = f"the server answered GET {url} with something that is not a model list ({exc}); {BASE_URL_HINT}"
            raise ModelsNotListed(self.scrub(said)) from None
        if require is not None and require not in models:
            raise ModelNotServed(f"model {require!r} is not served by {self.base_url} (served: {', '.join(models)})")
        return models

    async def request_json(
        self, method: str, path: str, payload: object | None = None, *, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """A plain JSON request (tokenize, probes): (HTTP status, body). Raises ServerUnreachable on a connection
        failure or timeout (default: the probe timeout)."""
        data = msgspec.json.encode(payload) if payload is not None else None
        status, _, body = await self.call(method, path, data, timeout_s=timeout_s, accept="application/json")
        return status, body

    async def metrics_text(self, *, timeout_s: float = METRICS_TIMEOUT_S) -> str | None:
        """The server's Prometheus metrics, `GET /metrics` as text; None when it has none to give (another status
        than 200, a failed connection, a timeout, a body that is not text). Only a missing endpoint (404) is
        expected; any other failure, a refused credential or certificate for instance, is logged as a warning,
        since the figures computed from the counters then drop out of the run's summary."""
        try:
            status, _, body = await self.call("GET", "/metrics", None, timeout_s=timeout_s, accept="text/plain")
        except ServerUnreachable as exc:
            _log.warning("no server counters: %s", exc)
            return None
        if status != 200:
            if status != 404:
                message = self.scrub(error_message(body))
                _log.warning("no server counters: GET %s/metrics: HTTP %d: %s", self.base_url, status, message)
            return None
        try:
            return body.decode()
        except UnicodeDecodeError:
            _log.warning("no server counters: GET %s/metrics: the answer is not UTF-8 text", self.base_url)
            return None

    async def call(
        self, method: str, path: str, body: bytes | None, *, timeout_s: float | None, accept: str
    ) -> tuple[int, str, bytes]:
        """`method path` with `body` (JSON), its redirects followed: (status, reason, whole body). Raises
        ServerUnreachable when no answer came within `timeout_s` (default: the probe timeout)."""
        url = self.base_url + path
        total_s = timeout_s or self.probe_timeout_s
        head = self.head + encode_headers({"Accept": accept})
        if body is not None and self.content_type:
            head += b"Content-Type: application/json\r\n"
        try:
            async with asyncio.timeout(total_s) as deadline:
                return await self._follow(method, self.pool.endpoint.prefix + path, head, body)
        except TimeoutError:
            if deadline.expired():
                why = f"no answer within {total_s:g} s"
            else:
                why = f"connecting timed out after {self.pool.connect_timeout_s:g} s"
            raise ServerUnreachable(self.scrub(f"{method} {url}: {why}")) from None
        except (HTTPProtocolError, OSError) as exc:  # refused, reset, a TLS handshake refused, not HTTP
            raise ServerUnreachable(self.scrub(f"{method} {url}: {describe(exc)}")) from None

    async def _follow(self, method: str, target: str, head: bytes, body: bytes | None) -> tuple[int, str, bytes]:
        redirects = _GET_REDIRECTS if method == "GET" else _BODY_REDIRECTS
        for _ in range(MAX_REDIRECTS + 1):
            answer = WholeBody(BODY_MAX_BYTES)
            request = encode_request(method, self.pool.endpoint.target_root + target, head, body)
            await send(self.pool, request, answer)
            location = answer.headers.get("location")
            if answer.status not in redirects or not location:
                return answer.status, answer.reason, answer.body
            target = self._same_server(method, target, location)
        raise ServerUnreachable(self.scrub(f"{method} {self._root}{target}: more than {MAX_REDIRECTS} redirects"))

    def _same_server(self, method: str, target: str, location: str) -> str:
        """The request target a redirect to `location` asks for; ServerUnreachable when it is on another server."""
        there = urlsplit(urljoin(self._root + target, location.strip()))
        if (there.scheme, there.hostname, _port(there.scheme, there.port)) != self._origin:
            raise ServerUnreachable(
                self.scrub(
                    f"{method} {self._root}{target}: redirected to another server "
                    f"({there.scheme}://{there.netloc.rpartition('@')[2]}), not followed: give that server's URL"
                )
            )
        return (there.path or "/") + (f"?{there.query}" if there.query else "")


def _port(scheme: str, port: int | None) -> int:
    return port if port is not None else (443 if scheme == "https" else 80)
