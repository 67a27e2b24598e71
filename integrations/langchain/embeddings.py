"""``VLLMEmbeddings``: LangChain ``Embeddings`` on an in-process vLLM pooling engine.

>>> from vllm_inline.integrations.langchain import VLLMEmbeddings
>>> embeddings = VLLMEmbeddings(model="Qwen/Qwen3-Embedding-0.6B")
>>> vectors = embeddings.embed_documents(["vLLM runs in this process", "no HTTP hop"])

The engine is shared through :func:`vllm_inline.engine.get_engine` (with ``runner="pooling"``)
with every other ``VLLMEmbeddings`` and LlamaIndex ``VLLMEmbedding`` on the same model and
options; it starts on the first call, on the same loop thread machinery, errors and shutdown as
``ChatVLLM``'s.
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from vllm_inline.engine import Engine, get_engine
from vllm_inline.engine.host.directory import parse_keep_alive
from vllm_inline.engine.pooling.embeddings import DEFAULT_BATCH_SIZE, check_embed_options

__all__ = ["VLLMEmbeddings"]


class VLLMEmbeddings(BaseModel, Embeddings):
    """vLLM's pooling runner in this process as LangChain ``Embeddings``.

    Example:
        ```python
        from langchain_core.vectorstores import InMemoryVectorStore
        from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings

        store = InMemoryVectorStore(VLLMEmbeddings(model="Qwen/Qwen3-Embedding-0.6B"))
        store.add_texts(["Oslo is cold in winter.", "Paris is the capital of France."])
        store.similarity_search("capital of France", k=1)
        ```

    A text longer than the model's context raises ``ContextLengthExceededError`` (naming the
    text's index) unless ``truncate=True``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str
    """Model path or hub id of an embedding model (or a causal LM vLLM converts to one)."""
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Options for vLLM's ``AsyncEngineArgs`` (dtype, max_model_len, ...). ``runner`` defaults
    to ``"pooling"``. Default: ``{}``."""
    keep_alive: str | int | float | None = None
    """Load the model once per host: the engine runs in a process of its own that every process
    of yours attaches to, and stays loaded this long after the last one is gone (``"10m"``,
    ``"1h"``, seconds, ``0``: until the last process is gone, ``-1``: until ``python -m
    vllm_inline engines stop``; docs/host.md). Default ``None``: ``$VLLMINLINE_KEEP_ALIVE``,
    else the engine lives and dies with this process."""
    normalize: bool | None = None
    """L2-normalise the vectors; ``None`` keeps the model's own setting (sentence-transformers
    ``Normalize`` module or vLLM's default, which normalises). Default: ``None``."""
    truncate: bool = False
    """Embed only the first ``max_model_len`` tokens of longer texts instead of raising.
    Default: ``False``."""
    batch_size: int = DEFAULT_BATCH_SIZE
    """Texts tokenized per batch; all of a call's texts are submitted concurrently. Default: 64."""

    def __init__(self, **data: Any) -> None:
        # Bad options fail here, with the engine's typed error, before anything starts.
        check_embed_options(
            data.get("truncate", False),
            data.get("normalize"),
            data.get("batch_size", DEFAULT_BATCH_SIZE),
        )
        parse_keep_alive(data.get("keep_alive"))
        super().__init__(**data)

    @property
    def engine(self) -> Engine:
        """The shared pooling engine for ``model`` and ``vllm_kwargs`` (starts nothing)."""
        options = {"runner": "pooling", **self.vllm_kwargs}
        return get_engine(self.model, keep_alive=self.keep_alive, **options)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order."""
        return self.engine.embed(texts, **self._options())

    def embed_query(self, text: str) -> list[float]:
        """The vector of one query text (embedded as documents are)."""
        return self.engine.embed([text], **self._options())[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order, without blocking the event loop."""
        return await self.engine.aembed(texts, **self._options())

    async def aembed_query(self, text: str) -> list[float]:
        """The vector of one query text, without blocking the event loop."""
        return (await self.engine.aembed([text], **self._options()))[0]

    def _options(self) -> dict[str, Any]:
        return {
            "truncate": self.truncate,
            "normalize": self.normalize,
            "batch_size": self.batch_size,
        }
