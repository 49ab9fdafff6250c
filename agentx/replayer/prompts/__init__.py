"""What a request says: exact-length token-id prompts from block content (tokens.py); for `--api chat`, an agent's
messages (conversation.py, chat.py) and the calibration of the server's chat template (calibrate.py).
"""
