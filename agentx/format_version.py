"""The one version rule of every Arrow file agentx writes (a trace, a run's records, the server's metrics), each with
`MAJOR.MINOR` in its schema's metadata.

A minor version only adds columns or metadata keys, which an older reader leaves aside; a major version changes what
a column means. A reader reads every file of its own major version or an older one (an older file is brought up to
date as it is read: renamed columns, nulls for what it lacks) and refuses a newer major version, or a version it
cannot read as one, asking for a newer agentx. Files outlive the agentx that wrote them: a run measured a year ago is
still a measurement, and a newer agentx must read it.
"""

from __future__ import annotations


def version_refusal(version: str, reads: str, what: str) -> str | None:
    """Why a reader of format version `reads` refuses a `what` file (a "trace", "records") written in `version`: one
    sentence, or None when it reads it."""
    major = version.split(".", 1)[0]
    own = int(reads.split(".", 1)[0])
    if major.isascii() and major.isdigit() and int(major) <= own:
        return None
    return f"written in {what} format version {version}; this agentx reads {own}.x and older. Upgrade agentx to read it"
