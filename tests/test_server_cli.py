"""``python -m vllm_inline serve`` with a chat model, an embedder and a reranker, in a process of
its own: the ``openai`` SDK gets the four kinds of answer from it (chat, text completion,
embeddings, rerank through the SDK's ``post``), and SIGTERM stops it with every process it
started and every shared-memory segment they made (checked by pid and by name). And a ``vllm
serve`` command line with ``vllm serve`` replaced: the model first, engine options, CORS, the root
path, uvicorn's log level and the tool parser as ``vllm serve``'s flags."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from processes import clean_up, describe, free_port, process_tree, shm_entries, wait_gone

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, build_embedding_model, scripted_model
from vllm_inline.testing.reranker import build_reranker_model

pytestmark = [pytest.mark.engine, pytest.mark.server]


@contextlib.contextmanager
def serve_command(command: list[str], log_path: Path) -> Iterator[str]:
    """``command`` (a ``serve``) in a process group of its own until healthy; yields its URL.
    At the end SIGTERM stops it with every process it started and every shared-memory segment
    they made (checked by pid and by name), and whatever is left is cleaned up by pid."""
    port = command[command.index("--port") + 1]
    before = shm_entries()
    log = log_path.open("w")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0)
    tree: dict[int, Any] = {}
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            tree.update({p.pid: p for p in process_tree(child.pid)})
            assert child.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not become healthy"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tree.update({p.pid: p for p in process_tree(child.pid)})
        yield url
        entries = shm_entries() - before
        child.send_signal(signal.SIGTERM)  # uvicorn's shutdown: the lifespan stops the engines
        assert child.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it, once down
        left, shm_left, _ = wait_gone(list(tree.values()), entries, timeout=30)
        assert not left and not shm_left, (describe(left), shm_left)
    finally:
        clean_up(tree.values(), shm_entries() - before)


def test_serve_answers_chat_completions_embeddings_and_rerank(
    scripted_root: Path, tmp_path: Path
) -> None:
    chat = scripted_model("llama3", scripted_root)
    embedder = str(build_embedding_model(scripted_root))
    reranker = str(build_reranker_model(scripted_root))
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--model", chat.path,
        "--served-model-name", "chat", "--embedding-model", embedder,
        "--rerank-model", reranker, "--port", str(free_port()),
        "--vllm-kwargs", json.dumps(dict(CPU_TEST_ENGINE_KWARGS)),
    ]  # fmt: skip
    with serve_command(command, tmp_path / "serve.log") as url:
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


def test_a_vllm_serve_command_line_runs_with_vllm_serve_replaced(
    scripted_root: Path, tmp_path: Path
) -> None:
    """The model first, then vllm serve's own options: engine options (read by vLLM's parser
    in a child of the launcher), CORS, uvicorn's root path and log level, the tool parser."""
    chat = scripted_model("llama3_tools", scripted_root)
    options = CPU_TEST_ENGINE_KWARGS
    command = [
        sys.executable, "-m", "vllm_inline", "serve", chat.path, "--served-model-name", "m",
        "--dtype", options["dtype"], "--max-model-len", str(options["max_model_len"]),
        "--enforce-eager", "--kv-cache-memory-bytes", str(options["kv_cache_memory_bytes"]),
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json",
        "--allowed-origins", '["http://app.test"]', "--root-path", "/api",
        "--uvicorn-log-level", "warning", "--port", str(free_port()),
    ]  # fmt: skip
    with serve_command(command, tmp_path / "serve.log") as url:
        (card,) = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert (card["id"], card["max_model_len"]) == ("m", options["max_model_len"])
        preflight = httpx.options(
            f"{url}/v1/chat/completions",
            headers={"Origin": "http://app.test", "Access-Control-Request-Method": "POST"},
            timeout=30,
        )
        assert preflight.headers["access-control-allow-origin"] == "http://app.test"
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
        body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                "tools": [weather]}  # fmt: skip
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
            "get_weather", {"city": "Oslo"}
        )  # fmt: skip
