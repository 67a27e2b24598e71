"""Engine lifecycle on the suite's engines: exports, lazy imports, environment variables, lazy
start, the start-up heap freeze, shared memory with no name. Shutdown, restart, engine death and a script's exit start
engines of their own: ``tests/parallel/test_own_engines.py`` (``make test-parallel``)."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vllm_inline.engine as engine_module
from vllm_inline.engine import get_engine


@pytest.mark.smoke
def test_engine_exports_are_pinned():
    assert sorted(engine_module.__all__) == sorted(
        [
            "DEFAULTS",
            "BadRequestError",
            "ChatTemplateError",
            "ContextLengthExceededError",
            "Delta",
            "Engine",
            "EngineBusyError",
            "EngineDeadError",
            "EngineShutdownError",
            "EngineStats",
            "EngineUnavailableError",
            "GenerationFailedError",
            "InsufficientMemoryError",
            "ModelLoadError",
            "ParallelLayoutError",
            "RequestMetrics",
            "RequestTimeoutError",
            "StatsDisabledError",
            "StopPolicy",
            "TokenLogprob",
            "ToolCallDelta",
            "UnsupportedTaskError",
            "Usage",
            "VLLMInlineError",
            "get_engine",
            "prometheus_registry",
            "shutdown_all",
            "shutdown_engines",
            "start_engines",
        ]
    )


@pytest.mark.smoke
def test_importing_the_package_loads_neither_torch_nor_vllm():
    code = (
        "import sys, vllm_inline, vllm_inline.engine; "
        "from vllm_inline.engine import get_engine; get_engine('some/model'); "
        "print(','.join(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_our_environment_variables_pass_vllms_strict_check(monkeypatch, tmp_path):
    """vLLM warns about (or, with ``fail_on_environ_validation``, refuses) unknown ``VLLM_*``
    variables: every variable the package, tests and benchmarks read must pass its check."""
    import re
    from pathlib import Path

    from vllm.platforms import current_platform

    root = Path(__file__).resolve().parent.parent
    sources = [
        p
        for d in ("engine", "integrations", "vllm_inline", "tests", "benchmarks")
        for p in (root / d).rglob("*.py")
    ]
    read = re.compile(r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z0-9_]+)["']""")
    names = {n for p in sources for n in read.findall(p.read_text())}
    assert "VLLMINLINE_CACHE" in names  # the scan finds what it should
    for name in names:
        monkeypatch.setenv(name, str(tmp_path))
    current_platform.validate_environ(hard_fail=True)


def test_constructing_an_engine_starts_nothing(scripted):
    s = scripted("chatml")
    engine = get_engine(s.path, **{**s.engine_kwargs, "seed": 12345})
    assert not engine.started
    assert engine.num_unfinished_requests() == 0


def test_a_started_engine_freezes_the_start_up_heap(scripted):
    """As vLLM's server does: full collections then skip torch/vLLM's objects (no 0.5 s pauses)."""
    engine = scripted("llama3").engine.start()
    assert engine.started
    assert gc.get_freeze_count() > 100_000


def _titled(process: Any, title: str) -> bool:
    return title in " ".join(process.cmdline())  # vLLM's process titles; the fork server's command


def own_engine_processes() -> list[Any]:
    """The engine cores of this process's engines (its children, or its fork server's) and
    their workers: not those of the processes a test launched (tests/launches.py)."""
    import psutil

    cores = []
    for child in psutil.Process().children():
        if _titled(child, "multiprocessing.forkserver"):
            cores += [c for c in child.children() if _titled(c, "VLLM::EngineCore")]
        elif _titled(child, "VLLM::EngineCore"):
            cores.append(child)
    return cores + [w for c in cores for w in c.children() if _titled(w, "VLLM::Worker")]


def test_a_running_engine_s_shared_memory_has_no_name_left_to_outlive_it(scripted):
    """The ring buffers between an engine core and its worker are mapped by both, their
    ``/dev/shm`` names already unlinked (engine/seam/vllm_boot.py): a kill of every process of the
    engine at once (Ray's cleanup of a replica, the OOM killer on the engine core) leaves none
    of them behind. Read off ``/proc/<pid>/maps`` of this process's engine processes."""
    scripted("llama3").engine.start()
    mapped: dict[str, set[str]] = {}
    for child in own_engine_processes():
        try:
            with open(f"/proc/{child.pid}/maps") as maps:
                lines = [line.split(None, 5)[5].strip() for line in maps if "/dev/shm/psm_" in line]
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile (another test's)
            continue
        if lines:
            mapped[f"{child.pid} {child.name()}"] = set(lines)
    names = {name for lines in mapped.values() for name in lines}
    # The engine core's broadcast to its worker and the worker's answers, at least.
    assert len(names) >= 2 and len(mapped) >= 2, mapped
    assert all(name.endswith(" (deleted)") for name in names), mapped


def test_a_cpu_engine_s_processes_are_forked_and_its_worker_bound_as_vllm_binds_one(scripted):
    """On a CPU neither of an engine's processes is a new interpreter importing torch and vLLM
    again (engine/seam/vllm_processes.py, engine/seam/vllm_boot.py ``fork_workers``): the engine core is
    forked from this process's fork server and the worker from its engine core. Neither runs a
    program of its own: the C library is mapped where its parent has it (a new program gets an
    address of its own: Linux randomises it). Each of the worker's threads runs on the CPUs
    vLLM's own binding gives the first rank."""
    import psutil
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    engine = scripted("llama3").engine.start()
    expected = set(OMPProcessManager(engine.runtime.llm.vllm_config).cpu_lists[0])

    def named(process: psutil.Process, title: str) -> bool:
        return title in " ".join(process.cmdline())  # vLLM's titles; the server's command

    def libc_at(process: psutil.Process) -> str:
        maps = Path(f"/proc/{process.pid}/maps").read_text().splitlines()
        return next(line.split("-")[0] for line in maps if "/libc.so" in line or "/libc-" in line)

    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0"

    servers = [p for p in psutil.Process().children() if named(p, "multiprocessing.forkserver")]
    assert len(servers) == 1, servers
    cores = [p for p in servers[0].children() if named(p, "VLLM::EngineCore")]
    assert cores, "no engine core forked from the fork server"
    for core in cores:
        assert libc_at(core) == libc_at(servers[0]), f"engine core {core.pid} was spawned"
        workers = [w for w in core.children() if named(w, "VLLM::Worker")]
        assert len(workers) == 1, workers
        assert libc_at(workers[0]) == libc_at(core), f"worker {workers[0].pid} was spawned"
        for thread in Path(f"/proc/{workers[0].pid}/task").iterdir():
            assert os.sched_getaffinity(int(thread.name)) == expected, (workers[0], thread.name)


def test_start_engines_stops_what_it_started_when_one_fails_and_names_that_model(scripted):
    """One engine of a set cannot start (more KV cache than the machine has, refused before
    any process is spawned): the one that did start is shut down again, the running shared
    engine is left alone, and the error names the failed model."""
    import psutil

    from vllm_inline.engine import InsufficientMemoryError, start_engines

    shared = scripted("llama3").engine.start()
    s = scripted("gemma")
    good = get_engine(s.path, **{**s.engine_kwargs, "seed": 4242})  # this test's own engine
    bad = get_engine(
        scripted("chatml").path,
        **{**s.engine_kwargs, "kv_cache_memory_bytes": psutil.virtual_memory().total * 2},
    )
    lines: list[str] = []
    with pytest.raises(InsufficientMemoryError) as info:
        start_engines(shared, good, bad, max_concurrent=1, progress=lines.append)  # in order
    assert str(info.value).startswith(scripted("chatml").path + ": kv_cache_memory_bytes=")
    assert not good.started and not bad.started
    assert shared.started
    assert lines[0] == f"Starting vLLM for {s.path} ..." and lines[1].startswith(
        f"{s.path} ready in "
    )
    assert not any(scripted("llama3").path in line for line in lines)  # already running


@contextlib.contextmanager
def new_processes() -> Iterator[dict[int, Any]]:
    """The processes created below this one while the block runs (by pid, as
    :class:`psutil.Process`, which remembers the start time); any still alive after it are
    killed, whatever happened."""
    import psutil
    from processes import alive, clean_up, process_tree

    before, seen, done = {p.pid for p in process_tree(os.getpid())}, {}, threading.Event()

    def own_helper(p: psutil.Process) -> bool:
        # multiprocessing's resource tracker for this process: the standard library starts it
        # at the first shared-memory use, and it lives as long as this process does.
        try:
            return p.ppid() == os.getpid() and "resource_tracker" in " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            return False

    def watch() -> None:
        while not done.is_set():
            for p in process_tree(os.getpid()):
                if p.pid not in before and p.pid not in seen and not own_helper(p):
                    seen[p.pid] = p
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()
        clean_up(alive(list(seen.values())), ())


def test_start_engines_shuts_down_an_engine_still_starting_when_another_fails(scripted):
    """Started at once: one engine is refused (before it spawns anything) while the other is
    still starting. The call waits for that one, shuts it down, and raises the refused one's
    error; none of the processes started meanwhile is left."""
    import psutil
    from processes import describe, wait_gone

    from vllm_inline.engine import InsufficientMemoryError, start_engines

    s = scripted("gemma")
    good = get_engine(s.path, **{**s.engine_kwargs, "seed": 4343})  # this test's own engine
    bad = get_engine(
        scripted("chatml").path,
        **{**s.engine_kwargs, "kv_cache_memory_bytes": psutil.virtual_memory().total * 2},
    )
    lines: list[str] = []
    try:
        with new_processes() as seen:
            with pytest.raises(InsufficientMemoryError) as info:
                start_engines(good, bad, progress=lines.append)
            assert str(info.value).startswith(scripted("chatml").path + ": kv_cache_memory_bytes=")
            assert f"Starting vLLM for {s.path} ..." in lines  # it was starting meanwhile
            assert not good.started and not bad.started
            assert seen, "the engine that was starting spawned no process"
            left, _, _ = wait_gone(list(seen.values()), set(), timeout=30)
            assert not left, describe(left)
    finally:
        good.shutdown()


def test_a_memory_plan_that_cannot_fit_names_the_model_before_any_engine_starts(scripted):
    """Three engines, one sized by its user past the machine's memory and two left to the plan:
    the plan fails, naming a model and the option, and no engine process is started."""
    import psutil
    from processes import describe, wait_gone

    from vllm_inline.engine import InsufficientMemoryError, start_engines

    s = scripted("gemma")
    options = {k: v for k, v in s.engine_kwargs.items() if k != "kv_cache_memory_bytes"}
    huge = get_engine(
        scripted("chatml").path,
        **{**options, "kv_cache_memory_bytes": psutil.virtual_memory().total * 2},
    )
    planned = [
        get_engine(scripted(name).path, **{**options, "seed": 4444}) for name in ("gemma", "llama3")
    ]
    lines: list[str] = []
    with new_processes() as seen:
        with pytest.raises(InsufficientMemoryError) as info:
            start_engines(huge, *planned, progress=lines.append)
        left, _, _ = wait_gone(list(seen.values()), set(), timeout=30)
        assert not left, describe(left)  # the fork server launched for the plan stops too
    # The first engine the plan sizes is named, and the way out: fewer or smaller models.
    assert str(info.value).startswith(planned[0].model + ": the free memory")
    assert info.value.option == "model" and "Start fewer models" in str(info.value)
    assert lines == []  # no engine began to start
    assert not any(e.started for e in (huge, *planned))


def test_start_engines_refuses_a_bad_max_concurrent():
    from vllm_inline.engine import start_engines

    with pytest.raises(ValueError, match="max_concurrent=0"):
        start_engines(max_concurrent=0)
