"""The simulated engine: a continuously batching server's step loop (loop.py), one step's scheduling with speculative
decodes, chunked prefill and preemption (scheduler.py), a paged KV cache with prefix caching (kvcache.py), the
per-sequence state (sequence.py), forced acceptance (speculative.py), the step-time model (config.py) and the counters
`/metrics` reads (counters.py)."""
