"""``VLLMRerank``: a LangChain document compressor that reranks with an in-process cross-encoder.

>>> from vllm_inline.integrations.langchain import VLLMRerank
>>> reranker = VLLMRerank(model="BAAI/bge-reranker-v2-m3", top_n=3)
>>> best = reranker.compress_documents(retrieved_documents, "How cold is Oslo in winter?")

The engine is the shared pooling engine of :func:`vllm_inline.engine.get_engine` (with
``runner="pooling"``) for the reranker's model and options, the one LlamaIndex ``VLLMRerank``
uses too; it starts on the first call. Scores come from :meth:`Engine.score
<vllm_inline.engine.Engine.score>`: all of a call's documents are scored concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field

from vllm_inline.engine import BadRequestError, Engine, get_engine
from vllm_inline.engine.host.directory import parse_keep_alive
from vllm_inline.engine.pooling.scoring import DEFAULT_BATCH_SIZE, check_score_options, check_top_n

__all__ = ["VLLMRerank"]


class VLLMRerank(BaseDocumentCompressor):
    """A cross-encoder (reranker) on vLLM's pooling runner in this process, as a LangChain
    ``BaseDocumentCompressor``.

    Example:
        ```python
        from langchain_classic.retrievers import ContextualCompressionRetriever
        from vllm_inline.integrations.langchain import VLLMRerank

        retriever = ContextualCompressionRetriever(
            base_compressor=VLLMRerank(model="BAAI/bge-reranker-v2-m3", top_n=3),
            base_retriever=vector_store.as_retriever(search_kwargs={"k": 20}),
        )
        retriever.invoke("How cold is Oslo in winter?")
        ```

    Returns the ``top_n`` most relevant documents, best first, as copies whose
    ``metadata["relevance_score"]`` holds the model's score. A query-document pair longer than
    the model's context raises ``ContextLengthExceededError`` (naming ``documents[i]``) unless
    ``truncate=True``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str
    """Model path or hub id of a cross-encoder (a ``*ForSequenceClassification`` reranker with
    one label)."""
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Options for vLLM's ``AsyncEngineArgs`` (dtype, max_model_len, ...). ``runner`` defaults
    to ``"pooling"``. Default: ``{}``."""
    keep_alive: str | int | float | None = None
    """Load the model once per host: the engine runs in a process of its own that every process
    of yours attaches to, and stays loaded this long after the last one is gone (``"10m"``,
    ``"1h"``, seconds, ``0``: until the last process is gone, ``-1``: until ``python -m
    vllm_inline engines stop``; docs/host.md). Default ``None``: ``$VLLMINLINE_KEEP_ALIVE``,
    else the engine lives and dies with this process."""
    top_n: int | None = 3
    """How many documents to return (the best ones); ``None`` returns them all, reordered.
    Default: ``3``."""
    truncate: bool = False
    """Score only the first ``max_model_len`` tokens of longer query-document pairs instead of
    raising. Default: ``False``."""
    batch_size: int = DEFAULT_BATCH_SIZE
    """Pairs tokenized per batch; all of a call's pairs are submitted concurrently. Default: 64."""

    def __init__(self, **data: Any) -> None:
        # Bad options fail here, with the engine's typed error, before anything starts.
        check_score_options(data.get("truncate", False), data.get("batch_size", DEFAULT_BATCH_SIZE))
        check_top_n(data.get("top_n", 3))
        parse_keep_alive(data.get("keep_alive"))
        super().__init__(**data)

    @property
    def engine(self) -> Engine:
        """The shared pooling engine for ``model`` and ``vllm_kwargs`` (starts nothing)."""
        options = {"runner": "pooling", **self.vllm_kwargs}
        return get_engine(self.model, keep_alive=self.keep_alive, **options)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The ``top_n`` documents most relevant to ``query``, best first, each with
        ``metadata["relevance_score"]``."""
        if not documents:
            return []
        scores = self.engine.score(query, _texts(documents), **self._options())
        return _best(documents, scores, self.top_n)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """:meth:`compress_documents` without blocking the event loop."""
        if not documents:
            return []
        scores = await self.engine.ascore(query, _texts(documents), **self._options())
        return _best(documents, scores, self.top_n)

    def _options(self) -> dict[str, Any]:
        return {"truncate": self.truncate, "batch_size": self.batch_size}


def _texts(documents: Sequence[Document]) -> list[str]:
    texts = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise BadRequestError.invalid(f"documents[{i}]", doc, "a langchain_core Document")
        texts.append(doc.page_content)
    return texts


def _best(documents: Sequence[Document], scores: list[float], top_n: int | None) -> list[Document]:
    """Copies of the ``top_n`` best documents, best first, with their scores in metadata."""
    order = sorted(range(len(documents)), key=lambda i: scores[i], reverse=True)[:top_n]
    best = []
    for i in order:
        doc = documents[i]
        metadata = {**doc.metadata, "relevance_score": scores[i]}
        best.append(doc.model_copy(update={"metadata": metadata}))
    return best
