"""`agentx spec`: engine settings and golden acceptance lengths for forced speculative decoding."""

from __future__ import annotations

import click
import msgspec

from agentx.cli.common import (
    fail,
)


@click.group()
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
        fail("pass exactly one of --al AL (an acceptance length in [1, K+1]) or --golden MODEL (a published one)")
    golden = None
    try:
        if golden_model is not None:
            golden = golden_al(golden_model, spec_k, thinking, variant)
            acceptance_length = golden.acceptance_length
        assert acceptance_length is not None  # one of the two was given, checked above
        settings = engine_settings(engine, acceptance_length, spec_k, method, as_rates=as_rates)
    except ValueError as exc:
        fail(str(exc))
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
        fail(str(exc))
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
