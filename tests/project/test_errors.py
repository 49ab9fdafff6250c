"""One error tree in one module (agentx/errors.py): every error agentx raises for a user derives from
`agentx.AgentxError` through exactly one kind (TraceError, ConfigError, ServerError, RunError), and the command line
maps each kind to its exit code in one place (agentx.cli.common.exit_code)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from paths import SAMPLE_TRACE

import agentx
from agentx.cli import main
from agentx.cli.common import EXIT_BAD_INPUT, EXIT_RUN_FAILED, Group, exit_code
from agentx.errors import AgentxError, ConfigError, RunError, ServerError, StorageError, TraceError

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

KINDS = (TraceError, ConfigError, ServerError, RunError)
BASES = (StorageError,)
"""Bases of no kind that carry what errors of several kinds share (an OS condition: `OutputUnwritable` is a
ConfigError, `WriteFailed` a RunError)."""

INTERNAL = {
    # The streamed client turns these into a failed request's record (error kinds "protocol", "connection" after
    # a retry on a fresh connection, and an error answer's kind); none is raised to a caller.
    "agentx.replayer.http.http1.HTTPProtocolError",
    "agentx.replayer.http.http1.ConnectionClosedError",
    "agentx.replayer.http.exchange.ExchangeError",
    # A proxy unreachable or refusing its tunnel: a connection failure like any other (a record's "connection"
    # error, or `ServerUnreachable` naming the proxy).
    "agentx.replayer.http.proxy.ProxyError",
    # The simulator's answer to a bad request: an HTTP 4xx body for the client, never raised out of the server.
    "agentx.sim.protocol.ClientError",
}
"""Exception classes that never reach a user, so they stay outside the tree."""


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in agentx, by qualified name (each module imported, `__main__` excepted: it
    runs the command line)."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(agentx.__path__, "agentx."):
        if module_info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_a_user_can_meet_is_in_the_tree_under_one_kind() -> None:
    classes = _exception_classes()
    outside = sorted(name for name, cls in classes.items() if name not in INTERNAL and not issubclass(cls, AgentxError))
    assert outside == []
    roots = {AgentxError, *KINDS, *BASES}
    kindless = sorted(
        name
        for name, cls in classes.items()
        if issubclass(cls, AgentxError) and cls not in roots and sum(issubclass(cls, kind) for kind in KINDS) != 1
    )
    assert kindless == []


def test_the_internal_list_names_classes_that_exist_outside_the_tree() -> None:
    classes = _exception_classes()
    assert INTERNAL.issubset(classes)
    assert not any(issubclass(classes[name], AgentxError) for name in INTERNAL)


def test_the_walk_finds_the_classes_it_must_judge() -> None:
    classes = _exception_classes()
    assert classes["agentx.errors.WorkerFailed"].__name__ == "WorkerFailed"
    assert classes["agentx.errors.TraceError"] is TraceError
    assert len(classes) >= 20


def test_every_error_of_the_tree_is_defined_in_the_error_module() -> None:
    elsewhere = sorted(
        name
        for name, cls in _exception_classes().items()
        if issubclass(cls, AgentxError) and cls.__module__ != "agentx.errors"
    )
    assert elsewhere == []


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("agentx.errors.BadURLError", ConfigError),
        ("agentx.errors.SloError", ConfigError),
        ("agentx.errors.RunExists", ConfigError),
        ("agentx.errors.RecordsError", ConfigError),
        ("agentx.errors.PlanError", ConfigError),
        ("agentx.errors.NothingToReplay", ConfigError),
        ("agentx.errors.ReportError", ConfigError),
        ("agentx.errors.ExportError", ConfigError),
        ("agentx.errors.PriceError", ConfigError),
        ("agentx.errors.PlotsUnavailableError", ConfigError),
        ("agentx.errors.SweepError", ConfigError),
        ("agentx.errors.PromptError", ConfigError),
        ("agentx.errors.ResponseError", ConfigError),
        ("agentx.errors.ServerUnreachable", ServerError),
        ("agentx.errors.ModelNotServed", ServerError),
        ("agentx.errors.CalibrationError", ServerError),
        ("agentx.errors.WarmupFailed", ServerError),
        ("agentx.errors.SimServerError", ServerError),
        ("agentx.errors.WorkerFailed", RunError),
    ],
)
def test_each_error_has_its_kind(name: str, kind: type[AgentxError]) -> None:
    module, _, attribute = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), attribute), kind)


def test_the_bases_callers_catch_stay() -> None:
    from agentx.errors import PlotsUnavailableError, RunExists, SimServerError

    # The public docs promise a refused run folder is a ValueError; the simulator's and the plots' failures were
    # RuntimeErrors before the tree.
    assert issubclass(ConfigError, ValueError) and issubclass(RunExists, ValueError)
    assert issubclass(SimServerError, RuntimeError) and issubclass(PlotsUnavailableError, RuntimeError)


def test_the_tree_is_public() -> None:
    for cls in (AgentxError, *KINDS):
        assert getattr(agentx, cls.__name__) is cls and cls.__name__ in agentx.__all__
        assert cls.__name__ in (agentx.__doc__ or "")
    assert all(issubclass(kind, AgentxError) for kind in KINDS)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TraceError.at("a trace"), EXIT_BAD_INPUT),
        (ConfigError("an option"), EXIT_BAD_INPUT),
        (ServerError("a server"), EXIT_BAD_INPUT),
        (RunError("a run"), EXIT_RUN_FAILED),
        (AgentxError("no kind"), EXIT_BAD_INPUT),
    ],
)
def test_each_kind_maps_to_its_exit_code(error: AgentxError, code: int) -> None:
    assert exit_code(error) == code


def test_a_leaf_maps_through_its_kind() -> None:
    from agentx.errors import WorkerFailed
    from agentx.replayer.http.client import ServerUnreachable

    assert (exit_code(WorkerFailed("w")), exit_code(ServerUnreachable("s"))) == (EXIT_RUN_FAILED, EXIT_BAD_INPUT)
    assert (EXIT_BAD_INPUT, EXIT_RUN_FAILED) == (2, 3)  # docs/cli.md, "Exit codes"


@pytest.mark.parametrize(("kind", "code"), [(ConfigError, 2), (ServerError, 2), (RunError, 3), (TraceError, 2)])
def test_the_group_ends_an_escaping_error_with_its_code_and_message(kind: type[AgentxError], code: int) -> None:
    @click.group(cls=Group)
    def top() -> None:
        pass

    @top.group()
    def nested() -> None:
        pass

    @nested.command()
    def raising() -> None:
        raise TraceError.at("bad", file="t.jsonl") if kind is TraceError else kind("what went wrong at http://u:pw@h")

    result = CliRunner().invoke(top, ["nested", "raising"])
    assert result.exit_code == code
    assert isinstance(result.exception, SystemExit)
    assert "error:" in result.output and ("t.jsonl" in result.output or "what went wrong" in result.output)
    assert "pw@" not in result.output  # through `fail`, which scrubs credentials


def test_a_bad_trace_exits_2_in_one_paragraph(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    done = subprocess.run(
        [sys.executable, "-m", "agentx.cli", "synth", "compare", str(bad), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert str(bad) in done.stderr and "Traceback" not in done.stderr


def test_a_report_of_no_directory_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "no such directory" in result.output
    assert isinstance(result.exception, SystemExit)


def test_an_unreadable_records_file_is_one_paragraph_not_a_traceback(tmp_path: Path) -> None:
    # A RecordsError was no ValueError before the tree: `agentx report` let it out as a traceback.
    (tmp_path / "records.arrow").write_bytes(b"not arrow")
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no readable Arrow stream schema" in result.output
    assert isinstance(result.exception, SystemExit)


def test_a_worker_that_dies_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentx.run.replay
    from agentx.errors import WorkerFailed

    def dies(*args: object, **kwargs: object) -> None:
        raise WorkerFailed("worker 1 exited with code -9 and no result")

    monkeypatch.setattr(agentx.run.replay, "run_workers", dies)
    sample = SAMPLE_TRACE
    args = ["replay", str(sample), "--url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "2"]
    result = CliRunner().invoke(main, [*args, "--workers", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 3, result.output
    assert "worker 1 exited with code -9" in result.output
