"""The watch each engine process runs from its ``sitecustomize`` (engine/seam/vllm_boot.py): a
process started by multiprocessing's spawn gets SIGTERM when its parent ends, however the
parent ended; other processes are left alone; and it ends, once its exit hooks have run,
without the interpreter's finalization. No engine here (the real engines, killed three ways:
tests/parallel/test_no_orphans.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from processes import clean_up, process_tree, wait_gone

from vllm_inline.engine.seam import vllm_boot

PARENT = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from vllm_inline.engine.seam import vllm_boot

    def child(marker):
        def on_term(signum, frame):
            with open(marker, "w") as f:
                f.write("SIGTERM")
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
        time.sleep(120)

    if __name__ == "__main__":
        # As an engine start does: the boot environment, set while vLLM spawns.
        os.environ.update(vllm_boot.engine_environment())
        process = multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],))
        process.start()
        print(process.pid, flush=True)
        time.sleep(120)
    """
)


@pytest.mark.smoke
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_spawned_child_gets_sigterm_when_its_parent_dies(tmp_path: Path, how: str) -> None:
    marker, script = tmp_path / "child-was-told", tmp_path / "parent.py"
    script.write_text(PARENT)  # a file: spawn re-imports the parent's main module in the child
    parent = subprocess.Popen(
        [sys.executable, str(script), str(marker)], stdout=subprocess.PIPE, text=True
    )
    tree = []
    try:
        child_pid = int(parent.stdout.readline())
        tree = process_tree(parent.pid)
        assert child_pid in {p.pid for p in tree}
        time.sleep(1.0)  # alive parent: the child keeps running
        assert psutil.Process(child_pid).is_running() and not marker.exists()
        parent.send_signal(getattr(signal, how))
        parent.wait(timeout=10)
        left, _, waited = wait_gone(tree, set(), timeout=5)
        assert not left, left
        assert marker.read_text() == "SIGTERM"
        print(f"child ended {waited:.2f} s after its parent's {how}")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        clean_up(tree, ())


def test_a_child_orphaned_before_its_watch_began_stops_at_once() -> None:
    environment = {**os.environ, **vllm_boot.engine_environment()}
    environment[vllm_boot.PARENT_PID_VARIABLE] = "1"  # not the parent it finds
    # "--multiprocessing-fork" marks a process multiprocessing's spawn started.
    child = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(60)", "--multiprocessing-fork"],
        env=environment,
        timeout=30,
        check=False,
    )
    assert child.returncode == -signal.SIGTERM


def test_other_processes_are_not_watched() -> None:
    """multiprocessing's resource tracker inherits the environment and must outlive the engine
    processes (it releases what they leaked): no watch in a process spawn did not start."""
    environment = {**os.environ, **vllm_boot.engine_environment()}
    environment[vllm_boot.PARENT_PID_VARIABLE] = "1"
    child = subprocess.run(
        [sys.executable, "-c", "import threading; print(threading.active_count())"],
        env=environment,
        timeout=30,
        check=False,
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0 and child.stdout == "1\n"


@pytest.mark.smoke
def test_engine_environment_carries_the_boot_directory_and_this_pid() -> None:
    environment = vllm_boot.engine_environment()
    boot = environment["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(boot) / "sitecustomize.py").is_file()
    assert environment[vllm_boot.PARENT_PID_VARIABLE] == str(os.getpid())


EXITING = textwrap.dedent(
    """
    import atexit, gc, multiprocessing, os, sys
    from vllm_inline.engine.seam import vllm_boot

    class Cycle:
        def __del__(self, open=open):  # the builtins are gone by the interpreter's last collection
            with open(self.marker, "w") as f:
                f.write("finalization ran")

    def child(directory, fail):
        atexit.register(lambda: open(os.path.join(directory, "hook"), "w").write("exit hook ran"))
        print("buffered line", end="")  # not flushed: the exit must flush it
        gc.disable()  # no collection before the exit; the interpreter's last ones ignore this
        cycle = Cycle()
        cycle.marker, cycle.self = os.path.join(directory, "collected"), cycle
        del cycle
        if fail:
            raise RuntimeError("the child failed")
        sys.exit(3)

    if __name__ == "__main__":
        os.environ.update(vllm_boot.engine_environment())
        for fail in (False, True):
            process = multiprocessing.get_context("spawn").Process(
                target=child, args=(sys.argv[1], fail)
            )
            process.start()
            process.join(60)
            print(f" exitcode={process.exitcode}", flush=True)
    """
)


def test_a_spawned_child_keeps_its_exit_code_and_hooks_but_skips_the_interpreters_last_collections(
    tmp_path: Path,
) -> None:
    """An engine process ends through the C library's ``exit`` after its exit hooks: its exit
    code, its exit hooks and its unflushed output stay; the interpreter's last collections over
    vLLM's heap (seconds of every engine shutdown) do not run. That C++ destructors still run
    is shown on a real engine: the TP=2 case of tests/parallel/test_no_orphans.py (vLLM's CPU
    communicator unlinks its /dev/shm segments in one)."""
    script = tmp_path / "parent.py"
    script.write_text(EXITING)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "buffered line exitcode=3\nbuffered line exitcode=1\n"
    assert "RuntimeError: the child failed" in result.stderr
    assert (tmp_path / "hook").read_text() == "exit hook ran"
    assert not (tmp_path / "collected").exists(), "the interpreter's finalization ran"


FORKING = textwrap.dedent(
    """
    import multiprocessing, os, sys

    def worker(path):
        # What a forked worker sees, before its own code changes anything.
        with open(path, "w") as f:
            f.write(f"{sorted(os.sched_getaffinity(0))} {os.environ['OMP_PLACES']}")
        sys.exit(4)

    def engine_core(path):
        # As vLLM's executor starts a worker: its binding in the environment while it starts.
        os.environ.update(OMP_NUM_THREADS="1", OMP_PLACES="{0}", OMP_PROC_BIND="true")
        context = multiprocessing.get_context(os.environ["VLLM_WORKER_MULTIPROC_METHOD"])
        process = context.Process(target=worker, args=(path,))
        process.start()
        process.join(60)
        print(context.get_start_method(), process.exitcode, flush=True)

    if __name__ == "__main__":
        from vllm_inline.engine.seam import vllm_boot

        os.environ.update(vllm_boot.engine_environment(cpu=True))
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # as vLLM's CPU platform sets it
        os.environ[vllm_boot.PROCESS_START_VARIABLE] = sys.argv[2]
        process = multiprocessing.get_context("spawn").Process(target=engine_core, args=(sys.argv[1],))
        process.start()
        process.join(120)
    """
)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_an_engine_core_forks_its_workers_bound_as_vllm_binds_spawned_ones(
    tmp_path: Path, start: str
) -> None:
    """With ``VLLMINLINE_PROCESS_START=fork`` (the default on a CPU) a spawned engine process
    forks the processes vLLM starts through ``VLLM_WORKER_MULTIPROC_METHOD``, and a forked child
    takes the CPUs vLLM's OpenMP variables name as its affinity (a spawned one gets them from
    OpenMP as it loads) and keeps its exit code; with ``spawn`` vLLM's own way is left alone.
    No engine: the ``engine_core`` here only does what vLLM's executor does to start a worker.
    On a real engine: test_engine_lifecycle.py."""
    script, seen = tmp_path / "parent.py", tmp_path / "worker"
    script.write_text(FORKING)
    result = subprocess.run(
        [sys.executable, str(script), str(seen), start],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{start} 4\n"
    affinity, places = seen.read_text().rsplit(" ", 1)
    assert places == "{0}"  # a spawned worker's OpenMP binds it as it loads (if it loads)
    if start == "fork":
        assert affinity == "[0]"


def test_the_cpus_a_worker_is_bound_to_are_read_as_vllm_writes_them() -> None:
    """``OMPProcessManager.configure_omp_envs`` (vLLM 0.30-0.33) writes one of three forms."""
    cpus = vllm_boot.cpus_to_bind
    assert cpus({"OMP_PLACES": "{0,1,2}", "OMP_PROC_BIND": "true"}) == {0, 1, 2}
    assert cpus({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[4,5]"}) == {4, 5}
    assert cpus({"GOMP_CPU_AFFINITY": "2 3"}) == {2, 3}
    assert cpus({"OMP_PLACES": "{0-3}"}) == {0, 1, 2, 3}
    assert cpus({}) is None and cpus({"OMP_PLACES": "cores"}) is None
