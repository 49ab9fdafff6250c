"""A stop signal before a command starts (the command line's imports and parsing) ends the process at once with one
line and exit 130: nothing has been made yet that needs cleaning up, and without this Ctrl-C there would print an
import's traceback and SIGTERM would end the process without a word. From a command's start,
`agentx.cli.common.stop_signals_raise` takes over (every stop signal then ends the command through its cleanups).

Imported first by `agentx.cli`, which installs it by importing it; it imports nothing but the standard library, so
that the window before it is the interpreter's own start."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final

EXIT_INTERRUPTED: Final = 130
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, what schedulers, `timeout` and `kill` send, and a closed terminal or ssh session."""
_taken: dict[int, Callable[[int, FrameType | None], Any] | int] = {}
"""The signals `install` took, with their handlers before."""


def _stop_now(signum: int, frame: FrameType | None) -> None:
    os.write(2, b"interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def is_program() -> bool:
    """Whether this process is the agentx program (`agentx ...`, `python -m agentx.cli ...`), not one that imports the
    command line (a test), whose signals stay its own."""
    argv = sys.orig_argv
    by_module = any(flag == "-m" and module == "agentx.cli" for flag, module in itertools.pairwise(argv))
    return by_module or Path(sys.argv[0]).stem == "agentx"


def install() -> None:
    """Until `hand_over`, a stop signal ends the agentx program at once (module docstring); nothing elsewhere, nor for
    a signal the program was started with ignored (`nohup`). The signals wait while the handlers go in, so that one
    sent as soon as any of them is caught finds them all."""
    if not is_program():
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for stop_signal in STOP_SIGNALS:
            before = signal.getsignal(stop_signal)
            if before is signal.SIG_DFL or before is signal.default_int_handler:
                _taken[stop_signal] = before
                signal.signal(stop_signal, _stop_now)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def hand_over() -> dict[int, Callable[[int, FrameType | None], Any] | int]:
    """The signals `install` took that still have its handler, each with the handler it had before; they are the
    caller's from now on. The caller replaces this module's handlers with its own, leaving no instant in which a stop
    signal would meet the default action (SIGTERM's and SIGHUP's: death without a word)."""
    handed = {number: before for number, before in _taken.items() if signal.getsignal(number) is _stop_now}
    _taken.clear()
    return handed


install()
