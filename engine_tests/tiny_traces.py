"""Small traces for the engine suites: a CPU decodes tens to hundreds of tokens a second, so short contexts, a
few output tokens, the sample trace's shape (turns that grow a shared prefix, a subagent) rather than its size."""

from __future__ import annotations

from typing import Final

from agentx.trace.model import Agent, Request, Session, Trace

BLOCK: Final = 64


def _turns(session: int, count: int, first_in: int, step_in: int, out: int, offset: float = 0.0) -> list[Request]:
    """Turns whose prompts grow one shared prefix: each keeps the previous turn's blocks and adds its own."""
    turns = []
    for i in range(count):
        in_tokens = first_in + i * step_in
        turns.append(
            Request(
                t=offset + 2.0 * i,
                model="m",
                in_tokens=in_tokens,
                out_tokens=out,
                api_time=1.0,
                hash_ids_added=tuple(range(10_000 * session, 10_000 * session + in_tokens // BLOCK)),
            )
        )
    return turns


def tiny_trace(sessions: int = 2, turns: int = 4, out: int = 6) -> Trace:
    """Sessions of growing turns with one subagent each (spawned after the first turn, joined by the third)."""
    built = []
    for s in range(sessions):
        sub = Agent(agent_id="sub", spawn_after=1, t=1.0, requests=_turns(100 + s, 2, 150, 70, out, offset=1.0))
        root = Agent(requests=_turns(s, turns, 200, 90, out), subagents=[sub])
        built.append(Session(session_id=f"s{s}", root=root))
    return Trace(sessions=built, block_size=BLOCK)
