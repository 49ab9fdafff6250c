"""A run's summary: `summarize` (summarize.py) over the records table (columns.py) into the structs of model.py:
statistics (stats.py), InferenceX's added figures (inferencex.py), goodput (goodput.py), per-play roll-ups
(plays.py), realized acceptance (acceptance.py), the AgentX validity (validity.py), the server's telemetry
(server_telemetry.py), a sharded run's clocks (shards.py), where each play's time went along its critical path
(critical_path.py) and why the prefix cache missed (cache_misses.py).
"""
