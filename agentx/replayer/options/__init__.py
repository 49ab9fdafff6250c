"""What a run is told: `ReplayOptions` and `DecodeOptions` with their parts (replay.py), the server and the connection
(server.py), the loads (load.py), the AgentX rule sets (rules.py), the SLO targets (slo.py), the fields' units
(fields.py); what follows from them: how many trees start (limits.py), the AgentX scenario's locks (locks.py), and the
one `Client` a run's calls go through (server_client.py).
"""
