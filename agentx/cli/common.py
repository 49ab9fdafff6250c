"""Shared by the commands: consoles, the one-paragraph error exit and each agentx error's exit code, trace-format
options, running a coroutine."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import math
import os
import secrets
import signal
import sys
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import click

from agentx.cli.early_stop import STOP_SIGNALS as EARLY_STOP_SIGNALS
from agentx.cli.early_stop import hand_over as take_early_stop
from agentx.errors import (
    AgentxError,
    ConfigError,
    Finding,
    ModelsNotListed,
    RunError,
    RunStopped,
    ServerError,
    ServerUnreachable,
    TraceError,
    WriteFailed,
    cli_words,
)
from agentx.trace.io import Format, load_trace

if TYPE_CHECKING:
    import asyncio

    from rich.console import Console

    from agentx.replayer.options.replay import ReplayOptions
    from agentx.replayer.schedule.hooks import RunHooks
    from agentx.replayer.schedule.stops import RunStops
    from agentx.trace.model import Trace

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 3
"""The run ran, but its results do not stand: the failure threshold cancelled it, every request failed, the
realized speculative acceptance disagrees with the forced one, or it could not complete (a RunError)."""
EXIT_WRITE_FAILED = 4
"""The run's files could not be written once it had started (a full disk, a read-only file system, no permission,
an I/O error: a WriteFailed): it stopped early, and its one line says what its records and run.json kept."""
EXIT_INTERRUPTED = 130
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# Piped output (CI logs, `| less`) gets room for the tables instead of rich's 80-column default, unless COLUMNS
# says how wide the reader is.
PIPED_WIDTH = 120


def _piped_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 20 else PIPED_WIDTH


class LazyConsole:
    """A rich `Console` on stdout or stderr, made when first printed to: importing rich takes tens of milliseconds
    that `agentx --help`, or a replay before its first request, should not spend (bench/startup.py)."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr

    def _stream(self) -> IO[str]:
        return sys.stderr if self._stderr else sys.stdout

    @functools.cached_property
    def console(self) -> Console:
        from rich.console import Console

        width = None if self._stream().isatty() else _piped_width()
        return Console(stderr=self._stderr, highlight=False, soft_wrap=True, width=width)

    def print(self, *objects: Any, **options: Any) -> None:
        """`Console.print`."""
        self.console.print(*objects, **options)

    @property
    def is_terminal(self) -> bool:
        """`Console.is_terminal`, without loading rich when the stream is plainly not a terminal (no tty, and
        neither TTY_COMPATIBLE nor FORCE_COLOR set, which rich would heed)."""
        if "console" not in self.__dict__ and not {"TTY_COMPATIBLE", "FORCE_COLOR"} & os.environ.keys():
            try:
                if not self._stream().isatty():
                    return False
            except ValueError:  # a closed stream
                return False
        return self.console.is_terminal


stdout = LazyConsole()
stderr = LazyConsole(stderr=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `message` as the one-paragraph error and exit with `code`. Credentials in it (a password in a URL, a
    bearer token, a key-shaped word) are scrubbed, and its brackets are text, not markup."""
    from rich.markup import escape

    from agentx.secrets import scrub

    stderr.print(f"[bold red]error:[/] {escape(scrub(message))}", markup=True, highlight=False)
    sys.exit(code)


def interactivity_targets(text: str) -> tuple[float, ...]:
    """`--targets`: tokens/s per user, comma-separated, each positive; click.BadParameter otherwise."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"--targets wants tokens/s per user such as 30,50,75, got {text!r}") from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise click.BadParameter(f"--targets wants positive tokens/s per user such as 30,50,75, got {text!r}")
    return values


@contextlib.contextmanager
def failing_against(url: str, doing: str) -> Iterator[None]:
    """What a run against `url` can end with before it measures anything, each as its one-paragraph error: the
    server's errors named after the URL, options the library refuses (`doing`: "replay", "measure")."""
    from agentx.errors import CalibrationError, OutputUnwritable

    try:
        yield
    except OutputUnwritable as exc:  # the run folder: its message names it and the OS condition
        fail(str(exc), exit_code(exc))
    except ServerUnreachable as exc:
        fail(unreachable(url, exc))
    except CalibrationError as exc:
        fail(f"{url}: cannot calibrate chat prompts: {exc}")
    except ServerError as exc:  # the model not served, a root agent's warmup primer failed
        fail(f"{url}: {exc}")
    except ValueError as exc:  # options the library refuses before any request (e.g. an unsupported --api)
        fail(f"cannot {doing} with these options: {exc}")


def unreachable(url: str, error: ServerUnreachable) -> str:
    """The one-paragraph error for a server at `url` that cannot be used: one that answered, but not with its model
    list, says what it answered (it is not unreachable)."""
    return f"{url}: {error}" if isinstance(error, ModelsNotListed) else f"{url}: the server is unreachable ({error})"


EXIT_CODES: Final[tuple[tuple[type[AgentxError], int], ...]] = (
    (TraceError, EXIT_BAD_INPUT),
    (ConfigError, EXIT_BAD_INPUT),  # OutputUnwritable too: the run folder cannot be written as the run starts
    (ServerError, EXIT_BAD_INPUT),
    (RunStopped, EXIT_INTERRUPTED),  # RunErrors of their own codes
    (WriteFailed, EXIT_WRITE_FAILED),
    (RunError, EXIT_RUN_FAILED),
)
"""Each kind of agentx error and the exit code it ends a command with (docs/cli.md, "Exit codes")."""


def exit_code(error: AgentxError) -> int:
    """The exit code of `error`'s kind in EXIT_CODES; 2 for an AgentxError of no kind."""
    return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), EXIT_BAD_INPUT)


class Group(click.Group):
    """A click group that ends an agentx error escaping any of its commands as `fail(cli_words(error),
    exit_code(error))` (its message in the command line's words: flags, not parameters): a command catches one only
    to say more than its message.

    `lazy` names commands by "module:attribute", imported only when the command line names them (or `--help`
    lists them), so `agentx replay` does not import report's, synth's or the simulator's modules before its first
    request (bench/startup.py)."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module_name, attribute = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command), self.lazy[cmd_name]
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        with stop_signals_raise():
            try:
                return super().invoke(ctx)
            except AgentxError as error:
                fail(cli_words(error), exit_code(error))
            except KeyboardInterrupt:  # a stop signal outside a run's own handling: the command's start-up, say
                # Not through rich: cut short in the middle of a line's flush, its console would print that line again.
                sys.stderr.write("interrupted\n")
                sys.stderr.flush()
                sys.exit(EXIT_INTERRUPTED)


def print_findings(findings: list[Finding], limit: int) -> None:
    shown = findings if limit <= 0 else findings[:limit]
    for finding in shown:
        style = "red" if finding.severity == "error" else "yellow"
        stderr.print(f"[{style}]{finding.severity}:[/] ", end="", markup=True)
        stderr.print(finding.cli_text(), markup=False)
    if len(shown) < len(findings):
        stderr.print(f"… and {len(findings) - len(shown)} more (use --max-findings 0 to see all)", markup=False)


MMAP_THRESHOLD_BYTES: Final = 128 * 1024
"""glibc's default threshold from which a block is mapped on its own (`mallopt(M_MMAP_THRESHOLD)`)."""


def lean_heap() -> None:
    """Set glibc's allocator for a replay (the command line owns its process; elsewhere than glibc, nothing), which
    Arrow's buffers also come from (`agentx.cli.main`): one heap for every thread (`M_ARENA_MAX` 1), and every block of
    `MMAP_THRESHOLD_BYTES` or more mapped on its own and unmapped when freed, for good (glibc raises that threshold, up
    to 32 MiB, each time it frees such a block). Request bodies (~1 MB at 100k tokens) and prompt blocks are made on
    worker threads too (agentx.replayer.schedule.offloop): with a heap per thread, and bodies kept in the heaps, the
    AgentX-size corpus at 64 lanes held ~100 MB more (bench/corpus_replay.py --peak). Python holds the GIL as it
    allocates: the threads hardly contend for one heap."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_mmap_threshold, m_arena_max = -3, -8
    mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)
    mallopt(m_arena_max, 1)


def load_to_replay(path: Path, *, format: Format | None, block_size: int | None) -> Trace:
    """`load_trace` for a command that replays the trace: loaded with the garbage collector off and then frozen
    (`gc.freeze()`, as the command line owns its process; the run's `quiet_gc` unfreezes everything at its end), after
    setting the allocator for a replay (`lean_heap`).

    The trace is never garbage, yet a replay would otherwise walk all of it twice before its first request: the
    young collection that follows the load, then the full one with which the run freezes its set-up (~50 ms for
    6,000 Mooncake requests, more for a larger trace; bench/startup.py)."""
    lean_heap()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return load_trace(path, format=format, block_size=block_size)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


STOP_SIGNALS = EARLY_STOP_SIGNALS
"""Ctrl-C, what schedulers, `timeout` and `kill` send, and a closed terminal or ssh session: each stops a run
gracefully."""


_interrupted: list[int] = []
"""The stop signals `stop_signals_raise` turned into KeyboardInterrupt."""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    _interrupted.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """While a command runs, Ctrl-C, SIGTERM and SIGHUP raise KeyboardInterrupt, so that any stop signal during its
    start-up (the trace's load, planning, a simulator starting) ends it through its cleanups, with one line and exit
    130 (`Group.invoke`); a run's own handling (`run_interruptibly`) takes over while the run goes. Only the main thread
    can set handlers; the ones before are back on exit (`agentx.cli.early_stop`'s, before a command, being Python's
    own again), and a signal the process was started with ignored (`nohup`) stays ignored."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    early = take_early_stop()
    previous = {stop_signal: early.get(stop_signal, signal.getsignal(stop_signal)) for stop_signal in STOP_SIGNALS}
    for stop_signal, handler in previous.items():
        if handler is signal.SIG_DFL or handler is signal.default_int_handler:
            signal.signal(stop_signal, _raise_interrupt)
    try:
        yield
    finally:
        for stop_signal, handler in previous.items():
            if handler is not None:
                signal.signal(stop_signal, handler)
        if _interrupted:
            # A start cut short leaves the run's coroutines made and never started: nothing of them to say at exit.
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)


class _SignalStops:
    """Stop signals as a run's stops: counted from before its event loop is made (a signal then waits for the run),
    handed to the run's `RunStops` on the loop once it goes; the third cancels the run's task."""

    def __init__(self) -> None:
        self.received = 0
        self._wake: Callable[[], object] | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self._wake is not None:
            self._wake()

    @contextlib.contextmanager
    def handed_to(self, stops: RunStops, task: asyncio.Future[Any]) -> Iterator[None]:
        import asyncio

        loop = asyncio.get_running_loop()

        def hand_over() -> None:
            while stops.count < self.received:
                stops.stop()
                if stops.count > 2:
                    task.cancel()

        self._wake = functools.partial(loop.call_soon_threadsafe, hand_over)
        try:
            hand_over()  # those received while the loop was made
            yield
        finally:
            self._wake = None


def run_interruptibly(
    work: Callable[[RunHooks], Coroutine[Any, Any, T]],
    hooks: RunHooks | None = None,
    *around: contextlib.AbstractContextManager[object],
) -> T:
    """Run `work(hooks)` on an event loop of its own (`loop_factory`'s), inside `around` (entered once the loop is
    made), `hooks` given the run's stops (`RunStops`): Ctrl-C, SIGTERM or SIGHUP is one stop (the first graceful, the
    second ending the grace period: the run writes its files and returns its partial summary, exit 130). A third
    cancels it: the run is written at once and nothing more is summarized. The signals are taken from before the loop
    is made until it is closed: one sent as the loop starts or ends waits for the run (a run stopped before it started
    raises `RunStopped`), never an interrupt raised inside the loop's own machinery. One the process was started with
    ignored (`nohup`) stays ignored. The handlers before are back afterwards (`stop_signals_raise`'s)."""
    import asyncio

    import msgspec

    from agentx.replayer.schedule.clock import loop_factory
    from agentx.replayer.schedule.hooks import NO_HOOKS
    from agentx.replayer.schedule.stops import RunStops
    from agentx.replayer.workers import stop_signals_to

    signals = _SignalStops()

    async def interruptible() -> T:
        stops = RunStops()
        task = asyncio.ensure_future(work(msgspec.structs.replace(hooks or NO_HOOKS, stops=stops)))
        with signals.handed_to(stops, task):
            return await task

    # Not loop.add_signal_handler: removing the loop's handler puts the default action back before the one before can
    # return, and a SIGTERM in that instant would end the process without its summary.
    with contextlib.ExitStack() as stack:
        stack.enter_context(stop_signals_to(signals))
        runner = stack.enter_context(asyncio.Runner(loop_factory=loop_factory()))
        for context in around:
            stack.enter_context(context)
        return runner.run(interruptible())


def cluster_output(options: ReplayOptions) -> contextlib.AbstractContextManager[object]:
    """For a `--ray` run, Ray's own messages (a node that died, say), which it prints to stdout, go to stderr: stdout
    carries the summary (and with --json, nothing else)."""
    if options.runtime.ray is None:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(sys.stderr)


def default_run_dir() -> Path:
    """`runs/<time>-<6 hex>`: two replays started in the same second never share a folder."""
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def refuse_existing_run(run_dir: Path) -> None:
    """Fail (exit 2) before anything starts when `run_dir` already holds a run, by the rule every writer of a run
    folder follows (agentx.records.run_folder)."""
    from agentx.errors import RunExists
    from agentx.records.run_folder import refuse_existing_run as refuse

    try:
        refuse(run_dir, overwrite=False)
    except RunExists as exc:
        fail(cli_words(exc))


def write_page(path: Path, page: str) -> None:
    """Write an HTML page atomically (agentx.records.run_folder.write_atomically): never half a page."""
    from agentx.records.run_folder import write_atomically

    try:
        write_atomically(path, page.encode())
    except OSError as exc:
        fail(f"{exc.filename or path}: cannot write the page ({exc.strerror or exc})")
    stderr.print(f"wrote {path}", markup=False)
