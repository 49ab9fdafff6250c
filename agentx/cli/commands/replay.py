"""`agentx replay` and `decode`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

if TYPE_CHECKING:
    from agentx.replayer.options.replay import ReplayOptions
    from agentx.replayer.plan.play import PreparedTrace
    from agentx.replayer.run_result import RunResult
    from agentx.replayer.schedule.hooks import RunHooks
    from agentx.results.summary.summarize import Summary
    from agentx.run.repeats import ReplayRepeats
    from agentx.run.replay import ReplayResult

from agentx.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_WRITE_FAILED,
    cluster_output,
    default_run_dir,
    fail,
    failing_against,
    load_to_replay,
    refuse_existing_run,
    run_interruptibly,
    stderr,
    stdout,
)
from agentx.cli.flags import GroupedCommand, part_flags
from agentx.cli.parsed import (
    DECODE_SERVER_SKIP,
    ParsedFlags,
    parsed,
    replay_flags,
    server_and_model,
    server_flags,
    sim_fields,
    speculative_flags,
)
from agentx.cli.repeats import refuse_existing_repeats, repeat_header, repeats_footer
from agentx.cli.shared_flags import block_size_option, format_option, gpus_flag, json_flag, overwrite_flag, repeat_flag
from agentx.errors import RunStopped, WriteFailed, os_condition
from agentx.replayer.options.replay import DecodeOptions
from agentx.trace.io import Format


@click.command(cls=GroupedCommand)
@click.argument("trace", type=click.Path(path_type=Path))
@replay_flags()
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), help="Run directory (default: runs/<time>-<random>)."
)
@overwrite_flag("the run already in --out")
@repeat_flag("Run it")
@gpus_flag()
@json_flag("the summary", " (with --repeat: the index and each repeat's summary)")
@format_option
@block_size_option
@parsed
def replay(
    trace: Path,
    served_models: tuple[str, ...],
    out_dir: Path | None,
    overwrite: bool,
    repeat: int,
    gpus: int | None,
    sim_time_scale: float,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
    flags: ParsedFlags,
) -> None:
    """Replay TRACE's session trees against an OpenAI-compatible server and summarize the run.

    Records stream to RUN_DIR/records.arrow as the run goes; RUN_DIR/run.json (options, run, summary) is
    written at the end. Progress shows on stderr: live on a terminal, else a line every 10 s. Ctrl-C (SIGTERM, SIGHUP)
    stops dispatching, lets in-flight requests finish within the grace period, and prints the partial summary
    (exit 130). With --repeat N, RUN_DIR/rK is the K-th run; Ctrl-C ends the set after the current run's graceful
    stop, and RUN_DIR/repeats.json indexes the runs that ran to their end. A full disk (or another write the OS
    refuses) once the run has started stops it likewise; the summary counts what it measured, and the last line says
    what records.arrow and run.json kept (exit 4).
    """
    import asyncio

    from agentx.cli.display.planned import planned_requests
    from agentx.cli.display.progress import ReplayProgress
    from agentx.replayer.plan.preparation import prepare_trace
    from agentx.run.progress import end_line
    from agentx.run.replay import over_processes
    from agentx.run.replay import replay as run_and_summarize

    tokenizer = flags.tokenizer
    if tokenizer is not None and flags.api != "chat":
        fail("--tokenizer calibrates chat prompts; it needs --api chat (completions prompts are token ids already)")
    if tokenizer is not None and not Path(tokenizer).is_file():
        fail(f"--tokenizer {tokenizer}: no such file")
    try:
        loaded = load_to_replay(trace, format=input_format, block_size=block_size)
        parts = flags.replay_parts()  # every flag checked before the simulator starts
        run_dir = out_dir or default_run_dir()
    except click.BadParameter as exc:
        fail(exc.format_message())
    if not overwrite:
        if repeat > 1:
            refuse_existing_repeats(run_dir, flags="--overwrite to replace them")
        else:
            refuse_existing_run(run_dir)
    model = served_models[0] if served_models else None
    with contextlib.ExitStack() as stack:
        url, model = server_and_model(
            stack,
            flags.url,
            model,
            "replaying against",
            flags,
            time_scale=sim_time_scale,
            block_size=loaded.block_size,
            **sim_fields(parts.speculative),
        )
        try:
            options = parts.options(flags.server(url, (model, *served_models[1:])), run_dir, overwrite=overwrite)
        except click.BadParameter as exc:
            fail(exc.format_message())
        # Prepared once for the progress's count and the run: an agentx run's first trees are planned once.
        prepared = prepare_trace(loaded, options)
        live = not over_processes(options)  # a run over processes shows no live progress: its records meet at its end
        progress = ReplayProgress(
            console=stderr if live else None,  # with --json too: stdout carries only the JSON
            duration_s=options.scenario.duration_s,
            planned=planned_requests(prepared, options) if live else None,
            grace_s=options.runtime.grace_s,
        )
        repeated: ReplayRepeats | None = None
        failed: WriteFailed | None = None
        try:
            with failing_against(url, "replay"):
                if repeat > 1:
                    repeated = _replay_repeats(trace, prepared, options, repeat, gpus, live)
                else:
                    ends = end_line(options.scenario, len(loaded.sessions))
                    if not live:  # a run over processes takes no callbacks: said before it starts
                        stderr.print(ends, markup=False)
                    result = run_interruptibly(
                        lambda hooks: run_and_summarize(prepared, options, hooks, num_gpus=gpus, trace_path=trace),
                        saying_its_end(progress.hooks(), ends) if live else None,
                        progress,
                        cluster_output(options),
                    )
        except WriteFailed as exc:  # the run stopped early; what it measured is summarized below, if it could be
            failed = exc
        except OSError as exc:  # none of the run's own files (those are a WriteFailed): still one line
            fail(f"{exc.filename or run_dir}: the run failed ({os_condition(exc)})", EXIT_RUN_FAILED)
        except (KeyboardInterrupt, asyncio.CancelledError, RunStopped):
            # Ctrl-C before the run started (probing the server), or a third one: nothing to summarize.
            stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
    if failed is not None:
        if failed.result is not None and repeat == 1:
            show_result(failed.result, trace, options, as_json=as_json, failed=failed)
        fail(str(failed), EXIT_WRITE_FAILED)
    if repeated is not None:
        _end_repeats(repeated, as_json, options.scenario.failed_request_threshold)
        return
    show_result(result, trace, options, as_json=as_json)
    if result.run.interrupted:
        stderr.print(interrupted_line(result), markup=False)
        sys.exit(EXIT_INTERRUPTED)
    failure = run_failure(result.summary, result.run, options.scenario.failed_request_threshold)
    if failure is not None:
        fail(failure, EXIT_RUN_FAILED)


def show_result(
    result: ReplayResult, trace: Path, options: ReplayOptions, *, as_json: bool, failed: WriteFailed | None = None
) -> None:
    """Print a run's summary on stdout (as JSON with `as_json`) with where its files are; `failed`: its files could not
    all be written (run.json is named only if it was)."""
    from agentx.records.run_folder import RUN_FILE, SERVER_METRICS_FILE

    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result.summary)).decode() + "\n")
        return
    from agentx.cli.display.summary_tables import summary_table  # rich: after the run, not before its first request

    folder = Path(result.run.records_path).parent
    engine = result.run.server.label
    title = f"replay of {trace}" + (f" on {engine}" if engine else "")
    if result.run.interrupted:
        title += " (interrupted)"
    elif failed is not None:
        title += " (its files could not all be written)"
    for table in summary_table(result.summary, title=title):
        stdout.print(table)
    written = failed is None or Path(result.run.records_path).is_file()
    stdout.print(f"records: {result.run.records_path if written else 'not written'}", markup=False)
    run_file = folder / RUN_FILE if failed is None else failed.run_file
    if run_file is not None:
        stdout.print(f"run: {run_file}", markup=False)
    telemetry = folder / SERVER_METRICS_FILE
    if telemetry.is_file():
        stdout.print(f"server metrics: {telemetry}", markup=False)
    if options.scenario.num_requests is not None:
        stdout.print(cap_line(options.scenario.num_requests, result.run.request_cap_reached, result), markup=False)


def interrupted_line(result: ReplayResult) -> str:
    """What an interrupted run says last: that it was, why, and what it kept."""
    reason = result.run.cancel_reason
    why = f" ({reason})" if reason and reason != "interrupted" else ""
    kept = f"{result.summary.counts.rows:,} requests"
    return f"interrupted: the run stopped early{why}; its records and run.json keep the {kept} it measured"


def _replay_repeats(
    trace: Path, prepared: PreparedTrace, options: ReplayOptions, repeats: int, gpus: int | None, live: bool
) -> ReplayRepeats:
    """Run the repeats (`agentx.run.repeats`), each under its header line and, when `live`, with its own progress on
    stderr."""

    from agentx.cli.display.planned import planned_requests
    from agentx.cli.display.progress import ReplayProgress, current_progress_hooks
    from agentx.results.folders.repeat_index import repeat_seed
    from agentx.run.repeats import replay_repeats

    progress = ReplayProgress(console=None)

    def start(number: int, count: int, seed: int) -> None:
        nonlocal progress
        stderr.print(repeat_header(number, count, seed), markup=False)
        if not live:
            return
        seeded = msgspec.structs.replace(options, scenario=msgspec.structs.replace(options.scenario, seed=seed))
        progress = ReplayProgress(
            console=stderr,
            duration_s=options.scenario.duration_s,
            planned=planned_requests(prepared, seeded),  # the seed draws the session order
            grace_s=options.runtime.grace_s,
        )
        progress.start()

    def done(number: int, result: ReplayResult) -> None:
        progress.close()
        failure = run_failure(result.summary, result.run, options.scenario.failed_request_threshold)
        line = repeat_line(number, repeat_seed(options.scenario.seed, number), result, failed=failure is not None)
        stderr.print(line, markup=False)

    # Each repeat has a progress of its own: the hooks feed the current one.
    try:
        return run_interruptibly(
            lambda hooks: replay_repeats(
                prepared,
                options,
                repeats,
                hooks,
                num_gpus=gpus,
                on_repeat_start=start,
                on_repeat_done=done,
                trace_path=trace,
            ),
            current_progress_hooks(lambda: progress) if live else None,
            cluster_output(options),
        )
    finally:
        progress.close()


def repeat_line(number: int, seed: int, result: ReplayResult, *, failed: bool = False) -> str:
    """A finished repeat's headline numbers in one line (`failed`: the run does not stand), e.g.
    `  r2 (seed 123): ok, 1,234 requests, 0 errors, 3,456 out tok/s, TTFT p50 123 ms`."""
    from agentx.cli.commands.sweep import seconds_text

    summary = result.summary
    counts = summary.counts
    status = "interrupted" if result.run.interrupted else "failed" if failed else "ok"
    line = f"  r{number} (seed {seed}): {status}, {counts.profiling:,} requests, {counts.errors:,} errors"
    if summary.throughput is not None:
        line += f", {summary.throughput.output_tps:,.0f} out tok/s"
    ttft = summary.latency.ttft_s
    return line + f", TTFT p50 {seconds_text(None if ttft is None else ttft.p50)}"


def _end_repeats(repeated: ReplayRepeats, as_json: bool, threshold: float | None) -> None:
    """Print the set's outcome (each repeat's line is on stderr already); exit 130 when it was interrupted, 3 when a
    repeat does not stand."""
    if as_json:
        document = {"repeats": repeated.index, "summaries": [result.summary for result in repeated.results]}
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(document)).decode() + "\n")
    else:
        stdout.print(repeats_footer(repeated.out_dir, len(repeated.index.dirs)), markup=False)
    if repeated.interrupted:
        stderr.print(f"interrupted: {len(repeated.index.dirs)} repeat(s) ran to their end", markup=False)
        sys.exit(EXIT_INTERRUPTED)
    failures = [
        f"r{number}: {failure}"
        for number, result in enumerate(repeated.results, start=1)
        if (failure := run_failure(result.summary, result.run, threshold)) is not None
    ]
    if failures:
        named = "; ".join(failures)
        fail(f"{len(failures)} of {len(repeated.results)} repeats do not stand ({named})", EXIT_RUN_FAILED)


def saying_its_end(hooks: RunHooks, line: str) -> RunHooks:
    """`hooks` that say `line` (what ends the run) on stderr as the profiling phase starts: once the server answered and
    the run is under way, so a run that cannot start says only why."""
    shown = hooks.on_profiling

    def on_profiling() -> None:
        stderr.print(line, markup=False)
        if shown is not None:
            shown()

    return msgspec.structs.replace(hooks, on_profiling=on_profiling)


def cap_line(cap: int, reached: bool, result: ReplayResult) -> str:
    """What `--num-requests` did, in one line under the summary."""
    if reached:
        return f"stopped at --num-requests {cap}: no request started after those, and those in flight finished"
    sent = result.summary.counts.profiling
    return f"--num-requests {cap} not reached: the run ended by itself after {sent:,} profiling requests"


def run_failure(summary: Summary, run: RunResult, threshold: float | None) -> str | None:
    """Why a run that ended by itself does not stand (exit 3), in one line; None when it does."""
    cancel_reason = run.cancel_reason
    counts = summary.counts
    kinds = counts.errors_text()
    failed = f"{counts.errors:,} of {counts.profiling:,} profiling requests failed" + (f" ({kinds})" if kinds else "")
    if cancel_reason == "worker_lost":
        return (
            f"a Ray worker was lost and the others were stopped (--on-worker-loss abort): {failed}; the shard and its "
            "node are in the warning above and in run.json (run.shards)"
        )
    if cancel_reason == "server_lost":
        at = "" if run.server_lost_at_s is None else f" {run.server_lost_at_s:,.1f} s into the run"
        return (
            f"the server stopped answering{at}: every request and probe was refused or reset before its first byte "
            f"(--on-server-loss stop); {failed}"
        )
    if cancel_reason == "stalled":
        return f"the server stopped making progress with requests in flight (--stall-timeout): {failed}"
    if cancel_reason == "failure_threshold":
        given = "" if threshold is None else f" {threshold:g}"
        return f"the run was cancelled by --failed-request-threshold{given}: {failed}"
    if counts.profiling > 0 and counts.kept == 0:
        cancelled = f", {counts.cancelled:,} cancelled" if counts.cancelled else ""
        return f"no request succeeded: {failed}{cancelled}"
    coverage = _coverage_failure(summary)
    if coverage is not None:
        return coverage
    if summary.acceptance is not None and summary.acceptance.mismatch:
        reasons = "; ".join(summary.acceptance.mismatch_reasons)
        return f"the realized speculative acceptance disagrees with the forced one: {reasons}"
    return None


def _coverage_failure(summary: Summary) -> str | None:
    """The coverage rule's failure, under a rule set that fails the run on it (the harness exits non-zero)."""
    from agentx.results.summary.checks.validity import INSUFFICIENT_COVERAGE, rules_of

    verdict = summary.validity
    if verdict is None or not verdict.applies or rules_of({"rules": summary.rules}).coverage != "last_metric":
        return None
    reason = next((r for r in verdict.explained if r.code == INSUFFICIENT_COVERAGE), None)
    return None if reason is None else f"insufficient profile metric coverage: {reason.message}"


@click.command("decode", cls=GroupedCommand)
@server_flags(DECODE_SERVER_SKIP)
@part_flags("decode", (DecodeOptions,), group="Load")
@speculative_flags
@click.option("--sim-time-scale", default=1.0, show_default=True, help="Simulator clock (wall s per simulated s).")
@json_flag("the result")
@parsed
def decode_command(served_models: tuple[str, ...], sim_time_scale: float, as_json: bool, flags: ParsedFlags) -> None:
    """Measure decode-only speed: tokens/s per user with prefill excluded, p50/p90, beside the realized AL.

    Each of --repetitions waves sends --concurrency streamed requests of --isl prompt tokens forcing --osl output
    tokens; a request's decode speed is its tokens after the first chunk over the time from its first to its last
    token. Without --url the built-in simulator serves it (with --spec-al and --spec-k as its forced acceptance).
    """
    from agentx.cli.display.tables import decode_tables
    from agentx.run.decode import decode_sync

    if len(served_models) > 1:
        fail("decode measures one model: pass --model once")
    try:
        speculative = flags.speculative()
        connection = flags.connection()
        measure = flags.decode_values()
        flags.check_server()  # header and body flags, before a simulator starts
    except click.BadParameter as exc:
        fail(exc.format_message())
    with contextlib.ExitStack() as stack:
        url, model = server_and_model(
            stack,
            flags.url,
            next(iter(served_models), None),
            "measuring",
            flags,
            time_scale=sim_time_scale,
            **sim_fields(speculative),
        )
        try:
            server = flags.server(url, (model,))
        except click.BadParameter as exc:
            fail(exc.format_message())
        options = DecodeOptions(server=server, connection=connection, speculative=speculative, **measure)
        try:
            with failing_against(url, "measure"):
                result = decode_sync(options)
        except KeyboardInterrupt:
            stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result)).decode() + "\n")
    else:
        for table in decode_tables(result, title=f"decode-only speed at {url}"):
            stdout.print(table)
    if result.decode_tps is None:
        fail(
            f"no request produced a token after its first ({result.failed} of {len(result.samples)} failed)",
            EXIT_RUN_FAILED,
        )
    if result.acceptance.mismatch:
        reasons = "; ".join(result.acceptance.mismatch_reasons)
        fail(f"the realized speculative acceptance disagrees with the forced one: {reasons}", EXIT_RUN_FAILED)
