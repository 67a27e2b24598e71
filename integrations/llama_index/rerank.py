"""``VLLMRerank``: a LlamaIndex node postprocessor that reranks with an in-process cross-encoder.

>>> from vllm_inline.integrations.llama_index import VLLMRerank
>>> query_engine = index.as_query_engine(
...     similarity_top_k=20, node_postprocessors=[VLLMRerank(model="BAAI/bge-reranker-v2-m3")]
... )

The engine comes from :func:`vllm_inline.engine.get_engine` (with ``runner="pooling"``), shared
with LangChain ``VLLMRerank`` on the same model and options. Scores come from
:meth:`Engine.score <vllm_inline.engine.Engine.score>`: all of a query's nodes are scored
concurrently.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from vllm_inline.engine import BadRequestError, Engine, get_engine
from vllm_inline.engine.host.directory import KEEP_ALIVE_HELP, parse_keep_alive
from vllm_inline.engine.pooling.scoring import DEFAULT_BATCH_SIZE, check_score_options, check_top_n

__all__ = ["VLLMRerank"]


class VLLMRerank(BaseNodePostprocessor):
    """A cross-encoder (reranker) on vLLM's pooling runner in this process, as a LlamaIndex
    ``BaseNodePostprocessor``.

    >>> query_engine = index.as_query_engine(
    ...     llm=VLLM(model="Qwen/Qwen3-0.6B"),
    ...     similarity_top_k=20,
    ...     node_postprocessors=[VLLMRerank(model="BAAI/bge-reranker-v2-m3", top_n=3)],
    ... )

    Keeps the ``top_n`` nodes most relevant to the query, best first, as new ``NodeWithScore``
    objects whose ``score`` is the model's (the retriever's nodes are not modified). A
    query-node pair longer than the model's context raises ``ContextLengthExceededError``
    (naming ``documents[i]``) unless ``truncate=True``.
    """

    model: str = Field(description="Model path or hub id of a cross-encoder (reranker).")
    vllm_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for vLLM's AsyncEngineArgs (dtype, max_model_len, ...); runner "
        "defaults to 'pooling'. Default: {}.",
    )
    keep_alive: str | int | float | None = Field(default=None, description=KEEP_ALIVE_HELP)
    top_n: int | None = Field(
        default=3,
        description="How many nodes to keep (the best ones); None keeps them all, reordered. "
        "Default: 3.",
    )
    truncate: bool = Field(
        default=False,
        description="Score only the first max_model_len tokens of longer query-node pairs "
        "instead of raising. Default: False.",
    )
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        description="Pairs tokenized per engine batch (all submitted concurrently). Default: 64.",
    )

    def __init__(self, model: str | None = None, **data: Any) -> None:
        if model is not None:
            data["model"] = model
        # Bad options fail here, with the engine's typed error, before anything starts.
        check_score_options(data.get("truncate", False), data.get("batch_size", DEFAULT_BATCH_SIZE))
        check_top_n(data.get("top_n", 3))
        parse_keep_alive(data.get("keep_alive"))
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "VLLMInlineRerank"

    @property
    def engine(self) -> Engine:
        """The shared pooling engine for ``model`` and ``vllm_kwargs`` (starts nothing)."""
        options = {"runner": "pooling", **self.vllm_kwargs}
        return get_engine(self.model, keep_alive=self.keep_alive, **options)

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        if not nodes:
            return []
        payload = self._payload(nodes, query)
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            scores = self.engine.score(query, _texts(nodes), **self._options())
            best = _best(nodes, scores, self.top_n)
            event.on_end(payload={EventPayload.NODES: best})
        return best

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        if not nodes:
            return []
        payload = self._payload(nodes, query)
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            scores = await self.engine.ascore(query, _texts(nodes), **self._options())
            best = _best(nodes, scores, self.top_n)
            event.on_end(payload={EventPayload.NODES: best})
        return best

    def _payload(self, nodes: list[NodeWithScore], query: str) -> dict[str, Any]:
        return {
            EventPayload.NODES: nodes,
            EventPayload.MODEL_NAME: self.model,
            EventPayload.QUERY_STR: query,
            EventPayload.TOP_K: self.top_n,
        }

    def _options(self) -> dict[str, Any]:
        return {"truncate": self.truncate, "batch_size": self.batch_size}


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise BadRequestError(
            "VLLMRerank needs the query: call postprocess_nodes(nodes, query_str=...) or "
            "query_bundle=QueryBundle(...); a query engine passes it by itself.",
            parameter="query_bundle",
            value=None,
        )
    return query_bundle.query_str


def _texts(nodes: list[NodeWithScore]) -> list[str]:
    # The text the node was embedded with (its content plus embed-visible metadata), as
    # LlamaIndex's own SentenceTransformerRerank scores it.
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def _best(
    nodes: list[NodeWithScore], scores: list[float], top_n: int | None
) -> list[NodeWithScore]:
    """New ``NodeWithScore`` objects for the ``top_n`` best nodes, best first."""
    order = sorted(range(len(nodes)), key=lambda i: scores[i], reverse=True)[:top_n]
    return [NodeWithScore(node=nodes[i].node, score=scores[i]) for i in order]
