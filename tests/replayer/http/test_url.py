"""The server base URL as users type it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentx.errors import BadURLError
from agentx.replayer.http.url import base_url


@pytest.mark.parametrize(
    ("typed", "expected", "noted"),
    [
        ("localhost:8123", "http://localhost:8123", False),
        ("127.0.0.1:8123", "http://127.0.0.1:8123", False),
        ("[::1]:8000", "http://[::1]:8000", False),
        ("HTTPS://host/prefix/", "https://host/prefix", False),
        ("http://host:8000/v1", "http://host:8000", True),
        (" http://host/openai/v1/ ", "http://host/openai", True),
        ("http://host/v10", "http://host/v10", False),
    ],
)
def test_forms_users_type(typed: str, expected: str, noted: bool) -> None:
    url, note = base_url(typed)
    assert url == expected
    assert (note is not None) == noted


@pytest.mark.parametrize(
    "typed",
    ["", "   ", "ftp://host", "http://", "http://host:99999", "http://[::1", "http://h:0", "h:1/?q", "h#x"],
)
def test_unusable_urls_are_refused(typed: str) -> None:
    with pytest.raises(BadURLError):
        base_url(typed)


hosts = st.sampled_from(["localhost", "127.0.0.1", "[::1]", "example.com"])
ports = st.one_of(st.none(), st.integers(1, 65535))
paths = st.lists(st.sampled_from(["v1", "api", "openai", "x"]), max_size=3)


@given(scheme=st.sampled_from(["", "http://", "https://"]), host=hosts, port=ports, path=paths)
def test_a_normalized_url_is_its_own_normal_form(scheme: str, host: str, port: int | None, path: list[str]) -> None:
    typed = scheme + host + (f":{port}" if port else "") + "".join("/" + part for part in path)
    url, _ = base_url(typed)
    assert base_url(url) == (url, None)
    assert not url.endswith(("/", "/v1"))
