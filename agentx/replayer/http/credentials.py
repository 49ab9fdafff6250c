"""The credentials a client sends with every call, and the secrets it hides from every message.

An explicit `Authorization` header wins; else the API key is sent as `Authorization: Bearer ...`; else a URL's
`user:password@` as basic authentication. An explicit header is what the caller chose: a key (typically from the
environment) does not silently replace it, nor does a key give way to a URL's password. The key, the password and
every header value the caller gave are secrets: `Credentials.scrub` replaces them in any text meant for a message,
a log line or an `Exchange`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote, urlsplit, urlunsplit

SECRET_MIN_CHARS: Final = 4
"""Header values shorter than this are not scrubbed from messages (they would mangle them, and hide nothing)."""
REDACTED: Final = "<redacted>"
_log = logging.getLogger(__name__)


def without_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """`url` without its `user:password@`, and the user and password (percent-encoded as given; None when absent).
    The URL a message, a log line or a request line gets to see is the bare one."""
    parts = urlsplit(url)
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, parts.username, parts.password


class Credentials:
    """The headers every call carries (the caller's, plus the `Authorization` the credentials make) and the
    secrets to hide. `base_url` (without user and password) only names the server in a warning."""

    __slots__ = ("headers", "secrets")

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        user: str | None = None,
        password: str | None = None,
        hidden: tuple[str, ...] = (),
    ) -> None:
        """`hidden`: more secrets to scrub from messages (a proxy's credentials)."""
        self.headers: dict[str, str] = dict(headers or {})
        explicit_auth = next((value for name, value in self.headers.items() if name.lower() == "authorization"), None)
        # What to hide from every message: the values the caller gave (the standard headers are no secret).
        secrets = {value for value in self.headers.values() if len(value) >= SECRET_MIN_CHARS} | set(hidden)
        if explicit_auth is not None:
            secrets.add(explicit_auth.partition(" ")[2].strip())
        elif api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
            secrets.add(api_key)
        elif user is not None or password is not None:
            pair = f"{unquote(user or '')}:{unquote(password or '')}"
            token = base64.b64encode(pair.encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
            secrets.update((token, unquote(password or ""), password or ""))
        if (user is not None or password is not None) and (explicit_auth is not None or api_key):
            _log.warning(
                "%s: the URL's user and password are not used (an API key or Authorization header is)", base_url
            )
        # Longest first, so that a secret holding another is hidden whole.
        self.secrets: tuple[str, ...] = tuple(
            sorted((s for s in secrets if len(s) >= SECRET_MIN_CHARS), key=len, reverse=True)
        )

    @property
    def present(self) -> bool:
        """Whether any credential or secret header is sent (a `repr` then says `credentials=<redacted>`)."""
        return "Authorization" in self.headers or bool(self.secrets)

    def scrub(self, text: str, max_chars: int | None = None) -> str:
        """`text` with every secret replaced by `<redacted>`, cut to `max_chars`."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text if max_chars is None else text[:max_chars]

    def __repr__(self) -> str:
        return f"Credentials({REDACTED if self.present else 'none'})"
