"""Before a run: the trace as the run replays it, and what the server is asked about first.

- `prepare_trace`: over-long sessions dropped, flattened agents split and plans built per session when first
  played (agentx.replayer.plan.sessions); a sweep prepares once for all its levels.
- `stream_usage_probe`: what `stream_options` the server takes (agentx.replayer.http.probe), unless forced.
- `chat_calibration`: `--api chat`'s words and template overhead (agentx.replayer.prompts.calibrate).
"""

from __future__ import annotations

import logging
from pathlib import Path

from agentx.errors import NothingToReplay
from agentx.replayer.http.client import Client
from agentx.replayer.http.probe import UsageProbe, detect_stream_usage
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.plan.bodies import COMPLETIONS_PATH
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.sessions import ReplaySessions
from agentx.replayer.prompts.calibrate import ChatCalibration, LocalCounter, ServerCounter, TokenCounter, calibrate
from agentx.replayer.prompts.chat import CHAT_PATH
from agentx.replayer.prompts.tokens import TokenSpace
from agentx.trace.model import Trace

_log = logging.getLogger(__name__)


def prepare_trace(trace: Trace, options: ReplayOptions) -> PreparedTrace:
    """The trace as runs with `options` replay it: over-long sessions dropped (§4f) now; flattened agents split
    out (§3b), idle gaps cut when the per-tree cap is the load-time kind (§4c) and plans built per session when
    first played. Pass it to several `run_replay` calls (a sweep) to prepare the trace once."""
    cap = options.scenario.tree_idle_cap_s
    sessions = ReplaySessions(
        trace,
        chain_rules=options.scenario.chain_rules if options.scenario.split_flattened_agents else None,
        max_context_length=options.scenario.max_context_length,
        warp_cap_s=cap if cap is not None and options.scenario.tree_cap_mode == "warp" else None,
    )
    return PreparedTrace(
        sessions,
        options.scenario.child_offset,
        (options.server.model, *options.server.models),
        preparation_key(options),
    )


def dropped_notices(sessions: ReplaySessions, options: ReplayOptions) -> list[str]:
    """The sessions `max_context_length` left out, said (logged, and returned for `RunResult.notices`); raises
    NothingToReplay when none is left."""
    dropped = sessions.dropped
    if not dropped:
        return []
    total = len(dropped) + len(sessions.trace.sessions)
    shown = ", ".join(repr(session_id) for session_id in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
    what = (
        f"{len(dropped):,} of {total:,} sessions need more than max_context_length "
        f"{options.scenario.max_context_length:,} tokens (peak in + out) and are left out: {shown}"
    )
    if len(dropped) == total:
        raise NothingToReplay(f"nothing to replay: {what}")
    _log.warning(what)
    return [what]


def preparation_key(options: ReplayOptions) -> tuple[object, ...]:
    """The options a `PreparedTrace` depends on: runs that agree on them can share one."""
    warp = options.scenario.tree_idle_cap_s if options.scenario.tree_cap_mode == "warp" else None
    rules = options.scenario.chain_rules if options.scenario.split_flattened_agents else None
    return (
        rules,
        options.scenario.max_context_length,
        warp,
        options.scenario.child_offset,
        options.server.model,
        options.server.models,
    )


async def stream_usage_probe(client: Client, options: ReplayOptions, space: TokenSpace) -> UsageProbe:
    if options.server.stream_usage != "auto":
        return UsageProbe(options.server.stream_usage)
    body: dict[str, object] = {"model": options.server.model, "max_tokens": 2, "ignore_eos": True}
    if options.server.api == "chat":
        body["messages"] = [{"role": "user", "content": "ok"}]
        return await detect_stream_usage(client, CHAT_PATH, body)
    body["prompt"] = [space.low] * 8
    return await detect_stream_usage(client, COMPLETIONS_PATH, body)


async def chat_calibration(client: Client, options: ReplayOptions, block_size: int) -> ChatCalibration:
    counter: TokenCounter
    if options.server.tokenizer is not None:
        counter, source = (
            LocalCounter(options.server.tokenizer, client, options.server.model),
            Path(options.server.tokenizer).name,
        )
    else:
        counter, source = ServerCounter(client, options.server.model), "server"
    return await calibrate(counter, block_size=block_size, source=source)
