"""Every `--flag` README.md and docs/*.md name exists: on the command it is used with (a command line, or a row of a
table whose first cell names the command), else on some agentx command. Flags of other tools are listed in
`FOREIGN` with the tool they belong to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from paths import REPO

from agentx.cli import main

DOCS = [REPO / "README.md", *sorted(path for path in (REPO / "docs").glob("*.md") if path.name != "cli.md")]
"""The hand-written documents (docs/cli.md is the commands' own help: tests/cli/test_cli_manual.py)."""
FOREIGN: dict[str, str] = {
    # AIPerf 0.13.0, the AgentX reference (docs/agentx.md compares its options with agentx's)
    "--agentic-cache-warmup-duration": "AIPerf",
    "--agentic-warmup-grace-period": "AIPerf",
    "--benchmark-grace-period": "AIPerf",
    "--burst-phase-starts": "AIPerf",
    "--hf-weka-dataset": "AIPerf",
    "--ignore-trace-delays": "AIPerf",
    "--inter-turn-delay-cap-seconds": "AIPerf",
    "--num-dataset-entries": "AIPerf",
    "--public-dataset": "AIPerf",
    "--request-count": "AIPerf",
    "--synthesis-max-isl": "AIPerf",
    "--synthesis-max-osl": "AIPerf",
    "--trace-idle-gap-cap-seconds": "AIPerf",
    "--unsafe-override": "AIPerf",
    "--use-server-token-count": "AIPerf",
    "--use-think-time-only": "AIPerf",
    "--warmup-grace-period": "AIPerf",
    # Ray's command line (docs/distributed.md: starting a cluster)
    "--head": "Ray",
    "--address": "Ray",
    # inference servers and their benchmarks
    "--metrics": "llama.cpp's llama-server",
    "--enable-prompt-tokens-details": "vLLM",
    "--num-prompts": "vLLM bench",
    "--goodput": "vLLM bench (and AIPerf; docs/replay.md compares --slo with it)",
    "--metric-percentiles": "vLLM bench (docs/replay.md: what --percentiles matches)",
    "--num-speculative-tokens": "a server launch script (docs/results.md's --before-level example)",
    # the repository's tools and scripts
    "--strict": "mypy",
    "--hypothesis-profile": "pytest's Hypothesis plugin (docs/development.md: the fast tier)",
    "--fixture": "scripts/aiperf_export_keys.py",
}
"""Flags of other tools the documents name, and whose they are."""
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?:\.\.\.|\*)?")
"""A flag; `--fault-...` or `--spec-*` names a family of flags."""
COMMAND = re.compile(r"\bagentx ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
CODE_SPAN = re.compile(r"`([^`]+)`")


def _commands() -> dict[str, set[str]]:
    """Every agentx command ("replay", "spec golden", ...) and the option names it takes."""
    found: dict[str, set[str]] = {}

    def walk(command: click.Command, path: str, ctx: click.Context) -> None:
        names = {name for param in command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)}
        found[path] = names
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}".strip(), click.Context(sub, parent=ctx, info_name=name))

    # With the group's settings, as the command line makes its context: click keeps each command's help option as
    # the first context it sees made it (`-h, --help` here), and docs/cli.md is generated in the same process.
    walk(main, "", click.Context(main, info_name="agentx", **main.context_settings))
    return found


COMMANDS = _commands()
ANY: set[str] = set().union(*COMMANDS.values())


def _command_of(match: re.Match[str]) -> str | None:
    """The command a match of `COMMAND` names ("spec golden", "replay"), or None when it names none."""
    first, second = match.group(1), match.group(2)
    if second and f"{first} {second}" in COMMANDS:
        return f"{first} {second}"
    return first if first in COMMANDS else None


def _used(text: str) -> Iterator[tuple[set[str] | None, str]]:
    """(the commands a flag may belong to, None for any; the flag) for every flag in `text`, a piece of one line.
    After `agentx COMMAND` a flag is that command's, up to the next `agentx` or the end of the piece."""
    cuts = [(m.start(), _command_of(m)) for m in COMMAND.finditer(text)]
    for flag in FLAG.finditer(text):
        before = [command for start, command in cuts if start < flag.start()]
        named = before[-1] if before else None
        yield ({named} if named else None), flag.group(0)


def _lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block) with backslash-continued command lines joined."""
    fenced = False
    pending = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield number, pending + line, fenced
        pending = ""


def _uses(path: Path) -> Iterator[tuple[str, set[str] | None, str]]:
    """(where, the commands it may belong to or None for any, flag) for every flag `path` names."""
    for number, line, fenced in _lines(path):
        where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}"
        if fenced:
            for commands, flag in _used(line):
                yield where, commands, flag
            continue
        row: set[str] = set()
        if line.startswith("|"):  # a table row whose first cell names commands: the row's flags are theirs
            first_cell = line.replace("\\|", "/").split("|")[1]
            row = {command for m in COMMAND.finditer(first_cell) if (command := _command_of(m))}
        for span in CODE_SPAN.finditer(line.replace("\\|", "|")):
            for commands, flag in _used(span.group(1)):
                yield where, commands or row or None, flag
        for commands, flag in _used(CODE_SPAN.sub(" ", line)):  # plain text
            yield where, commands or row or None, flag


def _exists(flag: str, commands: set[str] | None) -> bool:
    names = ANY if commands is None else set().union(*(COMMANDS[command] for command in commands))
    if flag.endswith(("...", "*")):  # a family: `--fault-...`, `--spec-*`
        return any(name.startswith(flag.rstrip(".*")) for name in names)
    return flag in names


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_every_flag_the_docs_name_exists_where_it_is_used(path: Path) -> None:
    stale = [
        f"{where}: {flag}" + (f" (agentx {' / '.join(sorted(commands))})" if commands else " (no agentx command)")
        for where, commands, flag in _uses(path)
        if flag not in FOREIGN and not _exists(flag, commands)
    ]
    assert not stale, "flags the docs name that do not exist:\n" + "\n".join(stale)


def test_the_foreign_flags_are_named_in_the_docs_and_are_not_agentx_flags() -> None:
    """A foreign flag agentx also takes would hide a stale mention of it; one no document names is dead weight."""
    assert not sorted(flag for flag in FOREIGN if flag in ANY)
    named = {flag for path in DOCS for _, _, flag in _uses(path)}
    assert not sorted(set(FOREIGN) - named)


def test_the_scan_sees_commands_tables_and_prose(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\nagentx sweep T --concurrency 1,2\n```\n\n"
        "| command | what |\n|---|---|\n| `agentx replay T` | lanes resume at t* (`--tstar-window`) |\n\n"
        "Plain prose names `--seed`.\n"
    )
    uses = list(_uses(page))
    assert ("--concurrency" in {flag for _, commands, flag in uses if commands == {"sweep"}}) is True
    assert any(commands == {"replay"} and flag == "--tstar-window" for _, commands, flag in uses)
    assert any(commands is None and flag == "--seed" for _, commands, flag in uses)
    assert any(commands == {"sweep"} for _, commands, _ in _uses(REPO / "README.md"))
