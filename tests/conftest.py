"""Shared fixtures: the public Weka sample (skipped cleanly when absent) and small Weka documents."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from paths import SHARED_DATA
from strategies import WEKA_SUBAGENT, WEKA_TRACE

from agentx.sim.process import SimServer

WEKA_SAMPLE = SHARED_DATA / "weka-sample"


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimServer]:
    """The simulator at real time (blocks of 16 tokens): a request of a few thousand output tokens runs for many
    seconds, long enough to stop or cancel a run while it is in flight."""
    with SimServer(time_scale=1.0, block_size=16) as server:
        yield server


@pytest.fixture(scope="session")
def weka_sample_dir() -> Path:
    """The directory of 7 real Weka traces; the test is skipped (with the reason shown) without it."""
    if not WEKA_SAMPLE.is_dir() or not any(WEKA_SAMPLE.glob("*.json")):
        pytest.skip(f"real Weka sample traces not found at {WEKA_SAMPLE} (they are not part of the repository)")
    return WEKA_SAMPLE


@pytest.fixture(scope="session")
def weka_sample_files(weka_sample_dir: Path) -> list[Path]:
    return sorted(weka_sample_dir.glob("*.json"))


@pytest.fixture
def weka_trace() -> dict[str, Any]:
    """A fresh copy of WEKA_TRACE to modify."""
    return copy.deepcopy(WEKA_TRACE)


@pytest.fixture
def weka_subagent() -> dict[str, Any]:
    """A fresh copy of WEKA_SUBAGENT to modify."""
    return copy.deepcopy(WEKA_SUBAGENT)


# Hypothesis's deadline (200 ms an example) and its too_slow health check measure the wall clock: on a loaded machine
# (the suite side by side on every core, CI beside other jobs) they fail tests whose properties hold. Off for every
# profile: what a property test checks is the property, and the benchmarks under bench/ check speed.
settings.register_profile("agentx", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agentx")
# `pytest --hypothesis-profile=thorough`: every property test with twenty times its examples, to look for rare
# failures; `fast` (make test-fast): a quarter, for the inner loop. A test's own count scales alike
# (`strategies.examples`).
settings.register_profile("thorough", parent=settings.get_profile("agentx"), max_examples=2000)
settings.register_profile("fast", parent=settings.get_profile("agentx"), max_examples=25)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked slow (they start processes and wait on clocks) first, each in its own order: side by side
    (`pytest -n`), the short tests then fill the workers' last minutes instead of one long test ending the run alone.
    The same order in every worker, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
