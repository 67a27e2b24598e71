"""The one directory where an engine's processes put their files: vLLM's IPC sockets and
rendezvous file, the engine processes' boot directory. Removed when its owner stops; swept by
the next engine start on the host once its owner is dead.

vLLM binds its ZMQ sockets at ``ipc://<VLLM_RPC_BASE_PATH>/<uuid4>`` (``get_open_zmq_ipc_path``;
the variable defaults to the temporary directory) and never removes the files: raw
``AsyncLLM`` leaves 7 socket files in ``/tmp`` per engine, on every stop, clean ones included
(docs/deployment.md, "Files in /tmp and /dev/shm"). Here every engine process of one owner
(the process that started the engines) gets ``VLLM_RPC_BASE_PATH=<tmp>/vllm-inline-ipc-<pid>-<start>``: one
directory, mode 0700, named after the owner's pid and start time (clock ticks since boot, from
``/proc``, so a pid reused by another process is not mistaken for the owner). It is removed when
the owner's last engine shuts down, at the owner's exit, by the engine cores when they see their
owner gone (SIGTERM, SIGKILL: :mod:`.vllm_boot`), and otherwise (the engine cores killed too) by
the next engine start of any process on the host (:func:`sweep`): a directory of the same user
whose owner no longer runs.

Why a directory and not Linux's abstract socket namespace (``ipc://@name``, which leaves
nothing on disk): an abstract socket has no permissions, so any local user could connect to an
engine core's input socket and send it requests; a socket file in a 0700 directory admits the
owner's user only (vLLM's own files admit the user by the umask's mode). And vLLM's rendezvous
file (torch's ``FileStore``) needs a real directory. The abstract namespace is the fallback where
no directory can be made (a read-only or full temporary directory): the engine still starts,
where vLLM's own paths would fail.

Standard library only: :mod:`.vllm_boot` loads this file by path in the engine processes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading

__all__ = [
    "METRICS_PREFIX",
    "PREFIX",
    "RPC_VARIABLE",
    "hold",
    "is_dead_owners",
    "leaving",
    "owner_alive",
    "owner_directory",
    "process_start",
    "release",
    "remove_for_ended_owner",
    "remove_if_owner_dead",
    "sweep",
]

RPC_VARIABLE = "VLLM_RPC_BASE_PATH"
"""vLLM's variable for the directory of its IPC sockets (``vllm/envs.py``)."""
PREFIX = "vllm-inline-ipc-"
"""The start of an owner directory's name: ``vllm-inline-ipc-<pid>-<start>``."""

logger = logging.getLogger("vllm_inline")

_LONGEST = 107 - 1 - 36 - 1  # sockaddr_un's path, less "/", vLLM's uuid4 and the final NUL
_lock = threading.Lock()
_engines = 0  # engines of this process that hold the directory (hold/release)
_path: str | None = None  # this process's directory, or its abstract name ("@...")


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None where ``/proc`` does not
    say (not Linux) or the process has ended (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    try:
        if fields[0] in ("Z", "X"):  # fields[0] is field 3 of proc(5), the state
            return 0
        return int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None


def owner_alive(pid: int, start: int) -> bool:
    """True while process ``pid`` runs and is the one that started at ``start`` (0: unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it runs
    now = process_start(pid)
    if now == 0:
        return False  # ended, not yet reaped by its parent
    return start == 0 or now is None or now == start


METRICS_PREFIX = "vllm-inline-metrics-"
"""A ``--workers`` launcher's directory of the workers' metric files (:mod:`vllm_inline.workers`):
``vllm-inline-metrics-<pid>-<start>-<random>``; swept alike."""


def _owner(name: str) -> tuple[int, int] | None:
    """``(pid, start)`` from a directory name of :data:`PREFIX` or :data:`METRICS_PREFIX`
    (start 0 where the name has none), else None."""
    if name.startswith(PREFIX):
        pid, _, start = name[len(PREFIX) :].partition("-")
        if not (pid.isdigit() and start.isdigit()):
            return None
        return int(pid), int(start)
    if name.startswith(METRICS_PREFIX):
        parts = name[len(METRICS_PREFIX) :].split("-")
        if not parts[0].isdigit():
            return None
        start = parts[1] if len(parts) > 2 and parts[1].isdigit() else "0"
        return int(parts[0]), int(start)
    return None


def is_dead_owners(path: str) -> bool:
    """True when ``path`` is an owner directory of this user whose owner no longer runs."""
    owner = _owner(os.path.basename(path.rstrip("/")))
    if owner is None or not os.path.isabs(path):
        return False
    try:
        if os.lstat(path).st_uid != os.getuid():
            return False  # another user's: never ours to remove, alive or not
    except OSError:
        return False
    return not owner_alive(*owner)


def remove_if_owner_dead(path: str) -> bool:
    """Remove ``path`` when :func:`is_dead_owners`; True when it did."""
    if not is_dead_owners(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def remove_for_ended_owner(path: str, pid: int) -> bool:
    """Remove ``path`` when it is an owner directory of this user named after process ``pid``,
    which the caller has seen end (an engine process whose parent was the owner). True when
    it did."""
    owner = _owner(os.path.basename(path.rstrip("/")))
    if owner is None or owner[0] != pid or not os.path.isabs(path):
        return False
    try:
        if os.lstat(path).st_uid != os.getuid():
            return False
    except OSError:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def sweep(root: str | None = None) -> list[str]:
    """Remove the owner directories (and ``--workers`` launchers' metric directories) in
    ``root`` (the temporary directory) whose owner is dead: what engines killed outright left
    (SIGKILL of their owner and its engine cores, the OOM killer, a machine's power cut).
    Returns the paths removed; never raises."""
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        with contextlib.suppress(OSError):
            if _owner(name) is not None and remove_if_owner_dead(path):
                removed.append(path)
    return removed


def owner_directory() -> str:
    """This process's owner directory (made now if needed), or where none can be made, an
    abstract socket name (``@vllm-inline-ipc-...``: nothing on disk, see the module docstring).
    Use it as ``VLLM_RPC_BASE_PATH`` for the engine processes."""
    global _path
    with _lock:
        if _path is not None and _mine(_path) and (_path[0] == "@" or os.path.isdir(_path)):
            return _path
        sweep()
        from vllm_inline.engine.seam import vllm_names  # the standard library only

        vllm_names.sweep_unheld_cpu_shm()
        name = f"{PREFIX}{os.getpid()}-{process_start(os.getpid()) or 0}"
        path = os.path.join(tempfile.gettempdir(), name)
        try:
            if len(os.fsencode(path)) > _LONGEST:
                raise OSError(f"{path} is too long for a socket path under it")
            os.mkdir(path, 0o700)
        except FileExistsError:
            if os.lstat(path).st_uid != os.getuid() or os.path.islink(path):
                path = _abstract(name, f"{path} exists and is not this user's directory")
            else:
                os.chmod(path, 0o700)
        except OSError as e:  # read-only, full, no such directory
            path = _abstract(name, str(e))
        _path = path
        return path


def _abstract(name: str, reason: str) -> str:
    logger.warning(
        "vllm-inline: no directory for the engine's IPC sockets (%s): they go to Linux's "
        "abstract socket namespace, reachable by every local user. Point TMPDIR at a "
        "writable directory of yours to keep them private.",
        reason,
    )
    return "@" + name


def hold() -> None:
    """An engine of this process starts: the directory stays until :func:`release` (it is made
    by the first :func:`owner_directory`, when the engine starts processes of its own: a front
    end on another process's engine cores makes none)."""
    global _engines
    with _lock:
        _engines += 1


def release() -> None:
    """An engine of this process has stopped (or failed to start): the last one removes the
    directory."""
    global _engines, _path
    with _lock:
        _engines = max(0, _engines - 1)
        if _engines or _path is None:
            return
        path, _path = _path, None
    if not path.startswith("@") and _mine(path):
        shutil.rmtree(path, ignore_errors=True)


def _mine(path: str | None) -> bool:
    """True for a directory this process owns (a forked child inherits the parent's path)."""
    owner = _owner(os.path.basename(path).lstrip("@")) if path is not None else None
    return owner is not None and owner[0] == os.getpid()


def leaving() -> None:
    """The process is exiting: its directory goes now, before its engines' shutdown, whose end
    it may not live to see (Jupyter SIGTERMs a kernel 2.5 s into its shutdown, about what three
    engines' shutdowns take together here). The engines' processes keep what they hold in it
    (bound and connected sockets work on, unlinked); nothing starts there any more."""
    global _path
    with _lock:
        path, _path = _path, None
    if path is not None and not path.startswith("@") and _mine(path):
        shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _at_exit() -> None:
    global _path
    path, _path = _path, None
    if path is not None and not path.startswith("@") and _mine(path):
        shutil.rmtree(path, ignore_errors=True)
