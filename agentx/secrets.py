"""Keeping credentials out of what agentx stores and prints: `redact` (run options), `scrub` (free text such as
error messages), `secret_free_repr` (a struct's repr)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

REDACTED: Final = "[redacted]"
# A plural "tokens" key is a count (max_tokens, cached_tokens); a singular "token" is a credential.
_SECRET_KEY = re.compile(
    r"((api|access|private|secret|auth|signing)_?keys?|secrets?|passw(or)?ds?|token|auth|authorization|cookies?"
    r"|credentials?)$",
    re.IGNORECASE,
)
_HEADERS_KEY = re.compile(r"headers?$", re.IGNORECASE)
_COUNT_KEY = re.compile(r"^(max|min|num)_", re.IGNORECASE)
_SECRET_TEXT = re.compile(
    r"(?i:bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}"  # an Authorization value
    r"|\b(?:sk|pk|rk|hf|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{8,}"  # common API key shapes
    r"|(?<=://)[^/@\s:]+:[^/@\s]+(?=@)"  # user:password in a URL
)


def _secret_key(key: str) -> bool:
    # "max_token" and friends are limits, not credentials.
    normalized = key.replace("-", "_").lstrip("_")
    return bool(_SECRET_KEY.search(normalized)) and not _COUNT_KEY.search(normalized)


def scrub(text: str) -> str:
    """`text` with bearer/basic credentials, API-key-shaped words and URL passwords replaced."""
    return _SECRET_TEXT.sub(REDACTED, text)


def secret_free_repr(struct: msgspec.Struct) -> str:
    """`repr(struct)` with the fields that hold credentials (an API key, header values, a URL's password) shown as
    `redact` stores them; every other field as its own repr."""
    parts = []
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        if isinstance(value, msgspec.Struct):  # a part of composed options: shown the same way, as itself
            parts.append(f"{name}={secret_free_repr(value)}")
            continue
        plain = msgspec.to_builtins({name: value}, enc_hook=str)
        safe = redact(plain)
        parts.append(f"{name}={value!r}" if safe == plain else f"{name}={safe[name]!r}")
    return f"{type(struct).__name__}({', '.join(parts)})"


def redact(options: Any) -> Any:
    """A copy of `options` (nested dicts/lists) without credentials, safe to store in a records file.

    Values under credential-like keys (`api_key`, `Authorization`, `*_token`, `password`, ...) and every
    value under a `headers` key are replaced by `"[redacted]"` (header names are kept); CLI-style lists
    (`["--api-key", "sk-…"]`, `"--api-key=…"`) lose the value after a credential flag; any remaining
    string is `scrub`bed. The input is not modified.
    """
    if isinstance(options, Mapping):
        result: dict[Any, Any] = {}
        for key, value in options.items():
            name = str(key)
            if _secret_key(name):
                result[key] = REDACTED
            elif _HEADERS_KEY.search(name) and isinstance(value, Mapping):
                result[key] = dict.fromkeys(value, REDACTED)
            elif _HEADERS_KEY.search(name) and isinstance(value, list | tuple):
                result[key] = [REDACTED for _ in value]
            else:
                result[key] = redact(value)
        return result
    if isinstance(options, list | tuple):
        items: list[Any] = []
        hide_next = False
        for item in options:
            if hide_next:
                items.append(REDACTED)
                hide_next = False
                continue
            if isinstance(item, str) and item.startswith("-"):
                flag, eq, _ = item.partition("=")
                if _secret_key(flag.lstrip("-")) or _HEADERS_KEY.search(flag) or flag == "-H":  # curl-style -H
                    if eq:
                        items.append(f"{flag}={REDACTED}")
                    else:
                        items.append(item)
                        hide_next = True
                    continue
            items.append(redact(item))
        return items
    if isinstance(options, str):
        return scrub(options)
    return options
