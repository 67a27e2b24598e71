"""What vLLM's engine processes do so that the names vLLM gives its shared memory and files do
not outlive them, however they end (:func:`.vllm_boot.boot` applies each hook once vLLM's
module is imported).

- :func:`release_names_when_attached`: the ring buffers of vLLM's ``shm_broadcast`` queues
  (``psm_*`` in ``/dev/shm``; see :mod:`.vllm_boot`).
- :func:`release_cpu_shm_names_when_joined`: the segments of vLLM's CPU communicator for
  tensor and pipeline parallel ranks (``vllm_dist_<id>-tp:0-[0-1]-cpushm_<rank>``, 4 MiB each
  here). vLLM's C++ ``SHMManager`` (``csrc/cpu/shm.cpp``) creates one per rank and unlinks the
  group's names only in its destructor, which runs at the C library's exit. A rank that does not
  exit through it (SIGKILL: vLLM's executor kills a worker that has not exited 5 + 4 s after
  its shutdown began, which a starved worker on a loaded host does not; the OOM killer)
  leaves its name, and when both ranks are killed both names stay (docs/deployment.md,
  "Shared memory of tensor-parallel ranks"). Here each rank unlinks the group's names once
  every rank has joined (mapped every segment): the mappings work on and the kernel frees
  the memory with the last process holding it. What was left before (or by raw vLLM) goes
  at the next engine start of the host, once no process maps it (:func:`sweep_unheld_cpu_shm`).
- :func:`rendezvous_in_the_owner_directory`: torch's ``FileStore`` file (:mod:`.ipc_directory`).

Standard library only, vLLM named in strings: :mod:`.vllm_boot` loads this file by path in
the engine processes, before vLLM is imported.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

__all__ = [
    "CPU_SHM_MARK",
    "release_cpu_shm_names_when_joined",
    "release_names_when_attached",
    "rendezvous_in_the_owner_directory",
    "sweep_unheld_cpu_shm",
]


def release_names_when_attached(shm_broadcast: Any) -> None:
    """Make every ``MessageQueue`` of vLLM's ``shm_broadcast`` module unlink the ``/dev/shm``
    names it created once all its readers have attached (see :mod:`.vllm_boot`).

    A reader attaches in ``MessageQueue.create_from_handle`` before it subscribes, and the
    writer's ``wait_until_ready`` returns once every local reader has subscribed, so no one
    opens the name after that. ``unlink`` also takes the name off multiprocessing's resource
    tracker; the buffer then counts as not its creator's, so vLLM does not unlink it again.
    """
    queue = shm_broadcast.MessageQueue
    wait = queue.wait_until_ready

    @functools.wraps(wait)
    def wait_until_ready(self: Any) -> None:
        wait(self)
        # The ring buffer; its tensor arena too, where vLLM has one (0.32+, off by default).
        for holder in (getattr(self, "buffer", None), getattr(self, "tensor_arena", None)):
            if holder is not None and getattr(holder, "is_creator", False):
                holder.shared_memory.unlink()
                holder.is_creator = False

    queue.wait_until_ready = wait_until_ready


def release_cpu_shm_names_when_joined(cpu_communicator: Any) -> None:
    """Make vLLM's CPU communicator unlink its group's ``/dev/shm`` names once every rank has
    joined (see the module docstring).

    ``_CPUSHMDistributed._init_cpu_shm`` creates this rank's segment (``init_shm_manager``),
    waits for every rank (a barrier), opens and maps every other rank's (``join_shm_manager``)
    and waits again: once it returns no rank opens a name of the group again. The C++
    destructor's own ``shm_unlink`` of names already gone fails quietly.
    """
    shm = cpu_communicator._CPUSHMDistributed
    init = shm._init_cpu_shm

    @functools.wraps(init)
    def _init_cpu_shm(self: Any) -> int:
        handle = init(self)
        for rank in range(int(self.communicator.world_size)):
            # SHMManager::get_shm_name: the group's name, "_", the rank; shm_open's directory.
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", f"{self.group_name}_{rank}"))
        return int(handle)

    shm._init_cpu_shm = _init_cpu_shm


def rendezvous_in_the_owner_directory(network_utils: Any) -> None:
    """Put the file of torch's ``FileStore`` rendezvous, which vLLM makes in the temporary
    directory (``get_file_store_init_method``) and leaves there when a rank is killed, in the
    owner directory of the engine's IPC sockets (:mod:`.ipc_directory`), when it has one."""
    made = network_utils.get_file_store_init_method

    @functools.wraps(made)
    def get_file_store_init_method() -> str:
        directory = os.environ.get("VLLM_RPC_BASE_PATH", "")
        if not os.path.basename(directory).startswith("vllm-inline-ipc-"):
            return str(made())
        return "file://" + os.path.join(directory, os.path.basename(made()))

    network_utils.get_file_store_init_method = get_file_store_init_method


CPU_SHM_MARK = "-cpushm_"
"""In the ``/dev/shm`` names of vLLM's CPU communicator: ``<group>-cpushm_<rank>``."""


def sweep_unheld_cpu_shm(root: str = "/dev/shm", settle: float = 60.0) -> list[str]:
    """Remove the CPU communicator segments in ``root`` that no process maps: what ranks
    killed before :func:`release_cpu_shm_names_when_joined` (or raw vLLM's, the names of
    which outlive their ranks) left. Only this user's, older than ``settle`` s (a rank maps its
    segment right after creating it), mapped by none of this user's processes
    (``/proc/<pid>/maps``). Returns the names removed; never raises."""
    import time

    removed: list[str] = []
    try:
        names = [n for n in os.listdir(root) if CPU_SHM_MARK in n]
    except OSError:
        return removed
    now, uid, candidates = time.time(), os.getuid(), {}
    for name in names:
        with contextlib.suppress(OSError):
            info = os.stat(os.path.join(root, name))
            if info.st_uid == uid and now - info.st_mtime > settle:
                candidates[info.st_ino] = name
    if not candidates:
        return removed
    held = _mapped_inodes(root, uid)
    if held is None:
        return removed
    for inode, name in candidates.items():
        if inode not in held:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
                removed.append(name)
    return removed


def _mapped_inodes(root: str, uid: int) -> set[int] | None:
    """Inodes under ``root`` that this user's processes map or hold open; None when ``/proc``
    cannot be read. A process the kernel does not let this one read (a container's init, a
    process of another namespace) is passed over: an engine's ranks are the user's own
    processes, readable by it."""
    held: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(root + "/"):
                        held.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{entry}/fd"):
                path = f"/proc/{entry}/fd/{fd}"
                with contextlib.suppress(OSError):
                    if os.readlink(path).startswith(root + "/"):
                        held.add(os.stat(path).st_ino)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended meanwhile, or not readable (above)
        except OSError:
            return None
    return held
