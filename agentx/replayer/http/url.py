"""The server's base URL as users type it: `host:port` (AIPerf's form), a full URL, or one ending in `/v1` or in an
endpoint's path (`/v1/chat/completions`, copied from a curl line)."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

from agentx.errors import BadURLError

ENDPOINT_PATHS: Final = ("/chat/completions", "/completions", "/responses", "/v1/models")
"""Endpoint paths a URL may end in (after `/v1` or not), which agentx adds to the base URL itself. Longest first: a
path ending in `/chat/completions` ends in `/completions` too. `/models` only after `/v1`: alone it may well be a
gateway's own prefix."""


def base_url(text: str) -> tuple[str, str | None]:
    """`text` as the base URL requests are built on, and a note for the user when it was changed in a way they
    should know of (a trailing `/v1` or endpoint path removed), else None.

    Surrounding whitespace is dropped and a URL without a scheme is taken as `http://`. Raises BadURLError for an
    empty URL, a scheme other than http(s), no host, a port outside 1..65535, a malformed IPv6 address, or a
    query or fragment (requests append their own paths, so either would be sent nowhere useful).
    """
    url = text.strip()
    if not url:
        raise BadURLError("the server URL is empty")
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a non-numeric port
        raise BadURLError(f"{text!r} is not a usable server URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise BadURLError(f"{text!r}: the server URL must be http:// or https://, not {parts.scheme}://")
    if not parts.hostname:
        raise BadURLError(f"{text!r}: the server URL has no host")
    if port == 0:
        raise BadURLError(f"{text!r}: port 0 is not a server's port")
    if parts.query or parts.fragment:
        raise BadURLError(f"{text!r}: a server base URL has no ?query or #fragment")
    typed_path = path = parts.path.rstrip("/")
    endpoint = next((end for end in ENDPOINT_PATHS if path.endswith(end)), None)
    if endpoint is not None:
        path = path[: -len(endpoint)].rstrip("/")
    while path.endswith("/v1"):
        path = path[: -len("/v1")].rstrip("/")
    note = None
    if endpoint is not None:
        # A URL copied from a curl line or a client's settings: requests to it would go to `.../completions/v1/...`.
        note = (
            f"the URL ends in {typed_path[len(path) :]}, an endpoint's path: agentx adds each endpoint's path "
            "itself; using the URL without it"
        )
    elif path != typed_path:
        note = "the URL ends in /v1, which agentx adds to every path itself; using the URL without it"
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, "", "")), note
