"""Reaching the server through an HTTP proxy, as curl does: which proxy a URL takes (`--proxy`, else the
environment's `http_proxy`, `https_proxy`, `all_proxy` and `no_proxy`, either case), and the tunnel an `https://`
server is reached through.

An `http://` server is asked through the proxy with absolute-form request targets (`POST http://host/v1/...`), on
keep-alive connections to the proxy; an `https://` server through a `CONNECT host:port` tunnel, then TLS with the
server itself, so the proxy sees neither the requests nor the credentials. The environment's proxies never apply to
a loopback server (`localhost`, `127.0.0.0/8`, `::1`): a local server is meant to be reached directly, and so are
the hosts `no_proxy` names. An explicit proxy applies to every server. Only `http://` proxies are spoken; a proxy
URL's `user:password@` becomes `Proxy-Authorization: Basic` and is hidden from every message like the server's own
credentials.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import ssl
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import unquote, urlsplit

from agentx.errors import ConfigError
from agentx.replayer.http.http1 import HEAD_MAX_BYTES, HttpConnection

DIRECT: Final = "direct"
"""The route of a request that went straight to the server (`Proxy.route` otherwise)."""
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class ProxyError(ConnectionError):
    """The proxy could not be reached, or did not open the tunnel to the server."""


class Proxy:
    """An HTTP proxy: where its connections go, its URL as messages and records show it (no credentials), and
    the `Proxy-Authorization` its URL's user and password make."""

    __slots__ = ("authorization", "host", "port", "secrets", "shown", "source")

    def __init__(self, url: str, *, source: str = "--proxy") -> None:
        """`source`: where the URL came from, for an error or a note (`--proxy`, the environment's `HTTPS_PROXY`)."""
        self.source = source
        text = url.strip() if "://" in url else "http://" + url.strip()
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"{source}: not a usable proxy URL ({exc})") from None
        if parts.scheme.lower() != "http":
            raise ConfigError(
                f"{source}: {parts.scheme}:// proxies are not supported; agentx speaks to http:// proxies only "
                "(an https:// server is still reached through them, by CONNECT). Give an http:// proxy, or "
                "--no-proxy to go direct"
            )
        if not parts.hostname:
            raise ConfigError(f"{source}: the proxy URL has no host")
        self.host = parts.hostname
        self.port = port or 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.shown = f"http://{host}:{self.port}"
        self.authorization: str | None = None
        self.secrets: tuple[str, ...] = ()
        if parts.username is not None or parts.password is not None:
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            token = base64.b64encode(pair.encode()).decode()
            self.authorization = f"Basic {token}"
            self.secrets = tuple(s for s in (token, unquote(parts.password or ""), parts.password or "") if s)

    @property
    def route(self) -> str:
        """How a request through it went, as records say it."""
        return f"proxy {self.shown}"

    def __repr__(self) -> str:
        credentials = ", credentials=<redacted>" if self.authorization else ""
        return f"Proxy({self.shown!r}{credentials})"


def proxy_for(server_url: str, *, proxy: str | None = None, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy requests to `server_url` go through, if any: `proxy` when given ("": none), else the one `environ`
    (default: the process's) names for the URL's scheme (`https_proxy` or `http_proxy`, else `all_proxy`; the
    lower-case name first), unless the host is loopback or `no_proxy` names it."""
    if proxy is not None:
        return Proxy(proxy) if proxy.strip() else None
    environ = os.environ if environ is None else environ
    parts = urlsplit(server_url)
    host = (parts.hostname or "").lower()
    if _loopback(host) or _excluded(host, parts.port, _env(environ, "no_proxy")):
        return None
    scheme = parts.scheme.lower()
    for name in (f"{scheme}_proxy", "all_proxy"):
        value = _env(environ, name)
        if value:
            return Proxy(value, source=f"the environment's {name.upper()}")
    return None


def _env(environ: Mapping[str, str], name: str) -> str:
    # curl reads http_proxy in lower case only (CGI sets HTTP_PROXY from a request's header); a CLI run is no CGI
    # script, and users set either, so the lower case goes first and the upper case is read too.
    return (environ.get(name) or environ.get(name.upper()) or "").strip()


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _excluded(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether `no_proxy` names `host` (and `port`, where an entry has one): `*`, a domain and its subdomains
    (a leading dot or none), an address, or an address range (`10.0.0.0/8`)."""
    for raw in no_proxy.replace(" ", ",").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.count(":") == 1 or entry.startswith("["):  # host:port, [v6]:port
            name, _, tail = entry.rpartition(":")
            if tail.isdigit() and name:
                entry, entry_port = name, int(tail)
        entry = entry.strip("[]")
        if entry_port is not None and entry_port != port:
            continue
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            domain = entry.lstrip(".")
            if host == domain or host.endswith("." + domain):
                return True
            continue
        try:
            if ipaddress.ip_address(host) in network:
                return True
        except ValueError:
            continue
    return False


class _ConnectAnswer(asyncio.Protocol):
    """Reads the proxy's answer to `CONNECT`: its head, up to the blank line."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end >= 0:
            self.head.set_result(self._buffer[:end])
        elif len(self._buffer) > HEAD_MAX_BYTES:
            self.head.set_exception(ProxyError("the proxy's answer to CONNECT has no end of its head"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ProxyError("the proxy closed the connection before answering CONNECT"))


async def tunnel(proxy: Proxy, host: str, port: int, ssl_context: ssl.SSLContext) -> HttpConnection:
    """A connection to `host:port` through `proxy`'s `CONNECT` tunnel, TLS with the server on top (the caller's
    timeout bounds it all). Raises ProxyError when the proxy refuses the tunnel, OSError when it cannot be reached,
    and the TLS handshake's own errors."""
    loop = asyncio.get_running_loop()
    try:
        transport, answer = await loop.create_connection(_ConnectAnswer, proxy.host, proxy.port)
    except OSError as exc:
        raise ProxyError(f"the proxy {proxy.shown} cannot be reached: {exc.strerror or exc}") from None
    try:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await answer.head
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProxyError(f"the proxy {proxy.shown} answered CONNECT with {status_line[:80]!r}, not HTTP")
        if not 200 <= int(code) < 300:
            raise ProxyError(
                f"the proxy {proxy.shown} refused to open a tunnel to {authority}: {code} {reason}".rstrip()
            )
        connection = HttpConnection()
        tls_transport = await loop.start_tls(transport, connection, ssl_context, server_hostname=host)
        if tls_transport is None:
            raise ProxyError(f"the TLS handshake with {authority} through {proxy.shown} did not complete")
        connection.connection_made(tls_transport)
        return connection
    except BaseException:
        transport.abort()
        raise
