"""`agentx spec golden --list`: every published golden curve shipped with agentx, each one usable as listed."""

from __future__ import annotations

import msgspec
import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.cli.commands.spec import CurveListing
from agentx.spec.golden import load_golden_table

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


def test_the_list_names_every_curve_and_marks_the_defaults() -> None:
    result = CliRunner().invoke(main, ["spec", "golden", "--list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["model", "variant", "thinking", "K", "method"]
    curves = load_golden_table().curves
    assert len(lines) == 1 + len(curves) + 1  # header, one line per curve, how to get one value
    for curve, line in zip(curves, lines[1:], strict=False):
        assert line.split()[:2] == [curve.model, curve.variant]
        assert ("(default)" in line) == curve.default


def test_each_listed_curve_gives_its_values_as_listed() -> None:
    result = CliRunner().invoke(main, ["spec", "golden", "--list", "--json"])
    assert result.exit_code == 0, result.output
    listing = msgspec.json.decode(result.output, type=list[CurveListing])
    assert {(row.model, row.variant) for row in listing} == {(c.model, c.variant) for c in load_golden_table().curves}
    for row in listing:
        assert row.thinking and row.spec_k
        args = ["spec", "golden", "--model", row.model, "--variant", row.variant, "--k", str(row.spec_k[-1])]
        if row.thinking == ("off",):
            args.append("--no-thinking")
        found = CliRunner().invoke(main, args)
        assert found.exit_code == 0 and float(found.stdout.splitlines()[0]) >= 1.0, found.output


def test_list_and_a_lookup_are_not_mixed_and_one_of_them_is_needed() -> None:
    mixed = CliRunner().invoke(main, ["spec", "golden", "--list", "--model", "kimi-k3"])
    assert mixed.exit_code == 2 and "--list lists every curve; pass it alone" in mixed.output
    neither = CliRunner().invoke(main, ["spec", "golden"])
    assert neither.exit_code == 2 and "pass --model M" in neither.output and "--list" in neither.output
