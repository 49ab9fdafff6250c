"""Runs of other tools made agentx run folders, so that `agentx report`, `agentx export` and the summary read them.

- `agentx.results.imports.aiperf_folder`: an AIPerf or agentx-harness artifact folder → `records.arrow` and
  `run.json` (`import_aiperf`), composing the modules below;
- `agentx.results.imports.aiperf_records`: `profile_export.jsonl` → `RequestRecord`s;
- `agentx.results.imports.aiperf_config`: `profile_export_aiperf.json` → the run's options and rule set;
- `agentx.results.imports.aiperf_server_metrics`: `server_metrics_export.json` → the summary's server telemetry.

What maps to what, and what AIPerf does not record: docs/results.md, "Importing AIPerf runs".
"""
