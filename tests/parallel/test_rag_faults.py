"""A RAG app's three engines (chat, embedder, reranker), started together, when one of them
dies: the other two keep serving, calls to the dead one raise ``EngineDeadError`` (saying to
restart it), and ``restart()`` brings it back. One test per engine.

Each engine is killed the way the OOM killer kills: SIGKILL to its engine core and worker,
nothing else touched. The engines are this module's own (``seed`` sets them apart from the
suite's shared ones), so it may kill and restart them.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from vllm_inline.engine import Engine, EngineDeadError, get_engine, shutdown_engines, start_engines
from vllm_inline.testing import build_embedding_model, build_reranker_model

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

HI = [{"role": "user", "content": "Hi"}]
DOCS = ["Streaming sends each token at once.", "Rerankers score query-document pairs."]


@pytest.fixture(scope="module")
def rag(scripted: Any, scripted_root: Any) -> Iterator[dict[str, Engine]]:
    s = scripted("demo")
    options = {**s.engine_kwargs, "seed": 36}
    engines = {
        "chat": get_engine(s.path, **options),
        "embedder": get_engine(
            str(build_embedding_model(scripted_root)), runner="pooling", **options
        ),
        "reranker": get_engine(
            str(build_reranker_model(scripted_root)), runner="pooling", **options
        ),
    }
    start_engines(*engines.values())
    yield engines
    shutdown_engines(*engines.values())


def serves(role: str, engine: Engine, scripted: Any) -> None:
    """One call of the engine's kind, answered in full."""
    if role == "chat":
        answer = scripted("demo").scenario.answer
        assert "".join(d.text for d in engine.stream(HI)) == answer
    elif role == "embedder":
        vectors = engine.embed(DOCS)
        assert len(vectors) == 2 and len(set(map(len, vectors))) == 1
    else:
        assert len(engine.score("What do rerankers do?", DOCS)) == 2


def kill(engine: Engine) -> None:
    """SIGKILL the engine's core and every process below it (its worker)."""
    # The engine core's process, as vLLM's client holds it: a test may reach into vLLM.
    core = engine.runtime.llm.engine_core.resources.engine_manager.processes[0]
    victims = [psutil.Process(core.pid), *psutil.Process(core.pid).children(recursive=True)]
    for p in victims:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=30)


@pytest.mark.parametrize("dead", ["chat", "embedder", "reranker"])
def test_one_engine_dies_the_other_two_serve_and_it_restarts(rag, scripted, dead) -> None:
    for role, engine in rag.items():
        serves(role, engine, scripted)
    kill(rag[dead])
    # vLLM's client notices the dead core on its next read; the call then raises
    deadline = time.monotonic() + 60
    with pytest.raises(EngineDeadError, match="restart"):
        while time.monotonic() < deadline:
            serves(dead, rag[dead], scripted)
            time.sleep(0.2)
    with pytest.raises(EngineDeadError, match="restart"):
        serves(dead, rag[dead], scripted)  # and keeps raising: nothing restarts behind the app
    for role, engine in rag.items():
        if role != dead:
            serves(role, engine, scripted)
            assert engine.num_unfinished_requests() == 0
    rag[dead].restart()
    for role, engine in rag.items():
        serves(role, engine, scripted)
