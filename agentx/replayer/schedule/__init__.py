"""When each step is sent: the runner (runner.py) draws trees into lanes or arrivals and sends each step when it is due
(due.py; what released it: release.py) on a timer clock (clock.py); idle caps (idle.py); the AgentX warmup and
profiling gate (warmup.py); sending a step (sending.py) and recording it (recorder.py); the garbage collector between
due requests (collector.py) and large work off the loop (offloop.py).
"""
