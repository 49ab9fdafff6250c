"""The incremental SSE parser: any chunking of a stream yields the events of the whole stream, per the spec."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.replayer.http.sse import DONE, ERROR_EVENT, Event, SSEParser

ENDINGS = (b"\n", b"\r\n", b"\r")
# Text that may hold colons, spaces and non-ASCII, but no line break.
line_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=30).map(
    lambda text: text.encode()
)


@dataclass
class GeneratedEvent:
    event_type: bytes
    data_lines: list[bytes]
    lines: list[bytes]
    """Every line of the event in wire order, without line ends."""


@st.composite
def events(draw: st.DrawFn) -> GeneratedEvent:
    event_type = draw(st.sampled_from([b"", b"message-ish", b"error", b"ping"]))
    data_lines = draw(st.lists(line_text, max_size=4))
    lines: list[bytes] = []
    if event_type:
        lines.append(b"event: " + event_type)
    for value in data_lines:
        for _ in range(draw(st.integers(0, 1))):
            lines.append(b":" + draw(line_text))  # a comment, e.g. a keep-alive
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from([b"id: ", b"retry: ", b"id:", b"unknown: "])) + draw(line_text))
        if value == b"" and draw(st.booleans()):
            lines.append(b"data")  # a field name without a colon has an empty value
        elif value.startswith(b" ") or draw(st.booleans()):
            lines.append(b"data: " + value)  # the one space after the colon is not part of the value
        else:
            lines.append(b"data:" + value)
    return GeneratedEvent(event_type, data_lines, lines)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    """A byte stream with mixed line ends and the events a conforming parser dispatches from it."""
    generated = draw(st.lists(events(), max_size=8))
    out = bytearray(b"\xef\xbb\xbf" if draw(st.booleans()) else b"")  # a byte order mark is skipped
    expected: list[Event] = []
    previous_cr = False
    for event in generated:
        for line in [*event.lines, b""]:
            ending = draw(st.sampled_from(ENDINGS))
            if previous_cr and not line and ending == b"\n":
                ending = b"\r\n"  # CR then an LF-ended empty line would read as one CRLF
            out += line + ending
            previous_cr = ending == b"\r"
        if event.data_lines:
            expected.append((event.event_type, b"\n".join(event.data_lines)))
    if draw(st.booleans()):
        out += b"data: an unterminated event is discarded"
    return bytes(out), expected


def feed_in_pieces(stream: bytes, cuts: list[int]) -> list[Event]:
    parser = SSEParser()
    seen: list[Event] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        seen += parser.feed(stream[start:cut])
        start = cut
    return seen


@settings(max_examples=examples(500), deadline=None)
@given(streams(), st.data())
def test_any_chunking_yields_the_events_of_the_whole(stream: tuple[bytes, list[Event]], data: st.DataObject) -> None:
    raw, expected = stream
    whole = SSEParser().feed(raw)
    assert whole == expected
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    assert feed_in_pieces(raw, cuts) == expected
    one_byte_at_a_time = feed_in_pieces(raw, list(range(len(raw))))
    assert one_byte_at_a_time == expected


def test_openai_stream_with_done_and_keepalives() -> None:
    raw = b': keep-alive\r\n\r\ndata: {"a":1}\r\n\r\n:ping\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert SSEParser().feed(raw) == [(b"", b'{"a":1}'), (b"", b'{"b":2}'), (b"", DONE)]


def test_crlf_split_between_reads() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n\r") == [(b"", b"x")]
    assert parser.feed(b"\ndata: y\r\n\r\n") == [(b"", b"y")]


def test_multiline_data_and_fields() -> None:
    parser = SSEParser()
    raw = b"id: 7\nretry: 250\nevent: update\ndata: one\ndata:two\ndata:  three\n\n"
    assert parser.feed(raw) == [(b"update", b"one\ntwo\n three")]
    assert parser.last_event_id == b"7"
    assert parser.retry_ms == 250
    # The event type does not leak into the next event.
    assert parser.feed(b"data: next\n\n") == [(b"", b"next")]


def test_error_events() -> None:
    raw = b'data: {"choices":[]}\n\nevent: error\ndata: {"error": {"message": "boom"}}\n\n'
    events = SSEParser().feed(raw)
    assert events[1] == (ERROR_EVENT, b'{"error": {"message": "boom"}}')
    # An event with a type but no data is not dispatched.
    assert SSEParser().feed(b"event: error\n\n") == []


def test_empty_reads_change_nothing() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\n\n") == [(b"", b"a")]
