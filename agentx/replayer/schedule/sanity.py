"""Numbers the server got wrong: each request's answer checked against what was asked and sent.

Five kinds (`ServerNotice`), each a sign of a server, proxy or configuration that does not do what the run assumes:
- `output_over_max_tokens`: more output tokens (the server's `usage.completion_tokens`, or those streamed when the
  stream counted them) than the request's `max_tokens`: the server ignores the cap, so output lengths and throughput
  are not the trace's.
- `prompt_count_differs`: the server's `usage.prompt_tokens` differs from the tokens sent by more than
  `PROMPT_TOLERANCE` and `PROMPT_SLACK_TOKENS`: it tokenizes or templates the prompt otherwise than agentx built it.
- `not_event_stream`: a streamed request answered with another Content-Type than `text/event-stream` (a proxy's
  page, a server that does not stream).
- `no_done`: a stream that ended after its `finish_reason` without `data: [DONE]` (a server or proxy
  that closes early): kept as complete, since every token came, but the server does not end streams as OpenAI's do.
- `compressed`: an answer compressed (gzip, deflate) although the request asked for none (`Accept-Encoding:
  identity`): decoded as it arrived, but a compressing proxy may hold chunks back, which moves ITL and TTFT.

A request's kinds go into its record (`server_notices`); the first of each kind is announced as the run goes, and the
summary counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

from agentx.replayer.http.exchange import Exchange

ServerNotice = Literal["output_over_max_tokens", "prompt_count_differs", "not_event_stream", "no_done", "compressed"]
PROMPT_TOLERANCE: Final = 0.02
"""A server's prompt count within 2% of the tokens sent is the same count (a chat template's own tokens)."""
PROMPT_SLACK_TOKENS: Final = 8
"""... and so is one within 8 tokens (a template's few special tokens on a short prompt)."""


def prompt_count_differs(server_tokens: float, sent_tokens: float) -> bool:
    """Whether a server's prompt count is another count than the tokens sent (beyond the tolerances above)."""
    return abs(server_tokens - sent_tokens) > max(PROMPT_SLACK_TOKENS, PROMPT_TOLERANCE * sent_tokens)


def server_notices(
    exchange: Exchange, max_tokens: int | None, sent_tokens: int, streamed_tokens: int
) -> list[ServerNotice]:
    """What the server got wrong in `exchange` (empty for most), given the request's `max_tokens` (None: not known),
    the prompt tokens sent and the output tokens streamed (`exchange.chunk_tokens` summed)."""
    found: list[ServerNotice] = []
    if max_tokens is not None:
        streamed = 0 if exchange.tokens_estimated else streamed_tokens
        if max(exchange.completion_tokens or 0, streamed) > max_tokens:
            found.append("output_over_max_tokens")
    if exchange.prompt_tokens is not None and prompt_count_differs(exchange.prompt_tokens, sent_tokens):
        found.append("prompt_count_differs")
    if exchange.foreign_content_type is not None:
        found.append("not_event_stream")
    if exchange.without_done:
        found.append("no_done")
    if exchange.content_encoding is not None:
        found.append("compressed")
    return found


class SanityNotices:
    """Announces the first request of each kind (`notice(text)`), with its figures and where it was."""

    def __init__(self, notice: Callable[[str], None]) -> None:
        self.notice = notice
        self.seen: set[ServerNotice] = set()

    def first(
        self, kinds: list[ServerNotice], exchange: Exchange, max_tokens: int | None, sent_tokens: int, where: str
    ) -> None:
        for kind in kinds:
            if kind in self.seen:
                continue
            self.seen.add(kind)
            if kind == "output_over_max_tokens":
                streamed = "" if exchange.tokens_estimated else f", streamed {sum(exchange.chunk_tokens):,}"
                said = f"usage {exchange.completion_tokens:,}" if exchange.completion_tokens is not None else "usage -"
                what = f"the server gave more output tokens than max_tokens {max_tokens:,} ({said}{streamed})"
            elif kind == "prompt_count_differs":
                what = f"the server counted {exchange.prompt_tokens:,} prompt tokens where {sent_tokens:,} were sent"
            elif kind == "not_event_stream":
                what = (
                    f"the server answered a streamed request with Content-Type {exchange.foreign_content_type!r}, not "
                    "an event stream"
                )
            elif kind == "no_done":
                what = (
                    f"the server ended a stream after its finish_reason {exchange.finish_reason!r} without "
                    "data: [DONE] (kept as complete)"
                )
            else:
                what = (
                    f"the server compressed its answer ({exchange.content_encoding}) although agentx asked for none: "
                    "decoded as it arrived, but a compressing proxy may hold chunks back (ITL, TTFT)"
                )
            self.notice(
                f"{what} ({where}); every such request is marked in the records (server_notices: {kind}) and counted "
                "in the summary"
            )
