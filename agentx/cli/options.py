"""The options `replay`, `sweep` and `decode` share: the replay flags and forced speculative acceptance."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

if TYPE_CHECKING:
    from agentx.trace.chains import ChainRules


class Forced(msgspec.Struct, frozen=True):
    """A forced acceptance length and K from the command line (either may be absent)."""

    al: float | None = None
    k: int | None = None

    def sim_fields(self) -> dict[str, Any]:
        """SimServer keywords realizing it on the built-in simulator (nothing when no AL and K are forced)."""
        if self.al is None or self.k is None:
            return {}
        return {"spec_k": self.k, "acceptance_length": self.al}


def spec_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a forced speculative acceptance (agentx.spec), shared by `replay` and `decode`."""
    decorators = [
        click.option(
            "--spec-al",
            type=float,
            metavar="AL",
            help="The acceptance length the server is forced to (tokens per step, bonus included, in [1, K+1]); "
            "checked against the realized one.",
        ),
        click.option("--spec-k", type=int, metavar="K", help="Draft tokens per step the server runs with."),
        click.option(
            "--spec-golden",
            metavar="MODEL",
            help="Take --spec-al from MODEL's published golden curve at --spec-k (`agentx spec golden`).",
        ),
        click.option(
            "--spec-thinking/--no-spec-thinking", default=True, show_default=True, help="--spec-golden: which curve."
        ),
        click.option(
            "--spec-tolerance",
            type=click.FloatRange(min=0, min_open=True),
            default=0.05,
            show_default=True,
            help="Largest |realized − forced| AL accepted (absolute).",
        ),
        click.option(
            "--stream-interval",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Decode steps the server merges into one streamed chunk (its --stream-interval).",
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def forced_acceptance(al: float | None, k: int | None, golden_model: str | None, thinking: bool) -> Forced:
    """The forced AL and K from `--spec-al`/`--spec-k`/`--spec-golden`; click.BadParameter saying what is wrong."""
    from agentx.spec.golden import golden_al

    if golden_model is not None:
        if al is not None:
            raise click.BadParameter("pass --spec-al AL or --spec-golden MODEL, not both")
        if k is None:
            raise click.BadParameter("--spec-golden needs --spec-k K: a golden AL is published per K")
        try:
            al = golden_al(golden_model, k, thinking).acceptance_length
        except ValueError as exc:
            raise click.BadParameter(f"--spec-golden: {exc}") from None
    if k is not None and k < 1:
        raise click.BadParameter(f"--spec-k must be at least 1 (draft tokens per step), got {k}")
    why = "the acceptance length counts the bonus token, so a step emits between 1 and K+1 tokens"
    if al is not None and k is not None and not (math.isfinite(al) and 1.0 <= al <= k + 1):
        raise click.BadParameter(f"--spec-al {al} is outside [1, K+1] = [1, {k + 1}] for --spec-k {k}: {why}")
    if al is not None and not (math.isfinite(al) and al >= 1.0):
        raise click.BadParameter(f"--spec-al must be at least 1, got {al}: {why}")
    return Forced(al=al, k=k)


def parse_header(value: str) -> tuple[str, str]:
    """`--header NAME:VALUE` as a (name, value) pair; click.BadParameter unless it is a valid HTTP header."""
    from agentx.replayer.http1 import check_header

    name, sep, content = value.partition(":")
    if not sep or not name.strip():
        raise click.BadParameter(f"--header {value!r} is not NAME:VALUE")
    try:
        check_header(name.strip(), content.strip())
    except ValueError as exc:
        raise click.BadParameter(f"--header {value!r}: {exc}") from None
    return name.strip(), content.strip()


def parse_extra_body(text: str | None) -> dict[str, object] | None:
    """`--extra-body` as a JSON object; click.BadParameter naming the option when it is not one."""
    if not text:
        return None
    try:
        body = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise click.BadParameter(f"--extra-body is not valid JSON ({exc})") from None
    except RecursionError:
        raise click.BadParameter("--extra-body is nested too deeply to be a request body") from None
    if not isinstance(body, dict):
        raise click.BadParameter(f"--extra-body must be a JSON object, got {type(body).__name__}")
    return body


def api_key(env_name: str, headers: tuple[tuple[str, str], ...], *, say: bool = True) -> str | None:
    """The API key in `$env_name`, unless `--header Authorization:...` was given: that explicit header wins, and a
    key also set in the environment is said (`say`) to be unused."""
    from agentx.cli.common import stderr

    key = os.environ.get(env_name) or None
    if key is not None and any(name.lower() == "authorization" for name, _ in headers):
        if say:
            stderr.print(f"note: --header Authorization is sent; the key in ${env_name} is not used", markup=False)
        return None
    return key


def server_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--url`: a base URL (`host:port` taken as `http://host:port`); a trailing /v1 is dropped with a note, and
    an unusable URL is the one-paragraph error (credentials scrubbed), exit 2."""
    from agentx.cli.common import fail, stderr
    from agentx.replayer.secrets import scrub
    from agentx.replayer.url import BadURLError, base_url

    if value is None:
        return None
    try:
        url, note = base_url(value)
    except BadURLError as exc:
        fail(f"--url: {exc}")
    if note:
        stderr.print(f"note: --url {scrub(url)}: {note}", markup=False)
    return url


url_option = click.option(
    "--url",
    callback=server_url,
    metavar="URL",
    help="Server base URL (host:port means http://host:port); without it, the built-in simulator is started on a "
    "free port.",
)


request_timeout_option = click.option(
    "--request-timeout",
    "--request-timeout-seconds",
    "request_timeout",
    default="off",
    show_default=True,
    metavar="S|off",
    help="A request still running after S seconds fails as a timeout (kind: request).",
)
idle_timeout_option = click.option(
    "--idle-timeout",
    "idle_timeout",
    default="300",
    show_default=True,
    metavar="S|off",
    help="A request that receives no byte for S seconds fails as a timeout (kind: idle).",
)


def timeouts(request_timeout: str, idle_timeout: str) -> tuple[float | None, float | None]:
    """`--request-timeout` and `--idle-timeout` in seconds (None: off); click.BadParameter when not positive."""
    return (
        seconds_or_off("--request-timeout", request_timeout, positive=True),
        seconds_or_off("--idle-timeout", idle_timeout, positive=True),
    )


def replay_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a replay shared by `replay` and `sweep` (all but concurrency, output, GPUs and workers)."""
    decorators = [
        url_option,
        click.option(
            "--model",
            "served_models",
            multiple=True,
            help="Served model (default: the server's only one). Repeat it to map each session's i-th distinct "
            "recorded model, main model first, to the (i mod n)-th --model.",
        ),
        click.option(
            "--max-context-length",
            type=click.IntRange(min=1),
            metavar="TOKENS",
            help="Drop sessions whose peak in+out exceeds this, whole.",
        ),
        click.option(
            "--max-output-tokens",
            type=click.IntRange(min=1),
            metavar="TOKENS",
            help="Cap the output of the root's turns (subagent turns are never capped).",
        ),
        click.option(
            "--chain-rule",
            "chain_rules",
            multiple=True,
            metavar="NAME=VALUE",
            help="A flattened-agent detection threshold (agentx.trace.chains.ChainRules field), "
            "e.g. aux_isl_floor=8192.",
        ),
        click.option(
            "--context-overflow-substring",
            "overflow_substrings",
            multiple=True,
            metavar="TEXT",
            help="An error answer whose text holds this is a context overflow (repeatable; replaces the defaults).",
        ),
        click.option(
            "--split-flattened-agents/--no-split-flattened-agents",
            default=True,
            show_default=True,
            help=(
                "Split agents recorded flattened into their parent's requests into agents of their own "
                "(docs/agentx.md §3b)."
            ),
        ),
        click.option(
            "--duration",
            "duration_s",
            type=click.FloatRange(min=0, min_open=True),
            metavar="SECONDS",
            help="Run this long.",
        ),
        click.option("--sessions", type=click.IntRange(min=1), help="Stop after this many session trees."),
        click.option(
            "--grace", "grace_s", default=30.0, show_default=True, help="In-flight allowance after the end, s."
        ),
        request_timeout_option,
        idle_timeout_option,
        click.option(
            "--session-order",
            type=click.Choice(("sequential", "shuffle", "random")),
            default="sequential",
            show_default=True,
        ),
        click.option(
            "--seed",
            default=0,
            show_default=True,
            type=click.IntRange(min=0),
            help="Seed of session order and prompt content.",
        ),
        click.option("--delay-scale", default=1.0, show_default=True, help="Multiply every recorded delay (0: none)."),
        click.option(
            "--ramp",
            "ramp_s",
            default=0.0,
            show_default=True,
            type=click.FloatRange(min=0),
            metavar="SECONDS",
            help="Spread the lanes' first trees over this many seconds.",
        ),
        click.option(
            "--api",
            type=click.Choice(("completions", "chat")),
            default="completions",
            show_default=True,
            help="completions: token-id prompts (exact); chat: messages of calibrated text.",
        ),
        click.option(
            "--stream-usage",
            type=click.Choice(("auto", "continuous", "final", "none")),
            default="auto",
            show_default=True,
            help="Usage to ask for in stream_options (auto: probe the server).",
        ),
        click.option(
            "--tokenizer",
            type=click.Path(path_type=Path),
            metavar="PATH",
            help="With --api chat: a local tokenizer.json to calibrate with instead of the server's /tokenize.",
        ),
        click.option(
            "--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable of the key."
        ),
        click.option("--header", "headers", multiple=True, help="Extra request header NAME:VALUE (repeatable)."),
        click.option(
            "--affinity-header",
            "affinity_headers",
            multiple=True,
            type=click.Choice(("X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID"), case_sensitive=False),
            help="Also send the session play's correlation id in this header (repeatable), for router affinity.",
        ),
        click.option("--extra-body", help="JSON object merged into every request body."),
        click.option(
            "--sim-time-scale", default=1.0, show_default=True, help="Simulator clock (wall s per simulated s)."
        ),
        click.option(
            "--mode",
            type=click.Choice(("agentx", "closed", "trace", "rate")),
            default="agentx",
            show_default=True,
            help="agentx: lanes resume at t* after a warmup, trees carry cache-bust markers; closed: every tree from "
            "turn 0; trace: sessions start at their recorded times (open loop); rate: sessions arrive at --rate per s.",
        ),
        click.option(
            "--speedup",
            default=1.0,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="trace: time ÷.",
        ),
        click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="rate: session arrivals per second."),
        click.option(
            "--burstiness",
            default=1.0,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="rate: gamma shape of the gaps (1: Poisson).",
        ),
        click.option(
            "--tstar-window",
            default="0.25,0.75",
            show_default=True,
            metavar="LOW,HIGH",
            help="agentx: where in each session's span a lane's t* falls.",
        ),
        click.option(
            "--warmup",
            type=click.Choice(("spread", "burst")),
            default="spread",
            show_default=True,
            help="agentx: primer timing.",
        ),
        click.option(
            "--warmup-requests-per-lane",
            default=0,
            show_default=True,
            type=click.IntRange(min=0),
            help="agentx: cache-pressure requests per lane after the primers (InferenceX: 10).",
        ),
        click.option(
            "--warmup-max-tokens",
            default="1",
            show_default=True,
            metavar="N|recorded",
            help="agentx: output tokens of a warmup primer.",
        ),
        click.option(
            "--cache-bust",
            type=click.Choice(("marker", "salt", "off")),
            default="marker",
            show_default=True,
            help="agentx: a per-tree marker in every prompt, or as cache_salt, or none.",
        ),
        click.option(
            "--system-idle-cap",
            "system_idle_cap",
            default="10",
            show_default=True,
            metavar="SECONDS|off",
            help="When nothing is in flight, pull every pending timer in to at most this long (AgentX: 10).",
        ),
        click.option(
            "--tree-idle-cap",
            type=click.FloatRange(min=0),
            metavar="SECONDS",
            help="The same per session tree (InferenceX: 300); also caps warmup leads.",
        ),
        click.option(
            "--tree-idle-cap-mode",
            type=click.Choice(["runtime", "warp"]),
            default="warp",
            show_default=True,
            help="warp: cut each tree's recorded idle gaps before the run (the reference, AIPerf 0.13.0); "
            "runtime: act on the live schedule when a tree goes idle (as InferenceX describes a newer one).",
        ),
        click.option(
            "--failed-request-threshold",
            type=click.FloatRange(0, 1),
            metavar="FRACTION",
            help="Cancel the run once this fraction of profiling requests failed (InferenceX: 0.10).",
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def parse_window(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"--tstar-window wants LOW,HIGH (two fractions), got {text!r}") from None
    if not 0.0 <= low <= high <= 1.0:
        raise click.BadParameter(f"--tstar-window wants 0 <= LOW <= HIGH <= 1, got {text!r}")
    return low, high


def parse_chain_rules(pairs: tuple[str, ...]) -> ChainRules:
    from agentx.trace.chains import DEFAULT_RULES

    fields: dict[str, object] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"--chain-rule wants NAME=VALUE, got {pair!r}")
        fields[name.strip().replace("-", "_")] = value.strip()
    known = set(msgspec.structs.asdict(DEFAULT_RULES))
    unknown = sorted(set(fields) - known)
    if unknown:
        raise click.BadParameter(f"--chain-rule: unknown {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    try:
        # msgspec converts the strings to each field's type.
        return msgspec.convert({**msgspec.structs.asdict(DEFAULT_RULES), **fields}, type(DEFAULT_RULES), strict=False)
    except msgspec.ValidationError as exc:
        raise click.BadParameter(f"--chain-rule: {exc}") from None


def seconds_or_off(flag: str, text: str, *, positive: bool = False) -> float | None:
    """`text` as finite seconds (`positive`: above zero, else at least zero), or None for "off"."""
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{flag} wants seconds or 'off', got {text!r}") from None
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise click.BadParameter(f"{flag} wants {'positive' if positive else 'non-negative'} seconds, got {text!r}")
    return value


def positive_int(flag: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise click.BadParameter(f"{flag} wants a positive integer or 'recorded', got {text!r}")
    return int(text)
