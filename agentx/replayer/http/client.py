"""HTTP client for OpenAI-compatible servers: every call a run makes to its server, through one `Client`.

It knows HTTP and SSE, not traces: callers hand it a path and a pre-encoded JSON body and get back an `Exchange`
of timestamps, token counts, usage and, on failure, an error kind (`exchange.py`); server and network failures of
a request never raise. The client composes its parts, each a module of its own:

- `credentials.py`: the API key as a bearer token, explicit headers, or a URL's user and password, and the secrets
  hidden from every message;
- `pool.py` over `http1.py`: one keep-alive pool of lean HTTP/1.1 connections, sized for the concurrency, with
  the TLS context of `tls.TLSSettings` and the connect timeout, direct or through the proxy of `proxy.py`;
- `streaming.py`: the streamed (and non-streamed) generation requests, timed per chunk, with the idle watchdog;
- `calls.py`: the calls whose whole answer is read (the model listing, probes, `/tokenize`, `/metrics`).

Both kinds of call share the pool, the headers, the credentials and the TLS context, so no server call is made
differently from another; the replayer imports no other HTTP library.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final

from agentx.errors import ModelNotServed, ServerUnreachable
from agentx.records.kinds import ErrorKind, TimeoutKind
from agentx.replayer.http.calls import METRICS_TIMEOUT_S, Calls
from agentx.replayer.http.credentials import Credentials, without_userinfo
from agentx.replayer.http.exchange import (
    CONTEXT_OVERFLOW_SUBSTRINGS,
    MESSAGE_MAX_CHARS,
    Exchange,
)
from agentx.replayer.http.http1 import Body, Endpoint, encode_headers
from agentx.replayer.http.pool import SPARE_CONNECTIONS, Pool
from agentx.replayer.http.proxy import DIRECT, proxy_for
from agentx.replayer.http.streaming import WATCHDOG_PERIOD_MAX_S, StreamResponse, Streams
from agentx.replayer.http.tls import DEFAULT_TLS, TLSSettings, ssl_context
from agentx.replayer.http.url import base_url as parse_base_url

__all__ = [
    "MESSAGE_MAX_CHARS",
    "METRICS_TIMEOUT_S",
    "WATCHDOG_PERIOD_MAX_S",
    "Client",
    "ErrorKind",
    "Exchange",
    "ModelNotServed",
    "ServerUnreachable",
    "TimeoutKind",
]

USER_AGENT: Final = "agentx"
_log = logging.getLogger(__name__)


class Client:
    """Every call to one server: a keep-alive connection pool sized for the concurrency, shared by the streamed
    requests and the probes, JSON calls and `/metrics` scrapes, all with the same headers, credentials, TLS context
    and timeouts. Use as `async with`.

    Credentials: an explicit `Authorization` header wins; else the API key is sent as `Authorization: Bearer ...`;
    else a URL's `user:password@` as basic authentication. The key, the password and every header value are
    never logged, never in `repr`, never in an `Exchange` or an exception (messages are scrubbed of them).

    Proxy (agentx.replayer.http.proxy): `proxy` when given ("": none), else the environment's (`https_proxy`,
    `http_proxy`, `all_proxy`, `no_proxy`; never for a loopback server). `route` says which way requests go:
    "direct", or "proxy http://host:port".
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        tls: TLSSettings = DEFAULT_TLS,
        limit: int = 1024,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float | None = 300.0,
        total_timeout_s: float | None = None,
        probe_timeout_s: float = 10.0,
        keepalive_timeout_s: float = 60.0,
        context_overflow_substrings: Sequence[str] = CONTEXT_OVERFLOW_SUBSTRINGS,
        spare_connections: int = SPARE_CONNECTIONS,
        proxy: str | None = None,
    ) -> None:
        url, note = parse_base_url(base_url)
        # A URL's user and password become a header like any other credential, never part of a URL that a message
        # or a log line gets to see.
        self.base_url, user, password = without_userinfo(url)
        if note:
            _log.warning("%s: %s", self.base_url, note)
        self.tls = tls
        self._ssl = ssl_context(tls) if self.base_url.startswith("https:") else None
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.total_timeout_s = total_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.spare_connections = spare_connections
        self.context_overflow_substrings = tuple(s.lower() for s in context_overflow_substrings)
        self.proxy = proxy_for(self.base_url, proxy=proxy)
        self.route = DIRECT if self.proxy is None else self.proxy.route
        self._credentials = Credentials(
            self.base_url,
            api_key=api_key,
            headers=headers,
            user=user,
            password=password,
            hidden=self.proxy.secrets if self.proxy is not None else (),
        )
        self._endpoint = Endpoint(self.base_url, self._ssl, self.proxy)
        sent = self._credentials.headers
        # A plain-http request tells the proxy who asks; through a CONNECT tunnel the tunnel's own request did.
        proxy_auth = (
            {"Proxy-Authorization": self.proxy.authorization}
            if self.proxy is not None and self.proxy.authorization and self._ssl is None
            else {}
        )
        # No Accept-Encoding would allow any coding (RFC 9110 §12.5.3): a server or proxy that gzips a stream then
        # hides its chunks' timing and sends what no stream parser reads. agentx reads identity only, unless the
        # user's own headers say otherwise.
        own = {name.lower() for name in sent}
        identity = {} if "accept-encoding" in own else {"Accept-Encoding": "identity"}
        # Every streamed request's constant head lines, encoded once.
        self._fixed_head = encode_headers(
            {
                "Host": self._endpoint.host_header,
                "User-Agent": USER_AGENT,
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
                **identity,
                **sent,
                **proxy_auth,
            }
        )
        # The whole-answer calls say what they accept themselves.
        self._calls_head = encode_headers(
            {
                "Host": self._endpoint.host_header,
                "User-Agent": USER_AGENT,
                **identity,
                **{name: value for name, value in sent.items() if name.lower() != "accept"},
                **proxy_auth,
            }
        )
        self._content_type = not any(name.lower() == "content-type" for name in sent)
        self._pool: Pool | None = None
        self._streams: Streams | None = None
        self._calls: Calls | None = None

    def __repr__(self) -> str:
        key = ", credentials=<redacted>" if self._credentials.present else ""
        via = f", proxy={self.proxy!r}" if self.proxy is not None else ""
        return f"Client({self.base_url!r}{key}{via}, tls={self.tls!r}, limit={self.limit})"

    __str__ = __repr__

    async def __aenter__(self) -> Client:
        self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def open(self) -> None:
        """Create the pool; must run inside the event loop that will use it."""
        if self._pool is not None:
            return
        self._pool = pool = Pool(
            self._endpoint,
            limit=self.limit,
            connect_timeout_s=self.connect_timeout_s,
            keepalive_timeout_s=self.keepalive_timeout_s,
            spare=self.spare_connections,
        )
        self._streams = Streams(
            pool,
            head=self._fixed_head,
            scrub=self._scrub,
            connect_timeout_s=self.connect_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            total_timeout_s=self.total_timeout_s,
            context_overflow_substrings=self.context_overflow_substrings,
        )
        self._calls = Calls(
            pool,
            self.base_url,
            head=self._calls_head,
            scrub=self._scrub,
            probe_timeout_s=self.probe_timeout_s,
            content_type=self._content_type,
        )

    async def close(self) -> None:
        if self._streams is not None:
            self._streams.close()
            self._streams = None
        self._calls = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _scrub(self, text: str) -> str:
        return self._credentials.scrub(text, MESSAGE_MAX_CHARS)

    def _require_calls(self) -> Calls:
        if self._calls is None:
            raise RuntimeError("Client is not open: use `async with Client(...)` or call open() in the loop")
        return self._calls

    def _require_streams(self) -> Streams:
        if self._streams is None:
            raise RuntimeError("Client is not open: use `async with Client(...)` or call open() in the loop")
        return self._streams

    async def probe_models(self, require: str | None = None) -> list[str]:
        """The model ids of `GET /v1/models`; raises ServerUnreachable, or ModelNotServed if `require` is absent."""
        return await self._require_calls().probe_models(require)

    async def served_models(self, require: str | None = None) -> dict[str, int | None]:
        """`probe_models` with each model's context length, where the server says it (`max_model_len`)."""
        return await self._require_calls().served_models(require)

    async def request_json(
        self, method: str, path: str, payload: object | None = None, *, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """A plain JSON request (tokenize, probes): (HTTP status, body). Raises ServerUnreachable on a
        connection failure or timeout (default: the probe timeout)."""
        return await self._require_calls().request_json(method, path, payload, timeout_s=timeout_s)

    async def metrics_text(self, *, timeout_s: float = METRICS_TIMEOUT_S) -> str | None:
        """The server's Prometheus metrics, `GET /metrics` as text; None when it has none to give (another status
        than 200, a failed connection, a timeout, a body that is not text). Only a missing endpoint (404) is
        expected; any other failure is logged as a warning (`no server counters: ...`)."""
        return await self._require_calls().metrics_text(timeout_s=timeout_s)

    async def stream(
        self,
        path: str,
        body: Body,
        *,
        extra_headers: Mapping[str, str] | None = None,
        into: Exchange | None = None,
    ) -> Exchange:
        """POST a pre-encoded streaming request body to `path` and record the response as it arrives, in `into`
        when given: a caller that cancels the call still holds what arrived until then."""
        streams = self._require_streams()
        return await streams.exchange(path, body, extra_headers, StreamResponse(streamed=True, exchange=into))

    async def complete(
        self,
        path: str,
        body: Body,
        *,
        extra_headers: Mapping[str, str] | None = None,
        into: Exchange | None = None,
    ) -> Exchange:
        """POST a pre-encoded non-streaming (`"stream": false`) body; the whole answer is one chunk at its end."""
        streams = self._require_streams()
        return await streams.exchange(path, body, extra_headers, StreamResponse(streamed=False, exchange=into))
