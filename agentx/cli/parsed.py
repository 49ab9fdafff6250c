"""The flags `replay`, `sweep` and `decode` share, derived from the option parts (agentx.cli.flags), and the
values that need parsing: headers, the extra body, chain rules, the t* window, the API key and the URL."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click
import msgspec

from agentx.cli.flags import Command, Parser, convert_part, flags_set, part_flags, part_values
from agentx.replayer.options.replay import (
    LOADS,
    Connection,
    Load,
    ReplayOptions,
    Runtime,
    Scenario,
    Server,
    Speculative,
)
from agentx.replayer.options.rules import rule_set

if TYPE_CHECKING:
    import contextlib

    from agentx.replayer.options.slo import Slos
    from agentx.trace.chains import ChainRules


def parse_header(value: str) -> tuple[str, str]:
    """`--header NAME:VALUE` as a (name, value) pair; click.BadParameter unless it is a valid HTTP header."""
    from agentx.replayer.http.http1 import check_header

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


def api_key(
    env_name: str, headers: tuple[tuple[str, str], ...], *, given: str | None = None, say: bool = True
) -> str | None:
    """The API key: `--api-key` (`given`), else the one in `$env_name`, unless `--header Authorization:...` was given:
    that explicit header wins over the environment's key, which is said (`say`) to be unused; with `--api-key` too,
    click.BadParameter (two credentials, neither obviously meant). The key itself is never said."""
    from agentx.cli.common import stderr

    explicit = any(name.lower() == "authorization" for name, _ in headers)
    if given is not None:
        if explicit:
            raise click.BadParameter("pass --api-key KEY or --header Authorization:..., not both")
        return given
    key = os.environ.get(env_name) or None
    if key is not None and explicit:
        if say:
            stderr.print(f"note: --header Authorization is sent; the key in ${env_name} is not used", markup=False)
        return None
    return key


def server_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--url`: a base URL (`host:port` taken as `http://host:port`); a trailing /v1 or endpoint path is dropped with
    a note, and an unusable URL is the one-paragraph error (credentials scrubbed), exit 2."""
    from agentx.cli.common import fail, stderr
    from agentx.errors import BadURLError
    from agentx.replayer.http.url import base_url
    from agentx.secrets import scrub

    if value is None:
        return None
    try:
        url, note = base_url(value)
    except BadURLError as exc:
        fail(f"--url: {exc}")
    if note:
        stderr.print(f"note: --url {scrub(url)}: {note}", markup=False)
    return url


def parse_window(text: str) -> tuple[float, float]:
    """`--tstar-window LOW,HIGH` as two fractions; click.BadParameter otherwise."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"--tstar-window wants LOW,HIGH (two fractions), got {text!r}") from None
    if not 0.0 <= low <= high <= 1.0:
        raise click.BadParameter(f"--tstar-window wants 0 <= LOW <= HIGH <= 1, got {text!r}")
    return low, high


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`--percentiles 50,90,99.9` as numbers in [0, 100], in the order given, each once; click.BadParameter
    otherwise."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"--percentiles wants numbers in [0, 100] such as 50,90,99, got {text!r}") from None
    if not values or any(not 0.0 <= value <= 100.0 for value in values):
        raise click.BadParameter(f"--percentiles wants numbers in [0, 100] such as 50,90,99, got {text!r}")
    return tuple(dict.fromkeys(values))


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


def golden_acceptance(speculative: dict[str, Any], golden_model: str | None, thinking: bool) -> dict[str, Any]:
    """`--spec-golden MODEL`: the speculative values with `al` from MODEL's published curve at `--spec-k`."""
    if golden_model is None:
        return speculative
    from agentx.spec.golden import golden_al

    if speculative.get("al") is not None:
        raise click.BadParameter("pass --spec-al AL or --spec-golden MODEL, not both")
    k = speculative.get("k")
    if k is None:
        raise click.BadParameter("--spec-golden needs --spec-k K: a golden AL is published per K")
    try:
        al = golden_al(golden_model, k, thinking).acceptance_length
    except ValueError as exc:
        raise click.BadParameter(f"--spec-golden: {exc}") from None
    return {**speculative, "al": al}


def sim_fields(speculative: Speculative) -> dict[str, Any]:
    """SimServer keywords realizing a forced acceptance on the built-in simulator (none unless AL and K are set)."""
    if speculative.al is None or speculative.k is None:
        return {}
    return {"spec_k": speculative.k, "acceptance_length": speculative.al}


def parse_slo_flags(texts: tuple[str, ...]) -> Slos:
    """Every `--slo METRIC=VALUE` as one `Slos`; click.BadParameter naming the value that is wrong."""
    from agentx.errors import SloError
    from agentx.replayer.options.slo import parse_slos

    try:
        return parse_slos(texts)
    except SloError as exc:
        raise click.BadParameter(str(exc)) from None


PARSERS: dict[str, Parser] = {
    "headers": lambda flag, raw: tuple(parse_header(text) for text in raw),
    "slo": lambda flag, raw: parse_slo_flags(raw),
    "extra_body": lambda flag, raw: parse_extra_body(raw),
    "chain_rules": lambda flag, raw: parse_chain_rules(raw),
    "tstar_window": lambda flag, raw: parse_window(raw),
    "percentiles": lambda flag, raw: parse_percentiles(raw),
}
"""The fields whose flags are text to parse (agentx.cli.flags)."""
URL_HELP: Final = (
    "Server base URL (host:port means http://host:port); without it, the built-in simulator is started on a free port."
)
URL_FLAG: Final = {"url": {"callback": server_url, "help": URL_HELP}}
SERVER_FIELDS: Final = frozenset(Server.__struct_fields__)
SERVER_SKIP: Final = frozenset({"model"})
"""`--model` is repeatable on the command line (the served models)."""
DECODE_SERVER_SKIP: Final = SERVER_SKIP | {"tokenizer", "affinity_headers"}
"""`decode` sends no trace: no chat calibration, no session affinity."""


def _stack(*decorators: Callable[[Command], Command]) -> Callable[[Command], Command]:
    def apply(command: Command) -> Command:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def server_flags(skip: frozenset[str] = SERVER_SKIP) -> Callable[[Command], Command]:
    """`Server`'s flags, `--model` (repeatable) and `--api-key-env`; with `Connection`'s. `--help` lists `--url`,
    `--model`, `--api-key` and `--api-key-env` first."""
    first = ("url", "api_key")
    return _stack(
        part_flags("server", (Server,), skip=SERVER_FIELDS - {"url"}, overrides=URL_FLAG, group="Server"),
        click.option(
            "--model",
            "served_models",
            multiple=True,
            help="Served model (default: the server's only one). Repeat it to map each session's i-th distinct "
            "recorded model, main model first, to the (i mod n)-th --model.",
        ),
        part_flags("server", (Server,), skip=SERVER_FIELDS - {"api_key"}, group="Server"),
        click.option(
            "--api-key-env",
            default="OPENAI_API_KEY",
            show_default=True,
            metavar="NAME",
            help="Environment variable holding the key (unless --api-key).",
        ),
        part_flags("server", (Server,), PARSERS, skip=skip.union(first), group="Server"),
        part_flags("connection", (Connection,), group="Connection"),
        click.option(
            "--no-proxy",
            "no_proxy",
            is_flag=True,
            help="Reach the server directly, whatever the environment's proxy variables say.",
        ),
    )


speculative_flags = _stack(
    part_flags("speculative", (Speculative,), group="Speculative decoding"),
    click.option(
        "--spec-golden",
        metavar="MODEL",
        help="Take --spec-al from MODEL's published golden curve at --spec-k (`agentx spec golden`).",
    ),
    click.option(
        "--spec-thinking/--no-spec-thinking", default=True, show_default=True, help="--spec-golden: which curve."
    ),
)
"""`Speculative`'s flags and `--spec-golden`, shared by `replay`, `sweep` and `decode`."""


def replay_flags(*, sweep: bool = False) -> Callable[[Command], Command]:
    """The flags of a replay's options, shared by `replay` and `sweep` (a sweep sets the concurrency per level)."""
    return _stack(
        server_flags(),
        click.option(
            "--mode",
            type=click.Choice([load.mode for load in LOADS]),
            default="agentx",
            show_default=True,
            help="agentx: lanes resume at t* after a warmup, trees carry cache-bust markers; closed: every tree from "
            "turn 0; trace: sessions start at their recorded times (open loop); rate: sessions arrive at --rate per s.",
        ),
        part_flags("load", LOADS, PARSERS, skip=frozenset({"concurrency"}) if sweep else frozenset(), group="Load"),
        part_flags("scenario", (Scenario,), PARSERS, group="Load"),
        part_flags("runtime", (Runtime,), group="Run"),
        speculative_flags,
        click.option(
            "--sim-time-scale", default=1.0, show_default=True, help="Simulator clock (wall s per simulated s)."
        ),
    )


OWNED: Final = frozenset({"spec_golden", "spec_thinking", "api_key_env", "mode", "no_proxy"})
"""The flags `ParsedFlags` reads besides the derived ones (`part__field`)."""


class ReplayParts(msgspec.Struct, frozen=True, kw_only=True):
    """Every part of a replay's options but the server, checked: the server is known once a URL is (a simulator's
    starts after the flags are checked)."""

    load: Load
    scenario: Scenario
    connection: Connection
    speculative: Speculative
    runtime: Runtime

    def options(self, server: Server, out_dir: Path, *, overwrite: bool) -> ReplayOptions:
        return ReplayOptions(server=server, out_dir=out_dir, overwrite=overwrite, **msgspec.structs.asdict(self))


class ParsedFlags:
    """The derived flags of `replay`, `sweep` or `decode` (and `--mode`, `--spec-golden`, `--api-key-env`), turned
    into the options' parts on request; each part raises click.BadParameter naming the flags at fault."""

    def __init__(self, values: Mapping[str, Any], ctx: click.Context) -> None:
        self._values = dict(values)
        self._ctx = ctx

    @property
    def url(self) -> str | None:
        """`--url`, normalized (agentx.cli.parsed.server_url); None: the built-in simulator."""
        url: str | None = self._values["server__url"]
        return url

    @property
    def tokenizer(self) -> str | None:
        tokenizer: str | None = self._values.get("server__tokenizer")
        return tokenizer

    @property
    def api(self) -> str:
        return str(self._values["server__api"])

    def speculative(self) -> Speculative:
        """The `Speculative` part (`--spec-golden` looked up)."""
        values = golden_acceptance(
            part_values("speculative", Speculative, self._values),
            self._values["spec_golden"],
            self._values["spec_thinking"],
        )
        result: Speculative = convert_part(Speculative, values, "--spec-al/--spec-k")
        return result

    def check_server(self) -> None:
        """Parse the server's flags (headers, the extra body) before any server is known, so that a bad one fails
        before a simulator starts."""
        part_values("server", Server, self._values, PARSERS)

    def server(self, url: str, models: tuple[str, ...], *, say: bool = True) -> Server:
        """The `Server` part: the flags, the URL and served models as resolved, the key from `--api-key-env`."""
        values = part_values("server", Server, self._values, PARSERS)
        values.update(url=url, model=models[0], models=models[1:])
        given = values.get("api_key")
        values["api_key"] = api_key(self._values["api_key_env"], values.get("headers", ()), given=given, say=say)
        result: Server = convert_part(Server, values, "--url/--header")
        return result

    def connection(self) -> Connection:
        """The `Connection` part (timeouts, TLS, the proxy; `--no-proxy` is the proxy "")."""
        values = part_values("connection", Connection, self._values)
        if self._values.get("no_proxy"):
            if values.get("proxy"):
                raise click.BadParameter("--proxy and --no-proxy: give one or the other")
            values["proxy"] = ""
        result: Connection = convert_part(Connection, values, "--ca-bundle/timeouts")
        return result

    def decode_values(self) -> dict[str, Any]:
        """What `decode` measures (the `DecodeOptions` fields of its own flags)."""
        from agentx.replayer.options.replay import DecodeOptions

        return part_values("decode", DecodeOptions, self._values)

    def _with_rules(self, part: str, values: dict[str, Any]) -> dict[str, Any]:
        """`values` of part `part` with, in `--mode agentx`, the rule set's scenario defaults for the fields whose
        flags the user did not give (agentx.replayer.options.rules; e.g. 3600 s and 10 cache-pressure requests per
        lane under agentx-harness-1.0.12)."""
        if self._values.get("mode") != "agentx":
            return values
        given = flags_set(self._ctx, part, self._values)
        defaults = rule_set(self._values.get("scenario__rules")).defaults.get(part, {})
        return values | {name: value for name, value in defaults.items() if name not in given}

    def load(self, *, concurrency: int | None = None) -> Load:
        """The load of `--mode`, from its flags; a flag of another mode is refused rather than ignored."""
        kind = next(load for load in LOADS if load.mode == self._values["mode"])
        values = self._with_rules("load", part_values("load", kind, self._values, PARSERS))
        if concurrency is not None:
            values["concurrency"] = concurrency
        for name in sorted(flags_set(self._ctx, "load", self._values) - set(kind.__struct_fields__)):
            users = [load.mode for load in LOADS if name in load.__struct_fields__]
            flag = "--" + name.removesuffix("_s").replace("_", "-")
            raise click.BadParameter(f"{flag} applies to --mode {' or '.join(users)}, not {kind.mode}")
        result: Load = convert_part(kind, values, "--mode " + kind.mode)
        return result

    def replay_parts(self, *, concurrency: int | None = None) -> ReplayParts:
        """Every part of `replay`'s (or a sweep level's) options but the server (whose flags are parsed too)."""
        self.check_server()
        scenario = self._with_rules("scenario", part_values("scenario", Scenario, self._values, PARSERS))
        runtime = {**part_values("runtime", Runtime, self._values), **CLI_RUNTIME}
        return ReplayParts(
            load=self.load(concurrency=concurrency),
            scenario=convert_part(Scenario, scenario, "scenario flags"),
            connection=self.connection(),
            speculative=self.speculative(),
            runtime=convert_part(Runtime, runtime, "--grace"),
        )


def parsed(command: Command) -> Command:
    """`command` receiving its derived flags as one `ParsedFlags` (`flags=`), not as keyword arguments."""

    @functools.wraps(command)
    def call(*args: Any, **kwargs: Any) -> Any:
        derived = {key: kwargs.pop(key) for key in list(kwargs) if "__" in key or key in OWNED}
        return command(*args, flags=ParsedFlags(derived, click.get_current_context()), **kwargs)

    return call


CLI_RUNTIME: Final = {"quiet_gc": True, "fast_thread_switch": True}
"""The CLI owns its process, so it takes the garbage collector's timing and the thread switch interval for the run
(README, "Embedding": a library caller opts in)."""


def only_model(url: str, flags: ParsedFlags) -> str:
    """The model `url` serves, asked with the run's own credentials, headers and TLS settings (`flags`); one line
    and exit 2 unless it serves exactly one."""
    from agentx.cli.common import fail, unreachable
    from agentx.replayer.http.client import ServerUnreachable
    from agentx.replayer.options.server_client import server_client

    try:
        server = flags.server(url, ("",), say=False)  # the model is what is asked
        connection = flags.connection()
    except click.BadParameter as exc:
        fail(exc.format_message())

    async def probe() -> list[str]:
        async with server_client(server, connection, limit=1) as client:
            return await client.probe_models()

    import asyncio

    try:
        models = asyncio.run(probe())
    except ServerUnreachable as exc:
        fail(unreachable(url, exc))
    if len(models) != 1:
        fail(f"{url} serves {len(models)} models ({', '.join(models)}); pass --model")
    return models[0]


def server_and_model(
    stack: contextlib.ExitStack,
    url: str | None,
    model: str | None,
    doing: str,
    flags: ParsedFlags,
    **sim_fields: Any,
) -> tuple[str, str]:
    """The server to drive, `url` or else the built-in simulator started on `stack` with `sim_fields` (said on
    stderr: "no --url: {doing} the built-in simulator at ..."), and the model: `model`, else the simulator's or
    the server's only one."""
    from agentx.cli.common import fail, stderr

    if url is None:
        from agentx.errors import SimServerError
        from agentx.sim.process import SimServer

        try:
            sim = stack.enter_context(SimServer(**sim_fields))
        except SimServerError as exc:
            fail(f"cannot start the simulator: {exc}")
        url, model = sim.url, model or sim.model
        stderr.print(simulator_line(doing, url), markup=False)
    else:
        say_route(url, flags)
    return url, model if model is not None else only_model(url, flags)


def simulator_line(doing: str, url: str) -> str:
    """What stderr says when no `--url` starts the simulator. OPENAI_BASE_URL is never taken for `--url`: a replay
    is load, and that variable often names a paid API (with OPENAI_API_KEY beside it) set for other tools; a run
    against it must be asked for by name."""
    line = f"no --url: {doing} the built-in simulator at {url}"
    if os.environ.get("OPENAI_BASE_URL"):
        line += ' (OPENAI_BASE_URL is set but not used: pass --url "$OPENAI_BASE_URL" to replay against it)'
    return line


def say_route(url: str, flags: ParsedFlags) -> None:
    """Say on stderr when requests to `url` go through a proxy: the figures then include the proxy's time. One
    line and exit 2 when the proxy the flags or the environment name is unusable."""
    from agentx.cli.common import fail, stderr
    from agentx.errors import ConfigError
    from agentx.replayer.http.proxy import proxy_for

    try:
        proxy = proxy_for(url, proxy=flags.connection().proxy)
    except (ConfigError, click.BadParameter) as exc:
        fail(str(exc))
    if proxy is not None:
        direct = "" if proxy.source == "--proxy" else "; --no-proxy goes direct"
        stderr.print(f"requests go through the proxy {proxy.shown} ({proxy.source}){direct}", markup=False)
