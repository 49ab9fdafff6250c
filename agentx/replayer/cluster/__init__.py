"""`--ray`: one replay sharded over Ray actors across hosts (docs/distributed.md).

- placement: reaching the cluster, placing the shards (Ray is imported here only, and only for a `--ray` run).
- clocks: each shard's clock against the driver's (round trips, midpoint, bound).
- shard: the actor's side: the trace from the object store, the run on its own loop, the polls.
- driver: `run_cluster`, the driver's side: start at one instant, stream records home, losses, Ctrl-C.
"""
