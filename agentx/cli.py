"""The `agentx` command line: parse, call the library, print."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import msgspec
from rich.console import Console

from agentx.sim.options import click_options, options_from_flags
from agentx.tables import stats_tables
from agentx.trace.errors import Finding, Findings, TraceError
from agentx.trace.io import FORMATS, Format, load_trace, save_trace
from agentx.trace.stats import parse_token_counts, trace_stats

if TYPE_CHECKING:
    from agentx.replay.engine import ReplayOptions
    from agentx.results.sweep import LevelResult, LevelSettings
    from agentx.sim.process import SimServer
    from agentx.trace.chains import ChainRules
    from agentx.trace.model import Trace

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
T = TypeVar("T")

# Piped output (CI logs, `| less`) gets room for the tables instead of rich's 80-column default.
_PIPED_WIDTH = 120
_stdout = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else _PIPED_WIDTH)
_stderr = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)


def _fail(message: str) -> NoReturn:
    _stderr.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    sys.exit(EXIT_BAD_INPUT)


def _print_findings(findings: list[Finding], limit: int) -> None:
    shown = findings if limit <= 0 else findings[:limit]
    for finding in shown:
        style = "red" if finding.severity == "error" else "yellow"
        _stderr.print(f"[{style}]{finding.severity}:[/] ", end="", markup=True)
        _stderr.print(str(finding), markup=False)
    if len(shown) < len(findings):
        _stderr.print(f"… and {len(findings) - len(shown)} more (use --max-findings 0 to see all)", markup=False)


_format_option = click.option(
    "--format", "input_format", type=click.Choice(FORMATS), help="Input format (default: detected from content)."
)
_block_size_option = click.option(
    "--block-size", type=click.IntRange(min=1), help="Tokens per hash id, overriding the file's."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="agentx")
def main() -> None:
    """Replay agentic LLM workloads against OpenAI-compatible inference servers."""


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@_format_option
@_block_size_option
@click.option("--max-findings", default=50, show_default=True, help="Print at most this many findings (0: all).")
def validate(trace: Path, input_format: Format | None, block_size: int | None, max_findings: int) -> None:
    """Check TRACE; print each error and warning with its file, line, session and request.

    Exit status 0 when there are no errors (warnings allowed), 2 otherwise.
    """
    findings = Findings()
    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size, findings=findings)
    except TraceError as exc:
        _print_findings(findings.items or exc.findings, max_findings)
        errors = len(findings.errors) or len(exc.findings)
        _fail(f"{trace}: {errors} error(s), {len(findings.warnings)} warning(s); the trace is not usable")
    _print_findings(findings.items, max_findings)
    _stdout.print(
        f"{trace}: ok — {len(loaded.sessions):,} sessions, {loaded.request_count:,} requests, "
        f"{len(findings.warnings):,} warning(s)",
        markup=False,
    )


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("destination", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "output_format",
    type=click.Choice(("arrow", "parquet", "weka", "mooncake")),
    help="Output format (default: from DESTINATION's suffix: .arrow, .parquet, else Weka JSONL).",
)
@_format_option
@_block_size_option
def convert(
    source: Path, destination: Path, output_format: Format | None, input_format: Format | None, block_size: int | None
) -> None:
    """Convert SOURCE to DESTINATION (Arrow, Parquet, Weka JSONL or Mooncake JSONL)."""
    started = time.perf_counter()
    findings = Findings()
    try:
        trace = load_trace(source, format=input_format, block_size=block_size, findings=findings)
        _print_findings(findings.warnings, 10)
        save_trace(trace, destination, format=output_format)
    except TraceError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{destination}: cannot write: {exc.strerror or exc}")
    size_mb = destination.stat().st_size / 1e6 if destination.is_file() else 0.0
    _stdout.print(
        f"wrote {destination}: {len(trace.sessions):,} sessions, {trace.request_count:,} requests, "
        f"{size_mb:,.2f} MB in {time.perf_counter() - started:.2f} s",
        markup=False,
    )


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--cache-tokens",
    default="",
    metavar="N[,N...]",
    help="LRU cache capacities in tokens to simulate, e.g. 1e6,1e7,1e8.",
)
@click.option(
    "--non-causal",
    is_flag=True,
    help="Count a block as cached once its producer starts (older reference rule), not once it ends.",
)
@_format_option
@_block_size_option
def inspect(
    trace: Path, as_json: bool, cache_tokens: str, non_causal: bool, input_format: Format | None, block_size: int | None
) -> None:
    """Summarise TRACE: sessions, subagent shape, distributions, prefix-cache hit rates."""
    try:
        capacities = parse_token_counts(cache_tokens) if cache_tokens else []
    except ValueError as exc:
        _fail(f"--cache-tokens: {exc}")
    findings = Findings()
    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size, findings=findings)
    except TraceError as exc:
        _fail(str(exc))
    if findings.warnings:
        _stderr.print(f"{len(findings.warnings):,} warning(s); `agentx validate {trace}` lists them", markup=False)
    stats = trace_stats(loaded, cache_tokens=capacities, causal=not non_causal)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(stats)).decode() + "\n")
        return
    for table in stats_tables(stats, title=str(trace)):
        _stdout.print(table)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0: a free one)."
)
@click.option("--json", "ready_json", is_flag=True, help="Print the ready line as JSON {url, model, pid}.")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
@click_options
def sim(host: str, port: int, ready_json: bool, access_log: bool, **flags: Any) -> None:
    """Serve a simulated vLLM-like OpenAI-compatible server until Ctrl-C (docs/sim.md)."""
    try:
        options = options_from_flags(flags, host=host, port=port, access_log=access_log)
    except ValueError as exc:
        _fail(str(exc))
    from agentx.sim.server import serve  # aiohttp and uvloop load only for this command

    def ready(url: str, model: str) -> None:
        if ready_json:
            line = msgspec.json.encode({"url": url, "model": model, "pid": os.getpid()}).decode()
        else:
            line = f"agentx sim: serving model {model} at {url} (Ctrl-C to stop)"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # a harness reads this line through a pipe, where stdout is block-buffered

    try:
        serve(options, ready)
    except ValueError as exc:
        _fail(f"invalid simulator configuration: {exc}")
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    except RuntimeError as exc:
        _fail(str(exc))
    _stderr.print("agentx sim: stopped", markup=False)


class _Forced(msgspec.Struct, frozen=True):
    """A forced acceptance length and K from the command line (either may be absent)."""

    al: float | None = None
    k: int | None = None

    def sim_fields(self) -> dict[str, Any]:
        """SimServer keywords realizing it on the built-in simulator (nothing when no AL and K are forced)."""
        if self.al is None or self.k is None:
            return {}
        return {"spec_k": self.k, "acceptance_length": self.al}


def _spec_options(command: Callable[..., Any]) -> Callable[..., Any]:
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


def _forced_acceptance(al: float | None, k: int | None, golden_model: str | None, thinking: bool) -> _Forced:
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
    return _Forced(al=al, k=k)


def _header(value: str) -> tuple[str, str]:
    name, sep, content = value.partition(":")
    if not sep or not name.strip():
        raise click.BadParameter(f"{value!r} is not NAME:VALUE")
    return name.strip(), content.strip()


def _replay_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a replay shared by `replay` and `sweep` (all but concurrency, output, GPUs and workers)."""
    decorators = [
        click.option("--url", help="Server base URL; without it, the built-in simulator is started on a free port."),
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
            help="A 400 whose body holds this is a context overflow (repeatable; replaces the defaults).",
        ),
        click.option(
            "--split-flattened-agents/--no-split-flattened-agents",
            default=True,
            show_default=True,
            help="Split agents recorded flattened into their parent's requests into agents of their own (§3b).",
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
        click.option(
            "--session-order",
            type=click.Choice(("sequential", "shuffle", "random")),
            default="sequential",
            show_default=True,
        ),
        click.option("--seed", default=0, show_default=True, help="Seed of session order and prompt content."),
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
            default="runtime",
            show_default=True,
            help="runtime: act on the live schedule when a tree goes idle (newer reference); "
            "warp: cut each tree's recorded idle gaps before the run (older reference).",
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


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@_replay_flags
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Lanes (session trees).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Run directory (default: runs/<time>).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, for per-GPU throughput.")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Shard the lanes over this many processes (when one core cannot keep up; no live progress).",
)
@_spec_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_format_option
@_block_size_option
def replay(
    trace: Path,
    url: str | None,
    served_models: tuple[str, ...],
    max_context_length: int | None,
    max_output_tokens: int | None,
    chain_rules: tuple[str, ...],
    overflow_substrings: tuple[str, ...],
    split_flattened_agents: bool,
    concurrency: int,
    duration_s: float | None,
    sessions: int | None,
    grace_s: float,
    session_order: str,
    seed: int,
    delay_scale: float,
    ramp_s: float,
    api: str,
    stream_usage: str,
    tokenizer: Path | None,
    out_dir: Path | None,
    api_key_env: str,
    headers: tuple[str, ...],
    affinity_headers: tuple[str, ...],
    extra_body: str | None,
    gpus: int | None,
    sim_time_scale: float,
    mode: str,
    speedup: float,
    rate: float | None,
    burstiness: float,
    tstar_window: str,
    warmup: str,
    warmup_requests_per_lane: int,
    warmup_max_tokens: str,
    cache_bust: str,
    failed_request_threshold: float | None,
    system_idle_cap: str,
    tree_idle_cap: float | None,
    tree_idle_cap_mode: str,
    workers: int,
    spec_al: float | None,
    spec_k: int | None,
    spec_golden: str | None,
    spec_thinking: bool,
    spec_tolerance: float,
    stream_interval: int,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
) -> None:
    """Replay TRACE's session trees against an OpenAI-compatible server and summarize the run.

    Records stream to RUN_DIR/records.arrow as the run goes; RUN_DIR/run.json (options, run, summary) is
    written at the end. Progress shows on stderr when it is a terminal (not with --json). Ctrl-C stops
    dispatching, lets in-flight requests finish within the grace period, and prints the partial summary
    (exit 130).
    """
    from agentx.replay.calibrate import CalibrationError
    from agentx.replay.client import CONTEXT_OVERFLOW_SUBSTRINGS, ModelNotServed, ServerUnreachable
    from agentx.replay.engine import ReplayOptions, WarmupFailed
    from agentx.replay.workers import WorkerFailed
    from agentx.results.summary import summary_table
    from agentx.run import RUN_FILE, replay_workers
    from agentx.run import replay as run_and_summarize
    from agentx.sim.process import SimServer, SimServerError
    from agentx.tables import ReplayProgress, planned_requests

    if tokenizer is not None and api != "chat":
        _fail("--tokenizer calibrates chat prompts; it needs --api chat (completions prompts are token ids already)")
    if tokenizer is not None and not tokenizer.is_file():
        _fail(f"--tokenizer {tokenizer}: no such file")
    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size)
        parsed_headers = tuple(_header(h) for h in headers)
        window = _window(tstar_window)
        system_cap = _seconds_or_off("--system-idle-cap", system_idle_cap)
        rules = _chain_rules(chain_rules)
        primer_tokens = (
            None if warmup_max_tokens == "recorded" else _positive_int("--warmup-max-tokens", warmup_max_tokens)
        )
        body = msgspec.json.decode(extra_body) if extra_body else None
        if body is not None and not isinstance(body, dict):
            raise click.BadParameter("--extra-body must be a JSON object")
        forced = _forced_acceptance(spec_al, spec_k, spec_golden, spec_thinking)
    except TraceError as exc:
        _fail(str(exc))
    except (click.BadParameter, msgspec.DecodeError) as exc:
        _fail(str(exc))
    run_dir = out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    model = served_models[0] if served_models else None
    with contextlib.ExitStack() as stack:
        if url is None:
            try:
                sim = stack.enter_context(
                    SimServer(time_scale=sim_time_scale, block_size=loaded.block_size, **forced.sim_fields())
                )
            except SimServerError as exc:
                _fail(f"cannot start the simulator: {exc}")
            url, model = sim.url, model or sim.model
            _stderr.print(f"no --url: replaying against the built-in simulator at {url}", markup=False)
        if model is None:
            model = _only_model(url)
        options = ReplayOptions(
            url=url,
            model=model,
            models=served_models[1:],
            max_context_length=max_context_length,
            max_output_tokens=max_output_tokens,
            split_flattened_agents=split_flattened_agents,
            chain_rules=rules,
            context_overflow_substrings=overflow_substrings or CONTEXT_OVERFLOW_SUBSTRINGS,
            out_dir=run_dir,
            concurrency=concurrency,
            duration_s=duration_s,
            sessions=sessions,
            grace_s=grace_s,
            session_order=session_order,  # type: ignore[arg-type]
            seed=seed,
            delay_scale=delay_scale,
            ramp_s=ramp_s,
            api=api,  # type: ignore[arg-type]
            stream_usage=stream_usage,  # type: ignore[arg-type]
            tokenizer=None if tokenizer is None else str(tokenizer),
            api_key=os.environ.get(api_key_env) or None,
            headers=parsed_headers,
            affinity_headers=affinity_headers,
            extra_body=body,
            mode=mode,  # type: ignore[arg-type]
            speedup=speedup,
            rate=rate,
            burstiness=burstiness,
            tstar_window=window,
            warmup=warmup,  # type: ignore[arg-type]
            warmup_max_tokens=primer_tokens,
            warmup_requests_per_lane=warmup_requests_per_lane,
            cache_bust=cache_bust,  # type: ignore[arg-type]
            failed_request_threshold=failed_request_threshold,
            system_idle_cap_s=system_cap,
            tree_idle_cap_s=tree_idle_cap,
            tree_idle_cap_mode=tree_idle_cap_mode,  # type: ignore[arg-type]
            spec_al=forced.al,
            spec_k=forced.k,
            spec_al_tolerance=spec_tolerance,
            stream_interval=stream_interval,
        )
        progress = ReplayProgress(
            console=None if as_json else _stderr, duration_s=duration_s, planned=planned_requests(loaded, options)
        )
        try:
            if workers > 1:
                result = replay_workers(
                    trace, options, workers, num_gpus=gpus, trace_format=input_format, block_size=block_size
                )
            else:
                work = _interruptible(
                    run_and_summarize(
                        loaded, options, num_gpus=gpus, on_record=progress.on_record, on_sent=progress.on_sent
                    )
                )
                with asyncio.Runner(loop_factory=_loop_factory()) as runner, progress:
                    result = runner.run(work)
        except WarmupFailed as exc:
            _fail(f"{url}: {exc}")
        except CalibrationError as exc:
            _fail(f"{url}: cannot calibrate chat prompts: {exc}")
        except WorkerFailed as exc:
            _fail(str(exc))
        except ServerUnreachable as exc:
            _fail(f"{url}: the server is unreachable ({exc})")
        except ModelNotServed as exc:
            _fail(f"{url}: {exc}")
        except ValueError as exc:  # options the engine refuses before any request (e.g. an unsupported --api)
            _fail(f"cannot replay with these options: {exc}")
        except OSError as exc:
            if exc.filename is None:  # not a file of the run: a bug, shown as one
                raise
            _fail(f"{exc.filename}: cannot write the run ({exc.strerror or exc})")
        except (KeyboardInterrupt, asyncio.CancelledError):
            # Ctrl-C outside the replay itself (probing, scraping metrics): nothing to summarize yet.
            _stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result.summary)).decode() + "\n")
    else:
        engine = result.run.server.label
        title = f"replay of {trace}" + (f" on {engine}" if engine else "")
        for table in summary_table(result.summary, title=title):
            _stdout.print(table)
        _stdout.print(f"records: {result.run.records_path}", markup=False)
        _stdout.print(f"run: {Path(result.run.records_path).parent / RUN_FILE}", markup=False)
    if result.run.interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _window(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"--tstar-window wants LOW,HIGH (two fractions), got {text!r}") from None
    if not 0.0 <= low <= high <= 1.0:
        raise click.BadParameter(f"--tstar-window wants 0 <= LOW <= HIGH <= 1, got {text!r}")
    return low, high


def _chain_rules(pairs: tuple[str, ...]) -> ChainRules:
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


def _seconds_or_off(flag: str, text: str) -> float | None:
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{flag} wants seconds or 'off', got {text!r}") from None
    if value < 0:
        raise click.BadParameter(f"{flag} wants non-negative seconds, got {text!r}")
    return value


def _positive_int(flag: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise click.BadParameter(f"{flag} wants a positive integer or 'recorded', got {text!r}")
    return int(text)


async def _interruptible(work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; Ctrl-C cancels it, and the replay turns that into a graceful stop (grace, flush)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: a quarter less client CPU per streamed chunk (bench/replay_overhead.py)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency except on Windows
        return None
    return uvloop.new_event_loop


def _only_model(url: str) -> str:
    from agentx.replay.client import Client, ServerUnreachable

    async def probe() -> list[str]:
        async with Client(url) as client:
            return await client.probe_models()

    try:
        models = asyncio.run(probe())
    except ServerUnreachable as exc:
        _fail(f"{url}: the server is unreachable ({exc})")
    if len(models) != 1:
        _fail(f"{url} serves {len(models)} models ({', '.join(models)}); pass --model")
    return models[0]


@main.command("decode")
@click.option("--url", help="Server base URL; without it, the built-in simulator is started on a free port.")
@click.option("--model", help="Served model (default: the server's only one).")
@click.option("--isl", "isl_tokens", default=1, show_default=True, type=click.IntRange(min=1), help="Prompt tokens.")
@click.option(
    "--osl", "osl_tokens", default=1000, show_default=True, type=click.IntRange(min=2), help="Output tokens, forced."
)
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Users at once.")
@click.option("--repetitions", default=5, show_default=True, type=click.IntRange(min=1), help="Waves of requests.")
@click.option(
    "--api",
    type=click.Choice(("completions", "chat")),
    default="completions",
    show_default=True,
    help="completions: token-id prompts (exact ISL); chat: a message of ISL words (approximate).",
)
@click.option(
    "--stream-usage",
    type=click.Choice(("auto", "continuous", "final", "none")),
    default="auto",
    show_default=True,
    help="Usage to ask for in stream_options (auto: probe the server).",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the prompts.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable of the key.")
@click.option("--header", "headers", multiple=True, help="Extra request header NAME:VALUE (repeatable).")
@click.option("--extra-body", help="JSON object merged into every request body.")
@click.option("--sim-time-scale", default=1.0, show_default=True, help="Simulator clock (wall s per simulated s).")
@_spec_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def decode_command(
    url: str | None,
    model: str | None,
    isl_tokens: int,
    osl_tokens: int,
    concurrency: int,
    repetitions: int,
    api: str,
    stream_usage: str,
    seed: int,
    api_key_env: str,
    headers: tuple[str, ...],
    extra_body: str | None,
    sim_time_scale: float,
    spec_al: float | None,
    spec_k: int | None,
    spec_golden: str | None,
    spec_thinking: bool,
    spec_tolerance: float,
    stream_interval: int,
    as_json: bool,
) -> None:
    """Measure decode-only speed: tokens/s per user with prefill excluded, p50/p90, beside the realized AL.

    Each of --repetitions waves sends --concurrency streamed requests of --isl prompt tokens forcing --osl output
    tokens; a request's decode speed is its tokens after the first chunk over the time from its first to its last
    token. Without --url the built-in simulator serves it (with --spec-al and --spec-k as its forced acceptance).
    """
    from agentx.decoding import DecodeOptions, decode_sync, decode_tables
    from agentx.replay.client import ModelNotServed, ServerUnreachable
    from agentx.sim.process import SimServer, SimServerError

    try:
        forced = _forced_acceptance(spec_al, spec_k, spec_golden, spec_thinking)
        parsed_headers = tuple(_header(h) for h in headers)
        body = msgspec.json.decode(extra_body) if extra_body else None
        if body is not None and not isinstance(body, dict):
            raise click.BadParameter("--extra-body must be a JSON object")
    except (click.BadParameter, msgspec.DecodeError) as exc:
        _fail(str(exc))
    with contextlib.ExitStack() as stack:
        if url is None:
            try:
                sim = stack.enter_context(SimServer(time_scale=sim_time_scale, **forced.sim_fields()))
            except SimServerError as exc:
                _fail(f"cannot start the simulator: {exc}")
            url, model = sim.url, model or sim.model
            _stderr.print(f"no --url: measuring the built-in simulator at {url}", markup=False)
        if model is None:
            model = _only_model(url)
        options = DecodeOptions(
            url=url,
            model=model,
            isl_tokens=isl_tokens,
            osl_tokens=osl_tokens,
            concurrency=concurrency,
            repetitions=repetitions,
            api=api,  # type: ignore[arg-type]
            stream_usage=stream_usage,  # type: ignore[arg-type]
            seed=seed,
            api_key=os.environ.get(api_key_env) or None,
            headers=parsed_headers,
            extra_body=body,
            spec_al=forced.al,
            spec_k=forced.k,
            spec_al_tolerance=spec_tolerance,
            stream_interval=stream_interval,
        )
        try:
            result = decode_sync(options)
        except ServerUnreachable as exc:
            _fail(f"{url}: the server is unreachable ({exc})")
        except ModelNotServed as exc:
            _fail(f"{url}: {exc}")
        except ValueError as exc:
            _fail(f"cannot measure with these options: {exc}")
        except KeyboardInterrupt:
            _stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result)).decode() + "\n")
    else:
        for table in decode_tables(result, title=f"decode-only speed at {url}"):
            _stdout.print(table)
    if result.decode_tps is None:
        _fail(f"no request produced a token after its first ({result.failed} of {len(result.samples)} failed)")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "export_format",
    type=click.Choice(("aiperf-jsonl", "aiperf-summary")),
    required=True,
    help="aiperf-jsonl: profile_export.jsonl (one object per request); "
    "aiperf-summary: profile_export_aiperf.json (statistics and submission validity).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), metavar="PATH", help="File to write, or a directory (default: RUN_DIR)."
)
def export(run_dir: Path, export_format: str, out: Path | None) -> None:
    """Export the run in RUN_DIR (records.arrow, run.json) in AIPerf's file formats, for InferenceX tooling."""
    from agentx.results.export import ExportError, export_run

    started = time.perf_counter()
    try:
        written = export_run(run_dir, export_format, out)
    except ExportError as exc:
        _fail(f"{exc}. Pass the directory a replay wrote (its --out), which holds records.arrow and run.json.")
    except OSError as exc:
        _fail(f"{exc.filename or out}: cannot write the export ({exc.strerror or exc})")
    _stdout.print(f"wrote {written} in {time.perf_counter() - started:.2f} s", markup=False)
    if export_format == "aiperf-summary":
        metadata = msgspec.json.decode(written.read_bytes())["metadata"]
        reasons = ", ".join(metadata["submission_invalid_reasons"]) or "none"
        valid = "true" if metadata["submission_valid"] else "false"
        _stdout.print(f"submission_valid: {valid} (reasons: {reasons})", markup=False)
        if metadata["agentx"]["validity"]["run_file_missing"]:
            note = f"{run_dir} has no run.json (a crashed or unfinished run): counted as run_cancelled"
            _stderr.print(note, markup=False)


def _sweep_base_options(loaded: Trace, flags: dict[str, Any], url: str, model: str, out_dir: Path) -> ReplayOptions:
    """The ReplayOptions every level of a sweep shares, from the `_replay_flags` and `_spec_options` values."""
    from agentx.replay.client import CONTEXT_OVERFLOW_SUBSTRINGS
    from agentx.replay.engine import ReplayOptions

    body = msgspec.json.decode(flags["extra_body"]) if flags["extra_body"] else None
    if body is not None and not isinstance(body, dict):
        raise click.BadParameter("--extra-body must be a JSON object")
    primer = flags["warmup_max_tokens"]
    forced = _forced_acceptance(flags["spec_al"], flags["spec_k"], flags["spec_golden"], flags["spec_thinking"])
    tokenizer = flags["tokenizer"]
    return ReplayOptions(
        url=url,
        model=model,
        models=flags["served_models"][1:],
        max_context_length=flags["max_context_length"],
        max_output_tokens=flags["max_output_tokens"],
        split_flattened_agents=flags["split_flattened_agents"],
        chain_rules=_chain_rules(flags["chain_rules"]),
        context_overflow_substrings=flags["overflow_substrings"] or CONTEXT_OVERFLOW_SUBSTRINGS,
        out_dir=out_dir,
        duration_s=flags["duration_s"],
        sessions=flags["sessions"],
        grace_s=flags["grace_s"],
        session_order=flags["session_order"],
        seed=flags["seed"],
        delay_scale=flags["delay_scale"],
        ramp_s=flags["ramp_s"],
        api=flags["api"],
        stream_usage=flags["stream_usage"],
        tokenizer=None if tokenizer is None else str(tokenizer),
        api_key=os.environ.get(flags["api_key_env"]) or None,
        headers=tuple(_header(h) for h in flags["headers"]),
        affinity_headers=flags["affinity_headers"],
        extra_body=body,
        mode=flags["mode"],
        speedup=flags["speedup"],
        rate=flags["rate"],
        burstiness=flags["burstiness"],
        tstar_window=_window(flags["tstar_window"]),
        warmup=flags["warmup"],
        warmup_max_tokens=None if primer == "recorded" else _positive_int("--warmup-max-tokens", primer),
        warmup_requests_per_lane=flags["warmup_requests_per_lane"],
        cache_bust=flags["cache_bust"],
        failed_request_threshold=flags["failed_request_threshold"],
        system_idle_cap_s=_seconds_or_off("--system-idle-cap", flags["system_idle_cap"]),
        tree_idle_cap_s=flags["tree_idle_cap"],
        tree_idle_cap_mode=flags["tree_idle_cap_mode"],
        spec_al=forced.al,
        spec_k=forced.k,
        spec_al_tolerance=flags["spec_tolerance"],
        stream_interval=flags["stream_interval"],
    )


@main.command("sweep")
@click.argument("trace", type=click.Path(path_type=Path))
@_replay_flags
@click.option("--concurrency", "levels", required=True, metavar="N[,N...]", help="The levels, e.g. 1,2,4,8,16,32,64.")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Sweep directory.")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, for per-GPU throughput.")
@click.option("--gpu-sku", metavar="SKU", help="The GPUs (b300, b200, gb300, gb200, mi355x, h200, h100), for prices.")
@click.option("--resume", is_flag=True, help="Keep the levels whose run.json says they ran to the end.")
@click.option(
    "--before-level",
    metavar="CMD",
    help="Shell command run before each level, {concurrency}, {spec_al} and {spec_k} substituted; "
    "a non-zero exit fails that level.",
)
@click.option(
    "--before-level-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Fail the level when --before-level runs longer.",
)
@click.option(
    "--level-settings",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help='JSON of concurrency → settings, e.g. {"64": {"spec_al": 2.1, "spec_k": 1, "extra_body": {}}}.',
)
@_spec_options
@click.option("--json", "as_json", is_flag=True, help="Print sweep.json's index as JSON.")
@_format_option
@_block_size_option
def sweep_command(
    trace: Path,
    levels: str,
    out_dir: Path,
    gpus: int | None,
    gpu_sku: str | None,
    resume: bool,
    before_level: str | None,
    before_level_timeout: float | None,
    level_settings: Path | None,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
    **flags: Any,
) -> None:
    """Replay TRACE once per concurrency level (same seed), each level into OUT/c{N}, the index into OUT/sweep.json.

    A level that fails is recorded with its error and the sweep goes on (exit 1 when any failed). `agentx report
    OUT` turns the sweep into the frontier and cost tables. Ctrl-C stops the current level gracefully and ends the
    sweep (exit 130); `--resume` picks it up.
    """
    from agentx.results.cost import load_price_table
    from agentx.results.sweep import SWEEP_FILE, SweepError, SweepOptions, load_level_settings, parse_levels, sweep
    from agentx.sim.process import SimServerError
    from agentx.tables import ReplayProgress

    try:
        concurrency = parse_levels(levels)
        settings = load_level_settings(level_settings) if level_settings is not None else {}
        loaded = load_trace(trace, format=input_format, block_size=block_size)
        if gpu_sku is not None and gpu_sku.lower() not in load_price_table().gpus:
            known = ", ".join(load_price_table().gpus)
            raise SweepError(
                f"--gpu-sku {gpu_sku!r} is not one of {known} (the price table's GPUs); for another GPU leave it "
                "out and price the report with `agentx report OUT --price USD_PER_GPU_HOUR`"
            )
        # Parsed now, against a placeholder server, so that a bad flag fails before the simulator starts.
        _sweep_base_options(loaded, flags, "http://127.0.0.1", "model", out_dir)
    except (SweepError, TraceError, click.BadParameter, msgspec.DecodeError) as exc:
        _fail(str(exc))
    url, served = flags["url"], flags["served_models"]
    model = served[0] if served else None
    forced = _forced_acceptance(flags["spec_al"], flags["spec_k"], flags["spec_golden"], flags["spec_thinking"])
    level_server: Callable[[int, LevelSettings], str] | None = None
    with contextlib.ExitStack() as stack:
        if url is None:
            sims = stack.enter_context(_LevelSims(flags["sim_time_scale"], loaded.block_size, forced))
            try:
                sim = sims.start(forced)
            except SimServerError as exc:
                _fail(f"cannot start the simulator: {exc}")
            url, model = sim.url, model or sim.model
            _stderr.print(f"no --url: sweeping the built-in simulator at {url}", markup=False)
            if settings:
                level_server = sims.url_for
        if model is None:
            model = _only_model(url)
        base = _sweep_base_options(loaded, flags, url, model, out_dir)
        options = SweepOptions(
            concurrency=concurrency,
            out_dir=out_dir,
            num_gpus=gpus,
            gpu_sku=None if gpu_sku is None else gpu_sku.lower(),
            trace_label=str(trace),
            resume=resume,
            before_level=before_level,
            before_level_timeout_s=before_level_timeout,
            level_settings=settings,
        )
        console = None if as_json else _stderr
        # One live progress line per level (drawn on a terminal only), replaced as each level starts.
        progress = ReplayProgress(console=None)

        def start(position: int, count: int, level: int) -> None:
            nonlocal progress
            _stderr.print(f"level {position}/{count}: concurrency {level}", markup=False)
            progress = ReplayProgress(console=console, duration_s=base.duration_s)
            progress.start()

        def done(result: LevelResult) -> None:
            progress.close()
            entry = result.entry
            what = entry.status if entry.error is None else f"{entry.status}: {entry.error}"
            _stderr.print(f"  c{entry.concurrency}: {what} ({entry.elapsed_s:.1f} s)", markup=False)

        def on_record(record: Any) -> None:
            progress.on_record(record)

        def on_sent() -> None:
            progress.on_sent()

        work = _interruptible(
            sweep(
                loaded,
                base,
                options,
                on_level_start=start,
                on_level_done=done,
                on_record=on_record,
                on_sent=on_sent,
                level_server=level_server,
            )
        )
        try:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                result = runner.run(work)
        except OSError as exc:
            _fail(f"{exc.filename or out_dir}: cannot write the sweep ({exc.strerror or exc})")
        except (KeyboardInterrupt, asyncio.CancelledError):
            _stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
        finally:
            progress.close()
    index = (out_dir / SWEEP_FILE).read_text()
    if as_json:
        sys.stdout.write(index)
    else:
        failed = [level.entry for level in result.levels if level.entry.status == "failed"]
        _stdout.print(
            f"sweep: {len(result.levels)} level(s) in {out_dir}, {len(failed)} failed; "
            f"`agentx report {out_dir}` for the frontier and costs",
            markup=False,
        )
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if any(level.entry.status == "failed" for level in result.levels):
        sys.exit(1)


class _LevelSims:
    """The built-in simulator of a sweep without --url, restarted with a level's forced acceptance when it differs
    from the running one's (what --before-level does for a real server)."""

    def __init__(self, time_scale: float, block_size: int, forced: _Forced) -> None:
        self.time_scale = time_scale
        self.block_size = block_size
        self.forced = forced
        self.sim: SimServer | None = None
        self.running: _Forced | None = None

    def start(self, forced: _Forced) -> SimServer:
        from agentx.sim.process import SimServer

        self.close()
        self.sim = SimServer(time_scale=self.time_scale, block_size=self.block_size, **forced.sim_fields()).start()
        self.running = forced
        return self.sim

    def url_for(self, concurrency: int, settings: LevelSettings) -> str:
        wanted = _Forced(
            settings.spec_al if settings.spec_al is not None else self.forced.al,
            settings.spec_k if settings.spec_k is not None else self.forced.k,
        )
        if self.sim is None or wanted != self.running:
            _stderr.print(f"  restarting the simulator for c{concurrency}: AL {wanted.al}, K {wanted.k}", markup=False)
            return self.start(wanted).url
        return self.sim.url

    def close(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None

    def __enter__(self) -> _LevelSims:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _targets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"--targets wants tokens/s per user such as 30,50,75, got {text!r}") from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise click.BadParameter(f"--targets wants positive tokens/s per user such as 30,50,75, got {text!r}")
    return values


@main.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--markdown", is_flag=True, help="Print the report as Markdown tables.")
@click.option("--plots", "plots_dir", type=click.Path(path_type=Path), metavar="DIR", help="Write PNG and SVG plots.")
@click.option(
    "--target",
    "target_tps",
    default=50.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Interactivity (tok/s/user) of the per-tier cost table.",
)
@click.option(
    "--targets", default="30,50,75,100,150,200", show_default=True, help="Interactivity targets (tok/s/user)."
)
@click.option("--tier", default="hyperscaler", show_default=True, help="Price tier of the targets table's $/M.")
@click.option(
    "--statistic",
    type=click.Choice(("p50", "p75", "p90", "p95", "p99", "mean")),
    default="p90",
    show_default=True,
    help="Interactivity = 1/ITL at this statistic.",
)
@click.option(
    "--basis",
    type=click.Choice(("total", "output", "input")),
    default="total",
    show_default=True,
    help="Tokens the throughput counts.",
)
@click.option("--gpu-sku", metavar="SKU", help="The GPUs, overriding what the sweep recorded (for prices).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, overriding what was recorded.")
@click.option(
    "--price",
    "usd_per_gpu_hour",
    type=click.FloatRange(min=0),
    metavar="USD_PER_GPU_HOUR",
    help="Price every series at this $/GPU/hr (the tier 'given').",
)
@click.option("--prices", "prices_path", type=click.Path(path_type=Path), metavar="FILE", help="Price table JSON.")
@click.option(
    "--power-kw-per-gpu",
    type=click.FloatRange(min=0, min_open=True),
    metavar="KW",
    help="Power per GPU (its share of the facility), for J/token and tokens per MW.",
)
@click.option("--label", "labels", multiple=True, help="Name of each directory's series, in order (repeatable).")
@click.option(
    "--engine",
    "engines",
    multiple=True,
    help="The engine of each directory's series, in order, replacing what its runs recorded (repeatable).",
)
def report_command(
    dirs: tuple[Path, ...],
    as_json: bool,
    markdown: bool,
    plots_dir: Path | None,
    target_tps: float,
    targets: str,
    tier: str,
    statistic: str,
    basis: str,
    gpu_sku: str | None,
    gpus: int | None,
    usd_per_gpu_hour: float | None,
    prices_path: Path | None,
    power_kw_per_gpu: float | None,
    labels: tuple[str, ...],
    engines: tuple[str, ...],
) -> None:
    """Tables of one or more runs or sweeps (their directories), side by side: throughput per GPU at every
    interactivity target with $/M and the operating point, what serving costs per price tier, best TTFT and TPOT,
    peak throughput, every level. Reads run.json and records.arrow only, so any run directory works.
    """
    from agentx.results.cost import TIERS, PriceError, load_price_table
    from agentx.results.frontier import FrontierOptions
    from agentx.results.report import (
        ReportError,
        ReportOptions,
        build_report,
        load_series,
        report_json,
        report_markdown,
        report_tables,
    )

    if as_json and markdown:
        _fail("pass --json or --markdown, not both: each prints the whole report")
    for flag, given in (("--label", labels), ("--engine", engines)):
        if len(given) > len(dirs):
            _fail(f"{len(given)} {flag} for {len(dirs)} director{'y' if len(dirs) == 1 else 'ies'}: one per directory")
    try:
        prices = load_price_table(prices_path)
        known_tiers = sorted({*TIERS, *prices.tiers})
        if usd_per_gpu_hour is None and tier not in known_tiers:
            raise click.BadParameter(f"--tier {tier!r} is not one of {', '.join(known_tiers)}")
        if gpu_sku is not None and gpu_sku.lower() not in prices.gpus and usd_per_gpu_hour is None:
            raise click.BadParameter(
                f"--gpu-sku {gpu_sku!r} is not in the price table ({', '.join(prices.gpus)}); "
                "pass --price USD_PER_GPU_HOUR or a --prices file that has it"
            )
        options = ReportOptions(
            frontier=FrontierOptions(statistic=statistic, basis=basis, targets_tps=_targets(targets)),  # type: ignore[arg-type]
            target_tps=target_tps,
            tier=tier,
            gpu_sku=gpu_sku,
            num_gpus=gpus,
            usd_per_gpu_hour=usd_per_gpu_hour,
            kw_per_gpu=power_kw_per_gpu,
        )
        series = [
            load_series(d, labels[i] if i < len(labels) else None, engines[i] if i < len(engines) else None)
            for i, d in enumerate(dirs)
        ]
        report = build_report(series, options, prices)
    except (PriceError, ReportError, click.BadParameter) as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(report_json(report) + "\n")
    elif markdown:
        sys.stdout.write(report_markdown(report))
    else:
        for table in report_tables(report):
            _stdout.print(table)
        unknown = [s.label for s in report.series if not s.gpus_known]
        if unknown:
            _stderr.print(
                f"{', '.join(unknown)}: no GPU count recorded; throughput is per server (pass --gpus N)", markup=False
            )
    if plots_dir is not None:
        from agentx.results.plots import PlotsUnavailableError, write_plots

        try:
            written = write_plots(report, plots_dir)
        except PlotsUnavailableError as exc:
            _stderr.print(f"no plots: {exc}", markup=False)
            return
        except OSError as exc:
            _fail(f"{exc.filename or plots_dir}: cannot write the plots ({exc.strerror or exc})")
        _stderr.print(f"wrote {len(written)} plot files into {plots_dir}", markup=False)


@main.group()
def spec() -> None:
    """Speculative decoding at a fixed acceptance length (AL): engine settings and published golden ALs."""


@spec.command("flags")
@click.option("--engine", required=True, help="vllm, sglang, trtllm, atom or llamacpp.")
@click.option("--al", "acceptance_length", type=float, help="Acceptance length: tokens per step, bonus included.")
@click.option("--golden", "golden_model", metavar="MODEL", help="Take the AL from MODEL's golden curve at --k.")
@click.option("--k", "spec_k", type=int, required=True, help="Draft (speculative) tokens per step, K.")
@click.option("--thinking/--no-thinking", default=True, show_default=True, help="--golden: which curve.")
@click.option("--variant", help="--golden: the recipe variant (source file stem, or part of it).")
@click.option("--method", help="Speculative method for the engine (mtp, eagle3, dspark, ...).")
@click.option("--rates", "as_rates", is_flag=True, help="Per-position rates instead of the length, where supported.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, for harnesses.")
def spec_flags(
    engine: str,
    acceptance_length: float | None,
    golden_model: str | None,
    spec_k: int,
    thinking: bool,
    variant: str | None,
    method: str | None,
    as_rates: bool,
    as_json: bool,
) -> None:
    """Print the server settings forcing an acceptance length: arguments, environment, per-position schedule."""
    from agentx.spec.flags import engine_settings, shell_lines
    from agentx.spec.golden import golden_al, source_line

    if (acceptance_length is None) == (golden_model is None):
        _fail("pass exactly one of --al AL (an acceptance length in [1, K+1]) or --golden MODEL (a published one)")
    golden = None
    try:
        if golden_model is not None:
            golden = golden_al(golden_model, spec_k, thinking, variant)
            acceptance_length = golden.acceptance_length
        assert acceptance_length is not None  # one of the two was given, checked above
        settings = engine_settings(engine, acceptance_length, spec_k, method, as_rates=as_rates)
    except ValueError as exc:
        _fail(str(exc))
    if as_json:
        document = {**msgspec.to_builtins(settings), "golden": msgspec.to_builtins(golden)}
        click.echo(msgspec.json.encode(document).decode())
        return
    lines = shell_lines(settings)
    if golden is not None:
        lines.insert(1, f"# golden: {source_line(golden)}")
    click.echo("\n".join(lines))


@spec.command("golden")
@click.option("--model", required=True, help="Model name or alias (case, -, _ and . ignored; e.g. kimi-k3).")
@click.option("--k", "spec_k", type=int, help="One K (draft tokens); without it, the whole curve.")
@click.option("--thinking/--no-thinking", default=True, show_default=True, help="Which curve.")
@click.option("--variant", help="The recipe variant (source file stem, or part of it); default: the plain recipe.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the value with its source, or the whole curve.")
def spec_golden(model: str, spec_k: int | None, thinking: bool, variant: str | None, as_json: bool) -> None:
    """Print a published golden AL (the number alone on stdout, its source on stderr) or a model's curve."""
    from agentx.spec.golden import curve_lines, find_curve, golden_al, source_line

    try:
        if spec_k is not None:
            golden = golden_al(model, spec_k, thinking, variant)
        else:
            curve = find_curve(model, variant)
            lines = curve_lines(curve, thinking)
    except ValueError as exc:
        _fail(str(exc))
    if spec_k is not None:
        if as_json:
            click.echo(msgspec.json.encode(golden).decode())
        else:
            # The number alone on stdout so that AL=$(agentx spec golden ...) works; the source goes to stderr.
            click.echo(repr(golden.acceptance_length))
            click.echo(f"# {source_line(golden)}", err=True)
    elif as_json:
        click.echo(msgspec.json.encode(curve).decode())
    else:
        click.echo("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# synth and compare: making traces and judging them (agentx.synth)


@main.group()
def synth() -> None:
    """Make traces: from private logs (anonymized) or from a statistical model."""


def _model_map(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    mapping = []
    for pair in pairs:
        source, sep, target = pair.partition("=")
        if not sep or not source or not target:
            _fail(f"--model-map {pair!r}: expected FROM=TO, e.g. claude-opus-4-5=big")
        mapping.append((source, target))
    return tuple(mapping)


@synth.command("from-logs")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "log_format",
    required=True,
    type=click.Choice(("anthropic-proxy", "openai-proxy", "claude-code")),
    help="Input kind: proxy-capture JSONL (Anthropic Messages or OpenAI chat) or Claude Code folders.",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Trace to write (.arrow, .parquet, ...).")
@click.option("--tokenizer", type=click.Path(path_type=Path), help="tokenizer.json (default: built-in approximation).")
@click.option("--block-size", default=64, show_default=True, type=click.IntRange(min=1), help="Tokens per hash id.")
@click.option(
    "--scope", type=click.Choice(("session", "global")), default="session", show_default=True, help="Hash-id namespace."
)
@click.option("--salt-file", type=click.Path(path_type=Path), help="Secret key of the block hashes (default: random).")
@click.option("--relabel-models", is_flag=True, help="Write models as model-1, model-2, ... (first-seen order).")
@click.option("--model-map", multiple=True, metavar="FROM=TO", help="Rename a model (repeatable).")
def synth_from_logs(
    inputs: tuple[Path, ...],
    log_format: str,
    out: Path,
    tokenizer: Path | None,
    block_size: int,
    scope: str,
    salt_file: Path | None,
    relabel_models: bool,
    model_map: tuple[str, ...],
) -> None:
    """Turn logs (INPUTS: files or folders) into an anonymized trace: lengths, times, block ids, agent tree."""
    from agentx.synth.from_logs import FromLogsOptions, from_logs
    from agentx.synth.hashing import read_salt
    from agentx.trace.validate import validate as validate_trace

    started = time.perf_counter()
    options = msgspec.convert(
        {
            "format": log_format,
            "block_size": block_size,
            "scope": scope,
            "tokenizer_path": str(tokenizer) if tokenizer else None,
            "relabel_models": relabel_models,
            "model_map": _model_map(model_map),
        },
        FromLogsOptions,
    )
    try:
        salt = read_salt(salt_file) if salt_file else None
        trace = from_logs(inputs, options, salt=salt)
    except (TraceError, ValueError) as exc:
        _fail(str(exc))
    errors = [finding for finding in validate_trace(trace) if finding.severity == "error"]
    if errors:  # a bug, not bad input: say so plainly
        _fail(f"the synthesized trace is invalid ({errors[0]}); please report this")
    try:
        save_trace(trace, out)
    except OSError as exc:
        _fail(f"{out}: cannot write: {exc.strerror or exc}")
    _stdout.print(
        f"wrote {out}: {len(trace.sessions):,} sessions, {trace.request_count:,} requests "
        f"in {time.perf_counter() - started:.2f} s",
        markup=False,
    )


@synth.command("generate")
@click.option("--preset", "preset_name", help="A named session model (agentic-coding).")
@click.option("--like", "like", type=click.Path(path_type=Path), help="Fit the model to this trace instead.")
@click.option(
    "--sessions", type=click.IntRange(min=1), help="Sessions to generate (default: 100, or as many as --like's)."
)
@click.option("--seed", default=0, show_default=True, help="Random seed (same seed, same trace).")
@click.option(
    "--scope", type=click.Choice(("session", "global")), help="Hash-id namespace (default: --like's, else session)."
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Trace to write (.arrow, .parquet, ...).")
def synth_generate(
    preset_name: str | None, like: Path | None, sessions: int | None, seed: int, scope: str | None, out: Path
) -> None:
    """Generate sessions from a preset or from a model fitted to a trace (more sessions, never compressed time)."""
    from agentx.synth.fit import fit
    from agentx.synth.generate import generate
    from agentx.synth.presets import PRESETS, preset

    if (preset_name is None) == (like is None):
        _fail(f"pass exactly one of --preset NAME ({', '.join(PRESETS)}) or --like TRACE")
    started = time.perf_counter()
    try:
        if like is not None:
            source = load_trace(like)
            model = fit(source, source=f"fitted to {like.name}")
            count = sessions or len(source.sessions)
            scope = scope or source.hash_id_scope
        else:
            assert preset_name is not None  # one of the two was given, checked above
            model = preset(preset_name)
            count = sessions or 100
        trace = generate(model, sessions=count, seed=seed, scope="global" if scope == "global" else "session")
        save_trace(trace, out)
    except (TraceError, ValueError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{out}: cannot write: {exc.strerror or exc}")
    _stdout.print(
        f"wrote {out}: {len(trace.sessions):,} sessions, {trace.request_count:,} requests "
        f"in {time.perf_counter() - started:.2f} s",
        markup=False,
    )


@main.command("compare")
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_command(trace_a: Path, trace_b: Path, as_json: bool) -> None:
    """How alike TRACE_A and TRACE_B are: KS distances, prefix-cache hit-rate curves, a verdict."""
    from agentx.synth.compare import compare

    try:
        fidelity = compare(load_trace(trace_a), load_trace(trace_b))
    except TraceError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(msgspec.json.encode(fidelity).decode())
        return
    lines = [f"{'quantity':<22}{'KS':>7}{'limit':>8}{'median A':>12}{'median B':>12}{'n A':>9}{'n B':>9}"]
    for d in fidelity.distances:
        lines.append(
            f"{d.quantity:<22}{d.ks:>7.3f}{d.limit:>8.3f}{d.median_a:>12,.1f}{d.median_b:>12,.1f}{d.count_a:>9,}{d.count_b:>9,}"
        )
    lines.append(f"{'cache tokens/session':<22}{'hit A':>9}{'hit B':>9}")
    for point in fidelity.hit_curve:
        capacity = "infinite" if point.capacity_tokens_per_session is None else f"{point.capacity_tokens_per_session:,}"
        lines.append(f"{capacity:<22}{point.hit_rate_a:>9.1%}{point.hit_rate_b:>9.1%}")
    lines.append(fidelity.verdict)
    click.echo("\n".join(lines))


if __name__ == "__main__":
    main()
