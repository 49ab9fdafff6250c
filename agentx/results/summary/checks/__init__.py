"""Whether a run's figures stand: the realized speculative acceptance against the one forced (acceptance.py), the
AgentX validity of the run (validity.py) and the audit of what it sent against what the trace asked (audit.py)."""
