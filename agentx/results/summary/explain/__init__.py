"""Why a run's figures are what they are: where each play's time went along its critical path (critical_path.py)
and why the prefix cache missed (cache_misses.py)."""
