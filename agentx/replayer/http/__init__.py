"""Every call to the server: lean HTTP/1.1 connections (http1.py) in a keep-alive pool (pool.py), TLS (tls.py),
the base URL (url.py) and the credentials sent (credentials.py); a streamed request timed per chunk (sse.py,
streaming.py) into an `Exchange` (exchange.py); JSON calls, probes and `/metrics` (calls.py); `Client` (client.py)
composing them; what the server says it is (identity.py) and which `stream_options` it takes (probe.py).
"""
