"""The examples under ``examples/`` run on scripted models, on the session's shared engines.

Each example's ``main()`` is imported and called with a scripted model's path; the examples
pass no engine options (on this CPU the engine picks dtype, KV cache and eager mode itself), so
they run on engines of their own, next to the suite's (which set those options explicitly). The FastAPI example is served by uvicorn
on 127.0.0.1 in a thread and read with an HTTP client over a real socket.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import socket
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_inline.engine import get_engine

pytestmark = pytest.mark.engine

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUESTION = "How does streaming work?"
"""The question ``examples/rag_app.py`` asks by default."""


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (``examples/`` is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run(s: Any, name: str) -> tuple[Any, str]:
    """``examples/<name>.py``'s ``main(s.path)`` and what it printed.

    The engine starts first, outside the redirect: vLLM binds its log handler to the
    ``sys.stdout`` of the moment it is imported, which must outlive this test.
    """
    get_engine(s.path).start()  # the examples' engine: no options
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = load(name).main(s.path)
    return result, out.getvalue()


def test_examples_pass_no_cpu_settings() -> None:
    """On a CPU the engine picks these itself; an example that set them would teach a reader to
    copy CPU-only values onto a GPU. Options a user passes in (openai_server's --vllm-kwargs) are
    theirs."""
    for path in EXAMPLES.glob("*.py"):
        source = path.read_text()
        for setting in ("float32", "bfloat16", "enforce_eager", "kv_cache_memory_bytes", "dtype="):
            assert setting not in source, (path, setting)
        if path.name != "openai_server.py":
            assert "vllm_kwargs" not in source.replace("vllm_kwargs you pass", ""), path


def test_lcel_chain_streams_to_stdout(scripted: Any) -> None:
    s = scripted("demo")
    answer, out = run(s, "lcel_stream")
    assert answer == s.scenario.answer
    assert out == s.scenario.answer + "\n"


def test_agent_calls_its_tool_and_answers(scripted: Any) -> None:
    s = scripted("chatml_tools")
    messages, out = run(s, "langchain_agent")
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert messages[1].tool_calls[0]["name"] == "get_weather"
    assert messages[1].tool_calls[0]["args"] == {"city": "Oslo"}
    assert messages[2].content == "It is sunny in Oslo."
    assert messages[-1].content == "The weather in Oslo is sunny."
    assert "get_weather" in out and "The weather in Oslo is sunny." in out


def test_rag_query_engine_streams_its_answer(scripted: Any) -> None:
    s = scripted("demo")
    response, out = run(s, "llama_index_rag")
    assert out.startswith(s.scenario.answer + "\n")
    assert any("Streaming" in n.get_content() for n in response.source_nodes)
    assert "[source] Streaming" in out


@pytest.mark.parametrize("framework", ["langchain", "llama-index"])
def test_rag_app_answers_with_its_reranked_sources(scripted: Any, framework: str) -> None:
    """``examples/rag_app.py``: three engines started together with no memory option (the
    embedder's and the reranker's memory planned together), the answer streamed, then the 3
    sources the reranker ranked best of the 8 retrieved."""
    importlib.import_module("vllm")  # before the redirect: vLLM's log handler keeps sys.stdout
    s = scripted("demo")
    example = load("rag_app")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        answer, sources = example.main(s.path, framework=framework)
    assert answer == s.scenario.answer
    assert out.getvalue().startswith(s.scenario.answer + "\n")
    assert len(sources) == example.KEEP and set(sources) <= set(example.CHUNKS)
    assert [f"[source] {t}" for t in sources] == out.getvalue().splitlines()[1:]
    from vllm_inline.testing import build_embedding_model, build_reranker_model

    reranker = get_engine(str(build_reranker_model()), runner="pooling")
    embedder = get_engine(str(build_embedding_model()), runner="pooling")
    # the reranker's order: of the 8 nearest chunks, the best 3 by its own score, best first
    import numpy as np

    query, vectors = (
        np.array(v) for v in (embedder.embed([QUESTION]), embedder.embed(example.CHUNKS))
    )
    cosine = (vectors @ query.T)[:, 0] / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    near = [example.CHUNKS[i] for i in np.argsort(-cosine)[: example.RETRIEVE]]
    scores = dict(zip(near, reranker.score(QUESTION, near)))
    assert sources == sorted(near, key=scores.__getitem__, reverse=True)[: example.KEEP]
    for engine in (embedder, reranker):  # started together by the example, or by its first run
        chosen = {c.name: c.reason for c in engine.platform_defaults.chosen}
        assert chosen["kv_cache_memory_bytes"].startswith("planned with "), chosen


def test_sse_event_format() -> None:
    sse = load("fastapi_sse").sse
    assert sse(" answer") == "data:  answer\n\n"
    assert sse("a\nb", "x") == "event: x\ndata: a\ndata: b\n\n"


def _events(lines: list[str]) -> list[tuple[str, str]]:
    """SSE lines -> ``(event, data)`` pairs (one space after ``data:`` is dropped)."""
    events, event, data = [], "message", []
    for line in lines:
        if not line:
            if data:
                events.append((event, "\n".join(data)))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[len("event:") :].strip()
        elif line.startswith("data:"):
            value = line[len("data:") :]
            data.append(value.removeprefix(" "))
    return events


def test_fastapi_endpoint_streams_sse_over_a_real_socket(scripted: Any) -> None:
    import httpx
    import uvicorn

    s = scripted("demo")
    app = load("fastapi_sse").create_app(s.path)
    running_before = get_engine(s.path).started  # the example's engine: no options
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120  # the lifespan starts the engine (if not yet running)
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        lines = []
        with httpx.stream(
            "GET",
            f"http://127.0.0.1:{port}/chat",
            params={"q": "What does vllm-inline do?"},
            timeout=60,
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = list(response.iter_lines())
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
    events = _events(lines)
    texts = [data for event, data in events if event == "message"]
    assert len(texts) > 1
    assert "".join(texts) == s.scenario.answer
    usage = json.loads(next(data for event, data in events if event == "usage"))
    assert usage["finish_reason"] == "stop"
    # Each word, then <|eot_id|> (a consumer a step behind gets two words in one chunk).
    assert usage["output_tokens"] == len(s.scenario.answer.split(" ")) + 1
    assert events[-1] == ("done", "[DONE]")
    assert not thread.is_alive()
    # The lifespan stops the engine only if it started it (alone, this test; in the suite, the
    # engine the other examples started stays up for test_observability).
    assert get_engine(s.path).started == running_before


def test_openai_server_app_serves_the_api_next_to_its_rag_route(scripted: Any) -> None:
    import httpx
    from serving import serving

    s = scripted("demo")
    example = load("openai_server")
    app = example.create_app(s.path)  # no engine options, as the example runs
    with serving(app) as url:
        ask = httpx.get(f"{url}/ask", params={"q": "What does vllm-inline do?"}, timeout=120)
        assert ask.status_code == 200, ask.text
        assert ask.json()["answer"] == s.scenario.answer
        assert len(ask.json()["sources"]) == 2
        assert set(ask.json()["sources"]) <= set(example.DOCS)
        body = {"model": s.path, "messages": [{"role": "user", "content": "Hi"}]}
        chat = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
        assert chat["choices"][0]["message"]["content"] == s.scenario.answer
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models[0] == s.path and len(models) == 2
        vectors = httpx.post(f"{url}/v1/embeddings", json={"model": models[1], "input": "x"})
        assert len(vectors.json()["data"][0]["embedding"]) > 1
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and json.dumps([s.path]) in page.text
        metrics = httpx.get(f"{url}/metrics").text
        assert f'model_name="{s.path}"' in metrics and "vllm:generation_tokens" in metrics
