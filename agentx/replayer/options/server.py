"""Where a replay's requests go (`Server`: URL, served models, API, credentials, extra body) and how it connects
(`Connection`: the pool, timeouts, certificate checks); parts of `ReplayOptions` and `DecodeOptions`
(agentx.replayer.options.replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError
from agentx.replayer.http.url import base_url
from agentx.replayer.options.fields import PositiveSeconds
from agentx.secrets import secret_free_repr

if TYPE_CHECKING:
    from agentx.replayer.http.tls import TLSSettings

AFFINITY_HEADERS: Final = ("X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID")
"""Headers a router may key session affinity on; `Server.affinity_headers` picks among them."""
AffinityHeader = Literal["X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID"]


class Server(msgspec.Struct, frozen=True, kw_only=True):
    """Where requests go and what every request carries."""

    url: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000."""
    model: str
    """The served model requests name (a session's main model maps to it, docs/agentx.md §2f)."""
    models: tuple[str, ...] = ()
    """More served models: a session's i-th distinct recorded model (main model first) maps to
    `(model, *models)[i % n]`."""
    api: Literal["completions", "chat"] = "completions"
    """`completions`: token-id prompts (exact); `chat`: messages of calibrated text."""
    api_key: str | None = None
    """Bearer token; never written to records, logs or reports."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra request headers, sent with every call to the server."""
    extra_body: dict[str, Any] | None = None
    """JSON object merged into every request body."""
    stream_usage: Literal["auto", "continuous", "final", "none"] = "auto"
    """`auto` probes the server once before the run (continuous usage if it takes it, else final usage only,
    else no stream_options); the others force one choice."""
    tokenizer: str | None = None
    """With `api="chat"`: a local tokenizer.json to calibrate with instead of the server's /tokenize."""
    affinity_headers: tuple[AffinityHeader, ...] = ()
    """Extra headers that carry the play's X-Correlation-ID value too, for routers that keep a session on one
    worker by another header."""

    def __post_init__(self) -> None:
        from agentx.replayer.http.http1 import check_header  # asyncio and ssl: not for `agentx --help`

        base_url(self.url)  # BadURLError (a ValueError) names what is wrong with it
        for name, value in self.headers:
            check_header(name, value)

    def __repr__(self) -> str:
        return secret_free_repr(self)  # the API key, header values and a URL's password never show


class Connection(msgspec.Struct, frozen=True, kw_only=True):
    """The connection pool and the timeouts of every call."""

    max_connections: Annotated[int, Meta(ge=1)] | None = None
    """Pool size (default: 2 × concurrency; unbounded in the open-loop modes)."""
    connect_timeout_s: PositiveSeconds = 10.0
    """Opening a connection that takes longer fails the request as a timeout of kind "connect"."""
    idle_timeout_s: Annotated[float, Meta(gt=0)] | None = 300.0
    """A request that receives no byte for this long fails as a timeout (kind: idle); None: no limit."""
    request_timeout_s: Annotated[float, Meta(gt=0)] | None = None
    """A request still running after this long fails as a timeout (kind: request); None: no limit."""
    tls_verify: bool = True
    """Check an https server's certificate and host name (False: encrypted, but unchecked)."""
    ca_bundle: str | None = None
    """A PEM file of CA certificates to trust instead of the system's (a private CA, a self-signed server)."""
    proxy: str | None = None
    """An http:// proxy every call goes through (an https:// server through its CONNECT tunnel); "": none, whatever
    the environment says. None: the environment's (`https_proxy`, `http_proxy`, `all_proxy`, `no_proxy`; never for
    a loopback server), as curl reads them (agentx.replayer.http.proxy)."""

    def __post_init__(self) -> None:
        if self.ca_bundle is not None and not self.tls_verify:
            raise ConfigError("a CA bundle is only used when certificates are verified; pass one or the other")
        if self.proxy:
            from agentx.replayer.http.proxy import Proxy  # asyncio and ssl: not for `agentx --help`

            Proxy(self.proxy)  # ConfigError names what is wrong with it

    def __repr__(self) -> str:
        return secret_free_repr(self)  # a proxy URL's password never shows

    @property
    def tls(self) -> TLSSettings:
        """The certificate checks of every call (agentx.replayer.http.tls; ssl loads when a client is made)."""
        from agentx.replayer.http.tls import TLSSettings

        return TLSSettings(verify=self.tls_verify, ca_bundle=self.ca_bundle)
