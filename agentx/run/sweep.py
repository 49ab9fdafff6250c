"""A concurrency sweep: one replay per level, the same trace and seed, each level in its own run directory.

Layout: `OUT/c{N}/` holds level N's `records.arrow` and `run.json` (a plain run directory: `agentx report`,
`agentx export` read it alone too); `OUT/sweep.json` (`SweepIndex`) lists the levels, their status and errors,
rewritten after every level so that an interrupted sweep leaves a readable index.

A level that fails (the server unreachable, the before-level command failing, the failure threshold reached) is
recorded with its error and the sweep goes on. With `resume`, a level whose `run.json` exists and says the run
was not interrupted is kept as it is and not replayed (status `kept`); any other level directory is cleared and
replayed. A resume whose settings (`SETTINGS`: the scenario, the load, the forced acceptance, the model; the server's
URL unless the level ran against the built-in simulator) or trace differ from a level it would keep is refused before
anything runs: the kept figures would not be this sweep's. The index keeps
the levels of the earlier sweep that this one does not name.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from agentx.errors import RunStopped, SweepError
from agentx.replayer.http.identity import SIMULATOR
from agentx.replayer.options.replay import LOADS, LaneLoad, ReplayOptions, Scenario, Speculative, flat_options
from agentx.replayer.plan.play import PreparedTrace
from agentx.replayer.plan.preparation import prepare_trace
from agentx.replayer.schedule.hooks import RunHooks
from agentx.replayer.schedule.stops import Cancellation
from agentx.results.folders.run_file import RunFile, finished_run
from agentx.results.folders.sweep_index import (
    LevelEntry,
    SweepIndex,
    existing_sweep,
    level_dir_name,
    read_index,
    write_index,
)
from agentx.results.summary.summarize import Summary
from agentx.run.replay import replay
from agentx.run.sync import run_sync
from agentx.trace.digest import trace_digest
from agentx.trace.model import Trace

BEFORE_LEVEL_LOG: Final = "before_level.log"
_OUTPUT_TAIL_CHARS = 2000


class LevelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What changes with the level besides concurrency (InferenceX changes speculation with concurrency)."""

    spec_al: float | None = None
    """The forced acceptance length at this level (replaces the sweep's)."""
    spec_k: int | None = None
    extra_body: dict[str, Any] | None = None
    """Merged over the sweep's `extra_body` for this level's requests."""


class SweepOptions(msgspec.Struct, frozen=True, kw_only=True):
    concurrency: tuple[int, ...]
    """The levels, run in this order."""
    out_dir: Path
    num_gpus: int | None = None
    gpu_sku: str | None = None
    """Recorded in sweep.json for the report's prices (e.g. "b300")."""
    trace_label: str = ""
    """What the trace was (its path), recorded in sweep.json."""
    resume: bool = False
    """Keep the levels whose run.json says they ran to the end; re-run the others. A level that ran with other
    settings (`SETTINGS`, or another trace) refuses the resume (SweepError), unless `resume_anyway`."""
    resume_anyway: bool = False
    """Resume and keep finished levels even when they ran with other settings than this sweep's."""
    overwrite: bool = False
    """Replace a sweep already in `out_dir`; with neither this nor `resume`, one is refused (SweepError)."""
    before_level: str | None = None
    """A shell command run before each level, `{concurrency}`, `{spec_al}`, `{spec_k}` substituted (an unset
    value becomes an empty string); a non-zero exit fails the level."""
    before_level_timeout_s: float | None = None
    level_settings: dict[int, LevelSettings] = {}
    extend: bool = False
    """Add these levels to the sweep already in `out_dir`: its index keeps the levels not named here, and a named
    level is run afresh (none is kept, unlike `resume`). A search that runs its levels one sweep at a time."""


class LevelResult(msgspec.Struct, kw_only=True):
    """A level's outcome: its entry and, unless it failed, its summary (read back from run.json when resumed)."""

    entry: LevelEntry
    run_dir: Path
    summary: Summary | None = None


class SweepResult(msgspec.Struct, kw_only=True):
    out_dir: Path
    levels: list[LevelResult]
    interrupted: bool = False


def parse_levels(text: str) -> tuple[int, ...]:
    """ "1,2,4,8" → (1, 2, 4, 8); SweepError on anything but distinct positive integers."""
    try:
        levels = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise SweepError(f"--concurrency wants a comma-separated list of positive integers, got {text!r}") from None
    if not levels or any(level < 1 for level in levels) or len(set(levels)) != len(levels):
        raise SweepError(f"--concurrency wants distinct positive integers such as 1,2,4,8, got {text!r}")
    return levels


def load_level_settings(path: Path) -> dict[int, LevelSettings]:
    """A JSON object of concurrency → `LevelSettings`, e.g. {"1": {"spec_al": 3.2, "spec_k": 3}}."""
    example = '{"1": {"spec_al": 3.2, "spec_k": 3}, "64": {"spec_al": 2.1, "spec_k": 1, "extra_body": {}}}'
    try:
        raw = msgspec.json.decode(path.read_bytes(), type=dict[str, LevelSettings])
    except OSError as exc:
        raise SweepError(f"{path}: cannot read the level settings ({exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise SweepError(f"{path}: not a level-settings table ({exc}); it wants, e.g., {example}") from None
    settings: dict[int, LevelSettings] = {}
    for key, value in raw.items():
        if not key.strip().isdigit() or int(key) < 1:
            raise SweepError(f"{path}: {key!r} is not a concurrency level (a positive integer); e.g. {example}")
        settings[int(key)] = value
    return settings


def before_level_command(template: str, concurrency: int, settings: LevelSettings, base: ReplayOptions) -> str:
    """`template` with `{concurrency}`, `{spec_al}` and `{spec_k}` replaced (shell-quoted; unset: empty)."""
    spec_al = settings.spec_al if settings.spec_al is not None else base.speculative.al
    spec_k = settings.spec_k if settings.spec_k is not None else base.speculative.k
    values = {"concurrency": concurrency, "spec_al": spec_al, "spec_k": spec_k}
    command = template
    # Plain replacement, not str.format: the command may hold other braces (JSON, awk).
    for name, value in values.items():
        command = command.replace("{" + name + "}", "" if value is None else shlex.quote(str(value)))
    return command


async def _run_before_level(command: str, log_path: Path, timeout_s: float | None) -> str | None:
    """Run `command` in a shell, its output into `log_path`; the failure text, or None when it succeeded."""
    process = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return f"the before-level command `{command}` did not finish within {timeout_s} s"
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    text = output.decode(errors="replace")
    log_path.write_text(text)
    if process.returncode == 0:
        return None
    tail = text[-_OUTPUT_TAIL_CHARS:].strip()
    shown = f"; its output ends with: {tail}" if tail else " (no output)"
    return f"the before-level command `{command}` exited with status {process.returncode}{shown}"


def _level_options(base: ReplayOptions, concurrency: int, settings: LevelSettings, run_dir: Path) -> ReplayOptions:
    assert isinstance(base.load, LaneLoad)  # `sweep` refuses open loops
    server = base.server
    if settings.extra_body is not None:
        server = msgspec.structs.replace(server, extra_body={**(server.extra_body or {}), **settings.extra_body})
    speculative = msgspec.structs.replace(
        base.speculative,
        al=settings.spec_al if settings.spec_al is not None else base.speculative.al,
        k=settings.spec_k if settings.spec_k is not None else base.speculative.k,
    )
    return msgspec.structs.replace(
        base,
        server=server,
        load=msgspec.structs.replace(base.load, concurrency=concurrency),
        out_dir=run_dir,
        overwrite=True,  # the level's folder was emptied for it (`_level`)
        speculative=speculative,
    )


SETTINGS: Final = frozenset(
    f"spec_{field}" if part is Speculative and field != "stream_interval" else field
    for part in (Scenario, *LOADS, Speculative)
    for field in part.__struct_fields__
) | {"model", "api", "mode", "extra_body"}
"""The options a level's figures depend on (run.json's flat names): a resumed sweep keeps a level only when they are
the same (the concurrency apart, which each level sets), and the server's URL too (`_compared`)."""


def _compared(done: RunFile) -> frozenset[str]:
    """The settings a kept level must share with the sweep: `SETTINGS`, and the server's `url` unless the level ran
    against the built-in simulator, which a sweep without --url starts on a new port each time."""
    return SETTINGS if done.run.server.engine == SIMULATOR else SETTINGS | {"url"}


def _refuse_other_settings(out_dir: Path, levels: dict[int, ReplayOptions], digest: str) -> None:
    """SweepError when a level `--resume` would keep ran with other settings than this sweep's, or another trace (its
    `digest` differs): its figures would not be this sweep's."""
    differences: list[str] = []
    for concurrency, level in levels.items():
        done = finished_run(Path(level.out_dir))
        if done is None:
            continue
        now = flat_options(level)
        changed = [
            f"{name} {_shown(done.options[name])}, not {_shown(now[name])}"
            for name in sorted(_compared(done) & done.options.keys() & now.keys())
            if done.options[name] != now[name]
        ]
        if done.run.trace_digest is not None and done.run.trace_digest != digest:
            changed.append("another trace")
        if changed:
            differences.append(f"{level_dir_name(concurrency)} ran with {', '.join(changed)}")
    if differences:
        raise SweepError(
            f"{out_dir}: --resume would keep levels run with other settings than these ({'; '.join(differences)}); "
            "resume with the sweep's own settings, --resume-anyway to keep them all the same, or --overwrite to run it "
            "again"
        )


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else "off" if value is None else str(value)


LevelServer = Callable[[int, LevelSettings], str]
"""`level_server(concurrency, settings)`: the URL of a server set up for that level (the built-in simulator
restarted with the level's forced acceptance, say); called after the before-level command."""
OnLevel = Callable[[int, int, int], None]
"""`on_level_start(index, count, concurrency)`: a level is about to start (index from 1)."""
OnLevelDone = Callable[[LevelResult], None]


async def sweep(
    trace: Trace | PreparedTrace,
    base: ReplayOptions,
    options: SweepOptions,
    hooks: RunHooks | None = None,
    *,
    on_level_start: OnLevel | None = None,
    on_level_done: OnLevelDone | None = None,
    level_server: LevelServer | None = None,
) -> SweepResult:
    """Replay `trace` once per level of `options.concurrency` with `base`'s options (its concurrency, out_dir and
    forced acceptance replaced per level), writing each level into `out_dir/c{N}` and the index into sweep.json.
    The trace is prepared once (`prepare_trace`, unless it is prepared already): a session split or planned for one
    level is reused by the next.
    `level_server`, when given, names each level's server (its URL replaces `base.url` for that level).
    `hooks` go to every level's replay (`agentx.run.replay.replay`, which runs it the way `base.runtime` says).

    A stop of `hooks.stops` ends the current level early (its partial run is kept, marked "interrupted"), writes the
    index and returns with `interrupted` set. Cancelling the caller ends the current level at once (kept and marked
    the same), writes the index and raises CancelledError.
    """
    if not options.concurrency:
        raise SweepError("a sweep needs at least one concurrency level")
    if not isinstance(base.load, LaneLoad):
        raise SweepError(f"a concurrency sweep needs lanes (mode agentx or closed), not mode {base.load.mode!r}")
    out_dir = options.out_dir
    if not (options.resume or options.overwrite or options.extend) and (held := existing_sweep(out_dir)) is not None:
        raise SweepError(f"{out_dir} already holds a sweep ({held}); resume it, overwrite it, or choose another folder")
    levels = {
        concurrency: _level_options(
            base,
            concurrency,
            options.level_settings.get(concurrency, LevelSettings()),
            out_dir / level_dir_name(concurrency),
        )
        for concurrency in options.concurrency
    }
    earlier = read_index(out_dir) if options.resume or options.extend else None
    # Levels differ in concurrency, forced acceptance and extra body only: one preparation serves them all.
    prepared = trace if isinstance(trace, PreparedTrace) else prepare_trace(trace, base)
    if options.resume and not options.resume_anyway:
        _refuse_other_settings(out_dir, levels, trace_digest(prepared.trace))
    out_dir.mkdir(parents=True, exist_ok=True)
    # A resumed sweep's index keeps the levels it did not replay now: they are still on disk, and the report reads them.
    kept = [entry for entry in earlier.levels if entry.concurrency not in levels] if earlier is not None else []
    index = SweepIndex(
        trace=options.trace_label,
        gpu_sku=options.gpu_sku,
        num_gpus=options.num_gpus,
        seed=base.scenario.seed,
        concurrency=sorted({*options.concurrency, *(entry.concurrency for entry in kept)}),
    )
    results: list[LevelResult] = []
    interrupted = False
    cancellation = Cancellation()
    for position, concurrency in enumerate(options.concurrency, start=1):
        settings = options.level_settings.get(concurrency, LevelSettings())
        if on_level_start is not None:
            on_level_start(position, len(options.concurrency), concurrency)
        result = await _level(prepared, base, concurrency, levels[concurrency], settings, options, hooks, level_server)
        results.append(result)
        index.levels = sorted([*kept, *(done.entry for done in results)], key=lambda entry: entry.concurrency)
        write_index(out_dir, index)
        if on_level_done is not None:
            on_level_done(result)
        if cancellation.requested:  # the level's run and the index are written: asyncio's contract wants it raised
            raise asyncio.CancelledError
        if result.entry.status == "interrupted":
            interrupted = True
            break
    return SweepResult(out_dir=out_dir, levels=results, interrupted=interrupted)


async def _level(
    trace: PreparedTrace,
    base: ReplayOptions,
    concurrency: int,
    level: ReplayOptions,
    settings: LevelSettings,
    options: SweepOptions,
    hooks: RunHooks | None,
    level_server: LevelServer | None,
) -> LevelResult:
    run_dir = Path(level.out_dir)
    entry = LevelEntry(
        concurrency=concurrency,
        dir=level_dir_name(concurrency),
        status="ok",
        spec_al=level.speculative.al,
        spec_k=level.speculative.k,
    )
    if options.resume and (done := finished_run(run_dir)) is not None:
        entry.status = "kept"
        entry.elapsed_s = done.run.elapsed_s
        return LevelResult(entry=entry, run_dir=run_dir, summary=done.summary)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale or partial level: its records would mix with the new run's
    run_dir.mkdir(parents=True)
    started = time.monotonic()
    try:
        if options.before_level is not None:
            command = before_level_command(options.before_level, concurrency, settings, base)
            failure = await _run_before_level(command, run_dir / BEFORE_LEVEL_LOG, options.before_level_timeout_s)
            if failure is not None:
                entry.status, entry.error = "failed", failure
                return LevelResult(entry=entry, run_dir=run_dir)
        if level_server is not None:
            server = msgspec.structs.replace(level.server, url=level_server(concurrency, settings))
            level = msgspec.structs.replace(level, server=server)
        result = await replay(trace, level, hooks, num_gpus=options.num_gpus, trace_path=options.trace_label or None)
    except asyncio.CancelledError:  # the sweep raises it again once the index says so
        entry.status, entry.error = "interrupted", "cancelled"
        return LevelResult(entry=entry, run_dir=run_dir)
    except RunStopped:
        entry.status, entry.error = "interrupted", "stopped before the run started"
        return LevelResult(entry=entry, run_dir=run_dir)
    except Exception as exc:  # any failure of one level is recorded; the sweep goes on
        entry.status, entry.error = "failed", f"{type(exc).__name__}: {exc}"
        return LevelResult(entry=entry, run_dir=run_dir)
    finally:
        entry.elapsed_s = time.monotonic() - started
    run = result.run
    if run.cancel_reason == "interrupted":
        entry.status, entry.error = "interrupted", "stopped early (Ctrl-C or a stop)"
    elif run.cancel_reason is not None:
        entry.status, entry.error = "failed", f"the run stopped early: {run.cancel_reason}"
    elif result.summary.counts.profiling > 0 and result.summary.counts.kept == 0:
        counts = result.summary.counts
        entry.status, entry.error = "failed", f"no request succeeded ({counts.errors} of {counts.profiling} failed)"
    return LevelResult(entry=entry, run_dir=run_dir, summary=result.summary)


def sweep_sync(trace: Trace, base: ReplayOptions, options: SweepOptions) -> SweepResult:
    """`sweep` for code without an event loop."""
    return run_sync(sweep(trace, base, options), "agentx.sweep")
