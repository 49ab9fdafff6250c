"""The simulator's options and their command-line flags, one table for both directions.

`agentx sim` builds its click options from the table (`click_options`) and turns the parsed values into
`SimOptions` (`options_from_flags`); `SimServer` turns `SimOptions` back into flags (`cli_args`), so a
harness and a human start exactly the same server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

import click
import msgspec

from agentx.errors import ConfigError
from agentx.sim.engine.config import EngineConfig
from agentx.sim.engine.speculative import acceptance_schedule, validate_acceptance_rates
from agentx.sim.faults import FaultConfig
from agentx.sim.power import PowerModel
from agentx.sim.tokenizer import MIN_VOCAB_SIZE


class SimOptions(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port."""
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    faults: FaultConfig = msgspec.field(default_factory=FaultConfig)
    power: PowerModel = msgspec.field(default_factory=PowerModel)
    """The GPUs' power served at `/dcgm/metrics` (agentx.sim.power)."""
    access_log: bool = False
    tls_cert: str | None = None
    """Serve https with this PEM certificate (chain); with `tls_key`."""
    tls_key: str | None = None
    """The PEM private key of `tls_cert`."""
    api_key: str | None = None
    """Answer 401 to any request but `GET /health` that lacks `Authorization: Bearer <api_key>` (`/metrics`
    included, as behind an authenticating gateway; vLLM's own `--api-key` guards only `/v1`)."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("serving https needs both a certificate and its key (--tls-cert and --tls-key)")

    def __repr__(self) -> str:
        shown = msgspec.structs.replace(self, api_key="<redacted>") if self.api_key else self
        fields = ", ".join(f"{name}={getattr(shown, name)!r}" for name in self.__struct_fields__)
        return f"SimOptions({fields})"


class _Flag(NamedTuple):
    name: str
    section: Literal["engine", "faults", "power"]
    field: str
    type: click.ParamType[Any, Any]
    """`click.BOOL` makes an on/off flag that takes no value (its field defaults to off)."""
    help: str


_RATE = click.FloatRange(0.0, 1.0)
_SECONDS = click.FloatRange(min=0.0)
_COUNT = click.IntRange(min=0)
_FLAGS = (
    _Flag("--model", "engine", "model_name", click.STRING, "Served model name; requests must name it."),
    _Flag("--block-size", "engine", "block_size", click.IntRange(min=1), "KV-cache block size, tokens."),
    _Flag("--num-gpu-blocks", "engine", "num_gpu_blocks", click.IntRange(min=1), "KV-cache capacity, blocks."),
    _Flag("--max-model-len", "engine", "max_model_len", click.IntRange(min=2), "Context length, tokens."),
    _Flag("--max-num-seqs", "engine", "max_num_seqs", click.IntRange(min=1), "Most sequences running at once."),
    _Flag(
        "--max-num-batched-tokens", "engine", "max_num_batched_tokens", click.IntRange(min=1), "Token budget of a step."
    ),
    _Flag("--step-overhead-s", "engine", "step_overhead_s", _SECONDS, "Step time: fixed cost of a step."),
    _Flag("--prefill-s-per-token", "engine", "prefill_s_per_token", _SECONDS, "Step time: per prefill token."),
    _Flag("--decode-s-per-token", "engine", "decode_s_per_token", _SECONDS, "Step time: per verified decode token."),
    _Flag("--attention-s-per-kv-token", "engine", "attention_s_per_kv_token", _SECONDS, "Step time: per KV token."),
    _Flag("--spec-k", "engine", "spec_k", _COUNT, "Draft tokens per step (0: no speculative decoding)."),
    _Flag("--stream-interval", "engine", "stream_interval", click.IntRange(min=1), "Steps between a stream's chunks."),
    _Flag("--eos-probability", "engine", "eos_probability", _RATE, "Chance a token is EOS (past min_tokens)."),
    _Flag("--vocab-size", "engine", "vocab_size", click.IntRange(min=MIN_VOCAB_SIZE), "Tokenizer vocabulary size."),
    _Flag("--seed", "engine", "seed", click.INT, "Seed of the engine and of the fault draws."),
    _Flag("--time-scale", "engine", "time_scale", _SECONDS, "Wall s per simulated s (0: no clock)."),
    _Flag("--gpus", "power", "gpus", click.IntRange(min=1), "GPUs whose power /dcgm/metrics serves."),
    _Flag("--power-idle-w", "power", "idle_w", _SECONDS, "Watts each GPU draws, idle or not."),
    _Flag("--power-per-token-j", "power", "per_token_j", _SECONDS, "Joules per token processed, all GPUs together."),
    _Flag("--fault-500-rate", "faults", "error_500_rate", _RATE, "Fraction of requests answered 500."),
    _Flag("--fault-429-rate", "faults", "error_429_rate", _RATE, "Fraction of requests answered 429."),
    _Flag("--fault-retry-after-s", "faults", "retry_after_s", _COUNT, "Retry-After of the injected 429s."),
    _Flag("--fault-503-rate", "faults", "error_503_rate", _RATE, "Fraction of requests answered 503."),
    _Flag("--fault-reset-rate", "faults", "reset_rate", _RATE, "Fraction of streams reset (TCP RST) mid-stream."),
    _Flag("--fault-reset-after-chunks", "faults", "reset_after_chunks", _COUNT, "Chunks sent before the reset."),
    _Flag("--fault-stall-rate", "faults", "stall_rate", _RATE, "Fraction of streams that stall mid-stream."),
    _Flag("--fault-stall-s", "faults", "stall_s", _SECONDS, "Length of a stall, wall seconds."),
    _Flag("--fault-stall-after-chunks", "faults", "stall_after_chunks", _COUNT, "Chunks sent before the stall."),
    _Flag("--fault-malformed-rate", "faults", "malformed_rate", _RATE, "Fraction of streams with a malformed event."),
    _Flag("--fault-malformed-after-chunks", "faults", "malformed_after_chunks", _COUNT, "Chunks before the bad event."),
    _Flag("--fault-slow-first-byte-rate", "faults", "slow_first_byte_rate", _RATE, "Fraction with delayed headers."),
    _Flag("--fault-slow-first-byte-s", "faults", "slow_first_byte_s", _SECONDS, "Delay before headers, wall s."),
    _Flag("--fault-bundle-rate", "faults", "bundle_rate", _RATE, "Fraction of streams whose chunks come in one write."),
    _Flag(
        "--fault-early-first-token-rate",
        "faults",
        "early_first_token_rate",
        _RATE,
        "Fraction of streams whose first token comes before the prefill.",
    ),
    _Flag(
        "--fault-output-scale",
        "faults",
        "output_scale",
        click.FloatRange(min=0.0, min_open=True),
        "Generate this many times each request's max_tokens (a server ignoring the cap).",
    ),
    _Flag(
        "--fault-prompt-tokens-scale",
        "faults",
        "prompt_tokens_scale",
        click.FloatRange(min=0.0, min_open=True),
        "Report usage.prompt_tokens as this many times the prompt's tokens.",
    ),
    _Flag(
        "--fault-drop-cached-tokens",
        "faults",
        "drop_cached_tokens",
        click.BOOL,
        "Leave prompt_tokens_details (cached_tokens) out of usage.",
    ),
)
_ACCEPTANCE_LENGTH = "--synthetic-acceptance-length"
_ACCEPTANCE_RATES = "--synthetic-acceptance-rates"

F = TypeVar("F", bound=Callable[..., Any])


def _param(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _defaults() -> dict[str, msgspec.Struct]:
    return {"engine": EngineConfig(), "faults": FaultConfig(), "power": PowerModel()}


def click_options(command: F) -> F:
    """Decorate a click command with every engine and fault flag (defaults from the config classes)."""
    defaults = _defaults()
    decorators = [
        click.option(flag.name, is_flag=True, help=flag.help)
        if flag.type is click.BOOL
        else click.option(
            flag.name,
            type=flag.type,
            default=getattr(defaults[flag.section], flag.field),
            show_default=True,
            help=flag.help,
        )
        for flag in _FLAGS
    ]
    decorators.append(
        click.option(
            _ACCEPTANCE_LENGTH,
            type=click.FloatRange(min=1.0),
            metavar="L",
            help="Mean acceptance length (bonus token included) to realize; exclusive with the rates.",
        )
    )
    decorators.append(
        click.option(
            _ACCEPTANCE_RATES,
            metavar="R1,...,RK",
            help="Per-position conditional acceptance rates, non-increasing, one per draft position.",
        )
    )
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def options_from_flags(
    values: dict[str, Any],
    *,
    host: str,
    port: int,
    access_log: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    api_key: str | None = None,
) -> SimOptions:
    """SimOptions from `click_options`' parsed values; ValueError (with the flag's name) when they conflict."""
    sections: dict[str, dict[str, Any]] = {"engine": {}, "faults": {}, "power": {}}
    for flag in _FLAGS:
        sections[flag.section][flag.field] = values[_param(flag.name)]
    engine_fields, fault_fields = sections["engine"], sections["faults"]
    spec_k: int = engine_fields["spec_k"]
    length: float | None = values.get(_param(_ACCEPTANCE_LENGTH))
    rates_text: str | None = values.get(_param(_ACCEPTANCE_RATES))
    if length is not None and rates_text is not None:
        raise ConfigError(f"{_ACCEPTANCE_LENGTH} and {_ACCEPTANCE_RATES} are mutually exclusive")
    if length is not None:
        engine_fields["acceptance_rates"] = _call_for_flag(_ACCEPTANCE_LENGTH, acceptance_schedule, length, spec_k)
    elif rates_text is not None:
        try:
            rates = [float(item) for item in rates_text.split(",")]
        except ValueError:
            raise ConfigError(f"{_ACCEPTANCE_RATES}: expected comma-separated numbers, got {rates_text!r}") from None
        engine_fields["acceptance_rates"] = _call_for_flag(_ACCEPTANCE_RATES, validate_acceptance_rates, rates, spec_k)
    elif spec_k > 0:
        raise ConfigError(f"--spec-k {spec_k} needs {_ACCEPTANCE_LENGTH} or {_ACCEPTANCE_RATES}")
    try:
        faults = FaultConfig(**fault_fields)
    except ValueError as exc:
        raise ConfigError(f"fault flags: {exc}") from None
    return SimOptions(
        host=host,
        port=port,
        engine=EngineConfig(**engine_fields),
        faults=faults,
        power=PowerModel(**sections["power"]),
        access_log=access_log,
        tls_cert=tls_cert,
        tls_key=tls_key,
        api_key=api_key,
    )


def _call_for_flag(flag: str, function: Callable[[Any, int], tuple[float, ...]], value: Any, spec_k: int) -> Any:
    try:
        return function(value, spec_k)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def cli_args(options: SimOptions, *, acceptance_length: float | None = None) -> list[str]:
    """The `agentx sim` flags that reproduce `options` (only those that differ from the defaults), but for the API
    key: a command line is no place for a secret (`SimServer` hands it over in the environment)."""
    args = ["--host", options.host, "--port", str(options.port)]
    defaults = _defaults()
    for flag in _FLAGS:
        section = getattr(options, flag.section)
        value = getattr(section, flag.field)
        if value == getattr(defaults[flag.section], flag.field):
            continue
        if flag.type is click.BOOL:
            args.append(flag.name)
        else:
            args += [flag.name, repr(value) if isinstance(value, float) else str(value)]
    if acceptance_length is not None:
        args += [_ACCEPTANCE_LENGTH, repr(acceptance_length)]
    elif options.engine.acceptance_rates:
        args += [_ACCEPTANCE_RATES, ",".join(repr(rate) for rate in options.engine.acceptance_rates)]
    if options.access_log:
        args.append("--access-log")
    if options.tls_cert is not None and options.tls_key is not None:
        args += ["--tls-cert", options.tls_cert, "--tls-key", options.tls_key]
    return args
