"""Child processes of the tests that stop a replay with a signal."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_stop_signals() -> None:
    """A `preexec_fn`: the stop signals at their default in the child, whatever the test run's own. A child inherits
    an ignored signal (`nohup make test` ignores SIGHUP, a shell's background job SIGINT), and agentx rightly leaves
    one it was started with ignored."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_DFL)
