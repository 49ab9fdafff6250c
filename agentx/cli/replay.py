"""`agentx replay`, `decode` and `export`."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

if TYPE_CHECKING:
    from agentx.results.summary import Summary

from agentx.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    block_size_option,
    default_run_dir,
    fail,
    format_option,
    interruptible,
    loop_factory,
    refuse_existing_run,
    server_and_model,
    stderr,
    stdout,
)
from agentx.cli.options import (
    api_key,
    forced_acceptance,
    idle_timeout_option,
    parse_chain_rules,
    parse_extra_body,
    parse_header,
    parse_window,
    positive_int,
    replay_flags,
    request_timeout_option,
    seconds_or_off,
    spec_options,
    timeouts,
    url_option,
)
from agentx.trace.io import Format, load_trace


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@replay_flags
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Lanes (session trees).")
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), help="Run directory (default: runs/<time>-<random>)."
)
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out (refused otherwise).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs behind the server, for per-GPU throughput.")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Shard the lanes over this many processes (when one core cannot keep up; no live progress).",
)
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@format_option
@block_size_option
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
    request_timeout: str,
    idle_timeout: str,
    session_order: str,
    seed: int,
    delay_scale: float,
    ramp_s: float,
    api: str,
    stream_usage: str,
    tokenizer: Path | None,
    out_dir: Path | None,
    overwrite: bool,
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
    written at the end. Progress shows on stderr when it is a terminal (not with --json). Ctrl-C (or SIGTERM)
    stops dispatching, lets in-flight requests finish within the grace period, and prints the partial summary
    (exit 130).
    """
    from agentx.cli.summary_tables import summary_table
    from agentx.cli.tables import ReplayProgress, planned_requests
    from agentx.replayer.calibrate import CalibrationError
    from agentx.replayer.client import CONTEXT_OVERFLOW_SUBSTRINGS, ModelNotServed, ServerUnreachable
    from agentx.replayer.engine import ReplayOptions, WarmupFailed
    from agentx.replayer.run_folder import RUN_FILE
    from agentx.run.replay import replay as run_and_summarize
    from agentx.run.replay import replay_workers

    if tokenizer is not None and api != "chat":
        fail("--tokenizer calibrates chat prompts; it needs --api chat (completions prompts are token ids already)")
    if tokenizer is not None and not tokenizer.is_file():
        fail(f"--tokenizer {tokenizer}: no such file")
    try:
        loaded = load_trace(trace, format=input_format, block_size=block_size)
        parsed_headers = tuple(parse_header(h) for h in headers)
        window = parse_window(tstar_window)
        system_cap = seconds_or_off("--system-idle-cap", system_idle_cap)
        request_timeout_s, idle_timeout_s = timeouts(request_timeout, idle_timeout)
        rules = parse_chain_rules(chain_rules)
        primer_tokens = (
            None if warmup_max_tokens == "recorded" else positive_int("--warmup-max-tokens", warmup_max_tokens)
        )
        body = parse_extra_body(extra_body)
        forced = forced_acceptance(spec_al, spec_k, spec_golden, spec_thinking)
    except (click.BadParameter, msgspec.DecodeError) as exc:
        fail(str(exc))
    run_dir = out_dir or default_run_dir()
    if not overwrite:
        refuse_existing_run(run_dir)
    model = served_models[0] if served_models else None
    with contextlib.ExitStack() as stack:
        url, model = server_and_model(
            stack,
            url,
            model,
            "replaying against",
            time_scale=sim_time_scale,
            block_size=loaded.block_size,
            **forced.sim_fields(),
        )
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
            overwrite=overwrite,
            concurrency=concurrency,
            duration_s=duration_s,
            sessions=sessions,
            grace_s=grace_s,
            request_timeout_s=request_timeout_s,
            idle_timeout_s=idle_timeout_s,
            session_order=session_order,  # type: ignore[arg-type]
            seed=seed,
            delay_scale=delay_scale,
            ramp_s=ramp_s,
            api=api,  # type: ignore[arg-type]
            stream_usage=stream_usage,  # type: ignore[arg-type]
            tokenizer=None if tokenizer is None else str(tokenizer),
            api_key=api_key(api_key_env, parsed_headers),
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
            console=None if as_json else stderr, duration_s=duration_s, planned=planned_requests(loaded, options)
        )
        try:
            if workers > 1:
                result = replay_workers(
                    trace, options, workers, num_gpus=gpus, trace_format=input_format, block_size=block_size
                )
            else:
                work = interruptible(
                    run_and_summarize(
                        loaded, options, num_gpus=gpus, on_record=progress.on_record, on_sent=progress.on_sent
                    )
                )
                with asyncio.Runner(loop_factory=loop_factory()) as runner, progress:
                    result = runner.run(work)
        except WarmupFailed as exc:
            fail(f"{url}: {exc}")
        except CalibrationError as exc:
            fail(f"{url}: cannot calibrate chat prompts: {exc}")
        except ServerUnreachable as exc:
            fail(f"{url}: the server is unreachable ({exc})")
        except ModelNotServed as exc:
            fail(f"{url}: {exc}")
        except ValueError as exc:  # options the engine refuses before any request (e.g. an unsupported --api)
            fail(f"cannot replay with these options: {exc}")
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
        engine = result.run.server.label
        title = f"replay of {trace}" + (f" on {engine}" if engine else "")
        for table in summary_table(result.summary, title=title):
            stdout.print(table)
        stdout.print(f"records: {result.run.records_path}", markup=False)
        stdout.print(f"run: {Path(result.run.records_path).parent / RUN_FILE}", markup=False)
    if result.run.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    failure = run_failure(result.summary, result.run.cancel_reason, failed_request_threshold)
    if failure is not None:
        fail(failure, EXIT_RUN_FAILED)


def run_failure(summary: Summary, cancel_reason: str | None, threshold: float | None) -> str | None:
    """Why a run that ended by itself does not stand (exit 3), in one line; None when it does."""
    counts = summary.counts
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(counts.errors_by_kind.items()))
    failed = f"{counts.errors:,} of {counts.profiling:,} profiling requests failed" + (f" ({kinds})" if kinds else "")
    if cancel_reason == "failure_threshold":
        given = "" if threshold is None else f" {threshold:g}"
        return f"the run was cancelled by --failed-request-threshold{given}: {failed}"
    if counts.profiling > 0 and counts.kept == 0:
        cancelled = f", {counts.cancelled:,} cancelled" if counts.cancelled else ""
        return f"no request succeeded: {failed}{cancelled}"
    if summary.acceptance is not None and summary.acceptance.mismatch:
        reasons = "; ".join(summary.acceptance.mismatch_reasons)
        return f"the realized speculative acceptance disagrees with the forced one: {reasons}"
    return None


@click.command("decode")
@url_option
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
@request_timeout_option
@idle_timeout_option
@spec_options
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
    request_timeout: str,
    idle_timeout: str,
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
    from agentx.cli.tables import decode_tables
    from agentx.replayer.client import ModelNotServed, ServerUnreachable
    from agentx.run.decode import DecodeOptions, decode_sync

    try:
        forced = forced_acceptance(spec_al, spec_k, spec_golden, spec_thinking)
        parsed_headers = tuple(parse_header(h) for h in headers)
        body = parse_extra_body(extra_body)
        request_timeout_s, idle_timeout_s = timeouts(request_timeout, idle_timeout)
    except (click.BadParameter, msgspec.DecodeError) as exc:
        fail(str(exc))
    with contextlib.ExitStack() as stack:
        url, model = server_and_model(stack, url, model, "measuring", time_scale=sim_time_scale, **forced.sim_fields())
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
            api_key=api_key(api_key_env, parsed_headers),
            headers=parsed_headers,
            extra_body=body,
            request_timeout_s=request_timeout_s,
            idle_timeout_s=idle_timeout_s,
            spec_al=forced.al,
            spec_k=forced.k,
            spec_al_tolerance=spec_tolerance,
            stream_interval=stream_interval,
        )
        try:
            result = decode_sync(options)
        except ServerUnreachable as exc:
            fail(f"{url}: the server is unreachable ({exc})")
        except ModelNotServed as exc:
            fail(f"{url}: {exc}")
        except ValueError as exc:
            fail(f"cannot measure with these options: {exc}")
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


@click.command()
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
        fail(f"{exc}. Pass the directory a replay wrote (its --out), which holds records.arrow and run.json.")
    except OSError as exc:
        fail(f"{exc.filename or out}: cannot write the export ({exc.strerror or exc})")
    stdout.print(f"wrote {written} in {time.perf_counter() - started:.2f} s", markup=False)
    if export_format == "aiperf-summary":
        metadata = msgspec.json.decode(written.read_bytes())["metadata"]
        reasons = ", ".join(metadata["submission_invalid_reasons"]) or "none"
        valid = "true" if metadata["submission_valid"] else "false"
        stdout.print(f"submission_valid: {valid} (reasons: {reasons})", markup=False)
        if metadata["agentx"]["validity"]["run_file_missing"]:
            note = f"{run_dir} has no run.json (a crashed or unfinished run): counted as run_cancelled"
            stderr.print(note, markup=False)
