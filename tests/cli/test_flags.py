"""The command-line flags come from the option structs' fields and the CLI's flag table (agentx/cli/flags.py,
agentx/cli/flag_table.py): one definition, so `replay`, `sweep` and `decode` cannot drift, and a flag's default is
the field's."""

from __future__ import annotations

import re
from pathlib import Path

import click
import msgspec
import pytest
from click.testing import CliRunner
from paths import SAMPLE_TRACE

from agentx.cli import main
from agentx.cli.flag_table import FLAGS
from agentx.cli.flags import HELP_GROUPS, GroupedCommand, field_flag, fields_with_flags, flag_name
from agentx.cli.parsed import SERVER_SKIP
from agentx.replayer.options.replay import (
    LOADS,
    Connection,
    DecodeOptions,
    Runtime,
    Scenario,
    Server,
    Speculative,
)

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

SHARED = (Server, Connection, Speculative)
"""Parts every command that talks to a server takes."""
DECODE_SKIPS = frozenset({"tokenizer", "affinity_headers"})


def _options(command: str) -> dict[str, click.Option]:
    group = main
    assert isinstance(group, click.Group)
    found = group.get_command(click.Context(group), command)
    assert found is not None
    return {name: param for param in found.params if isinstance(param, click.Option) for name in param.opts}


def _flags(*kinds: type[msgspec.Struct], skip: frozenset[str] = frozenset()) -> set[str]:
    return {flag_name(kind, field) for kind in kinds for field in fields_with_flags(kind) if field.name not in skip}


@pytest.mark.parametrize("command", ["replay", "sweep", "decode"])
def test_every_command_takes_the_shared_parts_flags(command: str) -> None:
    skip = DECODE_SKIPS if command == "decode" else frozenset()
    assert _flags(*SHARED, skip=skip) <= set(_options(command))


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_replay_and_sweep_take_every_load_scenario_and_runtime_flag(command: str) -> None:
    skip = frozenset({"concurrency"}) if command == "sweep" else frozenset()  # a sweep's levels are its own flag
    assert _flags(*LOADS, Scenario, Runtime, skip=skip) <= set(_options(command))
    assert _flags(DecodeOptions) <= set(_options("decode"))


@pytest.mark.parametrize("kind", [*SHARED, *LOADS, Scenario, Runtime, DecodeOptions])
def test_a_flags_default_and_help_are_its_fields(kind: type[msgspec.Struct]) -> None:
    options = _options("decode" if kind is DecodeOptions else "replay")
    for field in fields_with_flags(kind, SERVER_SKIP):
        option = options[flag_name(kind, field)]
        entry = field_flag(kind, field)
        assert entry is not None
        assert option.help == entry.help or field.name == "url"  # --url says more about the simulator
        default = field.default
        if field.required or option.multiple or option.is_flag or (default is None and entry.none is None):
            assert not option.required  # the CLI's own defaults (a simulator, the server's model) fill them
            continue
        if entry.none is not None and default is None:
            assert option.default == entry.none
        elif isinstance(default, tuple):
            assert option.default == ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        else:
            assert option.default in (default, str(default)), field.name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "5"], "--rate applies to --mode rate, not agentx"),
        (["--mode", "closed", "--tstar-window", "0,1"], "--tstar-window applies to --mode agentx, not closed"),
        (["--mode", "rate"], "it needs --rate"),
        (["--mode", "trace", "--concurrency", "4"], "--concurrency applies to --mode agentx or closed, not trace"),
    ],
)
def test_a_flag_of_another_mode_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        main, ["replay", str(SAMPLE_TRACE), "--url", "http://127.0.0.1:9", "--model", "m", *args]
    )
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_bad_flag_is_refused_before_the_simulator_starts(tmp_path: Path) -> None:
    """No --url: the check comes first, so no simulator is started for a run that cannot be made."""
    for args, message in [
        (["--mode", "rate"], "it needs --rate"),
        (["--speedup", "2"], "--speedup applies to --mode trace, not agentx"),
        (["--mode", "trace", "--rate", "3"], "--rate applies to --mode rate, not trace"),
        (["--mode", "closed", "--burstiness", "2"], "--burstiness applies to --mode rate, not closed"),
        (["--header", "no colon"], "NAME:VALUE"),
        (["--extra-body", "{not json"], "--extra-body"),
    ]:
        out = tmp_path / "run"
        result = CliRunner().invoke(main, ["replay", str(SAMPLE_TRACE), "--out", str(out), *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "simulator" not in result.output and "Traceback" not in result.output and not out.exists()


HELP_ROW = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)")


def _help_sections(command: str) -> dict[str, list[str]]:
    """`agentx COMMAND --help`'s option sections: each section's option names, in order."""
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in result.output.splitlines():
        if line and not line.startswith(" ") and line.endswith(":") and not line.startswith("Usage"):
            current = sections.setdefault(line.removesuffix(":"), [])
        elif current is not None and (row := HELP_ROW.match(line)):
            current.extend(word.strip(",") for word in row.group(1).split() if word.startswith("-"))
    return sections


@pytest.mark.parametrize("command", ["replay", "sweep", "decode"])
def test_help_lists_every_option_in_exactly_one_section_in_the_intended_order(command: str) -> None:
    assert isinstance(main, click.Group)
    root = click.Context(main, info_name="agentx", **main.context_settings)  # as the command line makes it
    found = main.get_command(root, command)
    assert isinstance(found, GroupedCommand)
    sections = _help_sections(command)
    assert list(sections) == [group for group in HELP_GROUPS if group in sections]  # no "Other", in order
    assert {"Server", "Load", "Output", "Speculative decoding", "Connection", "Run"} <= set(sections)
    listed = [name for names in sections.values() for name in names]
    assert len(listed) == len(set(listed)), "an option listed twice"
    for param in found.get_params(click.Context(found, parent=root, info_name=command)):
        if isinstance(param, click.Option):
            assert sum(param.opts[0] in names for names in sections.values()) == 1, param.opts
    assert sections["Server"][0] == "--url" and sections["Run"][-1] == "--help"


def test_the_most_used_replay_flags_come_first() -> None:
    sections = _help_sections("replay")
    assert sections["Server"][:3] == ["--url", "--model", "--api-key"]
    assert sections["Load"][:2] == ["--mode", "--concurrency"]
    assert {"--duration", "--sessions", "--num-requests"} <= set(sections["Load"])
    assert sections["Output"][:2] == ["--out", "--overwrite"]
    assert "--tstar-window" in sections["AgentX scenario"] and "--system-idle-cap" in sections["AgentX scenario"]
    assert {"--api", "--tokenizer", "--token-low", "--token-high"} <= set(sections["Prompts"])


def test_every_derived_flag_names_a_known_section() -> None:
    for kind in (*SHARED, *LOADS, Scenario, Runtime, DecodeOptions):
        for field in fields_with_flags(kind):
            entry = field_flag(kind, field)
            assert entry is not None and (entry.group or "Server") in HELP_GROUPS, (kind.__name__, field.name)


def test_every_entry_of_the_flag_table_is_a_field() -> None:
    kinds = {kind.__name__: kind for kind in (*SHARED, *LOADS, Scenario, Runtime, DecodeOptions)}
    for path in FLAGS:
        struct, _, field = path.partition(".")
        assert field in {f.name for f in msgspec.structs.fields(kinds[struct])}, path
