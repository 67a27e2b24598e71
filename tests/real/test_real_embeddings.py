"""all-MiniLM-L6-v2 on a real pooling engine against a Sentence-Transformers-style reference.

The reference is transformers' ``AutoModel`` in float32, mean-pooled over the attention mask and
L2-normalised (what the checkpoint's ``modules.json`` asks for). ``Engine.embed``, LangChain
``VLLMEmbeddings`` and LlamaIndex ``VLLMEmbedding`` must each give vectors with cosine >= 0.9999
to it, and rank a small set of documents for each query in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from vllm_inline.engine import Engine, get_engine

MIN_COSINE = 0.9999
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "The Pacific is the largest and deepest of Earth's oceans.",
    "A sonnet is a poem of fourteen lines.",
    "Espresso is coffee brewed by forcing hot water through finely ground beans.",
]
QUERIES = [
    "Which landmark is in the French capital?",
    "How do plants make their food?",
    "What is the biggest ocean?",
    "How many lines does a sonnet have?",
    "How is an espresso made?",
]
MINILM_OPTIONS: dict[str, object] = {}
"""MiniLM runs on the engine's own CPU defaults (``runner="pooling"`` is the integrations')."""


@pytest.fixture(scope="module")
def engine(minilm: str) -> Engine:
    return get_engine(minilm, runner="pooling", **MINILM_OPTIONS).start()


@pytest.fixture(scope="module")
def expected(minilm: str) -> dict[str, list[float]]:
    """The reference vector of every text in this module."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm)
    model = AutoModel.from_pretrained(minilm, dtype=torch.float32).eval()
    texts = DOCS + QUERIES
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    vectors = torch.nn.functional.normalize(pooled, dim=-1)
    return dict(zip(texts, vectors.tolist()))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def ranking(query: Sequence[float], docs: Sequence[Sequence[float]]) -> list[int]:
    """Document indices, most similar first."""
    return sorted(range(len(docs)), key=lambda i: -cosine(query, docs[i]))


def check(
    docs: list[list[float]], queries: list[list[float]], expected: dict[str, list[float]]
) -> None:
    """Every vector close to its reference, and each query ranking the documents as it does."""
    assert (len(docs), len(queries)) == (len(DOCS), len(QUERIES))
    pairs = list(zip(DOCS + QUERIES, docs + queries))
    worst = min(cosine(v, expected[t]) for t, v in pairs)
    assert worst >= MIN_COSINE, f"lowest cosine to the reference {worst:.6f}"
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for _, v in pairs)  # normalised
    reference_docs = [expected[d] for d in DOCS]
    for q, text in zip(queries, QUERIES):
        assert ranking(q, docs) == ranking(expected[text], reference_docs), text
    # Each query's best document is its own: the set is easy, so a wrong order means a bug.
    assert [ranking(q, docs)[0] for q in queries] == list(range(len(DOCS)))


def test_engine_embed(engine: Engine, expected) -> None:
    check(engine.embed(DOCS), engine.embed(QUERIES), expected)


def test_langchain_embeddings(engine: Engine, expected, minilm: str) -> None:
    from vllm_inline.integrations.langchain import VLLMEmbeddings

    emb = VLLMEmbeddings(model=minilm, vllm_kwargs=MINILM_OPTIONS)
    assert emb.engine is engine
    check(emb.embed_documents(DOCS), [emb.embed_query(q) for q in QUERIES], expected)


def test_llama_index_embedding(engine: Engine, expected, minilm: str) -> None:
    from vllm_inline.integrations.llama_index import VLLMEmbedding

    emb = VLLMEmbedding(model=minilm, vllm_kwargs=MINILM_OPTIONS)
    assert emb.engine is engine
    check(
        emb.get_text_embedding_batch(DOCS), [emb.get_query_embedding(q) for q in QUERIES], expected
    )
