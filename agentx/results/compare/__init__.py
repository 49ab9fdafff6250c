"""Comparing runs and sweeps (`agentx compare`): paired deltas, bootstrap intervals over sessions, repeats, and
what makes two runs incomparable (docs/compare.md)."""
