"""The commands, one module per group: trace.py (validate, convert, inspect), sim.py, replay.py (replay, decode),
export.py, sweep.py, report.py, spec.py, synth.py (from-logs, generate, compare). Each parses, calls the library and
prints."""
