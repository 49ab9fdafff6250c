"""Request bodies: a step of a play as the bytes POSTed for it, and the prompt tokens they carry.

`--api completions` sends token ids built from the step's block ids (agentx.replayer.prompts.tokens), exact by
construction; `--api chat` sends the messages of the agent's conversation so far, rendered to calibrated text
(agentx.replayer.prompts.conversation, agentx.replayer.prompts.chat). Both carry the play's cache-bust marker (in the
prompt or as `cache_salt`) and force the output length.

The prompt goes into the body as pieces of JSON text kept per agent of the play (`Play.last_text`): the token ids'
text up to the last block the agent's previous turn shares (agentx.replayer.prompts.token_json), the messages the
previous turn sent unchanged (`ChatRenderer.render_json`), joined once into the body (agentx.replayer.prompts.spliced);
so a turn costs what it adds, and the bytes are the ones the lists would encode to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from agentx.records.record import Phase
from agentx.replayer.http.http1 import Body
from agentx.replayer.http.probe import STREAM_OPTIONS
from agentx.replayer.options.replay import AgentxLoad, ReplayOptions
from agentx.replayer.plan.play import Play, PreparedSession
from agentx.replayer.plan.steps import Step
from agentx.replayer.prompts.chat import CHAT_PATH, MARKER_WORDS, ChatRenderer, MessagesText, chat_body
from agentx.replayer.prompts.conversation import ChatTurn
from agentx.replayer.prompts.spliced import HOLE, spliced
from agentx.replayer.prompts.token_json import PromptText, id_text, prompt_text
from agentx.replayer.prompts.tokens import (
    BlockTokens,
    TokenSpace,
    common_prefix_length,
    completions_body,
    default_cache_blocks,
    filler_ids,
)
from agentx.trace.model import Trace

COMPLETIONS_PATH: Final = "/v1/completions"
MARKER_TOKENS: Final = 8
"""Token ids of a cache-bust marker on `--api completions` (drawn from the filler range, per tree)."""


class BodyBuilder:
    """Builds the bodies of one run, made once the server is known: what `stream_options` it takes, its chat
    `renderer` (`--api chat`: its calibration) and each served model's context length (`context_lengths`)."""

    def __init__(
        self,
        options: ReplayOptions,
        trace: Trace,
        space: TokenSpace,
        *,
        stream_options: Mapping[str, object] | None = STREAM_OPTIONS["continuous"],
        renderer: ChatRenderer | None = None,
        context_lengths: Mapping[str, int] | None = None,
    ) -> None:
        self.seed = options.scenario.seed
        self.max_output_tokens = options.scenario.max_output_tokens
        self.block_size = trace.block_size
        self.session_scope = trace.hash_id_scope == "session"
        # Completions cache each block's text (`IdText`), not its tokens: the token cache stays empty.
        self.blocks = BlockTokens(options.scenario.seed, trace.block_size, space, cache_blocks=0)
        self.ids = id_text(self.blocks, default_cache_blocks(trace.block_size)) if renderer is None else None
        self.extra_body = options.server.extra_body
        self.path = CHAT_PATH if options.server.api == "chat" else COMPLETIONS_PATH
        self.marker_tokens = MARKER_WORDS if options.server.api == "chat" else MARKER_TOKENS
        """Tokens a play's marker adds to each prompt (recorded as `cache_bust_tokens`)."""
        load = options.load
        self.cache_bust: Literal["marker", "salt", "off"] = load.cache_bust if isinstance(load, AgentxLoad) else "off"
        self.primer_tokens = load.warmup_max_tokens if isinstance(load, AgentxLoad) else None
        self.stream_options = stream_options
        self.renderer = renderer
        self.context_lengths: Mapping[str, int] = context_lengths or {}
        """Served model → its context length, where `/v1/models` says it (`min_tokens`)."""

    def max_tokens(self, tree: Play, step: Step, phase: Phase) -> int:
        """The output length `step` forces: a primer's, or the recorded one (top-level turns capped)."""
        if phase == "warmup" and self.primer_tokens is not None:
            return self.primer_tokens
        out = step.request.out_tokens
        cap = self.max_output_tokens
        if cap is not None and tree.prepared.top_level[step.index]:
            out = min(out, cap)
        return max(1, out)

    def min_tokens(self, model: str, prompt_tokens: int, out: int) -> int:
        """The `min_tokens` forcing `out` tokens, held within what the model's context leaves after the prompt.

        vLLM clamps `max_tokens` to that room and then refuses a `min_tokens` above it (a 400 no context-overflow
        check recognises); the references send no `min_tokens`, so the server answers with the room's tokens. Held
        to the room, agentx gets the same answer. A prompt that fills the context is left to the server's 400."""
        context = self.context_lengths.get(model)
        room = out if context is None else context - prompt_tokens
        return min(out, room) if room >= 1 else out

    def new_tokens(self, tree: Play, step: Step) -> int:
        """About how many of `step`'s prompt tokens its agent's last prompt does not hold: what building it writes."""
        request = step.request
        previous = tree.last_text(step.agent_id)
        if isinstance(previous, PromptText):
            hash_ids = tree.prepared.hash_ids[step.index]
            covered = self._whole_blocks(hash_ids, request.in_tokens)
            return request.in_tokens - common_prefix_length(previous.covered, hash_ids[:covered]) * self.block_size
        if isinstance(previous, MessagesText):
            # Its last message is written again too: no longer last, it gives up only its own template tokens.
            return abs(request.in_tokens - previous.tokens) + previous.budgets[-1]
        return request.in_tokens

    def step_blocks(self, prepared: PreparedSession, index: int) -> tuple[str, Sequence[int]]:
        """The scope key and hash ids of the whole blocks step `index` of `prepared` carries."""
        hash_ids = prepared.hash_ids[index]
        covered = self._whole_blocks(hash_ids, prepared.plan.steps[index].request.in_tokens)
        return (prepared.plan.session_id if self.session_scope else ""), hash_ids[:covered]

    def _whole_blocks(self, hash_ids: Sequence[int], in_tokens: int) -> int:
        """How many of a prompt's `hash_ids` it carries whole: the rest of its `in_tokens` is filler."""
        return min(len(hash_ids), in_tokens // self.block_size)

    def warm_blocks(self, scope_key: str, hash_ids: Sequence[int]) -> None:
        """Make and cache the text of `hash_ids`' blocks not cached yet, so that a body that carries them is assembled
        from it (the runner makes them a group at a time, letting what is due go between groups)."""
        if self.renderer is not None:
            self.renderer.block_jsons(scope_key, hash_ids)
        elif self.ids is not None:
            self.ids.block_texts(scope_key, hash_ids)

    def build(self, tree: Play, step: Step, phase: Phase = "profiling") -> tuple[int, Body]:
        """The request body of `step` (in pieces) and the prompt tokens it carries (as the server will count them)."""
        if self.renderer is not None:
            return self._build_chat(tree, step, self.renderer, phase)
        assert self.ids is not None
        session_id = tree.prepared.plan.session_id
        marker_text = b""
        marker_tokens = 0
        if tree.marker is not None and self.cache_bust == "marker":
            marker_tokens = MARKER_TOKENS
            marker_text = self.ids.text(
                filler_ids(self.seed, f"marker:{tree.marker}", 0, MARKER_TOKENS, self.blocks.space)
            )
        # The prompt of `prompt_token_ids` (agentx.replayer.prompts.tokens), written as text.
        in_tokens = step.request.in_tokens
        hash_ids = tree.prepared.hash_ids[step.index]
        covered = self._whole_blocks(hash_ids, in_tokens)
        rest = in_tokens - covered * self.block_size
        filler_text = b""
        if rest > 0:
            turn_key = f"{step.agent_id}:{step.turn}"
            filler_text = self.ids.text(filler_ids(self.seed, session_id, turn_key, rest, self.blocks.space))
        previous = tree.last_text(step.agent_id)
        text = prompt_text(
            self.ids,
            session_id if self.session_scope else "",
            tuple(hash_ids[:covered]),
            filler_text,
            marker_text,
            previous if isinstance(previous, PromptText) else None,
        )
        tree.keep_text(step.agent_id, text)
        sent_tokens = marker_tokens + in_tokens
        out = self.max_tokens(tree, step, phase)
        model = tree.prepared.models[step.index]
        fields = completions_body(
            model, HOLE, out, min_tokens=self.min_tokens(model, sent_tokens, out), **self._common(tree)
        )
        return sent_tokens, spliced(fields, text.json())

    def _common(self, tree: Play) -> dict[str, Any]:
        return {
            "stream_options": self.stream_options,
            "extra_body": self.extra_body,
            "cache_salt": tree.marker if self.cache_bust == "salt" else None,
        }

    def _build_chat(self, tree: Play, step: Step, renderer: ChatRenderer, phase: Phase) -> tuple[int, Body]:
        session_id = tree.prepared.plan.session_id
        agent = step.agent_id
        chat = tree.chat
        turn = chat.latest(agent, step.turn)
        if turn is None:  # else the same step's body again (its phase changed): the conversation has moved on
            prefix_blocks = -(-tree.prepared.prefix_tokens.get(agent, 0) // self.block_size)
            chat.conversation(agent, self.block_size, prefix_blocks)
            # A play resumed at t* starts mid-conversation: first replay the turns before it, unsent (§2c).
            steps = tree.prepared.plan.steps
            for earlier in tree.prepared.agent_steps[agent][chat.advanced_through(agent) + 1 : step.turn]:
                _advance(tree, steps[earlier])
            turn = _advance(tree, step)
            chat.keep(agent, step.turn, turn)
        marker = ("", 0)
        if tree.marker is not None and self.cache_bust == "marker":
            marker = renderer.marker_text(tree.marker)
        previous = tree.last_text(agent)
        messages, sent_tokens = renderer.render_json(
            turn.segments,
            target_tokens=step.request.in_tokens,
            scope_key=session_id if self.session_scope else "",
            session_id=session_id,
            marker=marker,
            previous=previous if isinstance(previous, MessagesText) else None,
        )
        tree.keep_text(agent, messages)
        model = tree.prepared.models[step.index]
        out = self.max_tokens(tree, step, phase)
        fields = chat_body(model, HOLE, out, min_tokens=self.min_tokens(model, sent_tokens, out), **self._common(tree))
        return sent_tokens, spliced(fields, messages.json())


def _advance(tree: Play, step: Step) -> ChatTurn:
    """The agent's conversation advanced through `step` (docs/agentx.md §2c: each turn adds what it saw since)."""
    request = step.request
    hash_ids = tree.prepared.hash_ids[step.index]
    return tree.chat.advance(step.agent_id, step.turn, hash_ids, request.in_tokens, request.out_tokens)
