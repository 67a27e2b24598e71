"""Whether engine processes may be forked on this Python: the standard library's private
``multiprocessing`` internals the forked starts use, checked before they are used.

On a CPU the engine cores come from a fork server of the package's own (:mod:`.vllm_processes`)
and each forks its worker (:mod:`.vllm_boot`). Both reach into ``multiprocessing``'s private
internals (:data:`INTERNALS`), which CPython may change in any release: the standard library
offers no public way to run a fork server of one's own, or to fork a child that then starts as a
spawned one. They were read in CPython 3.10, 3.11, 3.12, 3.13 and 3.14 (:data:`VERIFIED`):
every name exists in each with the same meaning, and ``popen_forkserver.Popen._launch``, which
:mod:`.vllm_processes` copies, has the same body in all five (3.14 adds an authentication step
inside ``ForkServer.connect_to_new_process``, which a private server does with itself; from 3.13
a forked child runs its ``atexit`` hooks before ``os._exit``, after which :mod:`.vllm_boot`'s
exit still applies). On any other Python, or where a name is missing, the processes are spawned
(vLLM's own way, as with ``VLLMINLINE_PROCESS_START=spawn``) and one log line says why.

Standard library only: ``tests/test_fork_support.py`` also loads this file by path in every
other CPython on the machine.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys

__all__ = ["INTERNALS", "PYTHON", "VERIFIED", "default_process_start", "fork_unavailable"]

PYTHON = sys.version_info[:2]
"""The running CPython release, ``(major, minor)``."""
VERIFIED = ((3, 10), (3, 14))
"""The oldest and newest CPython releases whose ``multiprocessing`` internals were read."""

INTERNALS = (
    # vllm_processes: a fork server of the package's own, and its children
    ("multiprocessing.forkserver", "ForkServer.connect_to_new_process"),
    ("multiprocessing.forkserver", "ForkServer.ensure_running"),
    ("multiprocessing.forkserver", "ForkServer.set_forkserver_preload"),
    ("multiprocessing.forkserver", "ForkServer._stop"),
    ("multiprocessing.forkserver", "_forkserver._forkserver_pid"),
    ("multiprocessing.forkserver", "_forkserver._forkserver_alive_fd"),
    ("multiprocessing.forkserver", "read_signed"),
    ("multiprocessing.popen_forkserver", "Popen._launch"),
    ("multiprocessing.spawn", "get_preparation_data"),
    ("multiprocessing.context", "set_spawning_popen"),
    ("multiprocessing.context", "BaseContext"),
    ("multiprocessing.process", "BaseProcess._Popen"),
    ("multiprocessing.process", "parent_process"),
    ("multiprocessing.util", "Finalize"),
    ("multiprocessing.util", "close_fds"),
    ("multiprocessing.util", "get_temp_dir"),  # reads the process's _config["tempdir"]
    ("multiprocessing.process", "_current_process._config"),  # the server's socket's directory
    # vllm_boot: a worker forked from its engine core, and the C library's exit
    ("multiprocessing.spawn", "_main"),
    ("multiprocessing.util", "register_after_fork"),
    ("os", "_exit"),
)
"""``(module, attribute path)`` of every private or internal standard-library name used."""

logger = logging.getLogger("vllm_inline")


def fork_unavailable(version: tuple[int, int] | None = None) -> str | None:
    """Why engine processes cannot be forked on this Python (``version``: that release instead
    of :data:`PYTHON`), or ``None`` when they can."""
    major, minor = version or PYTHON
    (low, high) = VERIFIED
    if not low <= (major, minor) <= high:
        return (
            f"Python {major}.{minor}: the multiprocessing internals the forked start uses were "
            f"read in {low[0]}.{low[1]} to {high[0]}.{high[1]} only"
        )
    for module, path in INTERNALS:
        found: object = importlib.import_module(module)
        for name in path.split("."):
            if not hasattr(found, name):
                return f"Python {major}.{minor} has no {module}.{path}"
            found = getattr(found, name)
    return None


@functools.cache
def default_process_start() -> str:
    """How the engine's processes start on a CPU when ``VLLMINLINE_PROCESS_START`` is unset:
    ``fork`` where :func:`fork_unavailable` finds nothing, else ``spawn``, said once."""
    reason = fork_unavailable()
    if reason is None:
        return "fork"
    logger.warning(
        "vllm-inline: engine processes are spawned, not forked (%s); starts take longer. "
        "VLLMINLINE_PROCESS_START=spawn silences this.",
        reason,
    )
    return "spawn"


if __name__ == "__main__":  # `python fork_support.py`: this interpreter's answer
    print(fork_unavailable() or "fork")
