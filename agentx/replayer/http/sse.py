"""Incremental server-sent-events parser over a raw byte stream (the WHATWG `text/event-stream` rules).

Hot path: a typical OpenAI chunk is one `data: {...}\\n\\n` event per network read, so `feed` does one
split and a handful of byte comparisons per event. CR and CRLF line ends are normalized to LF on the way
in; a CR at the very end of a read may be the first half of a CRLF, so an LF starting the next read is
then dropped.
"""

from __future__ import annotations

from typing import Final

DONE: Final = b"[DONE]"
"""The OpenAI end-of-stream sentinel data payload."""
ERROR_EVENT: Final = b"error"
"""The `event:` type servers use for an in-band error."""

_BOM: Final = b"\xef\xbb\xbf"

Event = tuple[bytes, bytes]
"""(event type, data): the type is b"" when no `event:` field was given (the spec's "message")."""


class SSEParser:
    """Feed it the bytes of one response as they arrive; it returns the events each read completed.

    An event is dispatched at a blank line when it had at least one `data` field; its data is the `data`
    field values joined by LF. `id:` and `retry:` are kept as the spec says; comments (`:` lines,
    keep-alives) and unknown fields are ignored. An unterminated event at the end of the stream is
    discarded, as the spec requires.
    """

    __slots__ = ("_at_start", "_data", "_event", "_skip_lf", "_tail", "last_event_id", "retry_ms")

    def __init__(self) -> None:
        self._tail = b""
        self._at_start = True
        self._skip_lf = False
        self._data: bytes | None = None
        self._event = b""
        self.last_event_id = b""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if (
            self._data is None
            and not self._tail
            and not self._at_start
            and not self._skip_lf
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            # The common case of a stream: one read, one whole event of one data line.
            event, self._event = self._event, b""
            return [(event, chunk[6:-2])]
        if self._at_start:
            chunk = self._strip_bom(chunk)
            if not chunk:
                return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._skip_lf = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._tail:
            chunk = self._tail + chunk
        lines = chunk.split(b"\n")
        self._tail = lines.pop()
        events: list[Event] = []
        for line in lines:
            if not line:
                if self._data is not None:
                    events.append((self._event, self._data))
                    self._data = None
                self._event = b""
            elif line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
                self._data = value if self._data is None else self._data + b"\n" + value
            elif line[0] != 0x3A:  # not a comment
                self._field(line)
        return events

    def _strip_bom(self, chunk: bytes) -> bytes:
        """The stream may start with a UTF-8 byte order mark, itself possibly split across reads."""
        chunk = self._tail + chunk
        self._tail = b""
        if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
            self._tail = chunk
            return b""
        self._at_start = False
        return chunk[len(_BOM) :] if chunk.startswith(_BOM) else chunk

    def _field(self, line: bytes) -> None:
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":  # `data` without a colon: an empty value
            self._data = value if self._data is None else self._data + b"\n" + value
        elif name == b"event":
            self._event = value
        elif name == b"id":
            if b"\0" not in value:
                self.last_event_id = value
        elif name == b"retry" and value.isdigit():
            self.retry_ms = int(value)
