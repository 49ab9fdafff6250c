"""The root of agentx's errors and the kinds under it, below every floor so that any module can raise them.

    AgentxError
      TraceError     a trace that cannot be used (agentx.trace.errors)
      ConfigError    an option or an input file the user must change; a ValueError too
      ServerError    the server is unreachable, refuses or fails what a run needs before it can start
      RunError       a run that started could not complete

Each message is one paragraph a user can act on; the command line prints it and exits with the code its kind
maps to (agentx.cli.common.exit_code): 3 for a RunError, 2 for the others.
"""

from __future__ import annotations


class AgentxError(Exception):
    """Anything agentx raises for a user to read: one paragraph naming the place, no traceback needed."""


class ConfigError(AgentxError, ValueError):
    """An option or an input file (not a trace) the user must change: a bad URL, a folder that already holds a
    run, an unreadable price table or records file. A ValueError too, as these were before the tree."""


class ServerError(AgentxError):
    """The server is unreachable, does not serve the model, or fails what a run needs before it starts (the
    calibration of chat prompts, a root agent's warmup primer, the simulator's start)."""


class RunError(AgentxError):
    """A run that started could not complete (a worker process died without its result)."""
