"""The options several commands take, declared once: one name, one meaning and one wording of the help wherever a
command takes them (each command says only what the option applies to)."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

import click

from agentx.trace.io import FORMATS
from agentx.trace.validation import MAX_BLOCK_SIZE

F = TypeVar("F", bound=Callable[..., Any])


def json_flag(what: str, detail: str = "") -> Callable[[F], F]:
    """`--json` (parameter `as_json`): print `what` as JSON instead of the tables."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as JSON{detail}.")


def overwrite_flag(what: str, unless: str = "") -> Callable[[F], F]:
    """`--overwrite`: replace `what`, which is refused otherwise (a user's data is never replaced silently)."""
    return click.option("--overwrite", is_flag=True, help=f"Replace {what} (refused otherwise{unless}).")


def gpus_flag(*, overriding: bool = False) -> Callable[[F], F]:
    """`--gpus`: the GPUs behind the server, for per-GPU throughput (`overriding` what a run recorded)."""
    use = "overriding what was recorded" if overriding else "for per-GPU throughput"
    return click.option("--gpus", type=click.IntRange(min=1), help=f"GPUs behind the server, {use}.")


def gpu_skus() -> list[str]:
    """The GPU SKUs the built-in price table holds (agentx/results/report/gpu_prices.json), in its order."""
    table = resources.files("agentx").joinpath("results", "report", "gpu_prices.json").read_bytes()
    return list(json.loads(table)["gpus"])


def gpu_sku_flag(use: str) -> Callable[[F], F]:
    """`--gpu-sku`: which GPUs they are, for prices; `use` says what for here."""
    return click.option("--gpu-sku", metavar="SKU", help=f"The GPUs ({', '.join(gpu_skus())}), {use}.")


def repeat_flag(does: str) -> Callable[[F], F]:
    """`--repeat N`: `does` it N times into r1 ... rN of --out, indexed in repeats.json for `agentx compare`."""
    return click.option(
        "--repeat",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        metavar="N",
        help=f"{does} N times, one after another, into r1 ... rN of --out, indexed in its repeats.json for `agentx "
        "compare` (the first keeps --seed, the others derive theirs from it).",
    )


format_option = click.option(
    "--format", "input_format", type=click.Choice(FORMATS), help="Input format (default: detected from content)."
)
block_size_option = click.option(
    "--block-size",
    type=click.IntRange(min=1, max=MAX_BLOCK_SIZE),
    help="Tokens per hash id, overriding the file's.",
)


def frontier_flags(command: F) -> F:
    """`--statistic`, `--basis` and `--targets`: how a frontier is read (`agentx report`, `agentx compare`)."""
    command = click.option(
        "--targets", default="30,50,75,100,150,200", show_default=True, help="Interactivity targets (tok/s/user)."
    )(command)
    command = click.option(
        "--basis",
        type=click.Choice(("total", "output", "input")),
        default="total",
        show_default=True,
        help="Tokens the throughput counts.",
    )(command)
    return click.option(
        "--statistic",
        type=click.Choice(("p50", "p75", "p90", "p95", "p99", "mean")),
        default="p90",
        show_default=True,
        help="Interactivity = 1/TPOT at this statistic (p90: the rate 90% of requests reached at least).",
    )(command)
