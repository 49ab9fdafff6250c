"""The documents of the folders a run leaves, with what reads and writes them: run.json (run_file.py), a sweep's
sweep.json (sweep_index.py) and a set of repeats' repeats.json (repeat_index.py), and what each kind of folder may
already hold before a new one is written into it.

The file names, the rule that a run is never replaced silently and the atomic write they all use are one floor down,
in agentx.records.run_folder: the replayer writes records.arrow and the server's metrics beside it before any of
these documents exist, and run.json's layout holds the replayer's `RunResult` and the results' `Summary`, which no
module below this floor may import.
"""
