"""Bodies built from the agent's previous prompt text are the bytes the prompt's lists encode to: for whole traces,
both APIs, subagents, cache-bust markers and salts, a step built again for another phase, and agents interleaved."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples, traces

from agentx.records.record import Phase
from agentx.replayer.options.replay import AgentxLoad, ClosedLoad, ReplayOptions, Scenario, Server
from agentx.replayer.plan.bodies import MARKER_TOKENS, BodyBuilder
from agentx.replayer.plan.play import Play
from agentx.replayer.plan.preparation import prepare_trace
from agentx.replayer.plan.steps import Step
from agentx.replayer.prompts.calibrate import ChatCalibration
from agentx.replayer.prompts.chat import ChatRenderer, chat_body
from agentx.replayer.prompts.token_json import id_text
from agentx.replayer.prompts.tokens import BlockTokens, TokenSpace, completions_body, filler, prompt_token_ids
from agentx.synth.generation import generate
from agentx.synth.presets import agentic_coding
from agentx.trace.io import load_trace
from agentx.trace.model import Trace

Api = Literal["completions", "chat"]

_CALIBRATION = ChatCalibration(
    # Words JSON must escape (a quote, a backslash, control characters) and that it writes as they are.
    words=("alpha", 'qu"ote', "back\\slash", "new\nline", "tab\t", "\u00e9t\u00e9", "\u2028", "\x01", "zeta", "omega"),
    base_tokens=2,
    role_tokens={"system": 3, "user": 3, "assistant": 4},
)


def _builder(
    trace: Trace, api: Api, cache_bust: str, seed: int = 5, extra_body: dict[str, Any] | None = None
) -> tuple[BodyBuilder, ReplayOptions]:
    load = AgentxLoad(concurrency=1, cache_bust=cache_bust) if cache_bust != "none" else ClosedLoad(concurrency=1)  # type: ignore[arg-type]
    options = ReplayOptions(
        server=Server(url="http://127.0.0.1:1", model="m", api=api, extra_body=extra_body),
        out_dir=Path("unused"),
        load=load,
        scenario=Scenario(seed=seed),
    )
    renderer = ChatRenderer(_CALIBRATION, seed, trace.block_size) if api == "chat" else None
    space = TokenSpace() if api == "completions" else TokenSpace(0, len(_CALIBRATION.words))
    return BodyBuilder(options, trace, space, renderer=renderer, context_lengths={"m": 150_000}), options


def _expected(
    bodies: BodyBuilder, tree: Play, step: Step, phase: Phase, fresh: BlockTokens | ChatRenderer
) -> tuple[int, bytes]:
    """The body as the lists encode: `prompt_token_ids`, or `ChatRenderer.render` of the turn the build made, with
    caches of their own (`fresh`)."""
    session_id = tree.prepared.plan.session_id
    scope = session_id if bodies.session_scope else ""
    model = tree.prepared.models[step.index]
    out = bodies.max_tokens(tree, step, phase)
    common: dict[str, Any] = {
        "stream_options": bodies.stream_options,
        "extra_body": bodies.extra_body,
        "cache_salt": tree.marker if bodies.cache_bust == "salt" else None,
    }
    if bodies.renderer is None:
        marker = []
        if tree.marker is not None and bodies.cache_bust == "marker":
            marker = filler(bodies.seed, f"marker:{tree.marker}", 0, MARKER_TOKENS, bodies.blocks.space)
        assert isinstance(fresh, BlockTokens)
        prompt = prompt_token_ids(
            step.request,
            tree.prepared.hash_ids[step.index],
            bodies.block_size,
            fresh,
            session_id,
            f"{step.agent_id}:{step.turn}",
            scope,
            prefix_ids=marker,
        )
        tokens = len(prompt)
        return tokens, completions_body(model, prompt, out, min_tokens=bodies.min_tokens(model, tokens, out), **common)
    turn = tree.chat.latest(step.agent_id, step.turn)
    assert turn is not None
    marker_text = ("", 0)
    if tree.marker is not None and bodies.cache_bust == "marker":
        marker_text = bodies.renderer.marker_text(tree.marker)
    assert isinstance(fresh, ChatRenderer)
    messages, tokens = fresh.render(
        turn.segments, target_tokens=step.request.in_tokens, scope_key=scope, session_id=session_id, marker=marker_text
    )
    return tokens, chat_body(model, messages, out, min_tokens=bodies.min_tokens(model, tokens, out), **common)


def _check_trace(
    trace: Trace, api: Api, cache_bust: str, order: str = "plan", extra_body: dict[str, Any] | None = None
) -> int:
    """Build every step of every session, in plan order (or agents interleaved, last first), each checked; returns
    how many bodies were checked."""
    bodies, options = _builder(trace, api, cache_bust, extra_body=extra_body)
    prepared = prepare_trace(trace, options)
    fresh: BlockTokens | ChatRenderer = (
        BlockTokens(bodies.seed, bodies.block_size, bodies.blocks.space, cache_blocks=0)
        if bodies.renderer is None
        else ChatRenderer(bodies.renderer.calibration, bodies.seed, bodies.block_size)
    )
    checked = 0
    for index in range(len(trace.sessions)):
        session = prepared.prepared(index)
        tree = Play(session, 0, index, 0, marker=None if cache_bust == "none" else f"{index:012x}")
        steps = list(session.plan.steps)
        if order == "interleaved":
            # Each agent's turns stay in order (a turn is built after its previous one is sent), agents interleaved.
            by_agent = {agent: [steps[i] for i in indices] for agent, indices in session.agent_steps.items()}
            steps = []
            while any(by_agent.values()):
                for queue in reversed(list(by_agent.values())):
                    if queue:
                        steps.append(queue.pop(0))
        for step in steps:
            for phase in ("warmup", "profiling"):  # the same turn built again for its phase
                tokens, body = bodies.build(tree, step, phase)
                got = (tokens, body if isinstance(body, bytes) else b"".join(body.parts))
                assert isinstance(body, bytes) or body.length == len(got[1])
                assert got == _expected(bodies, tree, step, phase, fresh), (trace.sessions[index].session_id, step)
                checked += 1
    return checked


def _shorter(trace: Trace) -> Trace:
    """`trace` with prompts of at most ~4k tokens: the encodings do not depend on length, and the lists that check
    them cost in proportion to it."""
    for session in trace.sessions:
        for agent, _, _ in session.agents():
            agent.requests = [
                msgspec.structs.replace(request, in_tokens=request.in_tokens % 4_099) for request in agent.requests
            ]
    return trace


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    trace=traces(max_sessions=2).map(_shorter),
    api=st.sampled_from(["completions", "chat"]),
    cache_bust=st.sampled_from(["marker", "salt", "none"]),
    order=st.sampled_from(["plan", "interleaved"]),
    extra_body=st.sampled_from([None, {"temperature": 0.5}, {"prompt": [7, 8]}, {"messages": [], "seed": 1}]),
)
def test_every_body_is_the_bytes_its_lists_encode_to(
    trace: Trace, api: Api, cache_bust: str, order: str, extra_body: dict[str, Any] | None
) -> None:
    """`extra_body` too: a field it names replaces the body's own, the prompt's included."""
    _check_trace(trace, api, cache_bust, order, extra_body)


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("cache_bust", ["marker", "none"])
def test_agentx_size_sessions_with_subagents_encode_the_same(api: Api, cache_bust: str) -> None:
    trace = generate(agentic_coding(), sessions=3, seed=4)
    assert any(agent.subagents for session in trace.sessions for agent, _, _ in session.agents())
    assert _check_trace(trace, api, cache_bust) > 50


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_real_weka_sample_encodes_the_same(weka_sample_files: list[Path], api: Api) -> None:
    for path in weka_sample_files:
        _check_trace(load_trace(path), api, "marker", "interleaved")


@given(ids=st.lists(st.integers(0, 29_999), max_size=300), low=st.integers(0, 5))
def test_id_text_is_the_json_of_the_ids(ids: list[int], low: int) -> None:
    text = id_text(BlockTokens(1, 4, TokenSpace(low, 30_000)), 0)
    assert b"[" + text.text(ids)[:-1] + b"]" == msgspec.json.encode(ids) or not ids


def test_a_turn_reuses_the_previous_text_and_writes_only_what_it_adds() -> None:
    """The previous prompt's text is taken as it is up to the blocks the turns share: the blocks made for the second
    turn are only its new ones."""
    trace = generate(agentic_coding(), sessions=1, seed=2)
    bodies, options = _builder(trace, "completions", "marker")
    session = prepare_trace(trace, options).prepared(0)
    tree = Play(session, 0, 0, 0, marker="00000000000a")
    root = [session.plan.steps[i] for i in session.agent_steps[session.plan.steps[0].agent_id]]
    bodies.build(tree, root[0])
    assert bodies.ids is not None
    made: list[int] = []
    original = bodies.ids.blocks.matrix

    def counting(scope_key: str, hash_ids: Sequence[int]) -> Any:
        made.extend(hash_ids)
        return original(scope_key, hash_ids)

    bodies.ids.blocks.matrix = counting  # type: ignore[method-assign]
    bodies.ids._slots = [None] * len(bodies.ids._slots)  # nothing cached: only the previous text helps
    bodies.build(tree, root[1])
    first, second = (session.hash_ids[step.index][: step.request.in_tokens // trace.block_size] for step in root[:2])
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    assert shared > 0 and made == list(second[shared:])
