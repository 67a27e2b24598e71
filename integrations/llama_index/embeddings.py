"""``VLLMEmbedding``: a LlamaIndex ``BaseEmbedding`` on an in-process vLLM pooling engine.

>>> from vllm_inline.integrations.llama_index import VLLMEmbedding
>>> embed_model = VLLMEmbedding(model="Qwen/Qwen3-Embedding-0.6B")
>>> embed_model.get_text_embedding("vLLM runs in this process")

The engine comes from :func:`vllm_inline.engine.get_engine` (with ``runner="pooling"``), shared
with LangChain ``VLLMEmbeddings`` on the same model and options. LlamaIndex hands over
``embed_batch_size`` texts per call; each call's texts are submitted to vLLM concurrently.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field

from vllm_inline.engine import Engine, get_engine
from vllm_inline.engine.host.directory import KEEP_ALIVE_HELP, parse_keep_alive
from vllm_inline.engine.pooling.embeddings import DEFAULT_BATCH_SIZE, check_embed_options

__all__ = ["VLLMEmbedding"]

_EMBED_BATCH_SIZE = 256


class VLLMEmbedding(BaseEmbedding):
    """vLLM's pooling runner in this process as a LlamaIndex embedding model.

    >>> from llama_index.core import Settings, VectorStoreIndex, Document
    >>> Settings.embed_model = VLLMEmbedding(model="Qwen/Qwen3-Embedding-0.6B")
    >>> index = VectorStoreIndex.from_documents([Document(text="Oslo is cold in winter.")])

    A text longer than the model's context raises ``ContextLengthExceededError`` (naming the
    text's index within the batch) unless ``truncate=True``.
    """

    model: str = Field(description="Model path or hub id of an embedding model.")
    vllm_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for vLLM's AsyncEngineArgs (dtype, max_model_len, ...); runner "
        "defaults to 'pooling'. Default: {}.",
    )
    keep_alive: str | int | float | None = Field(default=None, description=KEEP_ALIVE_HELP)
    normalize: bool | None = Field(
        default=None,
        description="L2-normalise the vectors; None keeps the model's setting. Default: None.",
    )
    truncate: bool = Field(
        default=False,
        description="Embed only the first max_model_len tokens of longer texts instead of "
        "raising. Default: False.",
    )
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        description="Texts tokenized per engine batch (all submitted concurrently). Default: 64.",
    )

    def __init__(self, model: str | None = None, **data: Any) -> None:
        if model is not None:
            data["model"] = model
        # Bad options fail here, with the engine's typed error, before anything starts.
        check_embed_options(
            data.get("truncate", False),
            data.get("normalize"),
            data.get("batch_size", DEFAULT_BATCH_SIZE),
        )
        parse_keep_alive(data.get("keep_alive"))
        data.setdefault("model_name", data.get("model"))
        # LlamaIndex's default of 10 texts per call would serialise what vLLM can batch.
        data.setdefault("embed_batch_size", _EMBED_BATCH_SIZE)
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "VLLMInlineEmbedding"

    @property
    def engine(self) -> Engine:
        """The shared pooling engine for ``model`` and ``vllm_kwargs`` (starts nothing)."""
        options = {"runner": "pooling", **self.vllm_kwargs}
        return get_engine(self.model, keep_alive=self.keep_alive, **options)

    def _get_query_embedding(self, query: str) -> Embedding:
        return self.engine.embed([query], **self._options())[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self.engine.aembed([query], **self._options()))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self.engine.embed([text], **self._options())[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self.engine.aembed([text], **self._options()))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.engine.embed(texts, **self._options())

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await self.engine.aembed(texts, **self._options())

    def _options(self) -> dict[str, Any]:
        return {
            "truncate": self.truncate,
            "normalize": self.normalize,
            "batch_size": self.batch_size,
        }
