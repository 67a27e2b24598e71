"""A quiet engine start and shutdown: vLLM's start-up noise off, nothing reported leaked at exit.

Left alone, every engine start printed, besides vLLM's own INFO lines (on stdout):

- "Triton is installed, but doesn't include CPU backend" once per process (this one, vLLM's
  engine core, its worker). ``xgrammar`` installs CUDA Triton on every Linux x86 machine, and
  vLLM's CPU build logs this from ``vllm.triton_utils.importing`` while it is being imported,
  before it configures its logging, so ``VLLM_LOGGING_LEVEL`` did not apply to it;
- two ``FutureWarning``\\ s from ``vllm/triton_utils/dispatcher.py`` in the worker: with Triton
  disabled, vLLM's CPU platform swaps Triton kernels for C++ ones and scans the attributes of
  every loaded module for them, which touches torch's deprecated ``torch.distributed.reduce_op``;
- "NUMA binding: Using MEMBIND policy ..." from the worker: a ``TORCH_WARN`` in vLLM's C++
  ``init_cpu_memory_env``, printed by torch's C++ logger.

At vLLM's quiet levels (``VLLM_LOGGING_LEVEL`` ERROR or CRITICAL, the default here when the
variable is unset) :func:`install_filters` and :func:`quiet_environment` silence exactly those;
``VLLM_LOGGING_LEVEL=WARNING``, ``INFO`` or ``DEBUG`` leaves every line as vLLM prints it.

The engine's processes are spawned, so nothing of this process reaches them but the
environment. Environment variables cover the log level and torch's C++ logger; the Triton line
is logged while vLLM is imported, before any code of ours could run there, so the engine's
processes call :func:`install_filters` from the ``sitecustomize`` that :mod:`.vllm_boot` puts
on their ``PYTHONPATH``, which loads this file on its own. This module therefore imports nothing
but the standard library, and names vLLM's loggers and modules only as strings.

At exit a script printed "resource_tracker: There appear to be 1 leaked shared_memory objects"
(or semaphore objects). Those are the engine core's: the ring buffer it broadcasts to its
workers and the lock it shares with them, registered with this process's ``resource_tracker``
(spawned processes share their parent's) and released by the engine core only once its workers
have exited. A worker's exit (gloo teardown, a collection of its whole heap) takes seconds on a
busy machine; a shutdown that kills the engine core first leaks both.
:func:`shutdown_timeout` gives vLLM's own teardown the time it bounds itself to.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

__all__ = [
    "install_filters",
    "quiet",
    "quiet_environment",
    "shutdown_timeout",
]

DEFAULT_LEVEL = "ERROR"
"""vLLM's log level for the engines of this package when ``VLLM_LOGGING_LEVEL`` is unset: a
library's user reads vLLM's INFO lines and capability warnings as noise (vLLM's own default
is INFO, for its server)."""

_QUIET_LEVELS = frozenset({"ERROR", "CRITICAL"})
_REDUCE_OP_WARNING = "`torch.distributed.reduce_op` is deprecated"


def level() -> str:
    """The level vLLM's logs run at in the engine's processes."""
    return (os.environ.get("VLLM_LOGGING_LEVEL") or DEFAULT_LEVEL).upper()


def quiet() -> bool:
    """True when vLLM's warnings are not wanted (``VLLM_LOGGING_LEVEL`` unset, ERROR or
    CRITICAL)."""
    return level() in _QUIET_LEVELS


def install_filters() -> None:
    """Apply vLLM's log level in this process from now on, and drop the one ``FutureWarning``
    vLLM's kernel scan provokes (idempotent; does nothing at vLLM's verbose levels).

    Call it before vLLM is imported: its import logs before vLLM configures its logging, and
    with no handler anywhere Python's last-resort handler prints every WARNING. vLLM sets the
    same level on the same logger once it configures logging.
    """
    if not quiet():
        return
    logging.getLogger("vllm").setLevel(level())
    # vLLM's own code, on each start, in the worker only (see the module docstring); torch's
    # deprecation is about an alias vLLM never uses, so this warning tells a user nothing.
    warnings.filterwarnings(
        "ignore",
        message=re.escape(_REDUCE_OP_WARNING),
        category=FutureWarning,
        module=r"vllm\.triton_utils\.dispatcher\Z",
    )


def quiet_environment() -> dict[str, str]:
    """Environment variables for the engine's processes (empty at vLLM's verbose levels)."""
    if not quiet():
        return {}
    environment = {"VLLM_LOGGING_LEVEL": level()}
    if "TORCH_CPP_LOG_LEVEL" not in os.environ:
        # The NUMA-binding line is a C++ TORCH_WARN; torch's C++ logger can only be filtered
        # by level. Errors still print; the engine's processes run only vLLM's code.
        environment["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    return environment


def shutdown_timeout() -> float:
    """Seconds to let vLLM's engine core shut down before it is killed.

    The engine core waits ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 by default) for its
    workers, then 4 s after a SIGTERM, then kills them and releases its shared memory and
    lock; the rest of its teardown took up to 4 s here on a loaded machine. vLLM's shutdown
    returns as soon as its processes are down: the bound is paid only by a slow teardown.
    """
    try:
        worker_grace = float(os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5"))
    except ValueError:
        worker_grace = 5.0
    return worker_grace + 4.0 + 6.0
