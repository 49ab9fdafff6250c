"""How an `https://` server's certificate is checked: the settings and the one `ssl.SSLContext` made from them.

`Client` builds the context once for its one `http1` pool, which carries the streamed requests and the probes,
JSON calls and `/metrics` scrapes alike, so no server call checks certificates differently from another.
"""

from __future__ import annotations

import os
import ssl
from typing import Final

import msgspec

from agentx.errors import ConfigError


class TLSSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Certificate checks for `https://` URLs (ignored for `http://`).

    The default is what a browser does: the system's trusted CAs, and the certificate must name the host.
    """

    verify: bool = True
    """Check the server's certificate and that it names the host; False: no check at all (encrypted, but anyone
    in between can read it), for a self-signed server one trusts anyway."""
    ca_bundle: str | None = None
    """A PEM file of CA certificates to trust instead of the system's (a private CA, a self-signed server's own
    certificate); only with `verify`."""

    def __post_init__(self) -> None:
        if self.ca_bundle is not None and not self.verify:
            raise ConfigError("a CA bundle is only used when certificates are verified; pass one or the other")


DEFAULT_TLS: Final = TLSSettings()
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})
"""OpenSSL's reasons for a handshake answered by something that does not speak TLS (a plain http server)."""


def ssl_context(settings: TLSSettings = DEFAULT_TLS) -> ssl.SSLContext:
    """The client context for `settings`; ValueError when the CA bundle is missing or holds no certificate."""
    if not settings.verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if settings.ca_bundle is not None and not os.path.isfile(settings.ca_bundle):
        raise ConfigError(f"CA bundle {settings.ca_bundle!r}: no such file")
    try:
        return ssl.create_default_context(cafile=settings.ca_bundle)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise ConfigError(f"CA bundle {settings.ca_bundle!r}: not a PEM file of certificates ({reason})") from None


def describe_tls_error(exc: BaseException) -> str | None:
    """One line saying why a TLS handshake failed, if `exc` (or what it wraps) is such a failure; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # Some libraries' errors (aiohttp's) subclass ssl's and wrap the original (`certificate_error`, `os_error`):
        # read that one.
        wrapped = getattr(current, "certificate_error", None) or getattr(current, "os_error", None)
        if isinstance(wrapped, ssl.SSLError):
            current = wrapped
        if isinstance(current, ssl.SSLCertVerificationError):
            why = getattr(current, "verify_message", None) or getattr(current, "reason", None) or "rejected"
            return (
                f"the server's TLS certificate was not accepted: {why} (trust its CA with a CA bundle, or turn "
                "certificate verification off)"
            )
        if isinstance(current, ssl.SSLError):
            reason = getattr(current, "reason", None)
            hint = " (is the server plain http? then give an http:// URL)" if reason in _NOT_TLS else ""
            return f"the TLS handshake failed: {reason or current}{hint}"
        current = current.__cause__ or current.__context__
    return None
