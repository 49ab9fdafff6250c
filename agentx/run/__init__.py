"""Orchestration: runs that compose the replayer and the results (replay + summary, sweeps, decode speed)."""
