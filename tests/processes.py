"""What a test that starts processes needs to clean up after itself: the processes a child
started (by pid and start time, never by name), the ``/dev/shm`` entries they created
(those that appeared while it ran and that its processes hold: another run on the machine
creates entries meanwhile), and what engines leave in the temporary directory."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SHM = "/dev/shm"
RENDEZVOUS_PREFIX = "vllm_dist_"
"""vLLM's ``torch.distributed`` rendezvous files in the temporary directory (vLLM's
``get_file_store_init_method``): left there when a vLLM process is stopped by a signal."""


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` now (multiprocessing's ``psm_*`` segments and ``sem.mp-*``
    semaphores among them)."""
    try:
        return set(os.listdir(SHM))
    except FileNotFoundError:
        return set()


def held_shm(processes: Iterable[psutil.Process], among: set[str]) -> set[str]:
    """Those of ``among`` (names in ``/dev/shm``) that ``processes`` have mapped or open.

    Matched by inode: a process that creates a semaphore maps it under a temporary name, which
    glibc then links to the ``sem.*`` name and unlinks."""
    inodes = {}
    for name in among:
        try:
            inodes[os.stat(os.path.join(SHM, name)).st_ino] = name
        except FileNotFoundError:
            pass
    held = set()
    for p in processes:
        try:
            with open(f"/proc/{p.pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(SHM + "/"):
                        held.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                path = f"/proc/{p.pid}/fd/{fd}"
                if os.readlink(path).startswith(SHM + "/"):
                    held.add(os.stat(path).st_ino)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass  # gone meanwhile
    return {name for inode, name in inodes.items() if inode in held}


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it, as :class:`psutil.Process` objects (which remember
    each process's start time, so a reused pid is never mistaken for one of these)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` that still run (zombies count as gone)."""
    running = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(p)
        except psutil.NoSuchProcess:
            pass
    return running


def wait_gone(
    processes: list[psutil.Process],
    entries: set[str],
    timeout: float,
    since: float | None = None,
) -> tuple[list[psutil.Process], set[str], float]:
    """Wait up to ``timeout`` s (counted from ``since``, a ``time.monotonic()``, if given) for
    ``processes`` to exit and ``entries`` to leave ``/dev/shm``; returns what is still there
    and the seconds waited."""
    start = time.monotonic() if since is None else since
    while True:
        left, shm_left = alive(processes), entries & shm_entries()
        waited = time.monotonic() - start
        if (not left and not shm_left) or waited > timeout:
            return left, shm_left, waited
        time.sleep(0.1)


def clean_up(processes: Iterable[psutil.Process], entries: Iterable[str]) -> None:
    """Kill what is left of ``processes`` and remove ``entries`` from ``/dev/shm``: the ones this
    test created, whatever happened."""
    for p in alive(processes):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive(processes), timeout=10)
    for name in entries:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass


def describe(processes: Iterable[psutil.Process]) -> list[str]:
    """``pid (parent ppid) command line`` of each process still alive, for a failure message."""
    lines = []
    for p in alive(processes):
        try:
            lines.append(f"{p.pid} (parent {p.ppid()}) {' '.join(p.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            pass
    return lines


_GIVEN_PORTS: set[int] = set()
"""Every port :func:`free_port` handed out in this process."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, never handed out before in this
    process, and below the kernel's ephemeral range.

    A test starts several servers at once and each binds its port only after its imports
    (tens of seconds here); meanwhile every ``bind(("", 0))`` on the host picks from the
    ephemeral range (vLLM's engines for their distributed rendezvous, clients' outgoing
    sockets), and two ``bind(0)`` probes can return the same port. Below that range, and
    never twice, a port stays the one server's it was given.
    """
    low = ephemeral_ports()[0]
    candidates = range(20000, low) if low > 21000 else range(0)
    rng = random.Random()
    for _ in range(200 if candidates else 0):
        port = rng.choice(candidates)
        if port not in _GIVEN_PORTS and _bindable(port):
            _GIVEN_PORTS.add(port)
            return port
    while True:  # a host whose ephemeral range starts low: the kernel's pick, never twice
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a TCP socket listening on ``port``."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections
    )


@dataclass
class Footprint:
    """The processes from one pid down and the ``/dev/shm`` entries they hold, at one moment."""

    processes: list[psutil.Process]
    shm: set[str]

    def assert_gone(self, bound: float, what: str, since: float | None = None) -> float:
        """Wait until all of it is gone, at most ``bound`` s (from ``since`` if given), print
        how long that took (shown with ``pytest -s``) and fail naming what is left."""
        since = time.monotonic() if since is None else since
        left, shm_left, waited = wait_gone(self.processes, self.shm, bound, since)
        print(
            f"{what}: {len(self.processes)} processes and {len(self.shm)} /dev/shm entries "
            f"gone in {waited:.1f} s"
        )
        if left or shm_left:  # slow or never: wait a while longer to tell which
            late = f"{describe(left)} {sorted(shm_left)}"
            still, shm_still, waited = wait_gone(left, shm_left, 3 * bound, since)
            late += f"; {'still there' if still or shm_still else 'all gone'} at {waited:.1f} s"
            raise AssertionError(f"{what}: still there after {bound} s: {late}")
        return waited


@dataclass
class Started:
    """The processes a test started and the ``/dev/shm`` entries they created: killed and
    removed at its end, whatever happened (the ``started`` fixture)."""

    before: set[str] = field(default_factory=shm_entries)
    """``/dev/shm`` before the test began: nothing in it is the test's."""
    roots: list[psutil.Process] = field(default_factory=list)
    taken: list[Footprint] = field(default_factory=list)

    def track(self, pid: int) -> None:
        """Clean up ``pid`` and everything below it at the end (listed then, and by
        :meth:`footprint` meanwhile)."""
        self.roots.append(psutil.Process(pid))

    def footprint(self, pid: int) -> Footprint:
        """``pid``'s processes and the entries they hold now that the test created."""
        tree = process_tree(pid)
        taken = Footprint(tree, held_shm(tree, shm_entries() - self.before))
        self.taken.append(taken)
        return taken

    def clean_up(self) -> None:
        for root in alive(self.roots):
            try:
                self.footprint(root.pid)
            except psutil.NoSuchProcess:
                pass
        clean_up(
            [p for f in self.taken for p in f.processes] + self.roots,
            {name for f in self.taken for name in f.shm},
        )


def tmp_entries(root: str | None = None) -> set[str]:
    """Names directly in the temporary directory now."""
    try:
        return set(os.listdir(root or tempfile.gettempdir()))
    except OSError:
        return set()


def bound_sockets() -> set[str]:
    """Paths of the Unix sockets some process has bound (``/proc/net/unix``; abstract names and
    unnamed sockets left out)."""
    paths = set()
    with contextlib.suppress(OSError), open("/proc/net/unix", encoding="utf-8") as f:
        next(f, None)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("/"):
                paths.add(fields[7])
    return paths


def left_in_tmp(among: set[str], root: str | None = None) -> set[str]:
    """Those of ``among`` (names in the temporary directory) that are left behind: a socket
    file no process has bound (vLLM's IPC sockets; an engine's ends unbound), an engine's owner
    directory (``vllm-inline-ipc-<pid>-<start>``) whose owner no longer runs."""
    from vllm_inline.engine.seam import ipc_directory

    root = root or tempfile.gettempdir()
    bound = bound_sockets()
    left = set()
    for name in among:
        path = os.path.join(root, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        unbound_socket = stat.S_ISSOCK(mode) and path not in bound
        if unbound_socket or ipc_directory.is_dead_owners(path):
            left.add(name)
    return left


def remove_from_tmp(names: Iterable[str], root: str | None = None) -> None:
    """Remove ``names`` from the temporary directory (files, sockets, directories)."""
    root = root or tempfile.gettempdir()
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def owner_directories(pids: Iterable[int], root: str | None = None) -> list[str]:
    """The engines' owner directories (``vllm-inline-ipc-<pid>-<start>``) in the temporary
    directory named after one of ``pids``."""
    from vllm_inline.engine.seam import ipc_directory

    wanted = {f"{ipc_directory.PREFIX}{pid}-" for pid in pids}
    return sorted(n for n in tmp_entries(root) if any(n.startswith(w) for w in wanted))
