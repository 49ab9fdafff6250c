"""agentx: replay agentic LLM workloads against OpenAI-compatible inference servers."""
