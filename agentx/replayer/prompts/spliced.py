"""A request body whose prompt is written in afterwards, from pieces of JSON text.

A body's fields are encoded with `HOLE` in place of the prompt's value (a token-id list, or the chat messages), and
`spliced` puts the value's pieces between the encoded fields: a body in pieces, which the connection writes as they
are (agentx.replayer.http.http1: a vectored write), so a 100k-token prompt, whose pieces are the cached text of its
blocks (agentx.replayer.prompts.token_json, agentx.replayer.prompts.chat), is never copied into a body of its own. A
NUL byte never appears in JSON text (inside a string it is escaped), so the hole is found without doubt; a user's
`extra_body` that replaces the prompt's field leaves none, and the body is then the fields as encoded.
"""

from __future__ import annotations

from typing import Final

import msgspec

from agentx.replayer.http.http1 import Body, Pieces

HOLE: Final = msgspec.Raw(b"\0")


def spliced(encoded: bytes, value: Pieces) -> Body:
    """`encoded` with `value`'s pieces in place of `HOLE`."""
    head, hole, tail = encoded.partition(b"\0")
    if not hole:
        return encoded
    return Pieces((head, *value.parts, tail), len(head) + value.length + len(tail))
