"""An app that just ends, with no shutdown call, prints nothing of vLLM's or ours (issue 63).

tests/parallel/ending_app.py holds a chat model, an embedder and a reranker, uses every class of
the package on them (``ChatVLLM``, ``VLLM``, ``Engine``, both embeddings classes, both
rerankers), then ends one way: the script ends, a stream left by ``break``, ``sys.exit`` in the
middle of a stream, an exception out of ``main`` under ``asyncio.run`` with a stream in flight,
Ctrl-C (SIGINT to the app's process group) in the middle of a stream; and a Jupyter kernel with
a stream left unfinished is shut down as a notebook's "Shut Down Kernel" does. Its stdout and
stderr are compared whole with what the app printed and vLLM's weight-loading progress (with
``VLLM_LOGGING_LEVEL=INFO``: plus vLLM's own INFO and WARNING lines and the start-up noise
engine/seam/vllm_quiet.py names, never an ERROR or a traceback of vLLM's), and every process it
started, every ``/dev/shm`` entry they held and its owner directory in /tmp are gone within
:data:`BOUND` seconds.

Before the fix (engine/life/together.py: the package's exit hook runs before vLLM's finalizers;
engine/life/runtime.py: the output handler stops before the engine cores) every such ending
printed vLLM's "AsyncLLM output_handler failed" ERROR and an ``EngineDeadError`` traceback.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import (
    clean_up,
    describe,
    held_shm,
    owner_directories,
    process_tree,
    shm_entries,
    wait_gone,
)

from vllm_inline.testing import (
    CPU_TEST_ENGINE_KWARGS,
    EMBEDDING_HIDDEN_SIZE,
    SCENARIOS,
    build_embedding_model,
    build_reranker_model,
    build_scripted_model,
)

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

APP = Path(__file__).with_name("ending_app.py")
BOUND = 10.0
"""Seconds within which the app's processes, segments and files must be gone once it ended."""

ENDINGS = ("end", "break", "exit", "raise", "ctrl-c")
CASES = [
    *((how, "default") for how in ENDINGS),
    *((how, "INFO") for how in ("end", "raise", "ctrl-c")),
]
"""Each ending on vLLM's default level here (quiet); the ones with a traceback of their own
and the plain end also with ``VLLM_LOGGING_LEVEL=INFO``."""

FIRST_8 = "".join(SCENARIOS["long"].chat.script[:8])
ANSWERS = (
    f"ChatVLLM: {FIRST_8}\nVLLM: {FIRST_8}\nEngine: {FIRST_8}\n"
    f"VLLMEmbeddings: {EMBEDDING_HIDDEN_SIZE}\nVLLMEmbedding: {EMBEDDING_HIDDEN_SIZE}\n"
    "VLLMRerank (LangChain): 2\nVLLMRerank (LlamaIndex): 2\n"
)
PRINTED = {
    "end": ANSWERS,
    "break": ANSWERS + "first delta: True\n",
    "exit": ANSWERS + "exit in the middle of a stream\n",
    "raise": ANSWERS,
    "ctrl-c": ANSWERS + "Ctrl-C in the middle of a stream\n",
}
"""The app's stdout, whole: its own prints only."""
RAISED = {
    "raise": "RuntimeError: the app failed in the middle of a stream",
    "ctrl-c": "KeyboardInterrupt",
}
"""The last line of the one traceback Python prints for the app (nothing else on stderr)."""
RETURNCODE = {"end": (0,), "break": (0,), "exit": (0,), "raise": (1,), "ctrl-c": (-2, 1)}
"""Python ends on an uncaught KeyboardInterrupt by SIGINT (-2), or with 1 where Ray is installed:
vLLM imports it, and its exit hook (``ray._private.worker.shutdown``) clears the interpreter's
note of the interrupt (``python -c "import ray; raise KeyboardInterrupt"`` ends with 1)."""

PROGRESS = re.compile(r"^Loading safetensors checkpoint shards")
VLLM_LOG = re.compile(r"^(\([^)]* pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")
VERBOSE_NOISE = (
    # What engine/seam/vllm_quiet.py silences at the quiet levels and leaves at verbose ones.
    re.compile(r"^Triton is installed, but doesn't include CPU backend"),
    re.compile(r"vllm/triton_utils/dispatcher\.py:\d+: FutureWarning: `torch\.distributed\."),
    re.compile(r"^\[W\d+ [\d:.]+ \S+\] Warning: NUMA binding"),
)


@dataclass
class Ended:
    """One app's run: what it printed and what it left."""

    returncode: int
    stdout: str
    stderr: str
    left: list[str] = field(default_factory=list)
    """Its processes, /dev/shm entries and /tmp owner directories still there after BOUND s."""


def _environment(level: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS"):
        env.pop(name, None)
    if level != "default":
        env["VLLM_LOGGING_LEVEL"] = level
    return env


def run_app(how: str, level: str, models: list[str], directory: Path) -> Ended:
    """Run the app to its end (at most 10 minutes), watching its processes and what they hold
    while it runs; clean up whatever is left, by pid, whatever happens."""
    before = shm_entries()
    kwargs = json.dumps(dict(CPU_TEST_ENGINE_KWARGS))
    child = subprocess.Popen(
        [sys.executable, str(APP), how, *models, kwargs],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=directory,
        env=_environment(level), process_group=0,
    )  # fmt: skip
    seen: dict[int, psutil.Process] = {}
    held: set[str] = set()
    output: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: output.append(child.communicate(timeout=600)))
    reader.start()
    try:
        while child.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = process_tree(child.pid)
                seen.update((p.pid, p) for p in tree)
                held |= held_shm(tree, shm_entries() - before)
            time.sleep(0.2)
        reader.join()
        left, shm_left, _ = wait_gone(list(seen.values()), held, BOUND)
        owner = owner_directories([child.pid])
        stdout, stderr = output[0]
        return Ended(child.returncode, stdout, stderr, describe(left) + sorted(shm_left) + owner)
    finally:
        if child.poll() is None:
            child.kill()
        reader.join(timeout=60)
        clean_up(seen.values(), held)


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Ended]]:
    """Every case of :data:`CASES`, two apps at a time (an app spends much of its start on one
    core, importing)."""
    root = tmp_path_factory.mktemp("endings")
    models = [
        str(build_scripted_model("long", root)),
        str(build_embedding_model(root)),
        str(build_reranker_model(root)),
    ]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            case: pool.submit(run_app, *case, models, tmp_path_factory.mktemp("-".join(case)))
            for case in CASES
        }
        yield {case: future.result() for case, future in futures.items()}


ANSI = re.compile(r"\x1b\[[0-9;]*m")
QUIET_VLLM_LOG = re.compile(r"^(\([^)]* pid=\d+\) )?(DEBUG|INFO|WARNING) \d\d-\d\d ")


def users_lines(text: str, level: str) -> list[str]:
    """The lines of ``text`` (an app's stderr, or all a kernel printed) that are neither vLLM's
    weight-loading progress nor, at a verbose level, vLLM's own INFO and WARNING lines and the
    start-up noise vLLM prints on stderr (a FutureWarning's source line with it). An ERROR line
    of vLLM's is kept: it is never expected."""
    kept: list[str] = []
    after_warning = False
    for line in re.split(r"[\r\n]", ANSI.sub("", text)):
        if not line.strip() or PROGRESS.match(line):
            continue
        if after_warning and line.startswith("  "):
            after_warning = False
            continue
        verbose = level != "default"
        noise = verbose and (
            any(n.search(line) for n in VERBOSE_NOISE) or bool(QUIET_VLLM_LOG.match(line))
        )
        after_warning = noise and "FutureWarning" in line
        if not noise:
            kept.append(line)
    return kept


def check_traceback(lines: list[str], last: str) -> None:
    """``lines`` are one traceback of Python's for the app: its frames in the app and the
    standard library only, ending with ``last``."""
    assert lines[0] == "Traceback (most recent call last):", lines
    assert lines[-1] == last, lines
    assert sum(line.startswith("Traceback") for line in lines) == 1, lines
    stdlib = sysconfig.get_paths()["stdlib"]
    for line in lines[1:-1]:
        if line.startswith("  File "):
            assert line.startswith((f'  File "{APP}"', f'  File "{stdlib}')), lines
        else:
            assert line.startswith("    "), lines  # the frame's source line, or its carets


@pytest.mark.parametrize(("how", "level"), CASES, ids=["-".join(case) for case in CASES])
def test_an_app_that_ends_without_shutdown_prints_only_its_own_output(
    ended: dict[tuple[str, str], Ended], how: str, level: str
) -> None:
    run = ended[(how, level)]
    assert run.returncode in RETURNCODE[how], run.stderr[-3000:]
    stdout = run.stdout
    if level != "default":
        vllm_lines = [line for line in stdout.splitlines() if VLLM_LOG.match(line)]
        assert vllm_lines, "VLLM_LOGGING_LEVEL=INFO shows vLLM's own lines"
        assert not [line for line in vllm_lines if re.search(r"\) (ERROR|CRITICAL) ", line)]
        assert not [line for line in vllm_lines if "exited unexpectedly" in line]
        stdout = "".join(line for line in stdout.splitlines(True) if not VLLM_LOG.match(line))
    assert stdout == PRINTED[how], run.stdout[-3000:]
    rest = users_lines(run.stderr, level)
    if how in RAISED:
        check_traceback(rest, RAISED[how])
    else:
        assert rest == [], run.stderr[-3000:]
    assert run.left == [], f"left {BOUND} s after the app ended: {run.left}"


# -- a notebook ------------------------------------------------------------------------------

KERNEL_CODE = """
import json
from langchain_core.documents import Document
from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings, VLLMRerank

chat_model, embedder, reranker = json.loads({models!r})
kwargs = json.loads({kwargs!r})
chat = ChatVLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=400)
print("ANSWER", len(VLLMEmbeddings(model=embedder, vllm_kwargs=kwargs).embed_query("a")),
      len(VLLMRerank(model=reranker, vllm_kwargs=kwargs).compress_documents(
          [Document(page_content="a"), Document(page_content="b")], "q")))
stream = chat.stream("Hi")
print("LEFT IN THE MIDDLE", next(stream).content)
"""


@pytest.mark.parametrize("level", ["default", "INFO"])
def test_a_notebook_kernel_shut_down_prints_nothing_of_vllms(tmp_path: Path, level: str) -> None:
    """Jupyter's "Shut Down Kernel" (``shutdown_kernel(now=False)``: a shutdown request; the
    kernel exits on its own, SIGTERM and SIGKILL only past ``shutdown_wait_time``), with
    three engines and a stream left in the middle. The kernel's own stdout and stderr (where
    vLLM's engine processes and a dying interpreter write) and what the kernel sent its client
    hold nothing but the cell's prints and vLLM's progress (at INFO, vLLM's INFO lines)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    models = [
        str(build_scripted_model("long", tmp_path)),
        str(build_embedding_model(tmp_path)),
        str(build_reranker_model(tmp_path)),
    ]
    spec = tmp_path / "kernels" / "vllm-inline-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel_json = {"argv": argv, "display_name": "vllm-inline test", "language": "python",
                   "env": {k: v for k, v in _environment(level).items() if k == "VLLM_LOGGING_LEVEL"}}  # fmt: skip
    (spec / "kernel.json").write_text(json.dumps(kernel_json))
    km = KernelManager(
        kernel_name=spec.name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)])
    )
    sent: list[str] = []

    def keep(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in ("stream", "error"):
            sent.append(msg["content"].get("text") or "\n".join(msg["content"]["traceback"]))

    log_path = tmp_path / "kernel.log"
    before = shm_entries()
    seen: list[psutil.Process] = []
    held: set[str] = set()
    env = _environment(level)
    with open(log_path, "w") as log:
        km.start_kernel(cwd=str(tmp_path), stdout=log, stderr=log, env=env)
    kc = km.client()
    try:
        kernel_pid = km.provisioner.pid
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        code = KERNEL_CODE.format(
            models=json.dumps(models), kwargs=json.dumps(dict(CPU_TEST_ENGINE_KWARGS))
        )
        reply = kc.execute_interactive(code, timeout=600, output_hook=keep)
        assert reply["content"]["status"] == "ok", "".join(sent)[-3000:]
        seen = process_tree(kernel_pid)
        held = held_shm(seen, shm_entries() - before)
        asked = time.monotonic()
        km.shutdown_kernel(now=False)
        took = time.monotonic() - asked
        print(f"the kernel shut down in {took:.1f} s")
        # Jupyter SIGTERMs the kernel half way through shutdown_wait_time (2.5 s), about what
        # three engines' shutdowns take together here: either way, nothing printed or left.
        assert took < km.shutdown_wait_time, "Jupyter had to SIGKILL the kernel"
        with contextlib.suppress(queue.Empty):  # what the kernel sent while it shut down
            while True:
                keep(kc.get_iopub_msg(timeout=1))
        left, shm_left, _ = wait_gone(seen, held, BOUND)
        assert not left and not shm_left, (describe(left), shm_left)
        assert owner_directories([kernel_pid]) == []
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        clean_up(seen, held)
    printed = "".join(sent)
    # tqdm's own warning about the progress bar in a kernel without ipywidgets, and Ray's (vLLM
    # imports it where it is installed) about the same.
    printed = re.sub(r".*TqdmWarning: IProgress not found.*\n.*notebook_tqdm\n", "", printed)
    printed = re.sub(r".*Missing packages: \['ipywidgets'\].*\n", "", printed)
    answer = f"ANSWER {EMBEDDING_HIDDEN_SIZE} 2"
    left_in_the_middle = f"LEFT IN THE MIDDLE {SCENARIOS['long'].chat.script[0]}"
    assert users_lines(printed, level) == [answer, left_in_the_middle], printed[-3000:]
    kernel_log = [  # the kernel process's own stdout and stderr, and its engine processes'
        line for line in log_path.read_text().splitlines() if not line.startswith("[IPKernelApp] ")
    ]  # fmt: skip
    assert users_lines("\n".join(kernel_log), level) == [], log_path.read_text()[-3000:]
