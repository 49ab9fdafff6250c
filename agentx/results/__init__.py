"""Results of a replay run: what the records of a run add up to.

`summary.py` computes a `Summary` (`summary_model.py`) from a records table
(`agentx.records.record.read_records`) following the InferenceX aggregation (docs/agentx.md §6–§7): counts,
TTFT/E2E/ITL statistics (`stats.py`) and interactivity, per-chunk ITL, throughput, cache hit rates, client
dispatch lag, and per-play roll-ups and slowdown against the trace (`plays.py`). It reads the table
(`columns.py`), never `RequestRecord` objects, so it works on the file of any run (columns a newer minor
version adds are optional). This package sits above `replayer/` and `trace/`; neither imports it. It draws no
terminal tables: those are agentx.cli's (`summary_tables.py`, `report_tables.py`).
"""
