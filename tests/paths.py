"""Where the suite finds the repository's files, wherever a test module sits under tests/."""

from __future__ import annotations

from pathlib import Path
from typing import Final

TESTS: Final = Path(__file__).resolve().parent
REPO: Final = TESTS.parent
PACKAGE: Final = REPO / "agentx"
TRACES: Final = REPO / "traces"
SAMPLE_TRACE: Final = TRACES / "sample.arrow"
"""The sample trace (scripts/make_sample_traces.py)."""
SAMPLE_MOONCAKE: Final = TRACES / "sample.mooncake.jsonl"
FIXTURES: Final = TESTS / "fixtures"
SHARED_DATA: Final = REPO.parent / "shared" / "data"
"""`../shared/data` next to the repository: real public traces, never copied into it."""
