"""The command line's manual, docs/cli.md: every command's `--help`, generated (`make docs`), so the page and the
commands never disagree (tests/test_cli_manual.py)."""

from __future__ import annotations

from collections.abc import Iterator

import click

WIDTH = 100
"""The help's width in the manual, the command line's own `max_content_width`."""
HEADER = """# agentx command line

Generated from each command's `--help` by `make docs` (`agentx/cli/manual.py`); do not edit. The guides say what the
options mean together: [replay.md](replay.md), [results.md](results.md), [synth.md](synth.md), [sim.md](sim.md),
[distributed.md](distributed.md), [agentx.md](agentx.md).
"""


def _commands(command: click.Command, parent: click.Context | None, name: str) -> Iterator[tuple[str, str]]:
    settings = {**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    context = click.Context(command, info_name=name, parent=parent, **settings)
    yield context.command_path, command.get_help(context)
    if isinstance(command, click.Group):
        for child_name in command.list_commands(context):
            child = command.get_command(context, child_name)
            if child is not None and not child.hidden:
                yield from _commands(child, context, child_name)


def manual(main: click.Command) -> str:
    """The Markdown page of `main` and every command under it, in the order `--help` lists them."""
    parts = [HEADER]
    for path, text in _commands(main, None, "agentx"):
        parts.append(f"## `{path}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    from agentx.cli import main as _main

    print(manual(_main), end="")
