"""Driving a server with a trace: `run_replay` (run_replay.py) plays a trace's sessions against an OpenAI-compatible
server under the chosen rules and writes one record per request.

Sub-packages by concern, each importing only those below it (tests/project/test_layers.py):

- `http/`: every call to the server, over agentx's own HTTP/1.1 connections; knows nothing of traces.
- `options/`: what a run is told (`ReplayOptions`), the rule sets, the loads, the SLO targets.
- `prompts/`: what a request says: exact-length token ids, chat messages, the tokenizer's calibration.
- `plan/`: the trace as the run plays it: sessions, each tree's steps, plays, t*, request bodies.
- `schedule/`: when each step is sent: the runner, due times, idle caps, the AgentX warmup, sending and recording.
- `telemetry/`: the server's `/metrics` scraped over the run into `server_metrics.arrow`.
- `run_replay.py` composes them; `workers.py` shards a run over processes, `cluster/` over a Ray cluster;
  `run_result.py` is what run.json keeps.
"""
