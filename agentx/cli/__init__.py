"""The `agentx` command line: parse, call the library, print. One module per group of commands."""

from __future__ import annotations

import logging
import sys

import click

from agentx.cli.common import Group
from agentx.cli.replay import decode_command, export, replay
from agentx.cli.report import report_command
from agentx.cli.sim import sim
from agentx.cli.spec import spec
from agentx.cli.sweep import sweep_command
from agentx.cli.synth import synth
from agentx.cli.trace import compare_command, convert, inspect, validate


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="agentx")
def main() -> None:
    """Replay agentic LLM workloads against OpenAI-compatible inference servers."""
    # The library says what a user must know mid-run (a long warmup, say) as warnings of the "agentx" logger;
    # the command line shows them on stderr, one line each.
    log = logging.getLogger("agentx")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False


for _command in (
    validate,
    convert,
    inspect,
    sim,
    replay,
    decode_command,
    export,
    sweep_command,
    report_command,
    spec,
    synth,
    compare_command,
):
    main.add_command(_command)
