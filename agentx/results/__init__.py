"""What the records of a run add up to, from its folder alone (records.arrow, run.json, server_metrics.arrow).

Sub-packages, each importing only those below it (tests/project/test_layers.py):

- `summary/`: a run's `Summary` (summarize.py; the structs in model.py) by the InferenceX aggregation (docs/agentx.md
  §6–§7), read from the records table (columns.py), never `RequestRecord` objects, so it reads a file of any run;
  acceptance, validity, goodput, per-play roll-ups, the server's telemetry and a sharded run's clocks beside it.
- `export/`: the run as files: AIPerf's `profile_export.jsonl` and `profile_export_aiperf.json` (aiperf_*.py,
  time_weighted.py) and the records as plain tables (tables.py); `export_run` picks one.
- `report/`: runs and sweeps side by side (build.py): frontier, cost, notes on what is missing, plots, the HTML page.

Nothing here draws for the terminal: the tables are agentx.cli's.
"""
