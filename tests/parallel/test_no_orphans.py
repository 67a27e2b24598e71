"""Engines die with the app, however it stops (engine/seam/vllm_boot.py).

An app holds engines, answers once, and is stopped the way services and notebooks are
stopped: SIGTERM with Python's default handler (``kill``, ``docker stop``, ``systemctl stop``),
SIGKILL (the OOM killer), ``os._exit``, a Jupyter kernel restart, a ``uvicorn --reload``
reload, a normal exit after ``multiprocessing.get_logger()`` (which puts multiprocessing's exit
hook, joining the engine cores, ahead of the package's: that exit used to wait forever); and an
app on a data-parallel engine (a DP coordinator, two engine cores) is SIGKILLed.
Within 10 s every process it spawned (engine cores, workers, the coordinator,
multiprocessing's resource tracker) is gone, no ``/dev/shm`` entry it created remains (with
forked workers, the default on a CPU, none has a name; the spawned-workers case shows the
others) and nothing of it is left in ``/tmp`` (its owner directory).
Each case prints how long that took (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from layouts import wait_for, with_layout
from processes import Started, free_port, owner_directories

from vllm_inline.testing import ScriptedModel, build_embedding_model

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

BOUND = 10.0
"""Seconds within which the engines' processes and segments must be gone."""

START = 300.0
"""Seconds an app may take to answer for the first time (engine starts included)."""

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

APP = textwrap.dedent(
    """
    import json, os, sys, time
    from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings

    if __name__ == "__main__":
        chat_model, embedder, kwargs, how = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
        chat = ChatVLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=8)
        embeddings = VLLMEmbeddings(model=embedder, vllm_kwargs=kwargs) if embedder else None
        size = len(embeddings.embed_query("hi")) if embeddings else None
        print("READY", json.dumps([chat.invoke("Hi").content, size]), flush=True)
        if how in ("os._exit", "exit"):
            time.sleep(1)  # the test lists this process's children meanwhile
        if how == "os._exit":
            os._exit(3)
        if how == "exit":  # a normal exit, multiprocessing's exit hook (it joins the engine
            import multiprocessing  # cores) moved ahead of the package's, as its logger does

            multiprocessing.get_logger()
            sys.exit(0)
        time.sleep(600)
    """
)


NO_NAMED_SHM = "the engine's processes hold nothing with a name in /dev/shm"
"""What a forked worker leaves named in ``/dev/shm`` while its engine runs: nothing. The ring
buffers between the engine's processes lose their names once attached (engine/seam/vllm_boot.py)
and the lock an engine core shares with a forked worker is a semaphore multiprocessing unlinks
at once (a spawned worker's keeps its name until it is released; tensor-parallel ranks share
vLLM's CPU communicator's named segments)."""


def app_dies_leaving_nothing(
    started: Started,
    tmp_path: Path,
    s: ScriptedModel,
    embedder: str,
    how: str,
    processes: int,
    *,
    workers: str = "fork",
    named_shm: bool = False,
) -> None:
    """Start :data:`APP` (``embedder`` "" for none; its engine cores start their workers by
    ``workers``), wait for its answer, stop it ``how``, and assert its ``processes`` or more and
    its shared memory (``named_shm``: some with a name, else none) are gone within
    :data:`BOUND`."""
    script, log = tmp_path / "app.py", tmp_path / "app.log"
    script.write_text(APP)
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, str(script), s.path, embedder, json.dumps(s.engine_kwargs), how],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "VLLMINLINE_PROCESS_START": workers},
        )  # fmt: skip
    started.track(child.pid)

    def ready() -> bool:
        assert child.poll() is None, log.read_text()[-3000:]
        return "READY" in log.read_text()

    wait_for(ready, START, "the app answered")
    app = started.footprint(child.pid)
    answer, size = json.loads(log.read_text().split("READY", 1)[1].splitlines()[0])
    assert answer == s.scenario.answer and (size is None or size > 0)
    assert len(app.processes) >= processes, app.processes
    assert bool(app.shm) == named_shm, app.shm if app.shm else NO_NAMED_SHM
    if how == "SIGTERM":
        child.send_signal(signal.SIGTERM)
    elif how == "SIGKILL":
        child.kill()
    child.wait(timeout=60)
    app.assert_gone(BOUND, f"{how} of the app")
    # And no file in /tmp: the app's owner directory went with it (removed by the app, or by
    # its engine cores once they saw it end).
    assert owner_directories([child.pid]) == [], how


@pytest.mark.parametrize(
    ("how", "workers"),
    [
        ("SIGTERM", "fork"),
        ("SIGKILL", "fork"),
        ("os._exit", "fork"),
        ("exit", "fork"),
        ("SIGKILL", "spawn"),
    ],
    ids=["SIGTERM", "SIGKILL", "os._exit", "exit", "SIGKILL-spawned-workers"],
)
def test_an_app_with_two_engines_leaves_nothing_behind(
    scripted, scripted_root: Path, tmp_path: Path, started: Started, how: str, workers: str
) -> None:
    """Also with workers spawned as vLLM spawns them on a CPU (``VLLMINLINE_PROCESS_START=spawn``),
    whose semaphores have names in /dev/shm until they are released."""
    embedder = str(build_embedding_model(scripted_root))
    # The app, 2 engine cores, 2 workers (+ multiprocessing's resource tracker).
    app_dies_leaving_nothing(
        started,
        tmp_path,
        scripted("llama3"),
        embedder,
        how,
        processes=5,
        workers=workers,
        named_shm=workers == "spawn",
    )


@pytest.mark.parametrize(
    ("layout", "processes"),
    [
        # The app, the DP coordinator, 2 engine cores, 2 workers (+ the resource tracker).
        ({"data_parallel_size": 2}, 6),
        # The app, the engine core, a worker per rank (+ the resource tracker).
        ({"tensor_parallel_size": 2}, 4),
    ],
    ids=["DP=2", "TP=2"],
)
def test_a_killed_app_on_a_parallel_engine_leaves_nothing_behind(
    scripted, tmp_path: Path, started: Started, layout: dict[str, int], processes: int
) -> None:
    s = with_layout(scripted("llama3"), **layout)
    # The ranks' CPU communicator segments lose their names once both ranks have joined
    # (engine/seam/vllm_names.py): none is named while the app runs.
    app_dies_leaving_nothing(started, tmp_path, s, "", "SIGKILL", processes=processes)


KERNEL_CODE = """
import json
from vllm_inline.integrations.langchain import ChatVLLM

chat = ChatVLLM(model={path!r}, vllm_kwargs=json.loads({kwargs!r}), max_tokens=8)
print("READY", json.dumps(chat.invoke("Hi").content))
"""


@pytest.mark.parametrize("now", [False, True], ids=["restart", "restart-now"])
def test_a_jupyter_kernel_restart_leaves_nothing_behind(
    scripted, tmp_path: Path, started: Started, now: bool
) -> None:
    """Jupyter's default restart (``restart_kernel(now=False)``): a shutdown request, SIGTERM
    to the kernel's process group after half of ``shutdown_wait_time`` (5 s), SIGKILL at its
    end; then the new kernel starts. ``now=True``: SIGKILL to the kernel's whole process group
    at once (the engine's processes lead groups of their own, so they see the kernel die and
    release their shared memory). The kernel runs this environment's interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    s = scripted("llama3")
    spec = tmp_path / "kernels" / "vllm-inline-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel_json = {"argv": argv, "display_name": "vllm-inline test", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel_json))
    km = KernelManager(
        kernel_name=spec.name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)])
    )
    out: list[str] = []

    def keep(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in ("stream", "error"):
            out.append(msg["content"].get("text") or "\n".join(msg["content"]["traceback"]))

    with open(tmp_path / "kernel.log", "w") as log:  # the restart launches with it too
        km.start_kernel(cwd=str(tmp_path), stdout=log, stderr=log)
        kc = km.client()
        try:
            started.track(km.provisioner.pid)
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            code = KERNEL_CODE.format(path=s.path, kwargs=json.dumps(s.engine_kwargs))
            reply = kc.execute_interactive(code, timeout=START, output_hook=keep)
            assert reply["content"]["status"] == "ok", "".join(out)[-3000:]
            answer = json.loads("".join(out).split("READY", 1)[1].splitlines()[0])
            assert answer == s.scenario.answer
            kernel = started.footprint(km.provisioner.pid)
            assert len(kernel.processes) >= 3, kernel.processes  # kernel, engine core, worker
            assert not kernel.shm, kernel.shm

            restarted = time.monotonic()
            km.restart_kernel(now=now)
            print(f"restart_kernel returned in {time.monotonic() - restarted:.1f} s")
            started.track(km.provisioner.pid)
            kernel.assert_gone(BOUND, "Jupyter kernel restart", since=restarted)
        finally:
            kc.stop_channels()
            if km.has_kernel:  # list what runs before Jupyter's SIGKILL to the group
                with contextlib.suppress(psutil.NoSuchProcess):
                    started.footprint(km.provisioner.pid)
            km.shutdown_kernel(now=True)


def sse_text(body: str) -> str:
    """The text of the unnamed events of a ``text/event-stream`` body (examples/fastapi_sse.py)."""
    events = [e.split("\n") for e in body.split("\n\n") if e and not e.startswith("event:")]
    return "".join("\n".join(line[len("data: ") :] for line in e) for e in events)


def ask(port: int, server: subprocess.Popen[bytes], log: Path) -> str:
    """The answer of the server on ``port`` to one chat, once it answers."""
    answer = ""

    def answered() -> bool:
        nonlocal answer
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/chat", params={"q": "Hi"}, timeout=60)
        except httpx.TransportError:
            return False
        answer = sse_text(r.text)
        return r.status_code == 200

    wait_for(answered, START, "the server answered")
    return answer


def worker_of(reloader: int) -> int:
    """The pid of the server process ``uvicorn --reload`` runs now (spawned by
    multiprocessing, beside its resource tracker)."""
    workers = [
        p.pid for p in psutil.Process(reloader).children()
        if "spawn_main" in " ".join(p.cmdline())
    ]  # fmt: skip
    assert len(workers) == 1, workers
    return workers[0]


def test_a_uvicorn_reload_leaves_nothing_of_the_old_worker(
    scripted, tmp_path: Path, started: Started
) -> None:
    """``uvicorn --reload`` on a copy of examples/fastapi_sse.py: an edit makes the reloader
    SIGTERM its server process (uvicorn runs the app's lifespan shutdown) and start a new one,
    which answers with an engine of its own; SIGTERM to the reloader then ends everything."""
    s = scripted("demo")
    app_dir, log = tmp_path / "app", tmp_path / "uvicorn.log"
    app_dir.mkdir()
    source = app_dir / "fastapi_sse.py"
    shutil.copy(EXAMPLES / "fastapi_sse.py", source)
    port = free_port()
    cmd = [
        sys.executable, "-m", "uvicorn", "fastapi_sse:app", "--app-dir", str(app_dir),
        "--reload", "--reload-dir", str(app_dir), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "w") as out:
        reloader = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "MODEL": s.path},
        )  # fmt: skip
    started.track(reloader.pid)
    assert ask(port, reloader, log) == s.scenario.answer
    old = started.footprint(worker_of(reloader.pid))
    assert len(old.processes) >= 3, old.processes  # the server, engine core, worker
    assert not old.shm, old.shm  # NO_NAMED_SHM

    edited = time.monotonic()
    with open(source, "a") as f:
        f.write("\n# edited by tests/parallel/test_no_orphans.py\n")
    old.assert_gone(BOUND, "uvicorn --reload: the old server process", since=edited)
    assert ask(port, reloader, log) == s.scenario.answer
    assert worker_of(reloader.pid) != old.processes[0].pid

    everything = started.footprint(reloader.pid)
    stopped = time.monotonic()
    reloader.send_signal(signal.SIGTERM)
    everything.assert_gone(BOUND, "SIGTERM to the uvicorn reloader", since=stopped)
    reloader.wait(timeout=10)


STARTING = textwrap.dedent(
    """
    import json, sys
    from vllm_inline.engine import get_engine

    get_engine(sys.argv[1], **json.loads(sys.argv[2])).start()
    """
)


@pytest.mark.parametrize("delay", [1.0, 2.0, 3.0])
def test_an_app_killed_in_the_middle_of_a_start_leaves_no_fork_server(
    scripted: Any, tmp_path: Path, delay: float
) -> None:
    """SIGKILL 1-3 s into an engine start, while the engine cores' fork server still imports
    torch and vLLM: the server dies at once with the app (before, it imported on for 4-6 s
    here, 10-20 s on a loaded host, holding 100-600 MB; engine/seam/fork_server_guard.py)."""
    from processes import alive, clean_up, describe, process_tree

    from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

    script = tmp_path / "app.py"
    script.write_text(STARTING)
    arguments = [scripted("llama3").path, json.dumps(dict(CPU_TEST_ENGINE_KWARGS))]
    child = subprocess.Popen([sys.executable, str(script), *arguments], process_group=0)
    tree: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree.update({p.pid: p for p in process_tree(child.pid)})
            time.sleep(0.05)
        servers = [p for p in alive(tree.values()) if "forkserver" in " ".join(p.cmdline())]
        assert servers, describe(tree.values())
        child.kill()
        child.wait()
        killed = time.monotonic()
        while alive(tree.values()) and time.monotonic() - killed < 10:
            time.sleep(0.02)
        took = time.monotonic() - killed
        print(f"killed {delay:.0f} s into the start: every process gone in {took:.2f} s")
        assert not alive(tree.values()) and took < 2.0, (took, describe(tree.values()))
    finally:
        clean_up(tree.values(), ())
