"""How many session trees a run starts, and each `--workers` shard's share of a run-wide count: what the runner obeys
(agentx.replayer.schedule.runner) and the progress bar counts with (agentx.cli.display.planned); how many shards a load
takes."""

from __future__ import annotations

from agentx.errors import ConfigError
from agentx.replayer.options.replay import Load, Scenario, lanes


def tree_limit(scenario: Scenario, session_count: int) -> int | None:
    """Trees the whole run starts: `sessions`; one pass of its `session_count` sessions when neither a duration nor a
    request cap bounds it; None: until the deadline or the cap."""
    if scenario.sessions is not None:
        return scenario.sessions
    if scenario.duration_s is None and scenario.num_requests is None:
        return session_count
    return None


def shard_share(limit: int, shard: tuple[int, int]) -> int:
    """Shard `(index, count)`'s share of a run-wide count: the positions below `limit` dealt to it round-robin."""
    shard_index, shard_count = shard
    return max(0, -(-(limit - shard_index) // shard_count))


def check_shards(load: Load, workers: int) -> None:
    """A ConfigError when `workers` shards (`--workers`, `--ray`) cannot each own a lane of `load`; an open loop has
    no lanes, and its shards split the arrivals."""
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    if 0 < lanes(load) < workers:
        raise ConfigError(f"--workers {workers} exceeds --concurrency {lanes(load)}: a shard needs a lane")
