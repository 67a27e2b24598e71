"""What vLLM's engine processes run first: the quiet filters, a watch that ends the process when
the process that started it ends, and on a CPU the workers forked.

vLLM spawns its engine core (and, from there, its workers) as new interpreters; nothing of
this process reaches them but the environment. :func:`engine_environment` puts a directory
holding a ``sitecustomize`` on their ``PYTHONPATH``; the interpreter runs it before anything
else, vLLM's import included. It loads :mod:`.vllm_quiet` (vLLM's start-up noise, see there)
and this file by path and calls :func:`boot`. Both files therefore import nothing but the
standard library and name vLLM only in strings.

**Dying with the app.** vLLM's workers watch their engine core through a death pipe, but the
engine core watches nothing (vLLM issues 55510, 34643, 19849): when the app is killed (SIGTERM
with Python's default handler, SIGKILL, the OOM killer, ``os._exit``, a notebook kernel
restart) the engine core and its workers lived on, holding their memory and their shared-memory
segments. :func:`watch_parent` waits on a pidfd of the parent (no polling), then sends the
process SIGTERM, on which vLLM's engine core runs its own shutdown: its workers exit and its
shared memory is released (SIGKILL follows after the time that shutdown is given). Each engine
process leads a process group of its own, so a signal to the app's whole group (a notebook
kernel's forced restart, Ray killing a replica's group) reaches the app alone and the engine
stops as above instead of dying with it, shared memory left behind.

**Shared memory with no name left behind.** vLLM's engine core broadcasts to its workers, and
each worker answers, through ring buffers in ``/dev/shm`` that the writer creates and only its
own shutdown unlinks. When the writer is killed outright (Ray's cleanup of a killed replica's
children, the OOM killer choosing the engine core, the biggest process) nothing unlinks them, and
each stays in ``/dev/shm``, holding its memory, until the machine restarts.
:func:`.vllm_names.release_names_when_attached` unlinks a queue's names as soon as every reader
has attached (``wait_until_ready``), the way Ray's object store does its own: the mappings work
on, and the kernel frees the memory when the last process holding it ends, however it ends; so
do the tensor-parallel ranks' segments of vLLM's CPU communicator (:mod:`.vllm_names`).
**Forked, not spawned, on a CPU:** workers (:func:`fork_workers`), engine cores
(:func:`boot_forked`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.abc
import importlib.util
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "PARENT_PID_VARIABLE",
    "PROCESS_START_VARIABLE",
    "boot",
    "boot_forked",
    "cpus_to_bind",
    "engine_environment",
    "exit_without_finalization",
    "fork_workers",
    "watch_parent",
]

PARENT_PID_VARIABLE = "VLLMINLINE_PARENT_PID"
"""The pid of the process that spawned this one, as that process saw itself: a child that
finds another parent was orphaned before its watch began, and stops at once."""

PROCESS_START_VARIABLE = "VLLMINLINE_PROCESS_START"
"""How an engine's processes start on a CPU: ``fork`` (engine cores from a fork server,
``.vllm_processes``, workers from their engine core, :func:`fork_workers`; the default where
:mod:`.fork_support` allows it) or ``spawn`` (vLLM's own way)."""

_SPAWNED_FLAG = "--multiprocessing-fork"  # multiprocessing's spawn puts it on a child's argv
_RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"  # the tracker's -c code
_FORK_SERVER = "from multiprocessing.forkserver import main"  # .vllm_processes's server
_SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"  # vLLM's MessageQueue
_CPU_COMMUNICATOR = "vllm.distributed.device_communicators.cpu_communicator"  # TP/PP on a CPU

_FILE_STORE = "vllm.utils.network_utils"  # get_file_store_init_method: torch's rendezvous file


def engine_environment(*, cpu: bool = False) -> dict[str, str]:
    """The engine processes' environment: the boot directory on ``PYTHONPATH``, this pid, vLLM's
    quiet levels (:mod:`.vllm_quiet`), on a CPU (``cpu``) :data:`PROCESS_START_VARIABLE`."""
    from vllm_inline.engine.seam import boot_site, fork_support, ipc_directory, vllm_quiet

    rpc = ipc_directory.owner_directory()
    boot = boot_site.boot_directory(rpc)
    # Engines that start at once each set this while they spawn: keep one boot entry.
    paths = [boot, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != boot)]
    environment = {
        **vllm_quiet.quiet_environment(),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        PARENT_PID_VARIABLE: str(os.getpid()),
    }
    # The user's own VLLM_RPC_BASE_PATH stays theirs (and so do the files vLLM leaves there).
    if os.environ.get(ipc_directory.RPC_VARIABLE, rpc) == rpc:
        environment[ipc_directory.RPC_VARIABLE] = rpc
    if cpu:  # the user's choice, else the default (fork_support)
        start = os.environ.get(PROCESS_START_VARIABLE) or fork_support.default_process_start()
        environment[PROCESS_START_VARIABLE] = start
    return environment


def boot(quiet_module: Any) -> None:
    """Run in each engine process before vLLM is imported (from the ``sitecustomize``)."""
    quiet_module.install_filters()
    if _SPAWNED_FLAG in sys.argv or _RESOURCE_TRACKER in " ".join(sys.orig_argv):
        # A process group of its own: a SIGKILL to the app's whole group (a notebook kernel's
        # forced restart, Ray killing a replica's group) would otherwise kill the engine's
        # processes and the resource tracker with it, and nothing would unlink their shared
        # memory. Outside it, the engine sees its parent die, and the tracker outlives them.
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    watch_parent(grace=quiet_module.shutdown_timeout())
    names = _sibling("vllm_names")  # vLLM's names in /dev/shm and /tmp: gone with the engine
    _after_import(_SHM_BROADCAST, names.release_names_when_attached)
    _after_import(_CPU_COMMUNICATOR, names.release_cpu_shm_names_when_joined)
    _after_import(_FILE_STORE, names.rendezvous_in_the_owner_directory)
    exit_without_finalization()
    if _SPAWNED_FLAG in sys.argv and os.environ.get(PROCESS_START_VARIABLE) == "fork":
        fork_workers(grace=quiet_module.shutdown_timeout())
    if _FORK_SERVER in " ".join(sys.orig_argv):  # it imports torch and vLLM too: as above
        atexit.register(_exit_through_the_c_library, 0)


def exit_without_finalization() -> None:
    """End this spawned process, once its exit hooks have run, through the C library's
    ``exit`` with the process's exit code, without the interpreter's finalization.

    vLLM freezes its heap once the engine is built and unfreezes it in its own teardown (so that
    an engine deleted in a live process frees its memory). In a spawned engine process the
    interpreter's finalization then walks that whole heap of torch, transformers and vLLM in its
    last collections: 2.5-3 s of each process's exit on a 2-core host (``perf``:
    ``gc_collect_main``), and the engine core waits for its worker's. vLLM skips them the same
    way on ROCm (a ``gc.freeze()`` before the exit, ``EngineCoreProc.run_engine_core``); here a
    frozen heap would leave triton's nanobind objects uncollected, which nanobind reports as
    leaks on stderr. The C library's ``exit`` still runs the C++ destructors and C exit
    handlers (vLLM's CPU communicator unlinks its ``/dev/shm`` segments in one). Registered
    before vLLM is imported, the hook runs after every other exit hook. The exit code is the
    one multiprocessing's ``spawn._main`` returns (unchanged since Python 3.8); without it the
    process exits as before. Only in processes started by multiprocessing's spawn.
    """
    if _SPAWNED_FLAG not in sys.argv:
        return
    from multiprocessing import spawn

    run = getattr(spawn, "_main", None)
    if run is None:
        return
    exit_code: list[int] = []

    @functools.wraps(run)
    def _main(*args: Any, **kwargs: Any) -> int:
        exit_code.append(run(*args, **kwargs))
        return exit_code[-1]

    def exit_now() -> None:
        if exit_code:  # else the child's main did not return: the interpreter's exit as usual
            _exit_through_the_c_library(exit_code[-1])

    spawn._main = _main
    atexit.register(exit_now)


def _exit_through_the_c_library(code: int, *, otherwise: Any = None) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).exit(code)
    if otherwise is not None:
        otherwise(code)


def fork_workers(grace: float) -> None:
    """In an engine core, start vLLM's workers by forking it, bound as vLLM binds spawned ones.

    vLLM forks its workers on GPUs; its CPU platform forces ``spawn`` because it binds a
    worker's OpenMP threads through the environment it spawns the worker with
    (``OMPProcessManager.configure_omp_envs``: ``OMP_NUM_THREADS``, and ``OMP_PLACES``,
    ``KMP_AFFINITY`` or ``GOMP_CPU_AFFINITY``), which OpenMP reads when torch loads it. A spawned
    worker imports torch, transformers and vLLM again (docs/performance.md); a forked one has
    them and applies the binding itself: the thread count is set here just before the fork, as
    vLLM does for forked workers (``set_multiprocessing_worker_envs``; setting it in a forked
    child can deadlock OpenMP), and the CPUs become the child's affinity before it starts a
    thread. The child watches this process and ends through the C library's ``exit``, not the
    ``os._exit`` of multiprocessing's fork, which skips C++ destructors (vLLM's CPU communicator
    unlinks its ``/dev/shm`` segments in one).
    """
    from multiprocessing import util

    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # read by vLLM's get_mp_context
    os.register_at_fork(before=_size_the_childs_threads)
    _forked_worker.grace = grace
    util.register_after_fork(_forked_worker, _bind_the_forked_worker)


class _ForkedWorker:  # multiprocessing keeps an after-fork hook's object by a weak reference
    grace = 0.0


_forked_worker = _ForkedWorker()


def cpus_to_bind(environment: Mapping[str, str]) -> set[int] | None:
    """The CPUs vLLM binds a worker's OpenMP threads to through ``environment``, or None."""
    affinity = environment.get("KMP_AFFINITY", "")
    if "proclist=[" in affinity:
        places = affinity.split("proclist=[", 1)[1].split("]", 1)[0]
    else:
        places = environment.get("OMP_PLACES") or environment.get("GOMP_CPU_AFFINITY") or ""
    cpus: set[int] = set()
    for part in places.replace("{", " ").replace("}", " ").replace(",", " ").split():
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None  # a form vLLM does not write: leave the binding to OpenMP
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus or None


def _size_the_childs_threads() -> None:
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) != torch.get_num_threads():
        torch.set_num_threads(int(threads))


def _bind_the_forked_worker(worker: _ForkedWorker) -> None:
    cpus = cpus_to_bind(os.environ)
    if cpus:
        os.sched_setaffinity(0, cpus)
    # multiprocessing's fork ends the child with os._exit once the worker's main has returned
    # Replaced, not wrapped at the call: multiprocessing looks os._exit up when it calls it.
    os._exit = functools.partial(_exit_through_the_c_library, otherwise=os._exit)  # type: ignore[assignment]
    _watch_parent_pid(worker.grace)


def watch_parent(grace: float) -> None:
    """End this process once its parent has exited: SIGTERM, then SIGKILL after ``grace`` s.

    Only in processes started by multiprocessing's spawn, as vLLM starts its engine cores and
    workers; any other process that inherits the environment (multiprocessing's resource
    tracker, which must outlive everyone to release what they leaked) is left alone.
    """
    if _SPAWNED_FLAG in sys.argv:
        _watch_parent_pid(grace)


def _watch_parent_pid(grace: float) -> None:
    expected = os.environ.get(PARENT_PID_VARIABLE, "")
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())  # for this process's own children
    parent = os.getppid()
    orphaned = expected.isdigit() and int(expected) != parent  # the parent died meanwhile
    owner = int(expected) if expected.isdigit() else parent
    _stop_when(None if orphaned else functools.partial(_wait_for_pid, parent), grace, owner)


def _wait_for_pid(parent: int) -> None:
    try:
        pidfd = os.pidfd_open(parent)  # Linux 5.3+
    except (AttributeError, OSError):
        while os.getppid() == parent:  # other systems: a cheap read once a second
            time.sleep(1.0)
    else:
        select.select([pidfd], [], [])  # readable once the parent has exited
        os.close(pidfd)


def _stop_when(wait: Any, grace: float, parent: int) -> None:
    threading.Thread(
        target=_stop_after,
        args=(wait, grace, parent),
        name="vllm-inline-parent-watch",
        daemon=True,
    ).start()


def _stop_after(wait: Any, grace: float, parent: int) -> None:
    if wait is not None:
        wait()
    # The parent has ended. When it was the owner of the engine's files, it did not remove them
    # (SIGTERM, SIGKILL): its engine processes do; the sockets they hold work on unnamed.
    with contextlib.suppress(Exception):
        _sibling("ipc_directory").remove_for_ended_owner(
            os.environ.get("VLLM_RPC_BASE_PATH", ""), parent
        )
    # vLLM's engine core and workers turn SIGTERM into their own orderly shutdown. An engine
    # core still starting finishes its start first (vLLM applies a SIGTERM received then once
    # it is built); one that is not gone after the grace vLLM's own teardown takes is killed:
    # its workers follow it through their death pipes, and multiprocessing's resource tracker
    # releases the shared memory it held.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    os.kill(os.getpid(), signal.SIGKILL)


def boot_forked(app_sentinel: int | None, grace: float) -> None:
    """What :func:`boot` does in a spawned engine core, in one forked from the fork server
    (``.vllm_processes``): a process group of its own, its end once the pipe from the app
    (``app_sentinel``; its parent is the fork server) closes, the C library's exit, and its
    workers forked."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    app = os.environ.get(PARENT_PID_VARIABLE, "")  # the app's pid, set where it started us
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())  # for this process's own children
    if app_sentinel is not None:
        wait = functools.partial(select.select, [app_sentinel], [], [])
        _stop_when(wait, grace, int(app) if app.isdigit() else 0)
    # Replaced, not wrapped at the call: multiprocessing looks os._exit up when it calls it.
    os._exit = functools.partial(_exit_through_the_c_library, otherwise=os._exit)  # type: ignore[assignment]
    if os.environ.get(PROCESS_START_VARIABLE) == "fork":
        fork_workers(grace)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` has been executed, wherever it is
    imported from. The standard library has no post-import hook, and this file runs before
    vLLM is imported, so it cannot patch vLLM's module any other way."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; the real finders locate the module
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                execute(module)
                self.then(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _after_import(name: str, then: Any) -> None:
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _sibling(name: str) -> Any:
    """The module ``name`` of this folder (standard library only), imported where the package
    is (the app), else loaded by path (an engine process: see :func:`boot`)."""
    module = sys.modules.get(f"{__package__}.{name}") or sys.modules.get(f"_vllm_inline_{name}")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_vllm_inline_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"_vllm_inline_{name}"] = module
        spec.loader.exec_module(module)
    return module
