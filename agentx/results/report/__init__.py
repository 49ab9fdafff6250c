"""`agentx report`: runs and sweeps read from their folders (folders.py) and built into a report (build.py): the
throughput-per-GPU vs interactivity frontier (frontier.py), $ per million tokens (cost.py, gpu_prices.json), why a
figure is missing (notes.py), plots (plots.py) and the self-contained HTML page (html.py).
"""
