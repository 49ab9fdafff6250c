"""The command line's manual, docs/cli.md: every command's `--help`, generated (`make docs`), so the page and the
commands never disagree (tests/cli/test_cli_manual.py)."""

from __future__ import annotations

from collections.abc import Iterator

import click

WIDTH = 100
"""The help's width in the manual, the command line's own `max_content_width`."""
HEADER = """# agentx command line

Generated from each command's `--help` by `make docs` (`agentx/cli/manual.py`); do not edit. The guides say what the
options mean together: [replay.md](replay.md), [results.md](results.md), [synth.md](synth.md), [sim.md](sim.md),
[distributed.md](distributed.md), [agentx.md](agentx.md).

Every command that reads a trace takes `--format` (to force a reader; by default the format is detected from the
content, not the file name) and `--block-size` (tokens per hash id, overriding the file's). Bad input never produces
a traceback: one paragraph naming the place, and exit code 2.

**Exit codes**: 0 a run that stands; 2 bad input (a flag, a trace, an unusable URL, an unreachable server, a run folder
that cannot be written as the run starts, an output that exists without `--overwrite`); 3 a run that ran but does not
stand, said in one line (the failure threshold cancelled it, the server stalled with requests in flight for
`--stall-timeout`, 900 s by default, the server stopped answering for `--server-loss-window`, no request succeeded,
under the harness's rules the profile metrics did not reach the last 5% of the duration, the realized speculative
acceptance disagrees with the forced one, a sweep level failed, a worker process died); 4 the run's files could not be
written once it had started (a full disk, a read-only file system, no permission, a quota, an I/O error): it stopped as
an interrupt stops it, its summary is printed, and the last line names the file and the condition and says what
records.arrow and run.json kept; 130 interrupted (Ctrl-C, SIGTERM or SIGHUP; a second one ends the grace period, and the
run is still written). Every error agentx raises for a user is an `agentx.AgentxError` of one kind, and the kind sets
the exit code (`agentx.cli.common.exit_code`): `TraceError` (a trace), `ConfigError` (an option or an input file to
change; a `ValueError` too), `ServerError` (unreachable, the model not served, calibration or a root warmup primer
failed) and `OutputUnwritable` (the run folder refused at the start) exit 2; `WriteFailed` (the run's files refused once
it ran) exits 4; another `RunError` (a run that could not complete: a worker process died) exits 3.
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
