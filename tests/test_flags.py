"""The command-line flags come from the option structs (agentx/cli/flags.py): one definition, so `replay`, `sweep`
and `decode` cannot drift, and a flag's default is the field's."""

from __future__ import annotations

from pathlib import Path

import click
import msgspec
import msgspec.inspect as mi
import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.cli.flags import fields_with_flags, flag_name
from agentx.cli.options import SERVER_SKIP
from agentx.replayer.options import (
    LOADS,
    Connection,
    DecodeOptions,
    Runtime,
    Scenario,
    Server,
    Speculative,
)

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "sample.arrow"
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
    return {flag_name(field) for kind in kinds for field in fields_with_flags(kind) if field.name not in skip}


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
        option = options[flag_name(field)]
        meta = field.type
        assert isinstance(meta, mi.Metadata) and meta.extra is not None
        assert option.help == meta.extra["help"] or field.name == "url"  # --url says more about the simulator
        default = field.default
        if field.required or option.multiple or option.is_flag or (default is None and "none" not in meta.extra):
            assert not option.required  # the CLI's own defaults (a simulator, the server's model) fill them
            continue
        if "none" in meta.extra and default is None:
            assert option.default == meta.extra["none"]
        elif isinstance(default, tuple):
            assert option.default == ",".join(map(str, default))
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
    result = CliRunner().invoke(main, ["replay", str(SAMPLE), "--url", "http://127.0.0.1:9", "--model", "m", *args])
    assert result.exit_code == 2 and message in result.output, result.output
