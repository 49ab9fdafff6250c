"""The trace: the model (model.py), its checks (validate.py, errors.py), reading and writing every format (io.py over
formats/), inspection (stats.py), hidden agents split out of flattened sessions (chains.py and chain_*.py) and the idle
cap's load-time warp (warp.py)."""
