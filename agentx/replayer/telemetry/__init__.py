"""The server's `/metrics` over a run: each engine's metric names and the counters read from a scrape (metrics.py),
the series kept (series.py), the scraper (scrape.py) and its file, `server_metrics.arrow` (arrow_file.py).
"""
