"""Results of a replay run: what the records of a run add up to.

`summary.py` computes a `Summary` from a records table (`agentx.replayer.records.read_records`) following the
InferenceX aggregation (docs/agentx.md §6–§7): counts, TTFT/E2E/ITL statistics and
interactivity, per-chunk ITL, throughput, cache hit rates, client dispatch lag and per-play roll-ups, plus the
rich tables the terminal shows. It reads the table, never `RequestRecord` objects, so it works on the file of
any run (columns a newer minor version adds are optional). This package sits above `replayer/records` and
`trace/`; neither imports it.
"""
