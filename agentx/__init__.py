"""agentx: replay agentic LLM workloads against OpenAI-compatible inference servers.

The public API, small on purpose; everything else may change between versions.

Traces:
    load_trace(path, format=None, block_size=None, findings=None) -> Trace
    save_trace(trace, path, format=None)
    validate(trace) -> list[Finding]
    trace_stats(trace, cache_tokens=()) -> TraceStats
and the model they use: Trace, Session, Agent, Request; TraceError for unusable input.
"""

from agentx.trace.errors import Finding, Findings, TraceError
from agentx.trace.io import detect_format, load_trace, save_trace
from agentx.trace.model import Agent, Provenance, Request, Session, Trace
from agentx.trace.stats import TraceStats, trace_stats
from agentx.trace.validate import validate

__all__ = [
    "Agent",
    "Finding",
    "Findings",
    "Provenance",
    "Request",
    "Session",
    "Trace",
    "TraceError",
    "TraceStats",
    "detect_format",
    "load_trace",
    "save_trace",
    "trace_stats",
    "validate",
]
