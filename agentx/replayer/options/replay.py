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
`checked(options)` applies both, once, at the start of a run. Each field has one docstring; the command line's flags
for the fields (their help lines, names and sections) are agentx.cli.flag_table's, so the library carries no CLI.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from agentx.errors import ConfigError
from agentx.replayer.http.exchange import CONTEXT_OVERFLOW_SUBSTRINGS
from agentx.replayer.options.fields import Fraction, PositiveSeconds, Seconds
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

    duration_s: PositiveSeconds | None = None
    """Stop starting new requests after this long; None: until `sessions` trees are done."""
    sessions: Annotated[int, Meta(ge=1)] | None = None
    """Stop after this many session trees have been started (None with no duration and no request cap: one
    pass)."""
    num_requests: Annotated[int, Meta(ge=1)] | None = None
    """A cap on the requests sent in the profiling phase, failed ones included (the AgentX warmup's primers and
    cache-pressure requests are not counted): once the N-th is sent, no new request or tree starts, the requests in
    flight finish (the grace period does not cut them; their timeouts still apply) and the run ends
    (`RunResult.request_cap_reached`). Without `sessions` or `duration_s`, trees recycle until the cap. vLLM
    bench's --num-prompts, AIPerf's --request-count."""
    session_order: SessionOrder = "sequential"
    """The order lanes draw sessions in."""
    seed: Annotated[int, Meta(ge=0)] = 0
    """Seed of session order and prompt content."""
    delay_scale: Seconds = 1.0
    """Multiplies every planned delay (think times, subagent offsets): 1.0 replays the recorded timing, 0.01 runs
    a trace's idle gaps 100x faster, 0 sends each request as soon as its dependencies complete."""
    child_offset: Literal["branch_start", "anchor_end"] = "branch_start"
    """docs/replay.md, "The plan of a session"."""
    max_context_length: Annotated[int, Meta(ge=1)] | None = None
    """Sessions whose peak `in + out` (any agent, output uncapped) exceeds this are dropped before the run."""
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    """Cap the output of the root's turns (subagent turns are never capped)."""
    chain_rules: ChainRules = DEFAULT_RULES
    """The thresholds that find agents recorded flattened into their parent (docs/agentx.md §3b)."""
    split_flattened_agents: bool = True
    """Split agents recorded flattened into their parent's requests into agents of their own."""
    context_overflow_substrings: tuple[str, ...] = CONTEXT_OVERFLOW_SUBSTRINGS
    """An error answer whose text holds one of these is a context overflow."""
    token_low: Annotated[int, Meta(ge=0)] = 1000
    """Completions prompts: the lowest token id drawn (inclusive)."""
    token_high: Annotated[int, Meta(ge=1)] = 30000
    """Token ids of synthetic prompts are drawn from [token_low, token_high), inside every common vocabulary."""
    system_idle_cap_s: Seconds | None = 10.0
    """When nothing is in flight, pull every pending timer in to at most this long (AgentX: 10); None: off."""
    tree_idle_cap_s: Seconds | None = None
    """The same per session tree (InferenceX: 300; under the AIPerf 0.13.0 rules it also caps warmup leads); None:
    off."""
    tree_idle_cap_mode: Literal["runtime", "warp"] | None = None
    """None: the rule set's (`RuleSet.tree_idle_cap_mode`); `tree_cap_mode` says which applies."""
    failed_request_threshold: Fraction | None = None
    """Cancel the run once this fraction of profiling requests failed (InferenceX: 0.10)."""

    rules: RulesName = DEFAULT_RULES_NAME
    """The reference whose rules the replay follows (agentx.replayer.options.rules); run.json and the exports name
    it."""

    slo: Slos = Slos()
    """The targets each record is judged against as it is made (`RequestRecord.slo_met`,
    agentx.replayer.options.slo)."""
    percentiles: Annotated[tuple[Annotated[float, Meta(ge=0, le=100)], ...], Meta(min_length=1)] = (
        50.0,
        90.0,
        95.0,
        99.0,
    )
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

    al: float | None = None
    """The acceptance length the server is forced to (tokens per step, bonus included, in [1, K+1]); checked against
    the realized one."""
    k: Annotated[int, Meta(ge=1)] | None = None
    """Draft tokens per step the server runs with."""
    al_tolerance: Annotated[float, Meta(gt=0)] = 0.05
    """Largest |realized − forced| AL accepted (absolute)."""
    stream_interval: Annotated[int, Meta(ge=1)] = 1
    """Decode steps the server merges into one streamed chunk (its --stream-interval)."""

    def __post_init__(self) -> None:
        al, k = self.al, self.k
        if al is not None:
            high = math.inf if k is None else k + 1
            if not (math.isfinite(al) and 1.0 <= al <= high):
                bound = f"[1, K+1] = [1, {k + 1}] for K={k}" if k is not None else "at least 1"
                raise ConfigError(f"the acceptance length (bonus token included) must be {bound}, got {al}")


class Runtime(msgspec.Struct, frozen=True, kw_only=True):
    """How this process runs the replay."""

    grace_s: Seconds = 30.0
    """After the deadline, in-flight requests may finish within this; then they are cancelled."""
    metrics_interval_s: Annotated[float, Meta(ge=0.1)] | None = 1.0
    """Server telemetry over the run (agentx.replayer.telemetry.scrape); None: not scraped."""
    gpu_metrics_url: str | None = None
    """A Prometheus endpoint of the GPUs' power, a DCGM exporter's `http://host:9400/metrics` (no path:
    `/metrics`), scraped every `metrics_interval_s` (which must be on) into gpu_metrics.arrow
    (agentx.replayer.telemetry.gpu); a `user:password@` in it is sent as basic auth and never kept. None: not
    scraped."""
    gpu_power_metric: str = "DCGM_FI_DEV_POWER_USAGE"
    """The gauge of a GPU's board power, in watts, one series per GPU."""
    gpu_energy_metric: str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    """The counter of a GPU's energy since boot, in millijoules (DCGM's unit; joules when the name ends in
    `_joules` or `_joules_total`); "": none, the power is integrated instead."""
    workers: Annotated[int, Meta(ge=1)] = 1
    """Shards of the run, each with its own event loop: processes on this host (agentx.replayer.workers), or with
    `ray` actors on a Ray cluster (agentx.replayer.cluster); the union of the shards is the one-process plan."""
    ray: str | None = None
    """Run the `workers` shards as actors on a Ray cluster: its address, "auto" (the cluster `ray start` made here
    or RAY_ADDRESS) or "local" (a private one on this host); None: processes of this host (docs/distributed.md)."""
    on_worker_loss: Literal["abort", "continue"] = "abort"
    """When a Ray worker or its node dies: stop the run (its load changed), or go on with the others."""
    ray_placement_timeout_s: PositiveSeconds = 60.0
    """Give up when the Ray cluster cannot place the `workers` actors within this long."""
    stall_timeout_s: PositiveSeconds | None = 900.0
    """The run's stall watchdog (agentx.replayer.schedule.runner); 900 s is the harness's bound on a dead
    connection (its `agentx` scenario's `HTTP.TCP_USER_TIMEOUT`), longer than any healthy gap between two bytes of an
    answer."""
    on_server_loss: Literal["stop", "continue"] = "stop"
    """When the server stops answering (agentx.replayer.schedule.server_loss): stop the run as an interrupt does
    (grace, records, run.json), or go on against it (its requests then fail with connection errors)."""
    server_loss_failures: Annotated[int, Meta(ge=1)] = 5
    """Requests (or the watch's own probes) refused or reset before their first byte, in a row, that lose the
    server, if they also span `server_loss_window_s`."""
    server_loss_window_s: PositiveSeconds = 10.0
    """How long the server must go unanswering before it is lost: longer than a restart the run should ride out."""
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
    """While large sessions are planned on a worker thread, shorten the interpreter's thread switch interval
    (`sys.setswitchinterval`, process-wide; restored after). Off for library callers; the CLI turns it on."""

    def __post_init__(self) -> None:
        if self.ray is not None and not self.ray.strip():
            raise ConfigError("ray must be a cluster address, auto or local")
        index, count = self.shard
        if not 0 <= index < count:
            raise ConfigError(f"shard must be (index, count) with 0 <= index < count, got {self.shard}")
        if self.gpu_metrics_url is not None:
            if self.metrics_interval_s is None:
                raise ConfigError(
                    "the GPUs' power (--gpu-metrics) is scraped every metrics interval, and --metrics-interval is off: "
                    "give it an interval, or leave --gpu-metrics out"
                )
            from agentx.replayer.options.gpu_url import gpu_endpoint  # urllib: not for `agentx --help`

            gpu_endpoint(self.gpu_metrics_url)


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
    isl_tokens: Annotated[int, Meta(ge=1)] = 1
    """Prompt tokens."""
    osl_tokens: Annotated[int, Meta(ge=2)] = 1000
    """Output tokens, forced."""
    concurrency: Annotated[int, Meta(ge=1)] = 1
    """Users decoding at once (one wave of this many requests per repetition)."""
    repetitions: Annotated[int, Meta(ge=1)] = 5
    """Waves of requests."""
    seed: Annotated[int, Meta(ge=0)] = 0
    """Seed of the prompts."""

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
