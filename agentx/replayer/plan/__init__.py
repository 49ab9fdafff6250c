"""The trace as the run plays it: sessions split and warped when first played (sessions.py), a session tree as a DAG
of steps (steps.py), one play of a tree (play.py), t* and each lane's snapshot at it (tstar.py), open-loop arrivals
(arrivals.py), a step's request body (bodies.py), the replay's prefix-cache bounds (sent_blocks.py), and a run's
preparation: probes, calibration and the prepared trace (preparation.py).
"""
