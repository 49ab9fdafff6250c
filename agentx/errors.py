"""Every error agentx raises for a user to read, in one tree, below every floor so that any module can raise them.

    AgentxError
      TraceError            a trace that cannot be used (each problem a `Finding`)
      ConfigError           an option or an input file the user must change; a ValueError too
        BadURLError, SloError, RunExists, RecordsError (RecordsInUse, RecordsDamaged), ServerMetricsError,
        NothingToReplay, PlanError, ExportError (OutputExists, RunInProgress), ArtifactError, ReportError, PriceError,
        PlotsUnavailableError, SweepError, PromptError, ResponseError
      ServerError           the server cannot be used for a run
        ServerUnreachable (ModelsNotListed), ModelNotServed, CalibrationError, WarmupFailed, SimServerError
      RunError              a run that started could not complete
        WorkerFailed, ClusterError, RunStopped
      StorageError          an OS condition on a run's files (a full disk, a read-only file system, no permission)
        OutputUnwritable    at the start: nothing was sent
        WriteFailed         once the run had started (a RunError too): it stopped early, and says what it kept

Each message is one paragraph a user can act on; the command line prints it and exits with the code its kind
maps to (agentx.cli.common.exit_code): 130 for a RunStopped, 4 for a WriteFailed, 3 for another RunError, 2 for the
others. Errors that
never reach a user (a connection's protocol error, the simulator's answer to a bad request) stay private to the
modules that raise and catch them.
"""

from __future__ import annotations

import errno as errnos
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import msgspec

if TYPE_CHECKING:
    import pyarrow as pa


class AgentxError(Exception):
    """Anything agentx raises for a user to read: one paragraph naming the place, no traceback needed.

    `cli_message`, when set, is the same paragraph in the command line's words: its flags where the message names
    the library's parameters (`--format` for `format=`), which the command line prints instead (`cli_words`)."""

    cli_message: str | None = None

    def worded_for_cli(self, message: str) -> Self:
        """This error, with `message` as its paragraph on the command line (`cli_message`)."""
        self.cli_message = message
        return self


def cli_words(error: BaseException) -> str:
    """What the command line prints for `error`: its `cli_message` when it has one, else its message."""
    said = getattr(error, "cli_message", None)
    return said if isinstance(said, str) else str(error)


# Traces


Severity = Literal["error", "warning"]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One problem, located as precisely as the format allows.

    `line` is 1-based (the JSONL line, or the row of an Arrow file); `request` is the 0-based
    index of the request within its agent; `agent` is "" for a session's root agent.
    """

    severity: Severity
    message: str
    file: str = ""
    line: int | None = None
    session: str | None = None
    agent: str | None = None
    request: int | None = None
    cli_message: str | None = None
    """`message` in the command line's words (its flags for the library's parameters), when they differ."""

    def __str__(self) -> str:
        return self._located(self.message)

    def cli_text(self) -> str:
        """The finding as the command line prints it: located as `str` is, in its words (`cli_message`)."""
        return self._located(self.cli_message or self.message)

    def _located(self, message: str) -> str:
        where = self.file
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        parts = [where] if where else []
        if self.session is not None:
            parts.append(f'session "{_printable(self.session)}"')
        if self.agent:
            parts.append(f'subagent "{_printable(self.agent)}"')
        if self.request is not None:
            parts.append(f"request {self.request}")
        prefix = " ".join(parts)
        return f"{prefix}: {message}" if prefix else message


def _printable(name: str) -> str:
    # Ids come from files: a newline in one must not break the one-line, one-paragraph message.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


class TraceError(AgentxError):
    """A trace that cannot be used: the first error in one paragraph, with its location."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = [f for f in findings if f.severity == "error"] or findings
        more = len(self.findings) - 1
        tail = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        super().__init__(str(self.findings[0]) + tail)
        if self.findings[0].cli_message is not None:
            self.cli_message = self.findings[0].cli_text() + tail

    @classmethod
    def at(cls, message: str, **where: object) -> TraceError:
        """A TraceError for one problem at one place (keyword arguments as in Finding, `cli_message` included)."""
        return cls([Finding(severity="error", message=message, **where)])  # type: ignore[arg-type]


# Options and input files


class ConfigError(AgentxError, ValueError):
    """An option or an input file (not a trace) the user must change: a bad URL, a folder that already holds a
    run, an unreadable price table or records file. A ValueError too, as these were before the tree."""


class BadURLError(ConfigError):
    """A server URL that cannot be used; the message names the URL (credentials scrubbed by the caller)."""


class SloError(ConfigError):
    """A `--slo` value that is not METRIC=VALUE with a known metric, a unit and a positive value."""


class RunExists(ConfigError):  # noqa: N818 (reads as what is wrong)
    """The run folder already holds a run, and replacing it was not asked for (`overwrite`)."""


class RecordsError(ConfigError):
    """A records file that cannot be read (not ours, a newer major version, no complete schema)."""


class RecordsInUse(RecordsError):  # noqa: N818 (reads as what is wrong)
    """A records stream a process still writes (its `RecordWriter` holds the file's lock): not to be finalized."""


class RecordsDamaged(RecordsError):  # noqa: N818 (reads as what is wrong)
    """A records file that gives back fewer rows than it holds: a finished file (written whole at its run's end)
    cut short or damaged since. `rows_read` rows could be read of the `rows_expected` that `witness` ("the file"
    itself, or the run's "run.json") says it holds; None when nothing says."""

    def __init__(self, path: str, rows_read: int, rows_expected: int | None, witness: str = "the file") -> None:
        self.path, self.rows_read, self.rows_expected, self.witness = path, rows_read, rows_expected, witness
        if rows_expected is None:
            message = f"{path}: the file is cut short or damaged: {rows_read} rows could be read, of a count it lacks"
        else:
            holder = "it" if witness == "the file" else "the file"
            message = (
                f"{path}: {witness} says {holder} holds {rows_expected} rows, but only {rows_read} could be read "
                "(it is cut short or damaged)"
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[type[RecordsDamaged], tuple[str, int, int | None, str], dict[str, object]]:
        return type(self), (self.path, self.rows_read, self.rows_expected, self.witness), self.__dict__


class ServerMetricsError(ConfigError):
    """A file that is not a readable server_metrics.arrow (or of a newer major format version)."""


class NothingToReplay(ConfigError):  # noqa: N818 (reads as what happened)
    """Every session of the trace was left out (`max_context_length`): there is nothing to replay."""


class PlanError(ConfigError):
    """The session's steps do not form a DAG (cannot happen for a valid trace; a bug guard)."""


class ExportError(ConfigError):
    """A run directory that cannot be exported (no records file, an unreadable run.json)."""


class OutputExists(ExportError):  # noqa: N818 (reads as what is wrong, as RunExists)
    """The file to write exists already and replacing it was not asked for: an export's, or a converted trace's
    (`agentx convert`)."""


class RunInProgress(ExportError):  # noqa: N818 (reads as what is wrong)
    """The run's records file is still being written by a replay: it cannot be finalized yet."""


class ArtifactError(ConfigError):
    """An AIPerf artifact folder that cannot be imported (no profile_export.jsonl, a line or a summary file that is
    not AIPerf's); the message names the file and the line."""


class ReportError(ConfigError):
    """A directory that is neither a run nor a sweep, or unreadable files; the message says which."""


class PriceError(ConfigError):
    """A price file that cannot be read or does not have the table's shape."""


class PlotsUnavailableError(ConfigError, RuntimeError):
    """matplotlib is not installed."""


class SweepError(ConfigError):
    """Unusable sweep input (levels, settings file); the message says what to change."""


class PromptError(ConfigError):
    """A request body that cannot be rendered (the message says which part)."""


class ResponseError(ConfigError):
    """A response that cannot be read (the message says why)."""


# The server


class ServerError(AgentxError):
    """The server is unreachable, does not serve the model, or fails what a run needs before it starts (the
    calibration of chat prompts, a root agent's warmup primer, the simulator's start)."""


class ServerUnreachable(ServerError):  # noqa: N818 (reads as what is wrong)
    """The server did not answer `GET /v1/models` with a 200 (refused, timed out, or an error status)."""


class ModelsNotListed(ServerUnreachable):
    """The server answered `GET /v1/models`, but not with a model list (an error status, or a body that is not one):
    it is there, and the base URL, the credentials or its state are what to look at. A ServerUnreachable still, so
    that code waiting for a server that can be used goes on treating it as one that cannot."""


class ModelNotServed(ServerError):  # noqa: N818 (reads as what is wrong)
    """The server answered, but does not list the requested model."""


class CalibrationError(ServerError):
    """The chat text cannot be calibrated against this server (no tokenizer endpoint, too few words)."""


class WarmupFailed(ServerError):  # noqa: N818 (reads as a sentence: "warmup failed")
    """A root agent's warmup primer failed: the run stops before profiling (docs/agentx.md §5)."""


class SimServerError(ServerError, RuntimeError):
    """The simulator did not start; the message holds its exit status and stderr."""


# Runs


class RunError(AgentxError):
    """A run that started could not complete (a worker process died without its result)."""


class WorkerFailed(RunError):  # noqa: N818 (reads as a sentence: "worker failed")
    """A worker process exited without leaving a result (it crashed, or the server probe failed)."""


class ClusterError(RunError):
    """The Ray cluster cannot be reached, or cannot place the run's shards: nothing was sent."""


class RunStopped(RunError):  # noqa: N818 (reads as what happened)
    """The caller stopped the run (`RunStops`) before any of its processes or shards had started: nothing was
    measured."""


# The run's files


def os_condition(error: OSError) -> str:
    """What the OS said, in a few words with its errno name ("No space left on device, ENOSPC"); pyarrow's wordier
    messages are reduced to that too."""
    code = error.errno
    if code is None:
        return " ".join(str(error.strerror or error).split())
    name = errnos.errorcode.get(code)
    return f"{os.strerror(code)}, {name}" if name else os.strerror(code)


class StorageError(AgentxError):
    """The base of the errors of an OS condition on a run's files, of two kinds: `OutputUnwritable` (a ConfigError: the
    run cannot start) and `WriteFailed` (a RunError: it stopped early). The condition: a full disk (ENOSPC), a read-only
    file system (EROFS), no permission (EACCES), an exceeded quota (EDQUOT), an I/O error (EIO). `path` is the file or
    folder, `condition` what the OS said (`os_condition`), `errno` its number (None when it gave none)."""

    def __init__(self, message: str, *, path: str | os.PathLike[str], condition: str, errno: int | None) -> None:
        super().__init__(message)
        self.path = os.fspath(path)
        self.condition = condition
        self.errno = errno

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled across a `--workers` run's processes: rebuilt from its fields, not from `args`.
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def _rebuild(kind: type[StorageError], message: str, fields: dict[str, Any]) -> StorageError:
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    error.__dict__.update(fields)
    return error


class OutputUnwritable(StorageError, ConfigError):  # noqa: N818 (reads as what is wrong)
    """The run folder or its records file cannot be written as the run starts: nothing was sent or measured."""

    @classmethod
    def of(cls, path: str | os.PathLike[str], error: OSError) -> OutputUnwritable:
        """The error for `path`, which could not be created or written (`error`)."""
        condition = os_condition(error)
        return cls(
            f"{os.fspath(path)}: cannot write the run ({condition}); the run did not start",
            path=path,
            condition=condition,
            errno=error.errno,
        )


class WriteFailed(StorageError, RunError):  # noqa: N818 (reads as a sentence: "write failed")
    """A file of the run could not be written once it had started: the run stopped as an interrupt stops it (no new
    request, the grace period, then the rest cancelled), and the message says what was kept.

    `records_path` is the records file, whose complete batches stay readable (it is cut back to the last whole one);
    `records_kept` the rows it holds, `records_unwritten` those measured after the failure, which only the summary
    counts. `run_file` is run.json's path, None when it could not be written. `result` is the run and its summary (an
    `agentx.ReplayResult`), computed from the records on disk and those held in memory (None when it could not be).
    `run` and `unwritten` are what a run hands its caller (agentx.run.replay) to compute that: the `RunResult` and the
    rows not written. (Typed loosely: this module sits below the modules that define them.)"""

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str],
        condition: str,
        errno: int | None,
        records_path: str | os.PathLike[str] | None = None,
        records_kept: int | None = None,
        records_unwritten: int = 0,
        run_file: Path | None = None,
        result: Any = None,
        run: Any = None,
        unwritten: pa.Table | None = None,
    ) -> None:
        super().__init__(message, path=path, condition=condition, errno=errno)
        self.records_path = None if records_path is None else os.fspath(records_path)
        self.records_kept = records_kept
        self.records_unwritten = records_unwritten
        self.run_file = run_file
        self.result = result
        self.run = run
        self.unwritten = unwritten
