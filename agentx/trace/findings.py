"""Findings collected while a trace file is read: each error and warning with its location, raised as one
`TraceError` at the end (agentx.errors)."""

from __future__ import annotations

from agentx.errors import Finding, TraceError


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
