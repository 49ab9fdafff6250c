"""The server's base URL as users type it: `host:port` (AIPerf's form), a full URL, or one ending in `/v1`."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from agentx.errors import BadURLError


def base_url(text: str) -> tuple[str, str | None]:
    """`text` as the base URL requests are built on, and a note for the user when it was changed in a way they
    should know of (a trailing `/v1` removed), else None.

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
    path = parts.path.rstrip("/")
    note = None
    if path.endswith("/v1"):
        while path.endswith("/v1"):
            path = path[: -len("/v1")].rstrip("/")
        note = "the URL ends in /v1, which agentx adds to every path itself; using the URL without it"
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, "", "")), note
