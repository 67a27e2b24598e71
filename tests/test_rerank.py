"""Rerankers on a real pooling engine: ``Engine.score``, LangChain ``VLLMRerank`` and LlamaIndex
``VLLMRerank``, then retrieve -> rerank -> answer with a scripted chat model of the same process.

The reranker is :func:`vllm_inline.testing.reranker.build_reranker_model`: a random-weight
``LlamaForSequenceClassification`` with one label. Its scores mean nothing, but they differ
between documents and must equal transformers' ``AutoModelForSequenceClassification`` on the same
pairs, so the order the rerankers produce is the model's. One pooling engine serves the module.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from vllm_inline.engine import (
    BadRequestError,
    ContextLengthExceededError,
    UnsupportedTaskError,
    get_engine,
)
from vllm_inline.testing.reranker import build_reranker_model

pytestmark = pytest.mark.engine

QUERY = "How is the weather in Oslo today?"
DOCS = [
    "The weather in Oslo is cold and snowy in winter.",
    "Paris is the capital of France.",
    "Bananas are yellow fruit.",
    "Python is a programming language.",
    "The train leaves the station at noon.",
    "Cats and dogs are pets.",
]
TOL = 1e-4  # float32, different kernels


@pytest.fixture(scope="module")
def reranker(scripted, scripted_root: Path):
    """``(path, engine_kwargs, engine)``: the tiny reranker on its own pooling engine."""
    path = str(build_reranker_model(scripted_root))
    kwargs = scripted("llama3").engine_kwargs  # the suite's ENGINE_KWARGS
    engine = get_engine(path, runner="pooling", **kwargs)
    engine.start()
    yield path, kwargs, engine
    engine.shutdown()


@pytest.fixture(scope="module")
def expected(reranker) -> list[float]:
    """transformers' scores for ``(QUERY, DOCS[i])``: the pair tokenized as vLLM does it
    (``tokenizer(query, document)``, truncated past the context), sigmoid of the one logit."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path, kwargs, _ = reranker
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for doc in DOCS:
            enc = tokenizer(
                text=QUERY,
                text_pair=doc,
                truncation=True,
                max_length=kwargs["max_model_len"] + 1,
                return_tensors="pt",
            )
            scores.append(torch.sigmoid(model(**enc).logits[0, 0]).item())
    return scores


def close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def ranked(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)


# -- Engine.score / ascore -----------------------------------------------------------------------


def test_scores_equal_transformers(reranker, expected) -> None:
    engine = reranker[2]
    scores = engine.score(QUERY, DOCS)
    assert all(isinstance(s, float) for s in scores)
    assert close(scores, expected), (scores, expected)
    assert ranked(scores) == ranked(expected)
    assert max(scores) - min(scores) > 0.05  # the documents really are told apart


async def test_async_batched_and_concurrent_equal_sync(reranker, expected) -> None:
    engine = reranker[2]
    a, b = await asyncio.gather(
        engine.ascore(QUERY, DOCS, batch_size=2), engine.ascore(QUERY, DOCS[::-1], batch_size=4)
    )
    assert close(a, expected) and close(b, expected[::-1])
    many = [DOCS[i % len(DOCS)] for i in range(40)]
    want = [expected[i % len(DOCS)] for i in range(40)]
    assert close(engine.score(QUERY, many, batch_size=3), want)


def test_too_long_names_the_document_unless_truncate(reranker) -> None:
    engine = reranker[2]
    long_doc = "cat " * 1000  # > 512 tokens with the query
    with pytest.raises(ContextLengthExceededError) as e:
        engine.score(QUERY, [DOCS[0], DOCS[1], long_doc], batch_size=2)
    assert e.value.parameter == "documents[2]"
    assert "truncate=True" in str(e.value) and "512" in str(e.value)
    assert engine.num_unfinished_requests() == 0  # the first batch was aborted
    # truncate=True cuts the pair to max_model_len tokens: both documents become the same pair.
    a, b = engine.score(QUERY, [long_doc, "cat " * 2000], truncate=True)
    assert abs(a - b) < 1e-6
    assert len(engine.score(QUERY, DOCS[:2])) == 2  # still serving


def test_bad_input_is_refused_and_the_engine_keeps_serving(reranker, expected) -> None:
    engine = reranker[2]
    cases = [
        ({"query": "", "documents": DOCS}, "query"),
        ({"query": "   ", "documents": DOCS}, "query"),
        ({"query": None, "documents": DOCS}, "query"),
        ({"query": QUERY, "documents": "one document"}, "documents"),
        ({"query": QUERY, "documents": ["ok", 3]}, "documents[1]"),
        ({"query": QUERY, "documents": ["ok", None]}, "documents[1]"),
        ({"query": QUERY, "documents": ["ok"], "truncate": 1}, "truncate"),
        ({"query": QUERY, "documents": ["ok"], "batch_size": 0}, "batch_size"),
    ]
    for kwargs, parameter in cases:
        with pytest.raises(BadRequestError) as e:
            engine.score(**kwargs)
        assert e.value.parameter == parameter, kwargs
        with pytest.raises(BadRequestError):
            asyncio.run(engine.ascore(**kwargs))
    assert engine.score(QUERY, []) == []
    assert asyncio.run(engine.ascore(QUERY, [])) == []
    assert len(engine.score(QUERY, [""])) == 1  # an empty document is a valid (short) pair
    assert close(engine.score(QUERY, DOCS), expected)


def test_wrong_engine_is_a_typed_error(scripted, reranker) -> None:
    chat_engine = scripted("llama3").engine
    with pytest.raises(UnsupportedTaskError) as e:
        chat_engine.score(QUERY, DOCS)
    assert e.value.parameter == "model" and "runner='pooling'" in str(e.value)
    with pytest.raises(UnsupportedTaskError) as e:
        list(reranker[2].stream([{"role": "user", "content": "hi"}]))
    assert "cannot generate" in str(e.value) and "engine.score" in str(e.value)
    with pytest.raises(UnsupportedTaskError) as e:
        reranker[2].embed(["hello"])  # a classifier is no embedder
    assert "'embed'" in str(e.value)
    assert len(reranker[2].score(QUERY, DOCS[:1])) == 1


def test_an_embedding_model_is_no_reranker(scripted, scripted_root: Path) -> None:
    # The embedding tests' engine (same model and options): already running in a full run.
    from vllm_inline.testing import build_embedding_model

    path = str(build_embedding_model(scripted_root))
    embedder = get_engine(path, runner="pooling", **scripted("llama3").engine_kwargs)
    with pytest.raises(UnsupportedTaskError) as e:
        embedder.score(QUERY, DOCS)
    assert e.value.parameter == "model" and "num_labels=1" in str(e.value)
    assert len(embedder.embed([QUERY])) == 1  # still serving


async def test_cancelling_aborts_the_requests(reranker) -> None:
    engine = reranker[2]
    task = asyncio.ensure_future(engine.ascore(QUERY, [f"{DOCS[i % 6]} {i}" for i in range(400)]))
    while engine.num_unfinished_requests() == 0 and not task.done():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.num_unfinished_requests() == 0
    assert len(engine.score(QUERY, DOCS[:1])) == 1  # still serving


# -- LangChain -----------------------------------------------------------------------------------


def _lc_retriever():
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class AllDocuments(BaseRetriever):
        """Returns every document, in their stored order (the retrieval step is not tested)."""

        documents: list[Document]

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return list(self.documents)

    docs = [Document(page_content=t, metadata={"i": i}, id=str(i)) for i, t in enumerate(DOCS)]
    return AllDocuments(documents=docs)


def test_langchain_compressor(reranker, expected) -> None:
    from langchain_core.documents import Document

    from vllm_inline.integrations.langchain import VLLMRerank

    path, kwargs, engine = reranker
    rerank = VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=3)
    assert rerank.engine is engine  # runner="pooling" is the default: the same shared engine
    docs = [Document(page_content=t, metadata={"i": i}) for i, t in enumerate(DOCS)]
    best = rerank.compress_documents(docs, QUERY)
    assert [d.metadata["i"] for d in best] == ranked(expected)[:3]
    assert close([d.metadata["relevance_score"] for d in best], sorted(expected, reverse=True)[:3])
    assert "relevance_score" not in docs[0].metadata  # copies, the inputs are untouched
    abest = asyncio.run(rerank.acompress_documents(docs, QUERY))
    assert [d.metadata["i"] for d in abest] == ranked(expected)[:3]
    keep_all = VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=None)
    everything = keep_all.compress_documents(docs, QUERY)
    assert [d.metadata["i"] for d in everything] == ranked(expected)
    assert rerank.compress_documents([], QUERY) == []
    with pytest.raises(BadRequestError) as e:
        VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=0)
    assert e.value.parameter == "top_n"
    with pytest.raises(BadRequestError) as e:
        rerank.compress_documents(docs, "")
    assert e.value.parameter == "query"


def test_langchain_retrieve_rerank_answer_streams(scripted, reranker, expected) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    from vllm_inline.integrations.langchain import ChatVLLM, VLLMRerank

    path, kwargs, _ = reranker
    retriever = ContextualCompressionRetriever(
        base_compressor=VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=2),
        base_retriever=_lc_retriever(),
    )
    hits = retriever.invoke(QUERY)
    assert [d.page_content for d in hits] == [DOCS[i] for i in ranked(expected)[:2]]
    assert [d.page_content for d in asyncio.run(retriever.ainvoke(QUERY))] == [
        d.page_content for d in hits
    ]

    s = scripted("llama3")
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from this context:\n{context}"), ("human", "{question}")]
    )
    chain = (
        {
            "context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
        | StrOutputParser()
    )
    chunks = list(chain.stream(QUERY))
    assert len(chunks) > 1
    assert "".join(chunks) == s.scenario.answer

    async def astream() -> list[str]:
        return [c async for c in chain.astream(QUERY)]

    assert "".join(asyncio.run(astream())) == s.scenario.answer


# -- LlamaIndex ----------------------------------------------------------------------------------


def test_llama_index_postprocessor(reranker, expected) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from vllm_inline.integrations.llama_index import VLLMRerank

    path, kwargs, engine = reranker
    rerank = VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=3)
    assert rerank.engine is engine
    assert VLLMRerank.class_name() == "VLLMInlineRerank"
    nodes = [
        NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(DOCS)
    ]
    best = rerank.postprocess_nodes(nodes, query_str=QUERY)
    assert [int(n.node.node_id) for n in best] == ranked(expected)[:3]
    assert close([n.score for n in best], sorted(expected, reverse=True)[:3])
    assert all(n.score == 0.0 for n in nodes)  # new NodeWithScore objects
    abest = asyncio.run(rerank.apostprocess_nodes(nodes, query_str=QUERY))
    assert [int(n.node.node_id) for n in abest] == ranked(expected)[:3]
    assert rerank.postprocess_nodes([], query_str=QUERY) == []
    with pytest.raises(BadRequestError) as e:
        rerank.postprocess_nodes(nodes)
    assert e.value.parameter == "query_bundle"
    with pytest.raises(BadRequestError) as e:
        VLLMRerank(model=path, vllm_kwargs=kwargs, batch_size=0)
    assert e.value.parameter == "batch_size"


def test_llama_index_query_engine_reranks_and_streams(scripted, reranker, expected) -> None:
    from llama_index.core import Document, SummaryIndex

    from vllm_inline.integrations.llama_index import VLLM, VLLMRerank

    path, kwargs, _ = reranker
    # A summary index retrieves every node (no embedding model): the reranker picks the best.
    index = SummaryIndex.from_documents([Document(text=t) for t in DOCS])
    s = scripted("llama3")
    query_engine = index.as_query_engine(
        llm=VLLM(model=s.path, vllm_kwargs=s.engine_kwargs),
        node_postprocessors=[VLLMRerank(model=path, vllm_kwargs=kwargs, top_n=2)],
        response_mode="simple_summarize",  # the 512-token test window is too small for refine
        streaming=True,
    )
    response = query_engine.query(QUERY)
    assert [n.node.get_content() for n in response.source_nodes] == [
        DOCS[i] for i in ranked(expected)[:2]
    ]
    assert close([n.score for n in response.source_nodes], sorted(expected, reverse=True)[:2])
    tokens = list(response.response_gen)
    assert len(tokens) > 1
    assert "".join(tokens) == s.scenario.answer

    async def aquery() -> tuple[list[str], str]:
        aresponse = await query_engine.aquery(QUERY)
        text = "".join([t async for t in aresponse.async_response_gen()])
        return [n.node.get_content() for n in aresponse.source_nodes], text

    sources, text = asyncio.run(aquery())
    assert sources == [DOCS[i] for i in ranked(expected)[:2]]
    assert text == s.scenario.answer
