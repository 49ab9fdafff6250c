"""The `agentx` command line: parse, call the library, print. One module per group of commands."""

from __future__ import annotations

# First: from here on, a stop signal during the imports and the parsing ends the program with one line.
import agentx.cli.early_stop  # noqa: F401

# isort: split
import logging
import os
import sys

import click

from agentx.cli.common import Group
from agentx.distribution import DISTRIBUTION

COMMANDS = {
    "validate": "agentx.cli.commands.trace:validate",
    "convert": "agentx.cli.commands.trace:convert",
    "inspect": "agentx.cli.commands.trace:inspect",
    "sim": "agentx.cli.commands.sim:sim",
    "replay": "agentx.cli.commands.replay:replay",
    "decode": "agentx.cli.commands.replay:decode_command",
    "export": "agentx.cli.commands.export:export",
    "import": "agentx.cli.commands.imports:import_group",
    "sweep": "agentx.cli.commands.sweep:sweep_command",
    "frontier": "agentx.cli.commands.frontier:frontier_command",
    "report": "agentx.cli.commands.report:report_command",
    "compare": "agentx.cli.commands.compare:compare_command",
    "spec": "agentx.cli.commands.spec:spec",
    "synth": "agentx.cli.commands.synth:synth",
}
"""Every command, by name: its module and attribute (imported when used; see `Group`)."""


@click.group(
    cls=Group,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name=DISTRIBUTION, message=f"%(prog)s ({DISTRIBUTION}) %(version)s")
def main() -> None:
    """Replay agentic LLM workloads against OpenAI-compatible inference servers."""
    # Arrow's own pool (mimalloc) keeps what it frees; the system allocator (tuned by `lean_heap`) gives it back:
    # setup A's whole-life peak went from 212 to 148 MB (bench/replay_overhead.py --cli-peak). Arrow reads this at its
    # first allocation, which no command has made yet; a user's own setting stands.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # The library says what a user must know mid-run (a long warmup, say) as warnings of the "agentx" logger;
    # the command line shows them on stderr, one line each.
    log = logging.getLogger("agentx")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False
