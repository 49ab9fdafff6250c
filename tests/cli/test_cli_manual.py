"""docs/cli.md is every command's `--help`, as the commands print it today."""

from __future__ import annotations

from paths import REPO

from agentx.cli import main
from agentx.cli.manual import manual


def test_the_manual_is_the_commands_help() -> None:
    written = (REPO / "docs" / "cli.md").read_text()
    assert written == manual(main), "docs/cli.md is out of date: run `make docs`"


def test_the_manual_has_every_command_and_subcommand() -> None:
    text = manual(main)
    for path in ("agentx replay", "agentx sweep", "agentx synth compare", "agentx spec flags", "agentx sim"):
        assert f"## `{path}`\n" in text
    assert "--concurrency" in text.split("## `agentx sweep`")[1].split("## ")[0]
