"""The engine cores' fork server dies with the process that launched it, even in the middle of
its imports (:mod:`.vllm_processes`).

The standard library's fork server notices its parent's end through a pipe it reads only once
its preloaded modules are imported: killed 1-3 s into an engine start, an app left its fork
server importing torch and vLLM for 4-6 more seconds here (10-20 s on a loaded host), holding
100-600 MB. This module is the server's first preloaded import (the package's own imports before it take
~0.1 s, no torch): when the server was launched with :data:`PARENT_VARIABLE` naming its parent,
Linux's parent-death signal kills it the moment the parent dies. :mod:`.fork_server_ready`, the
last preloaded import, calls :func:`disarm` and leaves the rest of its life to the standard
library's pipe: the signal would also fire when the launching *thread* ends (an engine's loop
thread) while engine cores forked from the server run on, and their exit codes come through
the server.

Standard library only: it runs before anything else in the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["PARENT_VARIABLE", "disarm"]

PARENT_VARIABLE = "VLLMINLINE_FORK_SERVER_PARENT"
"""The pid of the process launching the fork server, in the server's environment."""

_PR_SET_PDEATHSIG = 1
_armed = False


def _prctl_death_signal(number: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, number) == 0)
    except (OSError, AttributeError):  # not Linux
        return False


def _arm() -> None:
    global _armed
    parent = os.environ.get(PARENT_VARIABLE, "")
    if not parent.isdigit():
        return
    # A process group of its own, as the engine cores have (.vllm_boot): what is sent to the
    # app's group must not reach it. ipykernel's shutdown SIGTERMs every child in the kernel's
    # group; the server's end closes the status pipes of the engine cores forked from it,
    # which vLLM reads as their death (and logs an ERROR), while they still run. Its own end
    # comes with the app's: the signal below, then the standard library's "alive" pipe.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if os.getppid() == int(parent):
        _armed = _prctl_death_signal(signal.SIGKILL)
        if os.getppid() != int(parent):  # the parent ended before the signal was set
            os._exit(1)
        return
    try:
        os.kill(int(parent), 0)
    except ProcessLookupError:  # launched by a parent already gone: nothing to serve
        os._exit(1)
    except PermissionError:
        pass


def disarm() -> None:
    """In the fork server, once its imports are done: no parent-death signal from now on."""
    global _armed
    if _armed:
        _prctl_death_signal(0)
        _armed = False


_arm()
