"""The command line says its flags where the library says its parameters: an error carries both wordings
(`AgentxError.cli_message`, `Finding.cli_message`) and the command line prints its own (`cli_words`)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from builders import make_request, make_session, make_trace
from click.testing import CliRunner

from agentx.cli import main
from agentx.errors import ConfigError, OutputExists, RunExists, TraceError, cli_words
from agentx.records.run_folder import RECORDS_FILE, refuse_existing_file, refuse_existing_run
from agentx.trace.io import load_trace, save_trace
from agentx.trace.model import Trace

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@pytest.fixture
def unknown(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("hello, not a trace\n")
    return path


def _trace() -> Trace:
    return make_trace(make_session("s", [make_request(0.0, 8, 2, added=(0,))]))


def test_the_library_names_its_parameter(unknown: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceError) as detected:
        load_trace(unknown)
    assert str(detected.value).endswith("; pass format= to force one") and "--format" not in str(detected.value)
    assert cli_words(detected.value).endswith("; pass --format to force one")
    assert str(detected.value.findings[0]).startswith(f"{unknown}: unrecognised trace format")
    with pytest.raises(ConfigError) as suffix:
        save_trace(_trace(), tmp_path / "out.txt")
    assert "format= (arrow, parquet, weka or mooncake)" in str(suffix.value)
    assert "format=" not in cli_words(suffix.value) and "--" not in cli_words(suffix.value)


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{trace}"],
        ["convert", "{trace}", "{out}/trace.arrow"],
        ["inspect", "{trace}"],
        ["replay", "{trace}", "--out", "{out}/run"],
    ],
)
def test_commands_say_format_as_their_flag(unknown: Path, tmp_path: Path, command: list[str]) -> None:
    args = [part.format(trace=unknown, out=tmp_path) for part in command]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "pass --format to force one" in result.output and "format=" not in result.output
    assert "Traceback" not in result.output


def test_synth_says_what_to_do_about_an_unknown_suffix(tmp_path: Path) -> None:
    out = tmp_path / "trace.txt"
    args = ["synth", "generate", "--preset", "agentic-coding", "--sessions", "1", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "names no trace format" in result.output and "use one of those suffixes" in result.output
    assert "format=" not in result.output and not out.exists()


def test_a_file_to_write_that_exists_says_overwrite_as_a_flag(tmp_path: Path) -> None:
    (tmp_path / "trace.arrow").write_bytes(b"")
    with pytest.raises(OutputExists) as held:
        refuse_existing_file(tmp_path / "trace.arrow", overwrite=False, named_by="DESTINATION")
    assert str(held.value) == f"{tmp_path / 'trace.arrow'} already exists; pass overwrite=True to replace it"
    assert cli_words(held.value).endswith("pass --overwrite to replace it, or choose another DESTINATION")
    refuse_existing_file(tmp_path / "trace.arrow", overwrite=True, named_by="DESTINATION")
    refuse_existing_file(tmp_path / "other.arrow", overwrite=False, named_by="DESTINATION")


def test_a_run_folder_already_held_says_overwrite_as_a_flag(tmp_path: Path) -> None:
    (tmp_path / RECORDS_FILE).write_bytes(b"")
    with pytest.raises(RunExists) as held:
        refuse_existing_run(tmp_path, overwrite=False)
    assert str(held.value).endswith("pass overwrite=True to replace it")
    assert cli_words(held.value).endswith("pass --overwrite to replace it")
    copied = pickle.loads(pickle.dumps(held.value))  # a worker's error crosses a process boundary whole
    assert str(copied) == str(held.value) and cli_words(copied) == cli_words(held.value)
