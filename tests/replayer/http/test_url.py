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
    ("typed", "expected", "ending"),
    [
        ("http://host:8000/v1/completions", "http://host:8000", "/v1/completions"),
        ("host:8000/v1/chat/completions/", "http://host:8000", "/v1/chat/completions"),
        ("https://host/openai/v1/models", "https://host/openai", "/v1/models"),
        ("http://host/v1/responses", "http://host", "/v1/responses"),
        ("http://host/api/completions", "http://host/api", "/completions"),
        ("http://host/chat/completions", "http://host", "/chat/completions"),
    ],
)
def test_an_endpoints_path_is_dropped_with_a_note_naming_it(typed: str, expected: str, ending: str) -> None:
    """A URL copied from a curl line: agentx adds the endpoint's path itself, so kept it would be sent twice."""
    url, note = base_url(typed)
    assert url == expected
    assert note is not None and note.startswith(f"the URL ends in {ending}, an endpoint's path")


@pytest.mark.parametrize("typed", ["http://host/models", "http://host/completions-proxy", "http://host/v1/chat"])
def test_a_path_that_only_resembles_an_endpoint_is_kept(typed: str) -> None:
    assert base_url(typed) == (typed, None)


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
