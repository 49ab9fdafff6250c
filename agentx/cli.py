"""The `agentx` command line: parse, call the library, print."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import msgspec
from rich.console import Console

from agentx.sim.options import click_options, options_from_flags
from agentx.tables import stats_tables
from agentx.trace.errors import Finding, Findings, TraceError
from agentx.trace.io import FORMATS, Format, load_trace, save_trace
from agentx.trace.stats import parse_token_counts, trace_stats

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


def _header(value: str) -> tuple[str, str]:
    name, sep, content = value.partition(":")
    if not sep or not name.strip():
        raise click.BadParameter(f"{value!r} is not NAME:VALUE")
    return name.strip(), content.strip()


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--url", help="Server base URL; without it, the built-in simulator is started on a free port.")
@click.option("--model", help="Model every request names (default: the server's only model).")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Lanes (session trees).")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), help="Run this long, s.")
@click.option("--sessions", type=click.IntRange(min=1), help="Stop after this many session trees.")
@click.option("--grace", "grace_s", default=30.0, show_default=True, help="In-flight allowance after the end, s.")
@click.option(
    "--session-order", type=click.Choice(("sequential", "shuffle", "random")), default="sequential", show_default=True
)
@click.option("--seed", default=0, show_default=True, help="Seed of session order and prompt content.")
@click.option("--delay-scale", default=1.0, show_default=True, help="Multiply every recorded delay (0: none).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Run directory (default: runs/<time>).")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable of the key.")
@click.option("--header", "headers", multiple=True, help="Extra request header NAME:VALUE (repeatable).")
@click.option(
    "--affinity-header",
    "affinity_headers",
    multiple=True,
    type=click.Choice(("X-Session-ID", "X-SMG-Routing-Key", "X-Dynamo-Session-ID"), case_sensitive=False),
    help="Also send the session play's correlation id in this header (repeatable), for router affinity.",
)
@click.option("--extra-body", help="JSON object merged into every request body.")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, for per-GPU throughput.")
@click.option("--sim-time-scale", default=1.0, show_default=True, help="Simulator clock (wall s per simulated s).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_format_option
@_block_size_option
def replay(
    trace: Path,
    url: str | None,
    model: str | None,
    concurrency: int,
    duration_s: float | None,
    sessions: int | None,
    grace_s: float,
    session_order: str,
    seed: int,
    delay_scale: float,
    out_dir: Path | None,
    api_key_env: str,
    headers: tuple[str, ...],
    affinity_headers: tuple[str, ...],
    extra_body: str | None,
    gpus: int | None,
    sim_time_scale: float,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
) -> None:
    """Replay TRACE's session trees against an OpenAI-compatible server and summarize the run.

    Records stream to RUN_DIR/records.arrow as the run goes. Ctrl-C stops dispatching, lets in-flight
    requests finish within the grace period, and prints the partial summary (exit 130).
    """
    from agentx.replay.client import ModelNotServed, ServerUnreachable
    from agentx.replay.engine import ReplayOptions
    from agentx.results.summary import summary_table
    from agentx.run import replay as run_and_summarize
    from agentx.sim.process import SimServer, SimServerError

    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size)
        parsed_headers = tuple(_header(h) for h in headers)
        body = msgspec.json.decode(extra_body) if extra_body else None
        if body is not None and not isinstance(body, dict):
            raise click.BadParameter("--extra-body must be a JSON object")
    except TraceError as exc:
        _fail(str(exc))
    except (click.BadParameter, msgspec.DecodeError) as exc:
        _fail(str(exc))
    run_dir = out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    with contextlib.ExitStack() as stack:
        if url is None:
            try:
                sim = stack.enter_context(SimServer(time_scale=sim_time_scale, block_size=loaded.block_size))
            except SimServerError as exc:
                _fail(f"cannot start the simulator: {exc}")
            url, model = sim.url, model or sim.model
            _stderr.print(f"no --url: replaying against the built-in simulator at {url}", markup=False)
        if model is None:
            model = _only_model(url)
        options = ReplayOptions(
            url=url,
            model=model,
            out_dir=run_dir,
            concurrency=concurrency,
            duration_s=duration_s,
            sessions=sessions,
            grace_s=grace_s,
            session_order=session_order,  # type: ignore[arg-type]
            seed=seed,
            delay_scale=delay_scale,
            api_key=os.environ.get(api_key_env) or None,
            headers=parsed_headers,
            affinity_headers=affinity_headers,
            extra_body=body,
        )
        progress = _Progress()
        try:
            work = _interruptible(run_and_summarize(loaded, options, num_gpus=gpus, on_record=progress))
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                result = runner.run(work)
        except ServerUnreachable as exc:
            _fail(f"{url}: the server is unreachable ({exc})")
        except ModelNotServed as exc:
            _fail(f"{url}: {exc}")
        except (KeyboardInterrupt, asyncio.CancelledError):
            # Ctrl-C outside the replay itself (probing, scraping metrics): nothing to summarize yet.
            _stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
        finally:
            progress.close()
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result.summary)).decode() + "\n")
    else:
        for table in summary_table(result.summary, title=f"replay of {trace}"):
            _stdout.print(table)
        _stdout.print(f"records: {result.run.records_path}", markup=False)
    if result.run.interrupted:
        sys.exit(EXIT_INTERRUPTED)


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


class _Progress:
    """A one-line live count of finished requests, errors and output tokens/s (stderr, terminals only)."""

    def __init__(self) -> None:
        self.done = self.errors = self.output_tokens = 0
        self.started = time.perf_counter()
        self.last_draw = 0.0
        self.live = _stderr.is_terminal

    def __call__(self, record: Any) -> None:
        self.done += 1
        self.errors += record.status != "ok"
        self.output_tokens += record.osl_streamed_tokens or 0
        now = time.perf_counter()
        if self.live and now - self.last_draw >= 0.2:
            self.last_draw = now
            rate = self.output_tokens / max(now - self.started, 1e-9)
            _stderr.file.write(f"\r{self.done:,} requests, {self.errors:,} errors, {rate:,.0f} output tok/s   ")
            _stderr.file.flush()

    def close(self) -> None:
        if self.live and self.done:
            _stderr.file.write("\n")


if __name__ == "__main__":
    main()
