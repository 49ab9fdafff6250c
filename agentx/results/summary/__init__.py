"""A run's summary: `summarize` (summarize.py) over the records table (columns.py, read by run_records.py) into the
structs of model.py: statistics (stats.py, population.py), InferenceX's added figures (inferencex.py), goodput
(goodput.py), per-play roll-ups (plays.py), cost per task (tasks.py), the server's telemetry and notices
(server_telemetry.py, server_notices.py) and a sharded run's clocks (shards.py). Whether the figures stand is in
checks/ (acceptance, validity, audit); why they are what they are, in explain/ (critical path, cache misses).
"""
