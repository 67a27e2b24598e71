"""Cross-encoder scores on the shared engine: :meth:`Engine.ascore` and :meth:`Engine.score`.

A reranker is a sequence-classification checkpoint with one label (``*ForSequenceClassification``
with ``num_labels=1``, e.g. BAAI/bge-reranker, mixedbread, ms-marco cross-encoders) started with
vLLM's pooling runner, ``get_engine(model, runner="pooling", ...)``: the same registry, loop
thread, typed errors and shutdown as chat and embedding engines. It reads the query and one
document together and returns one relevance score (vLLM applies the model's activation: the
sigmoid for one label, so scores lie in (0, 1)).

One call runs as one task on the engine loop, like an embedding call (:mod:`.embeddings`):

1. each ``(query, documents[i])`` pair is rendered by vLLM's own cross-encoder renderer (the
   model's score template if it has one, else ``tokenizer(query, document)`` as
   sentence-transformers' ``CrossEncoder`` does) on vLLM's tokenizer thread, ``batch_size``
   pairs at a time;
2. each rendered batch is submitted at once, one ``encode`` request per pair (at most
   ``batch_size * 4`` in flight), so vLLM's scheduler batches them, also with other callers',
   and the model runs on one batch while the next is tokenized. (Rendering a pair costs about
   as much as scoring it on a small model: vLLM's ``LLM.score`` overlaps the two the same way.)

A pair longer than ``max_model_len`` raises :class:`ContextLengthExceededError` naming
``documents[i]``, unless ``truncate=True`` (then the tokenizer shortens the pair, longest part
first, to ``max_model_len`` tokens); the pairs of earlier batches are then aborted, as they are
when the caller is cancelled or one request fails, and the engine keeps serving.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from vllm_inline.engine.errors import (
    BadRequestError,
    ContextLengthExceededError,
    UnsupportedTaskError,
)
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.seam.vllm_types import AsyncLLM

__all__ = ["DEFAULT_BATCH_SIZE", "check_score_options", "check_top_n", "score", "validate_pairs"]

DEFAULT_BATCH_SIZE = 64
"""Pairs rendered per batch; ``4 *`` this many requests are in flight at most."""

_BATCHES_IN_FLIGHT = 4
_request_ids = itertools.count()


# -- validation (no engine needed) -------------------------------------------------------------


def validate_pairs(query: Any, documents: Any, truncate: Any, batch_size: Any) -> list[str]:
    """The documents of a scoring call as a list; a bad argument is a :class:`BadRequestError`."""
    if not isinstance(query, str):
        raise BadRequestError.invalid("query", query, "a string")
    if not query.strip():
        raise BadRequestError.invalid(
            "query", query, "a non-empty string: there is nothing to score the documents against"
        )
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise BadRequestError.invalid(
            "documents", documents, "a list of strings (score one document as [document])"
        )
    for i, document in enumerate(documents):
        if not isinstance(document, str):
            raise BadRequestError.invalid(
                f"documents[{i}]", document, "a string (pass the document's text)"
            )
    check_score_options(truncate, batch_size)
    return list(documents)


def check_score_options(truncate: Any, batch_size: Any) -> None:
    """Raise :class:`BadRequestError` for a bad ``truncate`` or ``batch_size``."""
    if not isinstance(truncate, bool):
        raise BadRequestError.invalid("truncate", truncate, "True or False")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadRequestError.invalid("batch_size", batch_size, "a positive integer")


def check_top_n(top_n: Any) -> None:
    """Raise :class:`BadRequestError` unless ``top_n`` (how many documents a reranker keeps)
    is ``None`` or a positive integer. Used by the framework rerankers."""
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise BadRequestError.invalid("top_n", top_n, "a positive integer, or None for all")


# -- on the engine loop ------------------------------------------------------------------------


async def score(
    runtime: Runtime, query: str, documents: list[str], *, truncate: bool, batch_size: int
) -> list[float]:
    """Score checked ``documents`` against ``query`` (see :func:`validate_pairs`); runs on the
    engine loop."""
    from vllm_inline.engine.seam import vllm_pooling

    async with runtime.guard("scoring call", runner="pooling") as llm:
        tasks = await vllm_pooling.supported_tasks(llm)
        if vllm_pooling.score_type(llm, tasks) != "cross-encoder":
            message = _not_a_reranker(runtime.model, tasks, llm)
            raise UnsupportedTaskError(message, parameter="model", value=runtime.model)
        gate = asyncio.Semaphore(batch_size * _BATCHES_IN_FLIGHT)
        scored: list[asyncio.Future[float]] = []
        try:
            for start in range(0, len(documents), batch_size):
                batch = documents[start : start + batch_size]
                for pair_input in await _render(runtime, query, batch, start, truncate):
                    scored.append(asyncio.ensure_future(_score_one(llm, pair_input, gate)))
            return list(await asyncio.gather(*scored))
        finally:
            # After an error (or cancellation): abort the requests still running, and wait
            # until vLLM has let go of them, so the engine is idle when the error arrives.
            for t in scored:
                t.cancel()
            if scored:
                await asyncio.wait(scored)


def _not_a_reranker(model: str, tasks: Sequence[str], llm: AsyncLLM) -> str:
    from vllm_inline.engine.seam import vllm_pooling

    if "classify" in tasks:
        return (
            f"The pooling engine for {model!r} is a classifier with "
            f"{vllm_pooling.num_labels(llm)} labels; scoring needs a cross-encoder with one "
            "label (num_labels=1), such as a *ForSequenceClassification reranker checkpoint."
        )
    return (
        f"The pooling engine for {model!r} supports {list(tasks)}, not cross-encoder scoring. "
        "Score with a reranker checkpoint (a *ForSequenceClassification model with "
        "num_labels=1) on get_engine(reranker, runner='pooling'); for an embedding model, "
        "compare engine.embed(...) vectors instead."
    )


async def _render(
    runtime: Runtime, query: str, batch: list[str], start: int, truncate: bool
) -> list[dict[str, Any]]:
    """Engine inputs for the pairs of ``batch`` (``documents[start:]``); over-long ones named."""
    from vllm_inline.engine.seam import vllm_pooling

    llm = runtime.running_llm()
    results = await asyncio.gather(
        *(vllm_pooling.render_pair(llm, query, doc, truncate=truncate) for doc in batch),
        return_exceptions=True,
    )
    inputs: list[dict[str, Any]] = []
    for k, result in enumerate(results):
        if isinstance(result, BaseException):
            if not vllm_pooling.is_context_length_error(result):
                if isinstance(result, ValueError) and not isinstance(result, BadRequestError):
                    # vLLM's pair renderer refusing the pair (0.33: a checkpoint whose saved
                    # score template declares message inputs); vLLM's server answers 400 too.
                    raise BadRequestError(
                        f"vLLM cannot render the query with documents[{start + k}] for "
                        f"{runtime.model!r}: {result}",
                        parameter=f"documents[{start + k}]",
                        value=batch[k],
                    ) from result
                raise result
            tokens = getattr(result, "value", None)
            counted = f"{tokens} or more" if isinstance(tokens, int) else "more"
            raise ContextLengthExceededError(
                f"The query with documents[{start + k}] has {counted} tokens, more than the "
                f"model's context window of {runtime.max_model_len} (max_model_len). Split the "
                "document into shorter chunks, pass truncate=True to score only the first "
                f"{runtime.max_model_len} tokens of the pair, or start the engine with a larger "
                "max_model_len (vllm_kwargs).",
                parameter=f"documents[{start + k}]",
                value=tokens,
            ) from result
        inputs.append(result)
    return inputs


async def _score_one(llm: Any, pair_input: dict[str, Any], gate: asyncio.Semaphore) -> float:
    """One pair's score (at most ``gate``'s limit in flight)."""
    from vllm_inline.engine.seam import vllm_pooling

    async with gate:
        request_id = f"vllm-inline-score-{next(_request_ids)}"
        return await vllm_pooling.score_one(llm, pair_input, request_id)
