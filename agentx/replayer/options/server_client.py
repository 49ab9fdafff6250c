"""The one place options become a `Client`: every call a run makes to its server, the requests and probes of the
replay (agentx.replayer.run_replay) or of `decode`, and the `/metrics` scrapes around a run (agentx.run.replay), goes
through a client made here, so all of them carry the same credentials, headers, TLS settings and timeouts."""

from __future__ import annotations

from collections.abc import Sequence

from agentx.replayer.http.client import Client
from agentx.replayer.http.exchange import CONTEXT_OVERFLOW_SUBSTRINGS
from agentx.replayer.options.replay import Connection, Server


def server_client(
    server: Server,
    connection: Connection,
    *,
    limit: int = 2,
    context_overflow_substrings: Sequence[str] = CONTEXT_OVERFLOW_SUBSTRINGS,
) -> Client:
    """A client (not yet open: `async with`) for `server`, through a pool of at most `limit` connections (0: no
    limit) with `connection`'s timeouts, certificate checks and proxy."""
    return Client(
        server.url,
        api_key=server.api_key,
        headers=dict(server.headers),
        tls=connection.tls,
        limit=limit,
        connect_timeout_s=connection.connect_timeout_s,
        idle_timeout_s=connection.idle_timeout_s,
        total_timeout_s=connection.request_timeout_s,
        context_overflow_substrings=context_overflow_substrings,
        proxy=connection.proxy,
    )
