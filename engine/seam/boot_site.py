"""The ``sitecustomize`` vLLM's engine processes start with (:func:`.vllm_boot.boot`), in a
directory of its own on their ``PYTHONPATH`` only.

The directory is ``boot/`` in the owner directory of the engine's files (:mod:`.ipc_directory`),
so it goes with it, however the owner ends. Where the owner directory is an abstract socket name
(no directory could be made), a directory of its own in the temporary directory, removed at exit;
where none can be made either, none: the engine processes then start without the boot (vLLM's
start-up noise, their end with the owner), and one warning says so.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading

__all__ = ["boot_directory"]

logger = logging.getLogger("vllm_inline")

_SITECUSTOMIZE = '''\
"""Written by vllm-inline for vLLM's engine processes (see vllm_boot.py): apply vLLM's log level
before vLLM is imported and end with the parent process, then run the interpreter's own
sitecustomize, if any."""
import importlib.util
import sys


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_load("_vllm_inline_boot", {boot!r}).boot(_load("_vllm_inline_quiet", {quiet!r}))

sys.path[:] = [p for p in sys.path if p != {directory!r}]
_self = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401
except ImportError as e:
    if e.name != "sitecustomize":
        raise
    sys.modules["sitecustomize"] = _self
'''


_lock = threading.Lock()
_fallback: list[str] = []  # the directory made outside an owner directory, once


def boot_directory(owner: str) -> str:
    """The directory holding the ``sitecustomize`` (made now if missing) for an engine whose
    owner directory is ``owner`` (:func:`.ipc_directory.owner_directory`), or ``""``.

    Spawn gives a child its parent's ``sys.path`` once started, and the file takes itself off
    ``sys.path`` before the interpreter's own ``sitecustomize``."""
    with _lock:
        try:
            if not owner.startswith("@"):
                directory = os.path.join(owner, "boot")
                os.makedirs(directory, mode=0o700, exist_ok=True)
            elif _fallback and os.path.isdir(_fallback[0]):
                return _fallback[0]
            else:
                directory = tempfile.mkdtemp(prefix="vllm-inline-boot-")
                atexit.register(shutil.rmtree, directory, True)
                _fallback[:] = [directory]
            path = os.path.join(directory, "sitecustomize.py")
            if not os.path.isfile(path):
                _write(directory, path)
        except OSError as e:
            logger.warning(
                "vllm-inline: no directory for the engine processes' boot (%s): they start "
                "without it (vLLM's start-up logs, and no end when this process is killed).",
                e,
            )
            return ""
        return directory


def _write(directory: str, path: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    source = _SITECUSTOMIZE.format(
        boot=os.path.join(here, "vllm_boot.py"),
        quiet=os.path.join(here, "vllm_quiet.py"),
        directory=directory,
    )
    # Written whole under another name, then renamed: a process spawned meanwhile by another
    # engine of this process never reads half a file.
    partial = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(source)
    os.replace(partial, path)
