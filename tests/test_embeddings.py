"""Embeddings on a real pooling engine: ``Engine.embed``, LangChain ``VLLMEmbeddings`` and
LlamaIndex ``VLLMEmbedding``, then RAG with a scripted chat model answering on top, in one process.

The embedder is :func:`vllm_inline.testing.build_embedding_model`: a random-weight
``LlamaModel`` (hidden 128) with sentence-transformers files asking for mean pooling and L2
normalisation. Its vectors are close to a bag of words, so a query finds the document it shares
words with. One pooling engine serves the whole module.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest

from vllm_inline.engine import (
    BadRequestError,
    ContextLengthExceededError,
    UnsupportedTaskError,
    get_engine,
)
from vllm_inline.testing import EMBEDDING_HIDDEN_SIZE, build_embedding_model

pytestmark = pytest.mark.engine

DOCS = [
    "The weather in Oslo is cold and snowy in winter.",
    "Paris is the capital of France.",
    "Bananas are yellow fruit.",
    "Python is a programming language.",
]
QUERY = "How is the weather in Oslo today?"
TOL = 1e-5


def close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


@pytest.fixture(scope="module")
def embedder(scripted, scripted_root: Path):
    """``(path, engine_kwargs, engine)``: the tiny embedder on its shared pooling engine."""
    path = str(build_embedding_model(scripted_root))
    kwargs = scripted("chatml").engine_kwargs  # the kit's CPU_TEST_ENGINE_KWARGS
    engine = get_engine(path, runner="pooling", **kwargs)
    engine.start()
    return path, kwargs, engine


# -- Engine.embed / aembed ---------------------------------------------------------------------


def test_vector_size_is_the_hidden_size(embedder) -> None:
    path, _, engine = embedder
    hidden = json.loads((Path(path) / "config.json").read_text())["hidden_size"]
    vectors = engine.embed(DOCS[:2])
    assert hidden == EMBEDDING_HIDDEN_SIZE
    assert [len(v) for v in vectors] == [hidden, hidden]
    assert all(isinstance(x, float) for x in vectors[0])


def test_same_text_same_vector(embedder) -> None:
    engine = embedder[2]
    a, b, other = engine.embed([DOCS[0], DOCS[0], DOCS[1]])
    assert close(a, b)
    assert close(engine.embed([DOCS[0]])[0], a)
    assert not close(a, other, 1e-2)


def test_batches_equal_one_by_one(embedder) -> None:
    engine = embedder[2]
    texts = [f"{DOCS[i % 4]} Number {i}." for i in range(11)]
    batched = engine.embed(texts, batch_size=3)  # 4 tokenizer batches, all submitted at once
    single = [engine.embed([t])[0] for t in texts]
    assert len(batched) == len(texts)
    assert all(close(x, y) for x, y in zip(batched, single))


def test_normalisation_as_configured(embedder) -> None:
    engine = embedder[2]
    default = engine.embed(DOCS)  # the model's Normalize module: unit vectors
    assert all(abs(norm(v) - 1.0) < 1e-4 for v in default)
    assert all(close(v, w) for v, w in zip(engine.embed(DOCS, normalize=True), default))
    raw = engine.embed(DOCS, normalize=False)
    assert all(norm(v) > 1.5 for v in raw)
    for v, unit in zip(raw, default):
        assert close([x / norm(v) for x in v], unit)


def test_similar_texts_have_similar_vectors(embedder) -> None:
    query, *docs = embedder[2].embed([QUERY, *DOCS])
    scores = [sum(q * d for q, d in zip(query, doc)) for doc in docs]
    assert scores.index(max(scores)) == 0, scores


async def test_async_equals_sync_and_runs_concurrently(embedder) -> None:
    engine = embedder[2]
    sync = engine.embed(DOCS)
    a, b = await asyncio.gather(engine.aembed(DOCS), engine.aembed(DOCS[::-1]))
    assert all(close(x, y) for x, y in zip(a, sync))
    assert all(close(x, y) for x, y in zip(b, sync[::-1]))


def test_too_long_names_the_text_unless_truncate(embedder) -> None:
    engine = embedder[2]
    long_text = "cat " * 1000  # > 512 tokens
    with pytest.raises(ContextLengthExceededError) as e:
        engine.embed([DOCS[0], DOCS[1], long_text], batch_size=2)
    assert e.value.parameter == "texts[2]"
    assert "truncate=True" in str(e.value) and "512" in str(e.value)
    assert engine.num_unfinished_requests() == 0  # nothing was submitted
    # truncate=True keeps the first max_model_len tokens: both texts become the same prompt.
    a, b = engine.embed([long_text, "cat " * 2000], truncate=True)
    assert close(a, b)
    assert len(a) == EMBEDDING_HIDDEN_SIZE


def test_bad_input_is_refused(embedder) -> None:
    engine = embedder[2]
    cases = [
        ({"texts": "one text"}, "texts"),
        ({"texts": ["ok", 3]}, "texts[1]"),
        ({"texts": ["ok"], "normalize": "yes"}, "normalize"),
        ({"texts": ["ok"], "truncate": 1}, "truncate"),
        ({"texts": ["ok"], "batch_size": 0}, "batch_size"),
        ({"texts": ["ok", ""]}, "texts[1]"),  # no tokens
    ]
    for kwargs, parameter in cases:
        with pytest.raises(BadRequestError) as e:
            engine.embed(**kwargs)
        assert e.value.parameter == parameter, kwargs
    assert engine.embed([]) == []


def test_wrong_runner_is_a_typed_error(scripted, embedder) -> None:
    chat_engine = scripted("chatml").engine
    with pytest.raises(UnsupportedTaskError) as e:
        chat_engine.embed(["hello"])
    assert "runner='pooling'" in str(e.value)
    with pytest.raises(UnsupportedTaskError) as e:
        list(embedder[2].stream([{"role": "user", "content": "hi"}]))
    assert "cannot generate" in str(e.value)


async def test_cancelling_aborts_the_requests(embedder) -> None:
    engine = embedder[2]
    task = asyncio.ensure_future(engine.aembed([f"{DOCS[i % 4]} {i}" for i in range(400)]))
    while engine.num_unfinished_requests() == 0 and not task.done():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.num_unfinished_requests() == 0
    assert len(engine.embed([DOCS[0]])[0]) == EMBEDDING_HIDDEN_SIZE  # still serving


# -- LangChain -----------------------------------------------------------------------------------


def test_langchain_embeddings(embedder) -> None:
    from vllm_inline.integrations.langchain import VLLMEmbeddings

    path, kwargs, engine = embedder
    emb = VLLMEmbeddings(model=path, vllm_kwargs=kwargs)
    assert emb.engine is engine  # runner="pooling" is the default: the same shared engine
    docs = emb.embed_documents(DOCS)
    assert all(close(x, y) for x, y in zip(docs, engine.embed(DOCS)))
    assert close(emb.embed_query(DOCS[1]), docs[1])
    assert all(close(x, y) for x, y in zip(asyncio.run(emb.aembed_documents(DOCS)), docs))
    assert close(asyncio.run(emb.aembed_query(DOCS[2])), docs[2])
    raw = VLLMEmbeddings(model=path, vllm_kwargs=kwargs, normalize=False).embed_query(DOCS[0])
    assert norm(raw) > 1.5
    with pytest.raises(ContextLengthExceededError):
        emb.embed_documents(["cat " * 1000])
    long_ok = VLLMEmbeddings(model=path, vllm_kwargs=kwargs, truncate=True)
    assert len(long_ok.embed_query("cat " * 1000)) == EMBEDDING_HIDDEN_SIZE


def test_langchain_rag_with_chat_vllm(scripted, embedder) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.vectorstores import InMemoryVectorStore

    from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings

    path, kwargs, _ = embedder
    store = InMemoryVectorStore(VLLMEmbeddings(model=path, vllm_kwargs=kwargs))
    store.add_texts(DOCS)
    (hit,) = store.similarity_search(QUERY, k=1)
    assert hit.page_content == DOCS[0]
    (ahit,) = asyncio.run(store.asimilarity_search(QUERY, k=1))
    assert ahit.page_content == DOCS[0]

    s = scripted("chatml")
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    answer = chat.invoke(
        [SystemMessage(f"Answer from this context:\n{hit.page_content}"), HumanMessage(QUERY)]
    )
    assert answer.content == s.scenario.answer


# -- LlamaIndex ----------------------------------------------------------------------------------


def test_llama_index_embedding(embedder) -> None:
    from vllm_inline.integrations.llama_index import VLLMEmbedding

    path, kwargs, engine = embedder
    emb = VLLMEmbedding(model=path, vllm_kwargs=kwargs)
    assert emb.engine is engine
    assert emb.model_name == path and VLLMEmbedding.class_name() == "VLLMInlineEmbedding"
    expected = engine.embed(DOCS)
    batch = emb.get_text_embedding_batch(DOCS)
    assert all(close(x, y) for x, y in zip(batch, expected))
    assert close(emb.get_text_embedding(DOCS[1]), expected[1])
    assert close(emb.get_query_embedding(DOCS[2]), expected[2])
    abatch = asyncio.run(emb.aget_text_embedding_batch(DOCS))
    assert all(close(x, y) for x, y in zip(abatch, expected))
    assert close(asyncio.run(emb.aget_query_embedding(DOCS[3])), expected[3])
    assert close(asyncio.run(emb.aget_text_embedding(DOCS[0])), expected[0])


def test_llama_index_rag_with_vllm(scripted, embedder) -> None:
    from llama_index.core import Document, VectorStoreIndex

    from vllm_inline.integrations.llama_index import VLLM, VLLMEmbedding

    path, kwargs, _ = embedder
    index = VectorStoreIndex.from_documents(
        [Document(text=t) for t in DOCS], embed_model=VLLMEmbedding(model=path, vllm_kwargs=kwargs)
    )
    s = scripted("chatml")
    query_engine = index.as_query_engine(
        llm=VLLM(model=s.path, vllm_kwargs=s.engine_kwargs),
        similarity_top_k=1,
        response_mode="simple_summarize",
    )
    response = query_engine.query(QUERY)
    assert response.source_nodes[0].node.get_content() == DOCS[0]
    assert str(response) == s.scenario.answer
    aresponse = asyncio.run(query_engine.aquery(QUERY))
    assert aresponse.source_nodes[0].node.get_content() == DOCS[0]
    assert str(aresponse) == s.scenario.answer
