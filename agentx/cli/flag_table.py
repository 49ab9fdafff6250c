"""The command line's flags of the option structs' fields, keyed by field path (`Scenario.duration_s`): each flag's
one-line help, its name when not `--field-name` (a unit suffix `_s` dropped), metavar, `--help` section and parsing
hints. The library's structs keep the types, constraints and one docstring per field; agentx.cli.flags turns this
table into the click options of `replay`, `sweep` and `decode`, so they cannot drift."""

from __future__ import annotations

from typing import Final

import msgspec


class Flag(msgspec.Struct, frozen=True):
    """How one field is a flag."""

    help: str
    """The one-line `--help` text."""
    flag: str | None = None
    """The flag's name when not derived from the field's (`--duration` for `duration_s`)."""
    alias: str | None = None
    """A second name the flag answers to."""
    metavar: str | None = None
    group: str | None = None
    """The `--help` section (agentx.cli.flags.HELP_GROUPS) when not its part's."""
    late: bool = False
    """Listed after the section's other options (less used than the options a command adds after the derived ones)."""
    bare: str | None = None
    """The value of the flag given alone (`--ray` for `--ray auto`)."""
    none: str | None = None
    """The word that means None (`--idle-timeout off`)."""
    repeat: bool = False
    """The flag may be given more than once."""


FLAGS: Final[dict[str, Flag]] = {
    # Scenario
    "Scenario.duration_s": Flag(
        "Run this long. With no --duration, --sessions or --num-requests, a run ends after one pass of the trace "
        "(the run says its end as it starts).",
        flag="--duration",
        metavar="SECONDS",
    ),
    "Scenario.sessions": Flag("Stop after this many session trees."),
    "Scenario.num_requests": Flag(
        "Stop after sending this many profiling requests (warmup not counted); those in flight finish.", metavar="N"
    ),
    "Scenario.session_order": Flag("The order lanes draw sessions in."),
    "Scenario.seed": Flag("Seed of session order and prompt content."),
    "Scenario.delay_scale": Flag("Multiply every recorded delay (0: none)."),
    "Scenario.child_offset": Flag(
        "A subagent's first turn: at its recorded offset within its branch, or the recorded gap after the parent "
        "turn before its spawn.",
        group="Trace",
    ),
    "Scenario.max_context_length": Flag(
        "Drop sessions whose peak in+out exceeds this, whole.", metavar="TOKENS", group="Trace"
    ),
    "Scenario.max_output_tokens": Flag(
        "Cap the output of the root's turns (subagent turns are never capped).", metavar="TOKENS", group="Prompts"
    ),
    "Scenario.chain_rules": Flag(
        "A flattened-agent detection threshold (a ChainRules field), e.g. aux_isl_floor=8192.",
        flag="--chain-rule",
        metavar="NAME=VALUE",
        group="Trace",
        repeat=True,
    ),
    "Scenario.split_flattened_agents": Flag(
        "Split agents recorded flattened into their parent's requests into agents of their own.", group="Trace"
    ),
    "Scenario.context_overflow_substrings": Flag(
        "An error answer whose text holds this is a context overflow (repeatable; replaces the defaults).",
        flag="--context-overflow-substring",
        metavar="TEXT",
        group="AgentX scenario",
    ),
    "Scenario.token_low": Flag("Completions prompts: the lowest token id drawn (inclusive).", group="Prompts"),
    "Scenario.token_high": Flag("Completions prompts: the highest token id drawn (exclusive).", group="Prompts"),
    "Scenario.system_idle_cap_s": Flag(
        "When nothing is in flight, pull every pending timer in to at most this long (AgentX: 10).",
        metavar="SECONDS|off",
        group="AgentX scenario",
        none="off",
    ),
    "Scenario.tree_idle_cap_s": Flag(
        "The same per session tree (InferenceX: 300; under the AIPerf 0.13.0 rules it also caps warmup leads).",
        metavar="SECONDS|off",
        group="AgentX scenario",
        none="off",
    ),
    "Scenario.tree_idle_cap_mode": Flag(
        "runtime: act on the live schedule when a tree goes idle in profiling (agentx-harness); warp: cut each "
        "tree's recorded idle gaps before the run (AIPerf 0.13.0). Default: the rule set's.",
        metavar="runtime|warp",
        group="AgentX scenario",
        none="rules",
    ),
    "Scenario.failed_request_threshold": Flag(
        "Cancel the run once this fraction of profiling requests failed (InferenceX: 0.10).",
        metavar="FRACTION|off",
        group="AgentX scenario",
        none="off",
    ),
    "Scenario.rules": Flag(
        "The AgentX rules played: agentx-harness-1.0.12 (InferenceX's harness today) or aiperf-0.13.0 (older); in "
        "--mode agentx, flags left unset take that scenario's defaults.",
        group="AgentX scenario",
    ),
    "Scenario.slo": Flag(
        "A per-request objective METRIC=VALUE with a unit, s or ms (repeatable): ttft, tpot or e2el, e.g. ttft=2s, "
        "tpot=50ms; the summary's goodput counts the requests meeting every one.",
        flag="--slo",
        metavar="METRIC=VALUE",
        group="Output",
        late=True,
        repeat=True,
    ),
    "Scenario.percentiles": Flag(
        "Percentiles the summary shows for every latency (vllm bench's --metric-percentiles), e.g. 50,90,99,99.9.",
        metavar="P,P,...",
        group="Output",
        late=True,
    ),
    # Speculative
    "Speculative.al": Flag(
        "The acceptance length the server is forced to (tokens per step, bonus included, in [1, K+1]); checked "
        "against the realized one.",
        flag="--spec-al",
        metavar="AL",
    ),
    "Speculative.k": Flag("Draft tokens per step the server runs with.", flag="--spec-k", metavar="K"),
    "Speculative.al_tolerance": Flag("Largest |realized − forced| AL accepted (absolute).", flag="--spec-tolerance"),
    "Speculative.stream_interval": Flag(
        "Decode steps the server merges into one streamed chunk (its --stream-interval)."
    ),
    # Runtime
    "Runtime.grace_s": Flag("In-flight allowance after the end, s.", flag="--grace"),
    "Runtime.metrics_interval_s": Flag(
        "Scrape the server's /metrics every S seconds into server_metrics.arrow (off: never).",
        flag="--metrics-interval",
        metavar="S|off",
        none="off",
    ),
    "Runtime.gpu_metrics_url": Flag(
        "Scrape the GPUs' power from this Prometheus endpoint (a DCGM exporter's http://HOST:9400/metrics) every "
        "--metrics-interval (not off) into gpu_metrics.arrow, for energy per token and per task "
        "(docs/results.md: Energy).",
        flag="--gpu-metrics",
        metavar="URL",
    ),
    "Runtime.gpu_power_metric": Flag("The GPU power gauge's name (watts, one series per GPU).", metavar="NAME"),
    "Runtime.gpu_energy_metric": Flag(
        'The GPU energy counter\'s name (millijoules; joules when it ends in _joules or _joules_total); "": none, '
        "the power is integrated.",
        metavar="NAME",
    ),
    "Runtime.workers": Flag(
        "Shard the run over this many processes, or Ray actors with --ray (when one core or host falls short)."
    ),
    "Runtime.ray": Flag(
        "Run the --workers shards as actors on a Ray cluster: its address, auto (the cluster `ray start` made here "
        "or RAY_ADDRESS) or local (a private one on this host); --ray alone is auto (docs/distributed.md).",
        metavar="ADDRESS|auto|local",
        bare="auto",
    ),
    "Runtime.on_worker_loss": Flag(
        "When a Ray worker or its node dies: stop the run (its load changed), or go on with the others."
    ),
    "Runtime.ray_placement_timeout_s": Flag(
        "Give up when the Ray cluster cannot place the --workers actors within this long, s."
    ),
    "Runtime.stall_timeout_s": Flag(
        "Stop the run (exit 3) when requests are in flight and none has received a byte of its answer, nor ended, "
        "for this long (off: never).",
        flag="--stall-timeout",
        metavar="SECONDS|off",
        none="off",
    ),
    "Runtime.on_server_loss": Flag(
        "When the server stops answering (--server-loss-failures refusals or resets before any byte, in a row, over "
        "at least --server-loss-window): stop the run as Ctrl-C does and exit 3, or go on against it."
    ),
    "Runtime.server_loss_failures": Flag(
        "Requests (or probes) refused or reset before their first byte, in a row, that lose the server."
    ),
    "Runtime.server_loss_window_s": Flag(
        "Least time, s, from the first of those failures to the server's loss; an answer within it resets the count."
    ),
    # DecodeOptions
    "DecodeOptions.isl_tokens": Flag("Prompt tokens.", flag="--isl"),
    "DecodeOptions.osl_tokens": Flag("Output tokens, forced.", flag="--osl"),
    "DecodeOptions.concurrency": Flag("Users at once."),
    "DecodeOptions.repetitions": Flag("Waves of requests."),
    "DecodeOptions.seed": Flag("Seed of the prompts."),
    # AgentxLoad
    "AgentxLoad.concurrency": Flag("Lanes (session trees)."),
    "AgentxLoad.ramp_s": Flag("Spread the lanes' first trees over this many seconds."),
    "AgentxLoad.tstar_window": Flag(
        "agentx: where in each session's span a lane's t* falls.", metavar="LOW,HIGH", group="AgentX scenario"
    ),
    "AgentxLoad.warmup": Flag("agentx: primer timing.", group="AgentX scenario"),
    "AgentxLoad.warmup_requests_per_lane": Flag(
        "agentx: cache-pressure requests per lane after the primers (InferenceX: 10).", group="AgentX scenario"
    ),
    "AgentxLoad.warmup_max_tokens": Flag(
        "agentx: output tokens of a warmup primer.", metavar="N|recorded", group="AgentX scenario", none="recorded"
    ),
    "AgentxLoad.cache_bust": Flag(
        "agentx: a per-tree marker in every prompt, or as cache_salt, or none.", group="AgentX scenario"
    ),
    # ClosedLoad
    "ClosedLoad.concurrency": Flag("Lanes (session trees)."),
    "ClosedLoad.ramp_s": Flag("Spread the lanes' first trees over this many seconds."),
    # TraceLoad
    "TraceLoad.speedup": Flag("trace: time ÷."),
    # RateLoad
    "RateLoad.rate": Flag("rate: session arrivals per second."),
    "RateLoad.burstiness": Flag("rate: gamma shape of the gaps (1: Poisson)."),
    # Server
    "Server.url": Flag("Server base URL (host:port means http://host:port).", metavar="URL"),
    "Server.model": Flag("Served model."),
    "Server.api": Flag("completions: token-id prompts (exact); chat: messages of calibrated text.", group="Prompts"),
    "Server.api_key": Flag(
        "The key sent as Authorization: Bearer KEY (default: from --api-key-env). Other users may see a command "
        "line; the environment variable is safer.",
        metavar="KEY",
    ),
    "Server.headers": Flag(
        "Extra request header NAME:VALUE (repeatable).", flag="--header", metavar="NAME:VALUE", repeat=True
    ),
    "Server.extra_body": Flag("JSON object merged into every request body.", metavar="JSON"),
    "Server.stream_usage": Flag("Usage to ask for in stream_options (auto: probe the server)."),
    "Server.tokenizer": Flag(
        "With --api chat: a local tokenizer.json to calibrate with instead of the server's /tokenize.",
        metavar="PATH",
        group="Prompts",
    ),
    "Server.affinity_headers": Flag(
        "Also send the play's correlation id in this header (repeatable), for router affinity.",
        flag="--affinity-header",
    ),
    # Connection
    "Connection.idle_timeout_s": Flag(
        "A request that receives no byte for S seconds fails as a timeout (kind: idle).", metavar="S|off", none="off"
    ),
    "Connection.request_timeout_s": Flag(
        "A request still running after S seconds fails as a timeout (kind: request).",
        flag="--request-timeout",
        alias="--request-timeout-seconds",
        metavar="S|off",
        none="off",
    ),
    "Connection.tls_verify": Flag("Check an https server's certificate and host name (off: encrypted, but unchecked)."),
    "Connection.ca_bundle": Flag(
        "A PEM file of CA certificates to trust instead of the system's (a private CA, a self-signed server).",
        metavar="PATH",
    ),
    "Connection.proxy": Flag(
        "Reach the server through this http:// proxy (an https:// server by CONNECT). Default: the environment's "
        "https_proxy, http_proxy, all_proxy and no_proxy, as curl reads them; never for a loopback server.",
        metavar="URL",
    ),
}
"""Every field that is a flag, by `Struct.field`."""
