"""`agentx replay` and `decode`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

if TYPE_CHECKING:
    from agentx.results.summary.summarize import Summary
    from agentx.run.replay import ReplayResult

from agentx.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    block_size_option,
    cluster_output,
    default_run_dir,
    fail,
    failing_against,
    format_option,
    interruptible,
    load_to_replay,
    refuse_existing_run,
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
from agentx.replayer.options.replay import DecodeOptions
from agentx.trace.io import Format


@click.command(cls=GroupedCommand)
@click.argument("trace", type=click.Path(path_type=Path))
@replay_flags()
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), help="Run directory (default: runs/<time>-<random>)."
)
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out (refused otherwise).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, for per-GPU throughput.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@format_option
@block_size_option
@parsed
def replay(
    trace: Path,
    served_models: tuple[str, ...],
    out_dir: Path | None,
    overwrite: bool,
    gpus: int | None,
    sim_time_scale: float,
    as_json: bool,
    input_format: Format | None,
    block_size: int | None,
    flags: ParsedFlags,
) -> None:
    """Replay TRACE's session trees against an OpenAI-compatible server and summarize the run.

    Records stream to RUN_DIR/records.arrow as the run goes; RUN_DIR/run.json (options, run, summary) is
    written at the end. Progress shows on stderr: live on a terminal, else a line every 10 s. Ctrl-C (or SIGTERM)
    stops dispatching, lets in-flight requests finish within the grace period, and prints the partial summary
    (exit 130).
    """
    import asyncio

    from agentx.cli.display.planned import planned_requests
    from agentx.cli.display.progress import ReplayProgress
    from agentx.records.run_folder import RUN_FILE
    from agentx.replayer.plan.preparation import prepare_trace
    from agentx.replayer.schedule.clock import loop_factory
    from agentx.replayer.telemetry.arrow_file import SERVER_METRICS_FILE
    from agentx.run.replay import replay as run_and_summarize
    from agentx.run.replay import replay_workers

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
        workers = options.runtime.workers
        over_processes = workers > 1 and options.runtime.ray is None  # no live progress: records meet at the end
        progress = ReplayProgress(
            console=stderr,  # with --json too: stdout carries only the JSON
            duration_s=options.scenario.duration_s,
            planned=None if over_processes else planned_requests(prepared, options),
            grace_s=options.runtime.grace_s,
        )
        try:
            with failing_against(url, "replay"):
                if over_processes:
                    result = replay_workers(
                        trace, options, workers, num_gpus=gpus, trace_format=input_format, block_size=block_size
                    )
                else:
                    work = interruptible(
                        run_and_summarize(
                            prepared,
                            options,
                            num_gpus=gpus,
                            on_record=progress.on_record,
                            on_sent=progress.on_sent,
                            on_profiling=progress.on_profiling,
                            trace_path=trace,
                        )
                    )
                    with asyncio.Runner(loop_factory=loop_factory()) as runner, progress, cluster_output(options):
                        result = runner.run(work)
        except OSError as exc:
            if exc.filename is None:  # not a file of the run: a bug, shown as one
                raise
            fail(f"{exc.filename}: cannot write the run ({exc.strerror or exc})")
        except (KeyboardInterrupt, asyncio.CancelledError):
            # Ctrl-C outside the replay itself (probing, scraping metrics): nothing to summarize yet.
            stderr.print("interrupted", markup=False)
            sys.exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result.summary)).decode() + "\n")
    else:
        from agentx.cli.display.summary_tables import summary_table  # rich: after the run, not before its first request

        engine = result.run.server.label
        title = f"replay of {trace}" + (f" on {engine}" if engine else "")
        for table in summary_table(result.summary, title=title):
            stdout.print(table)
        stdout.print(f"records: {result.run.records_path}", markup=False)
        stdout.print(f"run: {Path(result.run.records_path).parent / RUN_FILE}", markup=False)
        telemetry = Path(result.run.records_path).parent / SERVER_METRICS_FILE
        if telemetry.is_file():
            stdout.print(f"server metrics: {telemetry}", markup=False)
        if options.scenario.num_requests is not None:
            stdout.print(cap_line(options.scenario.num_requests, result.run.request_cap_reached, result), markup=False)
    if result.run.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    failure = run_failure(result.summary, result.run.cancel_reason, options.scenario.failed_request_threshold)
    if failure is not None:
        fail(failure, EXIT_RUN_FAILED)


def cap_line(cap: int, reached: bool, result: ReplayResult) -> str:
    """What `--num-requests` did, in one line under the summary."""
    if reached:
        return f"stopped at --num-requests {cap}: no request started after those, and those in flight finished"
    sent = result.summary.counts.profiling
    return f"--num-requests {cap} not reached: the run ended by itself after {sent:,} profiling requests"


def run_failure(summary: Summary, cancel_reason: str | None, threshold: float | None) -> str | None:
    """Why a run that ended by itself does not stand (exit 3), in one line; None when it does."""
    counts = summary.counts
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(counts.errors_by_kind.items()))
    failed = f"{counts.errors:,} of {counts.profiling:,} profiling requests failed" + (f" ({kinds})" if kinds else "")
    if cancel_reason == "worker_lost":
        return (
            f"a Ray worker was lost and the others were stopped (--on-worker-loss abort): {failed}; the shard and its "
            "node are in the warning above and in run.json (run.shards)"
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
    from agentx.results.summary.validity import INSUFFICIENT_COVERAGE, rules_of

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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
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
