"""``python -m vllm_inline serve`` with a chat model, an embedder and a reranker, in a process of
its own: the ``openai`` SDK gets the four kinds of answer from it (chat, text completion,
embeddings, rerank through the SDK's ``post``), and SIGTERM stops it with every process it
started and every shared-memory segment they made (checked by pid and by name)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from processes import clean_up, describe, free_port, process_tree, shm_entries, wait_gone

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_embedding_model, scripted_model
from vllm_inline.testing.reranker import build_reranker_model

pytestmark = [pytest.mark.engine, pytest.mark.server]


def test_serve_answers_chat_completions_embeddings_and_rerank(
    scripted_root: Path, tmp_path: Path
) -> None:
    chat = scripted_model("llama3", scripted_root)
    embedder = str(build_embedding_model(scripted_root))
    reranker = str(build_reranker_model(scripted_root))
    port = free_port()
    before = shm_entries()
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--model", chat.path,
        "--served-model-name", "chat", "--embedding-model", embedder,
        "--rerank-model", reranker, "--port", str(port),
        "--vllm-kwargs", json.dumps(dict(CPU_TEST_ENGINE_KWARGS)),
    ]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0)
    tree: dict[int, Any] = {}
    entries: set[str] = set()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            tree.update({p.pid: p for p in process_tree(child.pid)})
            assert child.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not become healthy"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tree.update({p.pid: p for p in process_tree(child.pid)})
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["chat", embedder, reranker]
        hello = [{"role": "user", "content": "Hello"}]
        answer = client.chat.completions.create(model="chat", messages=hello)
        assert answer.choices[0].message.content == chat.scenario.answer
        text = client.completions.create(model="chat", prompt="Hello", max_tokens=3)
        assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 3
        vectors = client.embeddings.create(
            model=embedder, input=["a", "b"], encoding_format="float"
        )
        assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 1
        body = {"model": reranker, "query": "weather", "documents": ["snow", "sun"], "top_n": 1}
        ranked = client.post("/rerank", body=body, cast_to=object)
        assert isinstance(ranked, dict) and len(ranked["results"]) == 1
        entries = shm_entries() - before

        child.send_signal(signal.SIGTERM)  # uvicorn's shutdown: the lifespan stops the engines
        assert child.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it, once down
        left, shm_left, _ = wait_gone(list(tree.values()), entries, timeout=30)
        assert not left and not shm_left, (describe(left), shm_left)
    finally:
        clean_up(tree.values(), shm_entries() - before)
        log.close()
