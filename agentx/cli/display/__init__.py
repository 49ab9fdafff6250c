"""What the command line draws: tables fitted to the terminal's width (layout.py, tables.py, summary_tables.py,
report_tables.py) and a run's progress (progress.py, with the requests it will send, planned.py). rich loads only
when something is drawn."""
