"""A streamed request answered 200 with something that is not an event stream (a proxy's HTML page, a login wall)
says so, naming the content type and the page's start, not only that the stream lacked [DONE]."""

from __future__ import annotations

import pytest

from agentx.replayer.http.exchange import ExchangeError
from agentx.replayer.http.streaming import StreamResponse

EVENTS = b'data: {"choices": [{"text": "hi"}]}\n\ndata: [DONE]\n\n'


def _answer(content_type: str, body: bytes) -> StreamResponse:
    response = StreamResponse(streamed=True)
    response.head(200, "OK", {"content-type": content_type} if content_type else {}, 1)
    response.data(body, 2)
    return response


def test_an_html_page_for_a_stream_is_named_for_what_it_is() -> None:
    response = _answer("text/html; charset=utf-8", b"<html><body>Sign in to continue</body></html>")
    with pytest.raises(ExchangeError) as raised:
        response.finish(())
    assert raised.value.kind == "protocol"
    message = str(raised.value)
    assert "200 with Content-Type 'text/html; charset=utf-8', not an event stream" in message
    assert "Sign in to continue" in message


@pytest.mark.parametrize("content_type", ["text/event-stream", "text/event-stream; charset=utf-8", ""])
def test_an_event_stream_or_an_untyped_one_reads_as_before(content_type: str) -> None:
    response = _answer(content_type, EVENTS)
    response.finish(())
    assert len(response.exchange.chunk_ns) == 1


def test_an_event_stream_cut_before_done_still_says_so() -> None:
    response = _answer("text/event-stream", EVENTS.split(b"data: [DONE]")[0])
    with pytest.raises(ExchangeError, match=r"the stream ended without data: \[DONE\]"):
        response.finish(())


def test_an_error_status_answered_in_json_is_an_error_not_a_foreign_answer() -> None:
    response = StreamResponse(streamed=True)
    response.head(503, "Service Unavailable", {"content-type": "application/json"}, 1)
    response.data(b'{"error": {"message": "busy"}}', 2)
    with pytest.raises(ExchangeError) as raised:
        response.finish(())
    assert raised.value.kind == "http" and "busy" in str(raised.value)
    assert response.exchange.foreign_content_type is None
