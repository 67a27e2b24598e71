"""Engines die with the app, however it stops (engine/_vllm_boot.py).

A child process holds two engines (``ChatVLLM`` and ``VLLMEmbeddings``), answers once, and is
stopped the way services and notebooks are stopped: SIGTERM with Python's default handler
(``kill``, ``docker stop``, ``systemctl stop``), SIGKILL (the OOM killer, a kernel restart past
its grace) and ``os._exit``. Within 10 s every process it spawned (engine cores, workers,
multiprocessing's resource tracker) is gone and no ``/dev/shm`` entry it created remains.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from processes import clean_up, process_tree, shm_entries, wait_gone
from vllm_inline.testing import build_embedding_model

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

BOUND = 10.0
"""Seconds within which the engines' processes and segments must be gone."""

APP = textwrap.dedent(
    """
    import json, os, sys, time
    from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings

    if __name__ == "__main__":
        chat_model, embedder, kwargs, how = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
        chat = ChatVLLM(model=chat_model, vllm_kwargs=kwargs, max_tokens=8)
        embeddings = VLLMEmbeddings(model=embedder, vllm_kwargs=kwargs)
        answer = chat.invoke("Hi").content
        print("READY", json.dumps([answer, len(embeddings.embed_query("hi"))]), flush=True)
        if how == "os._exit":
            time.sleep(1)  # the test lists this process's children meanwhile
            os._exit(3)
        time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "os._exit"])
def test_an_app_with_two_engines_leaves_nothing_behind(
    scripted, scripted_root: Path, tmp_path: Path, how: str
) -> None:
    s = scripted("llama3")
    embedder = str(build_embedding_model(scripted_root))
    script, log = tmp_path / "app.py", tmp_path / "app.log"
    script.write_text(APP)
    before = shm_entries()
    tree, created = [], set()
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, str(script), s.path, embedder, json.dumps(s.engine_kwargs), how],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 300
        while "READY" not in log.read_text():
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the app did not answer in 300 s"
            time.sleep(0.2)
        tree = process_tree(child.pid)
        created = shm_entries() - before
        answer, size = json.loads(log.read_text().split("READY", 1)[1].splitlines()[0])
        assert answer == s.scenario.answer and size > 0
        assert len(tree) >= 5, tree  # the app, 2 engine cores, 2 workers (+ resource tracker)
        assert created, "the engines' shared memory was expected in /dev/shm"
        if how == "SIGTERM":
            child.send_signal(signal.SIGTERM)
        elif how == "SIGKILL":
            child.kill()
        child.wait(timeout=60)
        left, shm_left, waited = wait_gone(tree, created, BOUND)
        print(f"{how}: {len(tree) - 1} processes and {len(created)} /dev/shm entries gone "
              f"{waited:.1f} s after the app")
        assert not left, f"still running {BOUND} s after the app ({how}): {left}"
        assert not shm_left, f"left in /dev/shm ({how}): {sorted(shm_left)}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        clean_up(tree, created)
