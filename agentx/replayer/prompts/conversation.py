"""Chat conversations rebuilt from hash ids: the segment model of docs/agentx.md §2b–§2c.

- `Segment`: one chat message as blocks (hash ids, `block_size` tokens each) plus filler tokens.
- `ChatTurn`: the whole message list one request sends, plus what changed since the previous turn.
- `Conversation(block_size, prefix_blocks=0)`: the state of one agent's conversation;
  `conversation.next_turn(hash_ids, in_tokens, prev_out_tokens)` advances it by one request.

Invariant of every turn: the segments tile `hash_ids[:m]` in order, `m = min(len(hash_ids), in_tokens //
block_size)`, and only the last segment carries filler, `in_tokens − m·block_size` tokens; so the content
is exactly `in_tokens` tokens.

Decisions where §2b leaves room:

- LCP basis: the previous turn's *covered* ids (`prev_hash_ids[:m_prev]`, what its segments hold) against
  the current covered ids `hash_ids[:m]`. Ids past `m_prev` were rendered as filler, so a match there
  proves no shared content, and it would put the cut beyond the blocks the segments hold.
- Look-ahead cap (§2b.5): not implemented. It needs the next turn's ids, which `next_turn` does not get,
  and it only moves the assistant/user split, never blocks or token counts. Without it a later cut inside
  an assistant part slices that part; the request still ends on a user message unless the turn adds
  nothing (§2b.8, `ends_on_user=False`).
- Repeat: a turn whose covered ids and `in_tokens` equal the previous turn's resends the previous
  segments unchanged (same filler keys, so the same text), with `reset_context=True`.
- Turn 0 applies §2b.6 to the system prefix: a system segment that would hold every block with no filler
  left gives its last block to the user, so the request ends on a user message.
- The one empty segment: a turn with no content at all (`in_tokens == 0`, or a cut to nothing with nothing
  new) is a single empty user message, since a chat request needs one. It never survives a later cut.
- `prev_out_tokens` of None (or below 0) sizes the assistant part as 0 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from agentx.replayer.prompts.tokens import common_prefix_length

Role = Literal["system", "user", "assistant"]


class Segment(msgspec.Struct, frozen=True):
    """One message: the blocks of `hash_ids` (in order), then `filler_tokens` filler tokens."""

    role: Role
    hash_ids: tuple[int, ...]
    filler_tokens: int = 0
    filler_key: str = ""
    """Keys the filler's content: the turn that created it (equal keys must render equal text)."""


class ChatTurn(msgspec.Struct, frozen=True):
    """The message list of one request."""

    segments: tuple[Segment, ...]
    """Every message of the request, in order (the whole history: turn k carries turns 0..k)."""
    new_from: int
    """Index of the first segment not sent by the previous turn (the §2c delta); 0 on a reset."""
    reset_context: bool
    """An already-sent segment was changed or removed, or the turn repeats the previous one (§2c)."""
    context_loss: bool = False
    """No user segment survived the cut: the assistant part took no blocks (§2b.4)."""
    ends_on_user: bool = True
    """False only for a turn that adds nothing and ends on a non-user segment (§2b.8: logged, not faked)."""
    kept_blocks: int = 0
    """Blocks kept from the previous turn's segments (the cut point, the LCP); 0 on turn 0."""


_EMPTY_TURN = (Segment("user", ()),)
"""The message list of a turn without content."""


class Conversation:
    """One agent's conversation (see the module docstring)."""

    def __init__(self, block_size: int, *, prefix_blocks: int = 0, filler_key: str = "") -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if prefix_blocks < 0:
            raise ValueError(f"prefix_blocks must not be negative, got {prefix_blocks}")
        self.block_size = block_size
        self.prefix_blocks = prefix_blocks
        """Blocks of the turn-0 system segment, before clamping to the covered blocks (§1e)."""
        self.filler_key = filler_key
        self._turn_index = 0
        self._previous: ChatTurn | None = None
        self._covered_ids: tuple[int, ...] = ()
        """The previous turn's covered ids: its segments' blocks, concatenated."""
        self._in_tokens = 0

    def next_turn(self, hash_ids: Sequence[int], in_tokens: int, prev_out_tokens: int | None) -> ChatTurn:
        """Advance by one request of `in_tokens` tokens whose full hash ids are `hash_ids`;
        `prev_out_tokens` is the previous request's recorded output (None on the first turn)."""
        if in_tokens < 0:
            raise ValueError(f"in_tokens must not be negative, got {in_tokens}")
        block_size = self.block_size
        covered_blocks = min(len(hash_ids), in_tokens // block_size)
        covered = tuple(hash_ids[:covered_blocks])
        filler_tokens = in_tokens - covered_blocks * block_size
        filler_key = f"{self.filler_key}:turn_{self._turn_index}" if filler_tokens else ""
        previous = self._previous
        if previous is None:
            turn = self._first_turn(covered, filler_tokens, filler_key)
        elif covered == self._covered_ids and in_tokens == self._in_tokens:
            turn = ChatTurn(
                previous.segments,
                new_from=0,
                reset_context=True,
                ends_on_user=previous.ends_on_user,
                kept_blocks=covered_blocks,
            )
        else:
            turn = self._later_turn(previous.segments, covered, filler_tokens, filler_key, prev_out_tokens)
        self._previous = turn
        self._covered_ids = covered
        self._in_tokens = in_tokens
        self._turn_index += 1
        return turn

    def _first_turn(self, covered: tuple[int, ...], filler_tokens: int, filler_key: str) -> ChatTurn:
        system_blocks = min(self.prefix_blocks, len(covered))
        if system_blocks == len(covered) and filler_tokens == 0:
            system_blocks = max(0, system_blocks - 1)  # §2b.6: the request must end on a user message
        segments: list[Segment] = []
        if system_blocks:
            segments.append(Segment("system", covered[:system_blocks]))
        if system_blocks < len(covered) or filler_tokens:
            segments.append(Segment("user", covered[system_blocks:], filler_tokens, filler_key))
        return ChatTurn(tuple(segments) or _EMPTY_TURN, new_from=0, reset_context=False)

    def _later_turn(
        self,
        previous: tuple[Segment, ...],
        covered: tuple[int, ...],
        filler_tokens: int,
        filler_key: str,
        prev_out_tokens: int | None,
    ) -> ChatTurn:
        lcp_blocks = common_prefix_length(self._covered_ids, covered)
        kept: list[Segment] = []
        start_block = 0
        for segment in previous:
            if start_block >= lcp_blocks:
                break
            end_block = start_block + len(segment.hash_ids)
            if end_block < lcp_blocks:
                kept.append(segment)
            elif end_block == lcp_blocks and segment.filler_tokens == 0:
                kept.append(segment)
                break
            else:
                # A mid-segment cut, or a cut at the end of a segment whose filler overhang goes.
                kept.append(Segment(segment.role, segment.hash_ids[: lcp_blocks - start_block]))
                break
            start_block = end_block
        changed = len(kept) < len(previous) or (bool(kept) and kept[-1] is not previous[len(kept) - 1])
        sent_segments = len(kept)

        context_loss = not any(segment.role == "user" for segment in kept)
        new_blocks = len(covered) - lcp_blocks
        assistant_blocks = 0
        if not context_loss and prev_out_tokens is not None and prev_out_tokens > 0:
            assistant_blocks = min(-(-prev_out_tokens // self.block_size), new_blocks)
        if assistant_blocks == new_blocks and filler_tokens == 0 and assistant_blocks > 0:
            assistant_blocks -= 1  # §2b.6: the request must end on a user message
        user_start = lcp_blocks + assistant_blocks
        if assistant_blocks:
            kept.append(Segment("assistant", covered[lcp_blocks:user_start]))
        if user_start < len(covered) or filler_tokens:
            kept.append(Segment("user", covered[user_start:], filler_tokens, filler_key))

        segments = tuple(kept) or _EMPTY_TURN
        return ChatTurn(
            segments,
            new_from=0 if changed else sent_segments,
            reset_context=changed,
            context_loss=context_loss,
            ends_on_user=segments[-1].role == "user",
            kept_blocks=lcp_blocks,
        )


class ChatState:
    """One play's chat, per agent: its conversation, the turn it has been advanced through, its last output length
    and its latest turn (kept so that a body built again reuses it). Changed only through its methods."""

    def __init__(self) -> None:
        self._conversations: dict[str, Conversation] = {}
        self._advanced: dict[str, int] = {}
        self._last_out_tokens: dict[str, int] = {}
        self._latest: dict[str, tuple[int, ChatTurn]] = {}

    def conversation(self, agent_id: str, block_size: int, prefix_blocks: int) -> Conversation:
        """`agent_id`'s conversation, begun on first use."""
        found = self._conversations.get(agent_id)
        if found is None:
            found = Conversation(block_size, prefix_blocks=prefix_blocks, filler_key=agent_id)
            self._conversations[agent_id] = found
        return found

    def advanced_through(self, agent_id: str) -> int:
        """The last turn `agent_id`'s conversation has been advanced through (-1: none)."""
        return self._advanced.get(agent_id, -1)

    def advance(self, agent_id: str, turn: int, hash_ids: Sequence[int], in_tokens: int, out_tokens: int) -> ChatTurn:
        """`agent_id`'s conversation through `turn` (docs/agentx.md §2c: each turn adds what the agent saw since)."""
        next_turn = self._conversations[agent_id].next_turn(hash_ids, in_tokens, self._last_out_tokens.get(agent_id))
        self._last_out_tokens[agent_id] = out_tokens
        self._advanced[agent_id] = turn
        return next_turn

    def latest(self, agent_id: str, turn: int) -> ChatTurn | None:
        """`agent_id`'s turn `turn` when it is the latest one made."""
        found = self._latest.get(agent_id)
        return found[1] if found is not None and found[0] == turn else None

    def keep(self, agent_id: str, turn: int, chat_turn: ChatTurn) -> None:
        """`chat_turn` is `agent_id`'s latest, turn `turn`."""
        self._latest[agent_id] = (turn, chat_turn)
