"""How problems in trace files are reported: findings with a location, and TraceError."""

from __future__ import annotations

from typing import Literal

import msgspec

from agentx.errors import AgentxError

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


class Findings:
    """Collects findings while a file is read; raises once at the end if any were errors."""

    def __init__(self, file: str = "") -> None:
        self.file = file
        self.items: list[Finding] = []

    def error(self, message: str, **where: object) -> None:
        self.items.append(Finding(severity="error", message=message, file=self.file, **where))  # type: ignore[arg-type]

    def warning(self, message: str, **where: object) -> None:
        self.items.append(Finding(severity="warning", message=message, file=self.file, **where))  # type: ignore[arg-type]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.items if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.items if f.severity == "warning"]

    def raise_if_errors(self) -> None:
        if self.errors:
            raise TraceError(self.items)
