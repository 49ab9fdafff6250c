"""Token-id prompts as JSON text (`--api completions`), each turn's built from its agent's previous prompt plus what
the turn adds.

An AgentX turn resends its agent's whole history (~80k tokens) and a few thousand new ones. Rebuilt as a list of ids
and encoded again, every turn costs in proportion to its context (~15 ms at 80k tokens on this project's machines);
kept as text, it costs in proportion to what it adds. The text is the one `msgspec.json.encode` writes for the list
`prompt_token_ids` returns (agentx.replayer.prompts.tokens: the marker's ids, the blocks', the filler's), byte for
byte:

- `id_text` writes ids as decimal text, and each block's text (its `block_size` ids, each followed by a comma), a
  whole array at a time and cached (agentx.replayer.prompts.block_text).
- `PromptText` is one agent's last prompt as pieces of text (the opening with the marker, one per block, the filler)
  and the ids it covered. The next turn's pieces are those up to the last block the two turns share, then the
  blocks that follow, then the filler: references to cached text, joined once, into the request's body
  (agentx.replayer.prompts.spliced).
"""

from __future__ import annotations

import itertools

from agentx.replayer.http.http1 import Pieces
from agentx.replayer.prompts.block_text import BlockText
from agentx.replayer.prompts.tokens import BlockTokens, common_prefix_length


def id_text(blocks: BlockTokens, cache_blocks: int) -> BlockText:
    """Token ids of `blocks.space` as decimal text, each followed by a comma, and its blocks' text: `cache_blocks`
    of them kept."""
    return BlockText(blocks, [b"%d," % token for token in range(blocks.space.high)], cache_blocks)


class PromptText:
    """One agent's last prompt as the pieces of its JSON text: `pieces[0]` opens the list (`[` and the marker's ids),
    then one piece per block of `covered`, then the filler's, each id followed by a comma (`json` closes the list)."""

    __slots__ = ("covered", "ends", "marker", "pieces")

    def __init__(
        self, pieces: tuple[bytes, ...], ends: tuple[int, ...], covered: tuple[int, ...], marker: bytes
    ) -> None:
        self.pieces = pieces
        self.ends = ends
        """`ends[k]`: the length of the first k + 1 pieces."""
        self.covered = covered
        self.marker = marker

    def json(self) -> Pieces:
        """The list's JSON text in pieces, in order: the last id's comma becomes the closing bracket."""
        pieces, last = self.pieces, self.pieces[-1]
        if last[-1:] == b",":
            return Pieces((*pieces[:-1], last[:-1], b"]"), self.ends[-1])
        return Pieces((*pieces, b"]"), self.ends[-1] + 1)


def prompt_text(
    ids: BlockText,
    scope_key: str,
    covered: tuple[int, ...],
    filler_text: bytes,
    marker_text: bytes,
    previous: PromptText | None,
) -> PromptText:
    """The prompt whose blocks are `covered` (in scope `scope_key`), then `filler_text`, after `marker_text` (each
    text an id and a comma at a time), its pieces taken from `previous` (the agent's last prompt; None: from the
    cache alone) up to the last block the two share."""
    kept = 0
    if previous is not None and previous.marker == marker_text:
        kept = common_prefix_length(previous.covered, covered)
    if kept:
        assert previous is not None
        pieces, ends = previous.pieces[: kept + 1], previous.ends[: kept + 1]
    else:
        opening = b"[" + marker_text
        pieces, ends = (opening,), (len(opening),)
    added = ids.block_texts(scope_key, covered[kept:])
    if filler_text:
        added.append(filler_text)
    # Tuples of bytes and ints: the garbage collector stops tracking them at its first look, where lists of a prompt's
    # ~2,000 pieces were walked again at every collection of their generation (pauses of several ms at 100 requests/s).
    return PromptText(
        pieces + tuple(added),
        ends + tuple(itertools.accumulate(map(len, added), initial=ends[-1]))[1:],
        covered,
        marker_text,
    )
