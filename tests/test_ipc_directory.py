"""The owner directory of an engine's files (``engine/seam/ipc_directory.py``): made, removed
with its owner's last engine, swept once its owner is dead, never another live owner's or
another user's; a read-only or full temporary directory falls back without a crash. No engine."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_inline.engine.seam import boot_site, ipc_directory, vllm_boot, vllm_names


@pytest.fixture
def tmp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of the test's own, short as /tmp's names are (pytest's
    ``tmp_path`` leaves no room for socket paths under it), and this process's state reset."""
    root = tempfile.mkdtemp(prefix="ipc-test-")
    monkeypatch.setattr(ipc_directory.tempfile, "gettempdir", lambda: root)
    monkeypatch.setattr(ipc_directory, "_path", None)
    monkeypatch.setattr(ipc_directory, "_engines", 0)
    yield Path(root)
    shutil.rmtree(root, ignore_errors=True)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_owner_is_told_by_pid_and_start_time() -> None:
    start = ipc_directory.process_start(os.getpid())
    assert isinstance(start, int) and start > 0
    assert ipc_directory.owner_alive(os.getpid(), start)
    assert ipc_directory.owner_alive(os.getpid(), 0)  # start unknown: the pid alone
    assert not ipc_directory.owner_alive(os.getpid(), start + 1)  # the pid, reused
    assert not ipc_directory.owner_alive(_dead_pid(), 0)
    assert ipc_directory.owner_alive(1, 0)  # init: runs, whoever owns it
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    start = ipc_directory.process_start(zombie.pid) or 0
    while ipc_directory.process_start(zombie.pid) != 0:  # ended, not reaped: dead
        time.sleep(0.05)
    assert not ipc_directory.owner_alive(zombie.pid, start)
    zombie.wait()


def test_one_directory_per_process_private_and_removed_with_the_last_engine(
    tmp_root: Path,
) -> None:
    ipc_directory.hold()
    assert list(tmp_root.iterdir()) == []  # made when the engine starts processes, not before
    first = ipc_directory.owner_directory()
    ipc_directory.hold()
    assert ipc_directory.owner_directory() == first  # a second engine of the process: the same
    name = os.path.basename(first)
    assert name == f"vllm-inline-ipc-{os.getpid()}-{ipc_directory.process_start(os.getpid())}"
    assert Path(first).parent == tmp_root
    assert os.stat(first).st_mode & 0o777 == 0o700
    ipc_directory.release()
    assert os.path.isdir(first)  # one engine still runs
    ipc_directory.release()
    assert not os.path.exists(first)
    ipc_directory.hold()
    assert ipc_directory.owner_directory() == first  # made again by the next start
    ipc_directory.release()
    assert not os.path.exists(first)


def test_the_engine_environment_points_vllm_and_the_boot_into_it(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    environment = vllm_boot.engine_environment()
    owner = ipc_directory.owner_directory()
    assert environment["VLLM_RPC_BASE_PATH"] == owner
    boot = environment["PYTHONPATH"].split(os.pathsep)[0]
    assert boot == os.path.join(owner, "boot")
    assert (Path(boot) / "sitecustomize.py").is_file()
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/srv/mine")  # the user's choice stays theirs
    assert "VLLM_RPC_BASE_PATH" not in vllm_boot.engine_environment()
    ipc_directory._at_exit()
    assert not os.path.exists(owner)


def test_the_rendezvous_file_goes_to_the_owner_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    class NetworkUtils:
        @staticmethod
        def get_file_store_init_method() -> str:
            return "file:///tmp/vllm_dist_0123"

    vllm_names.rendezvous_in_the_owner_directory(NetworkUtils)
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/tmp/vllm-inline-ipc-12-34")
    assert NetworkUtils.get_file_store_init_method() == (
        "file:///tmp/vllm-inline-ipc-12-34/vllm_dist_0123"
    )
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/srv/mine")  # not ours: vLLM's own place
    assert NetworkUtils.get_file_store_init_method() == "file:///tmp/vllm_dist_0123"


def test_the_sweep_removes_dead_owners_only(tmp_root: Path) -> None:
    dead = tmp_root / f"vllm-inline-ipc-{_dead_pid()}-0"
    reused = tmp_root / f"vllm-inline-ipc-{os.getpid()}-1"  # this pid, another start time
    live = tmp_root / f"vllm-inline-ipc-{os.getpid()}-{ipc_directory.process_start(os.getpid())}"
    other_live = tmp_root / "vllm-inline-ipc-1-0"  # another owner (init) that runs
    unrelated = tmp_root / "vllm-inline-ipc-notapid"
    for path in (dead, reused, live, other_live, unrelated):
        path.mkdir()
        (path / "0de0eaee-socket").write_text("")
    assert sorted(ipc_directory.sweep()) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    assert live.exists() and other_live.exists() and unrelated.exists()


def test_the_sweep_leaves_another_users_directory(tmp_root: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    theirs = tmp_root / f"vllm-inline-ipc-{_dead_pid()}-0"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    assert ipc_directory.sweep() == []
    assert theirs.exists()


def test_a_stale_file_of_a_live_process_of_another_user_stays(tmp_root: Path) -> None:
    """A name of ours held by a process that runs (here init, pid 1, root's or another
    user's): neither swept nor taken."""
    theirs = tmp_root / "vllm-inline-ipc-1-0"
    theirs.mkdir()
    (theirs / "socket").write_text("")
    if os.getuid() == 0:
        os.chown(theirs, 65534, 65534)
    ipc_directory.sweep()
    assert (theirs / "socket").exists()


def test_the_sweep_of_a_missing_root_says_nothing(tmp_path: Path) -> None:
    assert ipc_directory.sweep(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_a_read_only_or_full_tmp_falls_back_to_abstract_names(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ipc_directory.os, "mkdir", refuse)
    ipc_directory.hold()
    with caplog.at_level(logging.WARNING, logger="vllm_inline"):
        path = ipc_directory.owner_directory()
    assert path == f"@vllm-inline-ipc-{os.getpid()}-{ipc_directory.process_start(os.getpid())}"
    assert "abstract socket namespace" in caplog.text
    assert list(tmp_root.iterdir()) == []
    ipc_directory.release()  # nothing to remove, no error


def test_the_boot_directory_without_any_writable_place(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object, **kwargs: object) -> str:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(boot_site, "_fallback", [])
    monkeypatch.setattr(boot_site.tempfile, "mkdtemp", refuse)
    with caplog.at_level(logging.WARNING, logger="vllm_inline"):
        assert boot_site.boot_directory("@vllm-inline-ipc-1-0") == ""
    assert "start without it" in caplog.text


def test_a_name_of_ours_that_is_another_users_is_not_taken(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    name = f"vllm-inline-ipc-{os.getpid()}-{ipc_directory.process_start(os.getpid())}"
    planted = tmp_root / name
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    assert ipc_directory.owner_directory() == "@" + name  # not theirs to share
    assert planted.exists()


def test_a_forked_child_does_not_remove_its_parents_directory(tmp_root: Path) -> None:
    ipc_directory.hold()
    path = ipc_directory.owner_directory()
    pid = os.fork()
    if pid == 0:  # the child: its exit hook and a release leave the parent's directory
        ipc_directory.release()
        ipc_directory._at_exit()
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.path.isdir(path)
    ipc_directory.release()
    assert not os.path.exists(path)


def test_a_temporary_directory_too_long_for_socket_paths_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr(ipc_directory.tempfile, "gettempdir", lambda: str(deep))
    monkeypatch.setattr(ipc_directory, "_path", None)
    assert ipc_directory.owner_directory().startswith("@vllm-inline-ipc-")
    assert list(deep.iterdir()) == []


def test_unheld_cpu_communicator_segments_are_swept_held_and_young_ones_stay(
    tmp_path: Path,
) -> None:
    """What tensor-parallel ranks killed outright left (vllm_names.sweep_unheld_cpu_shm), in a
    directory standing for /dev/shm: old and mapped by no process goes; mapped, young, another
    user's, or not the communicator's stays."""

    def segment(name: str, age: float = 3600.0) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\0" * 4096)
        os.utime(path, (time.time() - age, time.time() - age))
        return path

    left = segment("vllm_dist_0a-tp:0-[0-1]-cpushm_0")
    held = segment("vllm_dist_0a-tp:0-[0-1]-cpushm_1")
    young = segment("vllm_dist_0b-tp:0-[0-1]-cpushm_0", age=1.0)
    other = segment("psm_0123")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import mmap, sys, time\n"
                f"f = open({str(held)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096); f.close()\n"
                "print('mapped', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        theirs = None
        if os.getuid() == 0:
            theirs = segment("vllm_dist_0c-tp:0-[0-1]-cpushm_0")
            os.chown(theirs, 65534, 65534)
        removed = vllm_names.sweep_unheld_cpu_shm(str(tmp_path))
        assert removed == [left.name]
        assert held.exists() and young.exists() and other.exists()
        assert theirs is None or theirs.exists()
    finally:
        holder.kill()
        holder.wait()
