"""A simulated OpenAI-compatible inference server (`agentx sim`), for tests, demos and what-if studies.

It runs in its own process and is driven over HTTP, never called into: `engine/` is the model of a
continuously batching server (scheduler, KV cache with prefix caching, synthetic speculative
decoding, a step-time model), `server.py` its OpenAI-compatible HTTP surface with vLLM's metrics and injectable
faults, `process.py` a context manager that starts one on a free loopback port.
"""
