"""A replay's options: small typed parts composed into one immutable `ReplayOptions`.

- `Server`: where requests go and what they carry (URL, served models, API, credentials, extra body).
- `Connection`: the pool, its timeouts and how an https server's certificate is checked.
- `load`: how load is offered, a tagged union by `mode`: `AgentxLoad`, `ClosedLoad` (lanes of session trees),
  `TraceLoad`, `RateLoad` (open loop).
- `Scenario`: what is replayed and how the trace becomes requests (sessions, timing, limits, idle caps).
- `Speculative`: the acceptance the server was forced to, checked after the run.
- `Runtime`: how this process runs (grace period, run id, shard, garbage-collector control).

`DecodeOptions` composes the same server, connection and speculative parts for `agentx decode`.

Constraints sit on the fields (`Meta`: ranges, choices); rules that tie fields together are in `__post_init__`.
`checked(options)` applies both, once, at the start of a run; the CLI derives its flags from the same fields
(agentx.cli.flags), so `replay`, `sweep` and `decode` cannot drift. `Meta.extra` carries what the CLI needs
beyond the type: `help` (one line), `flag` (when not `--field-name`), `alias`, `metavar`, `none` (the word that
means None on the command line, e.g. "off"), `bare` (the value of the flag given alone: `--ray` is `--ray auto`),
`repeat` (a flag given once per value), `group` (the section of `--help` it is listed in, when not its part's;
agentx.cli.flags.HELP_GROUPS) and `late` (listed last there).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError
from agentx.replayer.http.exchange import CONTEXT_OVERFLOW_SUBSTRINGS
from agentx.replayer.options.fields import AGENTX, OUTPUT, PROMPTS, TRACE, Fraction, PositiveSeconds, Seconds
from agentx.replayer.options.fields import field_help as _help
from agentx.replayer.options.load import (
    DEFAULT_WINDOW,
    LOADS,
    AgentxLoad,
    ClosedLoad,
    LaneLoad,
    Load,
    Mode,
    RateLoad,
    TraceLoad,
    lanes,
)
from agentx.replayer.options.rules import DEFAULT_RULES_NAME, RuleSet, RulesName, rule_set
from agentx.replayer.options.server import AFFINITY_HEADERS, Connection, Server
from agentx.replayer.options.slo import Slos
from agentx.secrets import redact, secret_free_repr
from agentx.trace.chain_rules import DEFAULT_RULES, ChainRules

if TYPE_CHECKING:
    pass

__all__ = [
    "AFFINITY_HEADERS",
    "CONTEXT_OVERFLOW_SUBSTRINGS",
    "DEFAULT_WINDOW",
    "LOADS",
    "AgentxLoad",
    "ClosedLoad",
    "Connection",
    "DecodeOptions",
    "LaneLoad",
    "Load",
    "Mode",
    "RateLoad",
    "ReplayOptions",
    "Runtime",
    "Scenario",
    "Server",
    "SessionOrder",
    "Speculative",
    "TraceLoad",
    "checked",
    "flat_options",
    "lanes",
]
"""The parts live in load.py and server.py; every name of the options is imported from here."""

SessionOrder = Literal["sequential", "shuffle", "random"]


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    """What is replayed and how the trace becomes requests."""

    duration_s: Annotated[PositiveSeconds | None, _help("Run this long.", flag="--duration", metavar="SECONDS")] = None
    """Stop starting new requests after this long; None: until `sessions` trees are done."""
    sessions: Annotated[Annotated[int, Meta(ge=1)] | None, _help("Stop after this many session trees.")] = None
    """Stop after this many session trees have been started (None with no duration and no request cap: one
    pass)."""
    num_requests: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        _help(
            "Stop after sending this many profiling requests (warmup not counted); those in flight finish.",
            metavar="N",
        ),
    ] = None
    """A cap on the requests sent in the profiling phase, failed ones included (the AgentX warmup's primers and
    cache-pressure requests are not counted): once the N-th is sent, no new request or tree starts, the requests in
    flight finish (the grace period does not cut them; their timeouts still apply) and the run ends
    (`RunResult.request_cap_reached`). Without `sessions` or `duration_s`, trees recycle until the cap. vLLM
    bench's --num-prompts, AIPerf's --request-count."""
    session_order: Annotated[SessionOrder, _help("The order lanes draw sessions in.")] = "sequential"
    seed: Annotated[int, Meta(ge=0), _help("Seed of session order and prompt content.")] = 0
    delay_scale: Annotated[Seconds, _help("Multiply every recorded delay (0: none).")] = 1.0
    """Multiplies every planned delay (think times, subagent offsets): 1.0 replays the recorded timing, 0.01 runs
    a trace's idle gaps 100x faster, 0 sends each request as soon as its dependencies complete."""
    child_offset: Annotated[
        Literal["branch_start", "anchor_end"],
        _help(
            "A subagent's first turn: at its recorded offset within its branch, or the recorded gap after the "
            "parent turn before its spawn.",
            group=TRACE,
        ),
    ] = "branch_start"
    """docs/replay.md, "The plan of a session"."""
    max_context_length: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        _help("Drop sessions whose peak in+out exceeds this, whole.", metavar="TOKENS", group=TRACE),
    ] = None
    """Sessions whose peak `in + out` (any agent, output uncapped) exceeds this are dropped before the run."""
    max_output_tokens: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        _help("Cap the output of the root's turns (subagent turns are never capped).", metavar="TOKENS", group=PROMPTS),
    ] = None
    chain_rules: Annotated[
        ChainRules,
        _help(
            "A flattened-agent detection threshold (a ChainRules field), e.g. aux_isl_floor=8192.",
            flag="--chain-rule",
            metavar="NAME=VALUE",
            repeat=True,
            group=TRACE,
        ),
    ] = DEFAULT_RULES
    split_flattened_agents: Annotated[
        bool,
        _help("Split agents recorded flattened into their parent's requests into agents of their own.", group=TRACE),
    ] = True
    context_overflow_substrings: Annotated[
        tuple[str, ...],
        _help(
            "An error answer whose text holds this is a context overflow (repeatable; replaces the defaults).",
            flag="--context-overflow-substring",
            metavar="TEXT",
            group=AGENTX,
        ),
    ] = CONTEXT_OVERFLOW_SUBSTRINGS
    token_low: Annotated[
        int, Meta(ge=0), _help("Completions prompts: the lowest token id drawn (inclusive).", group=PROMPTS)
    ] = 1000
    token_high: Annotated[
        int, Meta(ge=1), _help("Completions prompts: the highest token id drawn (exclusive).", group=PROMPTS)
    ] = 30000
    """Token ids of synthetic prompts are drawn from [token_low, token_high), inside every common vocabulary."""
    system_idle_cap_s: Annotated[
        Seconds | None,
        _help(
            "When nothing is in flight, pull every pending timer in to at most this long (AgentX: 10).",
            none="off",
            metavar="SECONDS|off",
            group=AGENTX,
        ),
    ] = 10.0
    tree_idle_cap_s: Annotated[
        Seconds | None,
        _help(
            "The same per session tree (InferenceX: 300; under the AIPerf 0.13.0 rules it also caps warmup leads).",
            none="off",
            metavar="SECONDS|off",
            group=AGENTX,
        ),
    ] = None
    tree_idle_cap_mode: Annotated[
        Literal["runtime", "warp"] | None,
        _help(
            "runtime: act on the live schedule when a tree goes idle in profiling (agentx-harness); warp: cut each "
            "tree's recorded idle gaps before the run (AIPerf 0.13.0). Default: the rule set's.",
            none="rules",
            metavar="runtime|warp",
            group=AGENTX,
        ),
    ] = None
    """None: the rule set's (`RuleSet.tree_idle_cap_mode`); `tree_cap_mode` says which applies."""
    failed_request_threshold: Annotated[
        Fraction | None,
        _help(
            "Cancel the run once this fraction of profiling requests failed (InferenceX: 0.10).",
            none="off",
            metavar="FRACTION|off",
            group=AGENTX,
        ),
    ] = None

    rules: Annotated[
        RulesName,
        _help(
            "The AgentX rules played: agentx-harness-1.0.12 (InferenceX's harness today) or aiperf-0.13.0 (older); "
            "in --mode agentx, flags left unset take that scenario's defaults.",
            group=AGENTX,
        ),
    ] = DEFAULT_RULES_NAME
    """The reference whose rules the replay follows (agentx.replayer.options.rules); run.json and the exports name
    it."""

    slo: Annotated[
        Slos,
        _help(
            "A per-request objective METRIC=VALUE with a unit, s or ms (repeatable): ttft, tpot or e2el, e.g. "
            "ttft=2s, tpot=50ms; the summary's goodput counts the requests meeting every one.",
            flag="--slo",
            metavar="METRIC=VALUE",
            repeat=True,
            group=OUTPUT,
            late=True,
        ),
    ] = Slos()
    """The targets each record is judged against as it is made (`RequestRecord.slo_met`,
    agentx.replayer.options.slo)."""
    percentiles: Annotated[
        tuple[Annotated[float, Meta(ge=0, le=100)], ...],
        Meta(min_length=1),
        _help(
            "Percentiles the summary shows for every latency (vllm bench's --metric-percentiles), e.g. 50,90,99,99.9.",
            metavar="P,P,...",
            group=OUTPUT,
            late=True,
        ),
    ] = (50.0, 90.0, 95.0, 99.0)
    """Computed for TTFT, TPOT, ITL and E2EL and shown in this order (interactivity at each: 1/TPOT there)."""

    @property
    def rule_set(self) -> RuleSet:
        """The rules played, as data (agentx.replayer.options.rules)."""
        return rule_set(self.rules)

    @property
    def tree_cap_mode(self) -> Literal["runtime", "warp"]:
        """How the per-tree idle cap acts: `tree_idle_cap_mode`, else the rule set's."""
        return self.tree_idle_cap_mode or self.rule_set.tree_idle_cap_mode

    def __post_init__(self) -> None:
        if self.token_high <= self.token_low:
            raise ConfigError(f"token ids need token_low < token_high, got [{self.token_low}, {self.token_high})")


class Speculative(msgspec.Struct, frozen=True, kw_only=True):
    """The acceptance the server was forced to: run metadata, checked against the realized one after the run."""

    al: Annotated[
        float | None,
        _help(
            "The acceptance length the server is forced to (tokens per step, bonus included, in [1, K+1]); checked "
            "against the realized one.",
            flag="--spec-al",
            metavar="AL",
        ),
    ] = None
    k: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        _help("Draft tokens per step the server runs with.", flag="--spec-k", metavar="K"),
    ] = None
    al_tolerance: Annotated[
        float, Meta(gt=0), _help("Largest |realized − forced| AL accepted (absolute).", flag="--spec-tolerance")
    ] = 0.05
    stream_interval: Annotated[
        int, Meta(ge=1), _help("Decode steps the server merges into one streamed chunk (its --stream-interval).")
    ] = 1

    def __post_init__(self) -> None:
        al, k = self.al, self.k
        if al is not None:
            high = math.inf if k is None else k + 1
            if not (math.isfinite(al) and 1.0 <= al <= high):
                bound = f"[1, K+1] = [1, {k + 1}] for K={k}" if k is not None else "at least 1"
                raise ConfigError(f"the acceptance length (bonus token included) must be {bound}, got {al}")


class Runtime(msgspec.Struct, frozen=True, kw_only=True):
    """How this process runs the replay."""

    grace_s: Annotated[Seconds, _help("In-flight allowance after the end, s.", flag="--grace")] = 30.0
    """After the deadline, in-flight requests may finish within this; then they are cancelled."""
    metrics_interval_s: Annotated[
        Annotated[float, Meta(ge=0.1)] | None,
        _help(
            "Scrape the server's /metrics every S seconds into server_metrics.arrow (off: never).",
            none="off",
            metavar="S|off",
            flag="--metrics-interval",
        ),
    ] = 1.0
    """Server telemetry over the run (agentx.replayer.telemetry.scrape); None: not scraped."""
    workers: Annotated[
        int,
        Meta(ge=1),
        _help("Shard the run over this many processes, or Ray actors with --ray (when one core or host falls short)."),
    ] = 1
    """Shards of the run, each with its own event loop: processes on this host (agentx.replayer.workers), or with
    `ray` actors on a Ray cluster (agentx.replayer.cluster); the union of the shards is the one-process plan."""
    ray: Annotated[
        str | None,
        _help(
            "Run the --workers shards as actors on a Ray cluster: its address, auto (the cluster `ray start` made "
            "here or RAY_ADDRESS) or local (a private one on this host); --ray alone is auto (docs/distributed.md).",
            metavar="ADDRESS|auto|local",
            bare="auto",
        ),
    ] = None
    on_worker_loss: Annotated[
        Literal["abort", "continue"],
        _help("When a Ray worker or its node dies: stop the run (its load changed), or go on with the others."),
    ] = "abort"
    ray_placement_timeout_s: Annotated[
        PositiveSeconds,
        _help("Give up when the Ray cluster cannot place the --workers actors within this long, s."),
    ] = 60.0
    stall_timeout_s: Annotated[
        PositiveSeconds | None,
        _help(
            "Stop the run (exit 3) when requests are in flight and none has received a byte of its answer, nor "
            "ended, for this long (off: never).",
            flag="--stall-timeout",
            none="off",
            metavar="SECONDS|off",
        ),
    ] = 900.0
    """The run's stall watchdog (agentx.replayer.schedule.runner); 900 s is the harness's bound on a dead
    connection (its `agentx` scenario's `HTTP.TCP_USER_TIMEOUT`), longer than any healthy gap between two bytes of an
    answer."""
    run_id: str | None = None
    """The run's id (default: a fresh UUID); the workers of one `--workers` run share theirs."""
    node: str = ""
    """What this shard's records say in `node` (its Ray node id); "" : this host's name."""
    shard: tuple[Annotated[int, Meta(ge=0)], Annotated[int, Meta(ge=1)]] = (0, 1)
    """(index, count): this process runs lanes index, index+count, ... and the trees at positions ≡ index
    (mod count) of the shared session order (`--workers`; (0, 1) is the whole run)."""
    quiet_gc: bool = False
    """Take the garbage collector's timing from the run: freeze what exists at the start, collect on the run's own
    clock in gaps between due requests, restore at the end. It changes process-wide state (and `gc.unfreeze()`
    also unfreezes what the host had frozen), so it is off for library callers; the CLI turns it on
    (bench/replay_overhead.py measures what it buys)."""
    fast_thread_switch: bool = False
    """While large bodies are built on worker threads, shorten the interpreter's thread switch interval
    (`sys.setswitchinterval`, process-wide; restored after). Off for library callers; the CLI turns it on."""

    def __post_init__(self) -> None:
        if self.ray is not None and not self.ray.strip():
            raise ConfigError("ray must be a cluster address, auto or local")
        index, count = self.shard
        if not 0 <= index < count:
            raise ConfigError(f"shard must be (index, count) with 0 <= index < count, got {self.shard}")


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    """One immutable options object for a run, composed of its parts."""

    server: Server
    out_dir: Path
    """Where records.arrow (and run.json) are written."""
    overwrite: bool = False
    """Replace a run already in `out_dir`; without it, a folder holding records.arrow is refused (RunExists)."""
    load: Load = AgentxLoad()
    scenario: Scenario = Scenario()
    connection: Connection = Connection()
    speculative: Speculative = Speculative()
    runtime: Runtime = Runtime()

    def __repr__(self) -> str:
        return secret_free_repr(self)


class DecodeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What `decode` measures, and against which server (the parts are `ReplayOptions`' own)."""

    server: Server
    connection: Connection = Connection()
    speculative: Speculative = Speculative()
    """The forced acceptance, checked against the realized one."""
    isl_tokens: Annotated[int, Meta(ge=1), _help("Prompt tokens.", flag="--isl")] = 1
    osl_tokens: Annotated[int, Meta(ge=2), _help("Output tokens, forced.", flag="--osl")] = 1000
    concurrency: Annotated[int, Meta(ge=1), _help("Users at once.")] = 1
    """Users decoding at once (one wave of this many requests per repetition)."""
    repetitions: Annotated[int, Meta(ge=1), _help("Waves of requests.")] = 5
    seed: Annotated[int, Meta(ge=0), _help("Seed of the prompts.")] = 0

    def __repr__(self) -> str:
        return secret_free_repr(self)  # the API key, header values and a URL's password never show


_Options = TypeVar("_Options", bound=msgspec.Struct)


def checked(options: _Options) -> _Options:
    """`options` with every constraint applied (field ranges and choices, then each part's `__post_init__`);
    a ConfigError (a ValueError) naming the field (`$.load.concurrency`) otherwise. A struct built in Python skips
    the ranges, so a run checks its options once, here."""
    try:
        return msgspec.convert(msgspec.to_builtins(options, enc_hook=str), type(options), dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc)) from None


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(f"cannot convert to {kind}")


def flat_options(options: msgspec.Struct) -> dict[str, Any]:
    """`options` (a `ReplayOptions` or another struct of parts) as one flat JSON-ready mapping without credentials:
    the layout of run.json's `options` and of the records' metadata from before the parts existed (`mode`,
    `concurrency`, `spec_al`, ...). Each part's fields keep their names; `Speculative`'s take a `spec_` prefix."""
    flat: dict[str, Any] = {}
    for name, value in msgspec.structs.asdict(options).items():
        if isinstance(value, Speculative):
            for field, setting in msgspec.structs.asdict(value).items():
                flat[field if field == "stream_interval" else f"spec_{field}"] = setting
        elif isinstance(value, msgspec.Struct):
            flat.update(msgspec.to_builtins(value, enc_hook=str))  # a load adds its `mode` tag
        else:
            flat[name] = value
    flat.pop("api_key", None)
    result: dict[str, Any] = redact(msgspec.to_builtins(flat, enc_hook=str))
    return result
