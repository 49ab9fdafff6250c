"""Traces from anonymized logs (`from_logs`, from_logs.py): proxy and Claude Code logs read (proxy.py, claude_code.py)
into exchanges (exchange.py, response.py), rendered and tokenized (render.py, tokenize.py), hashed into KV blocks
(hashing.py) and arranged into agent trees (tree.py); mock_logs.py writes logs of that shape for tests."""
