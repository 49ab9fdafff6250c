"""Every error agentx raises for a user to read, in one tree, below every floor so that any module can raise them.

    AgentxError
      TraceError            a trace that cannot be used (each problem a `Finding`)
      ConfigError           an option or an input file the user must change; a ValueError too
        BadURLError, SloError, RunExists, RecordsError (RecordsInUse), ServerMetricsError, NothingToReplay,
        PlanError, ExportError (OutputExists, RunInProgress), ArtifactError, ReportError, PriceError,
        PlotsUnavailableError, SweepError, PromptError, ResponseError
      ServerError           the server cannot be used for a run
        ServerUnreachable, ModelNotServed, CalibrationError, WarmupFailed, SimServerError
      RunError              a run that started could not complete
        WorkerFailed, ClusterError

Each message is one paragraph a user can act on; the command line prints it and exits with the code its kind
maps to (agentx.cli.common.exit_code): 3 for a RunError, 2 for the others. Errors that never reach a user (a
connection's protocol error, the simulator's answer to a bad request) stay private to the modules that raise and
catch them.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class AgentxError(Exception):
    """Anything agentx raises for a user to read: one paragraph naming the place, no traceback needed."""


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

    def __str__(self) -> str:
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
        return f"{prefix}: {self.message}" if prefix else self.message


def _printable(name: str) -> str:
    # Ids come from files: a newline in one must not break the one-line, one-paragraph message.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


class TraceError(AgentxError):
    """A trace that cannot be used: the first error in one paragraph, with its location."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = [f for f in findings if f.severity == "error"] or findings
        first = str(self.findings[0])
        more = len(self.findings) - 1
        super().__init__(first + (f" (and {more} more error{'s' if more > 1 else ''})" if more else ""))

    @classmethod
    def at(cls, message: str, **where: object) -> TraceError:
        """A TraceError for one problem at one place (keyword arguments as in Finding)."""
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


class ServerMetricsError(ConfigError):
    """A file that is not a readable server_metrics.arrow (or of a newer major format version)."""


class NothingToReplay(ConfigError):  # noqa: N818 (reads as what happened)
    """Every session of the trace was left out (`max_context_length`): there is nothing to replay."""


class PlanError(ConfigError):
    """The session's steps do not form a DAG (cannot happen for a valid trace; a bug guard)."""


class ExportError(ConfigError):
    """A run directory that cannot be exported (no records file, an unreadable run.json)."""


class OutputExists(ExportError):  # noqa: N818 (reads as what is wrong, as RunExists)
    """The export's file exists already and replacing it was not asked for."""


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
