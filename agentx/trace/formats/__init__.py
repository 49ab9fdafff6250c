"""The trace formats agentx reads and writes (agentx.trace.io picks one): the native Arrow file (arrow.py), Weka/AgentX
JSON (weka.py, the wire format; weka_reader.py, weka_writer.py), Mooncake JSONL (mooncake.py), Alibaba Bailian
(bailian.py), and the text-file handling they share (textfile.py)."""
