"""`agentx synth`: traces from logs and from a model."""

from __future__ import annotations

import time
from pathlib import Path

import click
import msgspec

from agentx.cli.common import fail, stdout
from agentx.cli.shared_flags import json_flag, overwrite_flag
from agentx.errors import cli_words
from agentx.trace.io import load_trace, save_trace


@click.group()
def synth() -> None:
    """Make traces: from private logs (anonymized) or from a statistical model."""


def _model_map(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    mapping = []
    for pair in pairs:
        source, sep, target = pair.partition("=")
        if not sep or not source or not target:
            fail(f"--model-map {pair!r}: expected FROM=TO, e.g. claude-opus-4-5=big")
        mapping.append((source, target))
    return tuple(mapping)


@synth.command("from-logs")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "log_format",
    required=True,
    type=click.Choice(("anthropic-proxy", "openai-proxy", "claude-code", "codex")),
    help="Input kind: proxy-capture JSONL (Anthropic Messages or OpenAI chat), Claude Code folders, or Codex CLI "
    "rollouts (files or ~/.codex/sessions folders; ids from the cached-token counts, global scope, no tokenizer).",
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
@overwrite_flag("--out if it exists")
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
    overwrite: bool,
) -> None:
    """Turn logs (INPUTS: files or folders) into an anonymized trace: lengths, times, block ids, agent tree."""
    from agentx.records.run_folder import refuse_existing_file
    from agentx.synth.logs.from_logs import from_logs
    from agentx.synth.logs.hashing import read_salt
    from agentx.synth.logs.options import FromLogsOptions
    from agentx.trace.validation import validate as validate_trace

    refuse_existing_file(out, overwrite, named_by="--out")  # before reading the logs
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
    except ValueError as exc:
        fail(cli_words(exc))
    errors = [finding for finding in validate_trace(trace) if finding.severity == "error"]
    if errors:  # a bug, not bad input: say so plainly
        fail(f"the synthesized trace is invalid ({errors[0]}); please report this")
    try:
        save_trace(trace, out)
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    stdout.print(
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
@overwrite_flag("--out if it exists")
def synth_generate(
    preset_name: str | None,
    like: Path | None,
    sessions: int | None,
    seed: int,
    scope: str | None,
    out: Path,
    overwrite: bool,
) -> None:
    """Generate sessions from a preset or from a model fitted to a trace (more sessions, never compressed time)."""
    from agentx.records.run_folder import refuse_existing_file
    from agentx.synth.fitting import fit
    from agentx.synth.generation import generate
    from agentx.synth.presets import PRESETS, preset

    if (preset_name is None) == (like is None):
        fail(f"pass exactly one of --preset NAME ({', '.join(PRESETS)}) or --like TRACE")
    refuse_existing_file(out, overwrite, named_by="--out")  # before fitting a large trace
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
    except ValueError as exc:
        fail(cli_words(exc))
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    stdout.print(
        f"wrote {out}: {len(trace.sessions):,} sessions, {trace.request_count:,} requests "
        f"in {time.perf_counter() - started:.2f} s",
        markup=False,
    )


@synth.command("compare")
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@json_flag("the comparison")
def synth_compare(trace_a: Path, trace_b: Path, as_json: bool) -> None:
    """How alike TRACE_A and TRACE_B are: KS distances, prefix-cache hit-rate curves, a verdict."""
    from agentx.synth.fidelity import compare

    fidelity = compare(load_trace(trace_a), load_trace(trace_b))
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
