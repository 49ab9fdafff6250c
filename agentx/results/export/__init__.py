"""A run as files (`export_run`, export_run.py): AIPerf's exports, their per-request metrics (aiperf_metrics.py), the
JSONL (aiperf_jsonl.py), the aggregate (aiperf_summary.py) with the server's metrics (aiperf_server_metrics.py) and
the time-weighted figures (time_weighted.py); the records as an Arrow IPC file, Parquet or CSV (tables.py).
"""
