"""A trace's content digest: what `agentx compare` checks to tell whether two runs played the same trace."""

from __future__ import annotations

import hashlib

import msgspec

from agentx.trace.model import Trace


def trace_digest(trace: Trace) -> str:
    """SHA-256 of the trace's content (its MessagePack encoding), hex: equal for equal traces whatever file or format
    they were read from, different for any change of a session, request, token count or block id."""
    return hashlib.sha256(msgspec.msgpack.encode(trace)).hexdigest()
