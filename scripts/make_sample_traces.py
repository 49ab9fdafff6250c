"""Generate the sample traces in `traces/`: the same bytes on every run (fixed seed, no clock).

- `sample.arrow`, `sample.weka.jsonl`: 20 synthetic Claude-Code-like sessions (one corpus, two formats):
  root tool loops on an Opus-class model with growing contexts, Haiku-class subagents (parallel groups
  that join, background subagents, one nested subagent) and context compactions.
- `sample.mooncake.jsonl`: an open-loop Mooncake-style trace, 200 single-request sessions with Poisson
  arrivals, global hash ids at block size 512 and a shared first block (id 0).

Usage: `.venv/bin/python scripts/make_sample_traces.py [--out DIR]` (`make samples`).
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec

from agentx.trace.io import save_trace
from agentx.trace.model import Agent, Provenance, Request, RequestType, Session, Trace, delta_encode

SEED = 20_251_129
BLOCK_SIZE = 64
SESSION_COUNT = 20
ROOT_MODEL = "claude-opus-4-5"
SUBAGENT_MODEL = "claude-haiku-4-5"
# Decode speeds in the range the public Weka sample shows (Opus ~65 tokens/s, Haiku ~100 tokens/s).
DECODE_TOKENS_PER_S = {ROOT_MODEL: 60.0, SUBAGENT_MODEL: 110.0}

MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_SESSION_COUNT = 200
MOONCAKE_RATE_PER_S = 2.0
MOONCAKE_FOLLOW_UP_SHARE = 0.3
"""Share of Mooncake requests that continue an earlier conversation (reuse its blocks as a prefix)."""
MOONCAKE_FOLLOW_UP_MIN_GAP_MS = 20_000
"""A follow-up comes at least this long after the request it continues (answer time plus reading)."""

REPO = Path(__file__).resolve().parent.parent
ARROW_NAME = "sample.arrow"
WEKA_NAME = "sample.weka.jsonl"
MOONCAKE_NAME = "sample.mooncake.jsonl"

Feature = Literal["parallel", "single", "background", "nested", "compaction", "streamed"]

# Output-type mixes as the public Weka sample has them (Haiku subagents do not think).
_ROOT_TOOL_OUTPUTS: list[tuple[str, ...]] = (
    [("thinking", "tool_use")] * 9
    + [("text", "thinking", "tool_use")] * 5
    + [("text", "tool_use")] * 2
    + [("tool_use",)]
)
_ROOT_FINAL_OUTPUTS: list[tuple[str, ...]] = [("text", "thinking"), ("text",)]
_SUB_TOOL_OUTPUTS: list[tuple[str, ...]] = [("text", "tool_use")] * 4 + [("tool_use",)]


def _ceil_blocks(tokens: int, block_size: int = BLOCK_SIZE) -> int:
    return -(-tokens // block_size)


def _lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


class _Prefix(msgspec.Struct, frozen=True):
    """The tools + system prompt of one kind of agent: its token counts and its full-block ids."""

    tool_tokens: int
    system_tokens: int
    ids: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return self.tool_tokens + self.system_tokens


class _Context:
    """An agent's prompt as it grows: exact token count and one hash id per (possibly partial) block."""

    def __init__(self, ids: list[int], tokens: int) -> None:
        self.ids = ids
        self.tokens = tokens


class _SessionBuilder:
    """Builds one session; hash ids are numbered per session in first-use order (scope "session")."""

    def __init__(self, rng: random.Random, session_id: str, features: set[Feature]) -> None:
        self.rng = rng
        self.session_id = session_id
        self.features = features
        self.transport: RequestType = "s" if "streamed" in features else "n"
        self.next_id = 0
        self.prefixes: dict[str, _Prefix] = {}

    # -- hash ids -------------------------------------------------------------------------------

    def fresh(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def prefix(self, kind: str) -> _Prefix:
        """The shared first blocks of every agent of `kind` in this session."""
        if kind not in self.prefixes:
            if kind == "root":
                tool, system = self.rng.randint(11_800, 12_600), self.rng.randint(2_700, 3_100)
            else:
                tool, system = self.rng.randint(7_300, 7_500), self.rng.randint(1_000, 1_500)
            # Only full blocks are shared: the partial last block also holds the first message.
            self.prefixes[kind] = _Prefix(tool, system, tuple(self.fresh((tool + system) // BLOCK_SIZE)))
        return self.prefixes[kind]

    def start_context(self, prefix: _Prefix, message_tokens: int) -> _Context:
        tokens = prefix.tokens + message_tokens
        return _Context(list(prefix.ids) + self.fresh(_ceil_blocks(tokens) - len(prefix.ids)), tokens)

    def grow(self, context: _Context, tokens: int) -> None:
        """Append `tokens` (the previous output and the tool result) to the prompt."""
        # A partial last block gets a new id once more tokens fill it: its content changed.
        keep = len(context.ids) - (1 if context.tokens % BLOCK_SIZE else 0)
        context.tokens += tokens
        context.ids = context.ids[:keep] + self.fresh(_ceil_blocks(context.tokens) - keep)

    def compact(self, context: _Context, prefix: _Prefix, summary_tokens: int) -> None:
        """Replace the conversation by a summary: only the tools/system blocks survive."""
        context.tokens = prefix.tokens + summary_tokens
        kept = len(prefix.ids)
        context.ids = context.ids[:kept] + self.fresh(_ceil_blocks(context.tokens) - kept)

    # -- requests -------------------------------------------------------------------------------

    def request(
        self,
        *,
        t: float,
        model: str,
        context: _Context,
        previous_ids: Sequence[int],
        out_tokens: int,
        input_types: tuple[str, ...],
        output_types: tuple[str, ...],
        stop: str,
    ) -> Request:
        rng = self.rng
        prefill_s = context.tokens / 80_000
        api_time = round(1.0 + prefill_s + out_tokens / DECODE_TOKENS_PER_S[model] * rng.uniform(0.85, 1.2), 2)
        ttft = None
        if self.transport == "s":
            ttft = round(min(0.3 + prefill_s * rng.uniform(1.0, 1.6) + rng.uniform(0.0, 0.6), api_time * 0.9), 2)
        kept, added = delta_encode(previous_ids, context.ids)
        return Request(
            t=round(t, 3),
            model=model,
            in_tokens=context.tokens,
            out_tokens=out_tokens,
            hash_ids_kept=kept,
            hash_ids_added=added,
            api_time=api_time,
            ttft=ttft,
            type=self.transport,
            input_types=input_types,
            output_types=output_types,
            stop=stop,
        )

    def think_s(self) -> float:
        """Tool execution plus client overhead between a response and the next request."""
        return min(30.0, max(1.0, self.rng.lognormvariate(math.log(5.0), 0.7)))

    # -- agents ---------------------------------------------------------------------------------

    def root(self) -> Agent:
        rng = self.rng
        turns = rng.randint(40, 55) if "compaction" in self.features else rng.randint(8, 28)
        # Where subagents are spawned: after request k (k < turns - 1, so that k stops on "tool_use").
        spawns: dict[int, Feature] = {}
        if "background" in self.features:
            spawns[turns - rng.randint(2, 4)] = "background"
        for feature in ("parallel", "single", "nested"):
            if feature in self.features:
                free = [k for k in range(1, turns - 4) if not {k - 1, k, k + 1} & spawns.keys()]
                spawns[rng.choice(free)] = feature
        if "parallel" in self.features and turns > 20:
            free = [k for k in range(1, turns - 4) if not {k - 1, k, k + 1} & spawns.keys()]
            spawns[rng.choice(free)] = "parallel"
        # Late in a long run, where the context is largest (the sample is too small to reach a real
        # auto-compact threshold of ~160k tokens in every session that should show one).
        compact_at = rng.randint(turns * 3 // 4, turns - 4) if "compaction" in self.features else None

        prefix = self.prefix("root")
        context = self.start_context(prefix, rng.randint(300, 4_500))
        root = Agent(agent_id="", tool_tokens=prefix.tool_tokens, system_tokens=prefix.system_tokens)
        previous_ids: list[int] = []
        backgrounds: list[tuple[int, float]] = []
        t = 0.0
        for k in range(turns):
            final = k == turns - 1
            input_types: tuple[str, ...] = ("text",) if k == 0 else ("tool_result",)
            if k == compact_at:
                self.compact(context, prefix, rng.randint(6_000, 12_000))
                input_types = ("text",)  # the summary arrives as a user message, as in the public sample
            out_tokens = rng.randint(200, 1_500) if final else _lognormal_int(rng, 280, 0.8, 50, 2_000)
            request = self.request(
                t=t,
                model=ROOT_MODEL,
                context=context,
                previous_ids=previous_ids,
                out_tokens=out_tokens,
                input_types=input_types,
                output_types=rng.choice(_ROOT_FINAL_OUTPUTS if final else _ROOT_TOOL_OUTPUTS),
                stop="end_turn" if final else "tool_use",
            )
            root.requests.append(request)
            previous_ids = list(context.ids)
            ready_s = request.end
            tool_result_tokens = _lognormal_int(rng, 700, 1.3, 20, 15_000)
            spawn = spawns.get(k)
            if spawn == "background":
                backgrounds.append((k + 1, request.end + rng.uniform(0.1, 0.6)))
                tool_result_tokens = rng.randint(60, 120)  # "agent launched in the background"
            elif spawn is not None:
                count = rng.choice((2, 3)) if spawn == "parallel" else 1
                kind = "general-purpose" if spawn == "nested" else "Explore"
                subagents = [
                    self.subagent(kind, request.end + rng.uniform(0.05, 0.8), nest=spawn == "nested")
                    for _ in range(count)
                ]
                for sub in sorted(subagents, key=lambda sub: sub.t or 0.0):
                    sub.spawn_after = k + 1
                    root.subagents.append(sub)
                # The parent waits for every subagent it launched: its next request starts after them.
                ready_s = max(sub.end for sub in subagents)
                tool_result_tokens = sum(sub.requests[-1].out_tokens for sub in subagents) + rng.randint(50, 300)
            if not final:
                self.grow(context, out_tokens + tool_result_tokens)
                t = math.ceil((ready_s + self.think_s()) * 1000) / 1000
        for spawn_after, start_s in backgrounds:
            # Ends after the parent's last request: no later parent request joins it.
            sub = self.subagent("general-purpose", start_s, min_end_s=root.requests[-1].end + rng.uniform(5.0, 40.0))
            sub.spawn_after = spawn_after
            root.subagents.append(sub)
        root.subagents.sort(key=lambda sub: (sub.spawn_after, sub.t or 0.0))
        return root

    def subagent(self, kind: str, start_s: float, *, nest: bool = False, min_end_s: float = 0.0) -> Agent:
        """A Haiku tool loop from `start_s`; `nest` spawns one Explore subagent of its own mid-way."""
        rng = self.rng
        prefix = self.prefix(kind)
        context = self.start_context(prefix, rng.randint(150, 1_200))
        agent = Agent(
            agent_id="",  # numbered once the whole session is built, in tree order
            subagent_type=kind,
            status="completed",
            models=[SUBAGENT_MODEL],
            tool_tokens=prefix.tool_tokens,
            system_tokens=prefix.system_tokens,
        )
        turns = rng.randint(3, 8)
        nest_after = rng.randint(1, turns - 2) if nest else None
        previous_ids: list[int] = []
        t = math.ceil(start_s * 1000) / 1000
        k = 0
        while True:
            # The final report takes well over 5 s, so starting it 5 s before `min_end_s` ends it after.
            final = k >= turns - 1 and t >= min_end_s - 5.0
            request = self.request(
                t=t,
                model=SUBAGENT_MODEL,
                context=context,
                previous_ids=previous_ids,
                out_tokens=rng.randint(600, 2_000) if final else _lognormal_int(rng, 220, 0.6, 50, 900),
                input_types=("text",) if k == 0 else ("tool_result",),
                output_types=("text",) if final else rng.choice(_SUB_TOOL_OUTPUTS),
                stop="end_turn" if final else "tool_use",
            )
            agent.requests.append(request)
            previous_ids = list(context.ids)
            if final:
                break
            ready_s = request.end
            tool_result_tokens = _lognormal_int(rng, 1_500, 1.1, 40, 9_000)  # file reads and searches
            if k == nest_after:
                child = self.subagent("Explore", request.end + rng.uniform(0.05, 0.5))
                child.spawn_after = k + 1
                agent.subagents.append(child)
                ready_s = child.end
                tool_result_tokens = child.requests[-1].out_tokens + rng.randint(50, 200)
            self.grow(context, request.out_tokens + tool_result_tokens)
            t = math.ceil((ready_s + min(8.0, self.think_s() * 0.5)) * 1000) / 1000
            k += 1
        agent.t = agent.requests[0].t
        last_end_s = max(r.end for r in agent.requests)
        agent.duration_ms = math.ceil((last_end_s - agent.t) * 1000)
        agent.tool_use_count = sum(1 for r in agent.requests if r.stop == "tool_use")
        agent.total_tokens = agent.requests[-1].in_tokens + agent.requests[-1].out_tokens
        return agent

    def session(self) -> Session:
        root = self.root()
        agents = list(root.walk())
        for number, (agent, _parent, _depth) in enumerate(agents[1:], start=1):
            agent.agent_id = f"agent_{number:03d}"
        _set_think_times(root)
        subagent_requests = [r for agent, parent, _ in agents if parent is not None for r in agent.requests]
        parent_in = sum(r.in_tokens for r in root.requests)
        parent_out = sum(r.out_tokens for r in root.requests)
        sub_in = sum(r.in_tokens for r in subagent_requests)
        sub_out = sum(r.out_tokens for r in subagent_requests)
        return Session(
            session_id=self.session_id,
            root=root,
            models=[ROOT_MODEL, SUBAGENT_MODEL] if subagent_requests else [ROOT_MODEL],
            totals={
                "parent_tokens": {"input": parent_in, "output": parent_out},
                "subagent_tokens": {"input": sub_in, "output": sub_out},
                "combined_tokens": {"input": parent_in + sub_in, "output": parent_out + sub_out},
                "subagent_count": len(agents) - 1,
            },
        )


def _set_think_times(root: Agent) -> None:
    """think_time = start minus the previous row's end, rows of the whole session in start order."""
    rows = [
        (request.t, order, index, agent)
        for order, (agent, _, _) in enumerate(root.walk())
        for index, request in enumerate(agent.requests)
    ]
    rows.sort(key=lambda row: row[:3])
    previous_end: float | None = None
    for _t, _order, index, agent in rows:
        request = agent.requests[index]
        think = None if previous_end is None else round(max(0.0, request.t - previous_end), 3)
        agent.requests[index] = msgspec.structs.replace(request, think_time=think)
        previous_end = request.end


def _session_features(rng: random.Random) -> list[set[Feature]]:
    """Which sessions show which behaviour: each feature at least once, placed at random."""
    assigned: list[Feature] = [
        "parallel", "parallel", "parallel", "parallel", "parallel",
        "single", "single", "single",
        "background", "background",
        "nested",
        "compaction", "compaction",
    ]  # fmt: skip
    features: list[set[Feature]] = [set() for _ in range(SESSION_COUNT)]
    for feature in assigned:
        candidates = [i for i, have in enumerate(features) if feature not in have and len(have) < 2]
        features[rng.choice(candidates)].add(feature)
    for index in rng.sample(range(SESSION_COUNT), 5):
        features[index].add("streamed")
    return features


def agentic_trace(seed: int = SEED) -> Trace:
    """The 20-session coding-agent sample."""
    rng = random.Random(seed)
    sessions = [
        _SessionBuilder(rng, f"session_{index:03d}", features).session()
        for index, features in enumerate(_session_features(rng))
    ]
    return Trace(
        sessions=sessions,
        block_size=BLOCK_SIZE,
        hash_id_scope="session",
        provenance=Provenance(
            source_format="synthetic",
            source_path="scripts/make_sample_traces.py",
            notes=[f"seed {seed}; Claude-Code-like sessions with subagents, generated, not recorded"],
        ),
    )


def mooncake_trace(seed: int = SEED) -> Trace:
    """The open-loop Mooncake-style sample: single-request sessions, global ids, shared block 0."""
    rng = random.Random(seed + 1)
    next_id = 1
    earlier: list[tuple[int, tuple[int, ...]]] = []  # (arrival ms, full-block ids) of every request so far
    sessions: list[Session] = []
    arrival_ms = 0
    for index in range(MOONCAKE_SESSION_COUNT):
        if index:
            arrival_ms += round(rng.expovariate(MOONCAKE_RATE_PER_S) * 1000)
        prefix: tuple[int, ...] = (0,)
        answered = [ids for at_ms, ids in earlier if at_ms <= arrival_ms - MOONCAKE_FOLLOW_UP_MIN_GAP_MS]
        if answered and rng.random() < MOONCAKE_FOLLOW_UP_SHARE:
            # A later turn of an earlier conversation: its full blocks come back as the prefix.
            prefix = rng.choice(answered)
        in_tokens = max(
            len(prefix) * MOONCAKE_BLOCK_SIZE + rng.randint(1, 4_000), _lognormal_int(rng, 6_500, 0.9, 600, 60_000)
        )
        added = _ceil_blocks(in_tokens, MOONCAKE_BLOCK_SIZE) - len(prefix)
        ids = prefix + tuple(range(next_id, next_id + added))
        next_id += added
        full_blocks = in_tokens // MOONCAKE_BLOCK_SIZE
        earlier.append((arrival_ms, ids[:full_blocks]))
        out_tokens = _lognormal_int(rng, 350, 0.5, 5, 2_000)
        request = Request(t=0.0, model="", in_tokens=in_tokens, out_tokens=out_tokens, hash_ids_added=ids)
        sessions.append(
            Session(session_id=f"mooncake_{index:03d}", root=Agent(requests=[request]), start_s=arrival_ms / 1000)
        )
    return Trace(
        sessions=sessions,
        block_size=MOONCAKE_BLOCK_SIZE,
        hash_id_scope="global",
        provenance=Provenance(
            source_format="synthetic",
            source_path="scripts/make_sample_traces.py",
            notes=[f"seed {seed}; Mooncake-style open-loop requests, generated, not recorded"],
        ),
    )


def write_samples(out_dir: Path) -> list[Path]:
    """Write the three sample files into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    agentic = agentic_trace()
    written = [out_dir / ARROW_NAME, out_dir / WEKA_NAME, out_dir / MOONCAKE_NAME]
    save_trace(agentic, written[0], format="arrow")
    save_trace(agentic, written[1], format="weka")
    save_trace(mooncake_trace(), written[2], format="mooncake")
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "traces", help="output directory (default: traces/)")
    args = parser.parse_args(argv)
    for path in write_samples(args.out):
        print(f"{path}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
