"""Logs → trace: tokenize each prompt, hash its blocks as a keyed chain, rebuild the agent trees.

The trace keeps lengths, times, block identities (as small ints) and the tree; no text, no path,
no session key, no digest and no salt reaches it. Session ids become `s000000`, ..., agent ids
`a1`, `a2`, ... in order of appearance, times are shifted so the first request starts at 0, and
stop reasons and subagent types outside a fixed vocabulary become "other".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from itertools import groupby
from pathlib import Path

import msgspec

from agentx.errors import TraceError
from agentx.synth.logs.exchange import Exchange
from agentx.synth.logs.hashing import ChainHasher, IdRemap, random_salt
from agentx.synth.logs.options import FromLogsOptions, LogFormat, ModelNames
from agentx.synth.logs.tokenize import Tokenizer, load_tokenizer
from agentx.synth.logs.tree import Call, Chain, ChainBuilder, Extends, build_trees
from agentx.trace.model import Agent, Provenance, Request, Session, Trace, delta_encode

SUBAGENT_TYPES = frozenset({"Explore", "Plan", "general-purpose", "statusline-setup", "output-style-setup"})
"""Claude Code's built-in subagent types, kept verbatim; custom ones (named by users) become "other"."""

_CACHE_LIMIT = 1 << 20
"""Distinct segments whose tokens are kept; beyond it the cache starts over (memory stays bounded)."""


class _Tokens:
    """Segment → tokens, memoized: a conversation re-sends its whole history every turn."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, list[str]] = {}

    def of(self, segments: Sequence[str]) -> list[str]:
        cache, tokens = self.cache, []
        for segment in segments:
            pieces = cache.get(segment)
            if pieces is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                pieces = cache[segment] = self.tokenizer.encode(segment)
            tokens.extend(pieces)
        return tokens

    def count(self, segments: Sequence[str]) -> int:
        return len(self.of(segments))


def read_exchanges(paths: Iterable[str | os.PathLike[str]], fmt: LogFormat) -> list[Exchange]:
    """Every exchange in the inputs (files, or folders for claude-code)."""
    exchanges: list[Exchange] = []
    for path in map(Path, paths):
        if not path.exists():
            raise TraceError.at("no such file or directory", file=str(path))
        if fmt == "codex":
            raise TraceError.at("Codex rollouts record no prompts to make exchanges of: use from_logs", file=str(path))
        if fmt == "claude-code":
            from agentx.synth.logs.claude_code import read_claude_code

            exchanges.extend(read_claude_code(path))
        else:
            from agentx.synth.logs.proxy import read_proxy

            files = sorted(p for p in path.rglob("*.jsonl*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                exchanges.extend(read_proxy(file, fmt))
    if not exchanges:
        raise TraceError.at(f"no {fmt} exchanges found in the inputs", file=", ".join(map(str, paths)))
    return exchanges


def from_logs(paths: Sequence[str | os.PathLike[str]], options: FromLogsOptions, *, salt: bytes | None = None) -> Trace:
    """Read log files (or claude-code and codex folders) and build the anonymized trace; see `synthesize`."""
    if options.format == "codex":
        from agentx.synth.logs.codex import read_codex

        return read_codex(paths, options)
    return synthesize(read_exchanges(paths, options.format), options, salt=salt, source_count=len(paths))


def synthesize(
    exchanges: list[Exchange], options: FromLogsOptions, *, salt: bytes | None = None, source_count: int = 1
) -> Trace:
    """Build an anonymized trace from exchanges; a random salt (never returned) when none is given."""
    tokens = _Tokens(load_tokenizer(options.tokenizer_path))
    scale = _scale(exchanges, tokens)
    # With an approximate tokenizer, blocks are cut at the length that holds `block_size` real tokens.
    piece_block = max(1, round(options.block_size / scale))
    hasher = ChainHasher(salt if salt is not None else random_salt(), piece_block)
    models = ModelNames(options)
    pools = _pools(exchanges)
    origin = min(e.start_s for e in exchanges)
    sessions: list[Session] = []
    shared_remap = IdRemap()
    for pool in pools:
        remap = shared_remap if options.scope == "global" else IdRemap()
        requests: list[Request] = []
        builder = ChainBuilder()
        for index, exchange in enumerate(pool):
            prompt_tokens = tokens.of(exchange.prompt.segments)
            digests = hasher.digests(prompt_tokens)
            request, ids = _request(exchange, prompt_tokens, digests, tokens, remap, scale, options.block_size, models)
            requests.append(request)
            call = Call(
                index=index,
                start_s=exchange.start_s,
                end_s=exchange.end_s,
                ids=ids,
                n_tokens=len(prompt_tokens),
                final_digest=digests[-1] if digests else b"",
                anchor=digests[len(prompt_tokens) // hasher.block_size - 1]
                if len(prompt_tokens) >= hasher.block_size
                else b"",
                agent_key=exchange.agent_key,
                parent_key=exchange.parent_key,
            )
            builder.add(call, _extends(hasher, prompt_tokens, digests), digests, hasher.block_size)
        keyed = bool(pool[0].session_key)
        for root in build_trees(builder.finish(merge_restarts=keyed), one_session=keyed):
            sessions.append(_session(len(sessions), root, pool, requests, origin))
    notes = [
        f"synthesized by agentx synth from-logs from {source_count} input(s) ({options.format}); "
        "no text, paths, session keys or raw digests are kept",
        f"tokenizer: {tokens.tokenizer.name}" + ("" if tokens.tokenizer.exact else " (approximate)"),
    ]
    if not tokens.tokenizer.exact and scale != 1.0:
        notes.append(f"approximate tokens scaled by {scale:.3f} to match recorded usage; blocks of {piece_block}")
    return Trace(
        sessions=sessions,
        block_size=options.block_size,
        hash_id_scope=options.scope,
        provenance=Provenance(source_format=f"synth:{options.format}", notes=notes),
    )


def _extends(hasher: ChainHasher, prompt_tokens: list[str], digests: list[bytes]) -> Extends:
    """Whether this prompt starts with the whole prompt of an earlier call (compared by digest)."""

    def extends(earlier: Call) -> bool:
        length = earlier.n_tokens
        return length <= len(prompt_tokens) and earlier.final_digest == hasher.prefix_digest(
            prompt_tokens, digests, length
        )

    return extends


def _scale(exchanges: list[Exchange], tokens: _Tokens) -> float:
    """Recorded prompt tokens per approximate token, over requests that record usage (1 when exact)."""
    if tokens.tokenizer.exact:
        return 1.0
    recorded = counted = 0
    for exchange in exchanges:
        if exchange.response.in_tokens is not None:
            recorded += exchange.response.in_tokens
            counted += tokens.count(exchange.prompt.segments)
    return recorded / counted if recorded and counted else 1.0


def _pools(exchanges: list[Exchange]) -> list[list[Exchange]]:
    """Exchanges grouped by session key (one pool for all unkeyed ones), each in start order."""
    ordered = sorted(exchanges, key=lambda e: (e.session_key, e.start_s, e.file, e.line))
    pools = [list(group) for _, group in groupby(ordered, key=lambda e: e.session_key)]
    pools.sort(key=lambda pool: pool[0].start_s)
    return pools


def _request(
    exchange: Exchange,
    prompt_tokens: list[str],
    digests: list[bytes],
    tokens: _Tokens,
    remap: IdRemap,
    scale: float,
    block_size: int,
    models: ModelNames,
) -> tuple[Request, list[int]]:
    response = exchange.response
    in_tokens = response.in_tokens if response.in_tokens is not None else round(len(prompt_tokens) * scale)
    out_tokens = (
        response.out_tokens if response.out_tokens is not None else round(tokens.count(response.segments) * scale)
    )
    ids = remap.ids(digests)
    # Exactly ceil(in / block_size) ids, as replay expects: cut the surplus, fill a shortfall with
    # unshared ids (the tokenizer's estimate fell short; replay would use filler there anyway).
    wanted = -(-in_tokens // block_size)
    if len(ids) > wanted:
        del ids[wanted:]
    while len(ids) < wanted:
        ids.append(remap.fresh())
    ttft = None
    if exchange.first_token_s is not None:
        ttft = min(max(0.0, exchange.first_token_s - exchange.start_s), exchange.end_s - exchange.start_s)
    request = Request(
        t=exchange.start_s,  # absolute for now; made session-relative in _session
        model=models(exchange.model),
        in_tokens=in_tokens,
        out_tokens=out_tokens,
        api_time=exchange.end_s - exchange.start_s,
        ttft=ttft if response.streamed else None,
        type="s" if response.streamed else "n",
        input_types=exchange.prompt.input_types,
        output_types=response.output_types,
        stop=response.stop,
        hash_ids_added=tuple(ids),  # full ids for now; delta-encoded per agent in _agent
    )
    return request, ids


def _session(number: int, root: Chain, pool: list[Exchange], requests: list[Request], origin: float) -> Session:
    start = root.start_s
    chains = list(_walk(root))
    for chain in chains:
        start = min(start, chain.start_s)
    ordered = sorted((call for chain in chains for call in chain.calls), key=lambda c: (c.start_s, c.index))
    think: dict[int, float | None] = {}
    previous_end: float | None = None
    for call in ordered:
        think[call.index] = None if previous_end is None else max(0.0, call.start_s - previous_end)
        previous_end = call.end_s
    names = {id(chain): f"a{i}" for i, chain in enumerate(chains)}
    names[id(root)] = ""
    agent = _agent(root, names, pool, requests, think, start)
    models = list(dict.fromkeys(r.model for a, _, _ in agent.walk() for r in a.requests))
    return Session(session_id=f"s{number:06d}", root=agent, start_s=start - origin, models=models)


def _walk(chain: Chain) -> Iterable[Chain]:
    yield chain
    for child in chain.children:
        yield from _walk(child)


def _agent(
    chain: Chain,
    names: dict[int, str],
    pool: list[Exchange],
    requests: list[Request],
    think: dict[int, float | None],
    start: float,
) -> Agent:
    built: list[Request] = []
    previous: tuple[int, ...] = ()
    for call in chain.calls:
        source = requests[call.index]
        full = source.hash_ids_added
        kept, added = delta_encode(previous, full)
        previous = full
        built.append(
            msgspec.structs.replace(
                source, t=source.t - start, think_time=think[call.index], hash_ids_kept=kept, hash_ids_added=added
            )
        )
    agent = Agent(agent_id=names[id(chain)], requests=built, models=list(dict.fromkeys(r.model for r in built)))
    agent.subagents = [_agent(child, names, pool, requests, think, start) for child in chain.children]
    for child, sub in zip(chain.children, agent.subagents, strict=True):
        sub.spawn_after = min(child.spawn_after, len(built))
        spawn_s = chain.calls[child.spawn_after - 1].end_s if child.spawn_after else child.start_s
        sub.t = min(spawn_s, child.start_s) - start
        sub.duration_ms = max(0, math.ceil((child.end_s - start - sub.t) * 1000))
        sub.status = "completed"
        sub.subagent_type = _subagent_type(pool[child.calls[0].index].subagent_type)
    return agent


def _subagent_type(name: str) -> str:
    if not name:
        return ""
    return name if name in SUBAGENT_TYPES else "other"
