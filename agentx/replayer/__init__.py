"""The replay engine: drives a trace's sessions against an OpenAI-compatible server and records each exchange.

Bottom layer: `sse.py` parses server-sent events incrementally from raw bytes; `client.py` owns the HTTP
session (pooled keep-alive connections), streams one request and returns an `Exchange` of timestamps,
token counts, usage and error kind. Neither knows about traces.
"""
