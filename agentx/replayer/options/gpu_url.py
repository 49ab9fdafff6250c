"""Where the GPUs' power is scraped from (`Runtime.gpu_metrics_url`, agentx.replayer.telemetry.gpu): the URL checked
and split into the origin a client is made for and the path it asks for, and the URL as a record may show it."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

from agentx.errors import ConfigError
from agentx.replayer.http.credentials import without_userinfo
from agentx.secrets import scrub

DEFAULT_PATH: Final = "/metrics"
"""The path scraped when the URL names none (a DCGM exporter's)."""


def gpu_endpoint(url: str) -> tuple[str, str]:
    """`url` as (origin with its credentials, path): what the client is made for, and what it asks for. A
    ConfigError names what is wrong, the password never."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    bare = without_userinfo(text)[0]
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ConfigError(f"--gpu-metrics {scrub(bare)!r}: not a usable URL") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or port == 0:
        raise ConfigError(f"--gpu-metrics {scrub(bare)!r}: an http(s)://host[:port][/path] URL is needed")
    if parts.fragment:
        raise ConfigError(f"--gpu-metrics {scrub(bare)!r}: a URL has no #fragment here")
    path = (parts.path or DEFAULT_PATH) + (f"?{parts.query}" if parts.query else "")
    return urlunsplit(parts._replace(path="", query="", fragment="")), path


def bare_url(url: str) -> str:
    """`url` as a record may show it: no `user:password@`."""
    origin, path = gpu_endpoint(url)
    return without_userinfo(origin)[0] + path
