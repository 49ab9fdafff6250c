"""Running a replay: lanes of session trees over one client, records streamed to disk.

INTERFACE (fixed; the CLI and the public API are written against it):

- `ReplayOptions`: one immutable options object for a run.
- `await run_replay(trace, options, *, on_record=None) -> RunResult`: drives the server with the
  trace's sessions and returns where the records went; `on_record(record)` (optional) is called for
  every finished request (progress displays, harnesses). Raises `ServerUnreachable` / `ModelNotServed`
  (from agentx.replay.client) before any request when the probe fails.
- `RunResult`: the run id, the records file, counts, and whether the run was interrupted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

from agentx.replay.records import RequestRecord
from agentx.trace.model import Trace

SessionOrder = Literal["sequential", "shuffle", "random"]


class ReplayOptions(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000."""
    model: str
    """The served model every request names."""
    out_dir: Path
    """Where records.arrow (and run metadata) are written."""
    api: Literal["completions"] = "completions"
    concurrency: int = 1
    """Lanes: each runs one whole session tree at a time (background subagents included)."""
    duration_s: float | None = None
    """Stop starting new requests after this long; None: until `sessions` trees are done."""
    sessions: int | None = None
    """Stop after this many session trees have been started (None with no duration: one pass)."""
    grace_s: float = 30.0
    """After the deadline, in-flight requests may finish within this; then they are cancelled."""
    session_order: SessionOrder = "sequential"
    seed: int = 0
    child_offset: Literal["branch_start", "anchor_end"] = "branch_start"
    api_key: str | None = msgspec.field(default=None)
    """Bearer token; never written to records, logs or reports."""
    headers: tuple[tuple[str, str], ...] = ()
    extra_body: dict[str, object] | None = None
    token_low: int = 1000
    token_high: int = 30000
    """Token ids of synthetic prompts are drawn from [token_low, token_high)."""
    max_connections: int | None = None
    """Connection pool size (default: 2 × concurrency)."""


class RunResult(msgspec.Struct, kw_only=True):
    run_id: str
    records_path: Path
    requests: int
    errors: int
    trees_started: int
    trees_finished: int
    interrupted: bool
    elapsed_s: float


OnRecord = Callable[[RequestRecord], None]


async def run_replay(trace: Trace, options: ReplayOptions, *, on_record: OnRecord | None = None) -> RunResult:
    raise NotImplementedError
