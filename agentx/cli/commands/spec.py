"""`agentx spec`: engine settings and golden acceptance lengths for forced speculative decoding."""

from __future__ import annotations

import click
import msgspec

from agentx.cli.common import fail
from agentx.cli.shared_flags import json_flag
from agentx.engines import ENGINES


@click.group()
def spec() -> None:
    """Speculative decoding at a fixed acceptance length (AL): engine settings and published golden ALs."""


@spec.command("flags")
@click.option("--engine", required=True, help=f"{', '.join(ENGINES[:-1])} or {ENGINES[-1]}.")
@click.option("--al", "acceptance_length", type=float, help="Acceptance length: tokens per step, bonus included.")
@click.option("--golden", "golden_model", metavar="MODEL", help="Take the AL from MODEL's golden curve at --k.")
@click.option("--k", "spec_k", type=int, required=True, help="Draft (speculative) tokens per step, K.")
@click.option("--thinking/--no-thinking", default=True, show_default=True, help="--golden: which curve.")
@click.option("--variant", help="--golden: the recipe variant (source file stem, or part of it).")
@click.option("--method", help="Speculative method for the engine (mtp, eagle3, dspark, ...).")
@click.option("--rates", "as_rates", is_flag=True, help="Per-position rates instead of the length, where supported.")
@json_flag("the engine settings", ", one object for harnesses")
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
@click.option("--list", "list_curves", is_flag=True, help="List the published curves: model, variant, modes, K.")
@click.option("--model", help="Model name or alias (case, -, _ and . ignored; e.g. kimi-k3).")
@click.option("--k", "spec_k", type=int, help="One K (draft tokens); without it, the whole curve.")
@click.option("--thinking/--no-thinking", default=True, show_default=True, help="Which curve.")
@click.option("--variant", help="The recipe variant (source file stem, or part of it); default: the plain recipe.")
@json_flag("the value with its source (or the whole curve)")
def spec_golden(
    list_curves: bool, model: str | None, spec_k: int | None, thinking: bool, variant: str | None, as_json: bool
) -> None:
    """Print a published golden AL (the number alone on stdout, its source on stderr), a model's curve, or with
    --list every curve shipped with agentx."""
    from agentx.spec.golden import curve_lines, find_curve, golden_al, source_line

    if list_curves:
        if model is not None or spec_k is not None or variant is not None:
            fail("--list lists every curve; pass it alone (or with --json), or --model M [--k K] for one")
        _list_golden(as_json)
        return
    if model is None:
        fail("pass --model M (a curve, or its AL at --k K), or --list to see the published models")
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


class CurveListing(msgspec.Struct, frozen=True, kw_only=True):
    """One published curve, as `spec golden --list` shows it."""

    model: str
    variant: str
    default: bool
    """The curve a lookup without --variant takes."""
    thinking: tuple[str, ...]
    """The modes published: "on" (--thinking), "off" (--no-thinking)."""
    spec_k: tuple[int, ...]
    method: str
    hardware: str
    source_url: str


def _list_golden(as_json: bool) -> None:
    """`spec golden --list`: one line per curve (a model measured with several recipes has one per variant)."""
    from agentx.spec.golden import load_golden_table

    listing = [
        CurveListing(
            model=curve.model,
            variant=curve.variant,
            default=curve.default,
            thinking=tuple(mode for mode, ks in (("on", curve.thinking_on), ("off", curve.thinking_off)) if ks),
            spec_k=tuple(sorted(set(curve.thinking_on) | set(curve.thinking_off))),
            method=curve.method,
            hardware=curve.hardware,
            source_url=curve.source_url,
        )
        for curve in load_golden_table().curves
    ]
    if as_json:
        click.echo(msgspec.json.encode(listing).decode())
        return
    header = ("model", "variant", "thinking", "K", "method")
    table = [
        (
            row.model,
            row.variant + (" (default)" if row.default else ""),
            "/".join(row.thinking),
            f"{row.spec_k[0]}..{row.spec_k[-1]}" if row.spec_k else "-",
            f"{row.method} on {row.hardware}",
        )
        for row in listing
    ]
    widths = [max(len(line[column]) for line in (header, *table)) for column in range(len(header))]
    for line in (header, *table):
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    click.echo("one value: agentx spec golden --model M --k K [--no-thinking] [--variant V]")
