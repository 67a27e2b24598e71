"""Embeddings on the shared engine: :meth:`Engine.aembed` and :meth:`Engine.embed`.

An embedding engine is an :class:`~vllm_inline.engine.engine.Engine` started with vLLM's pooling
runner, ``get_engine(model, runner="pooling", ...)``: the same registry, loop thread, typed errors
and shutdown as the chat engines. (A checkpoint whose architecture is an encoder, ``BertModel``,
``LlamaModel``, ``Qwen2Model``..., gets the pooling runner by itself; a ``*ForCausalLM`` one is
converted by vLLM into an embedder under ``runner="pooling"``, i.e. ``convert="embed"``.) Pooling
and normalisation come from the model (sentence-transformers ``modules.json``, else vLLM's
per-architecture default); ``normalize=True/False`` overrides the normalisation.

One call runs as one task on the engine loop:

1. the texts are tokenized in batches of ``batch_size`` (one renderer call per batch), and
   every length is checked *before anything is submitted*: a text longer than ``max_model_len``
   raises :class:`ContextLengthExceededError` naming ``texts[i]``, unless ``truncate=True``
   (then vLLM keeps its first ``max_model_len`` tokens);
2. every text is submitted to vLLM as its own ``encode`` request, concurrently (at most
   ``batch_size * 4`` in flight), so vLLM's scheduler batches them, also with other callers'.

The call runs under :meth:`Runtime.guard <.runtime.Runtime.guard>` like a stream. The async
form awaits that task from the caller's loop; the sync form blocks on it. Cancelling the caller
(or an error in one request) cancels the rest, which aborts them in vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import (
    BadRequestError,
    ContextLengthExceededError,
    UnsupportedTaskError,
)
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.seam.vllm_types import AsyncLLM, PoolingParams

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EmbedOptions",
    "check_embed_options",
    "embed",
    "validate_texts",
]

DEFAULT_BATCH_SIZE = 64
"""Texts tokenized per renderer call; ``4 *`` this many requests are in flight at most."""

_BATCHES_IN_FLIGHT = 4
_request_ids = itertools.count()


# -- validation (no engine needed) -------------------------------------------------------------


def validate_texts(
    texts: Any, truncate: Any, normalize: Any, batch_size: Any, dimensions: Any = None
) -> list[str]:
    """The texts of an embedding call as a list; a bad argument is a :class:`BadRequestError`."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise BadRequestError.invalid(
            "texts", texts, "a list of strings (embed one text as [text])"
        )
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequestError.invalid(f"texts[{i}]", text, "a string")
    check_embed_options(truncate, normalize, batch_size, dimensions)
    return list(texts)


def check_embed_options(
    truncate: Any, normalize: Any, batch_size: Any, dimensions: Any = None
) -> None:
    """Raise :class:`BadRequestError` for a bad ``truncate``, ``normalize``, ``batch_size`` or
    ``dimensions`` (whether the model takes ``dimensions`` at all, vLLM checks)."""
    if not isinstance(truncate, bool):
        raise BadRequestError.invalid("truncate", truncate, "True or False")
    if normalize is not None and not isinstance(normalize, bool):
        raise BadRequestError.invalid(
            "normalize", normalize, "True, False or None (the model's setting)"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadRequestError.invalid("batch_size", batch_size, "a positive integer")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise BadRequestError.invalid("dimensions", dimensions, "a positive integer, or None")


# -- on the engine loop ------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbedOptions:
    """The options of one embedding call, checked (:func:`check_embed_options`)."""

    truncate: bool
    """Keep the first ``max_model_len`` tokens of an over-long text instead of refusing it."""
    normalize: bool | None
    """L2-normalise the vectors (``None``: the model's pooler setting)."""
    batch_size: int
    """Texts tokenized at a time."""
    dimensions: int | None = None
    """A Matryoshka model's shorter vectors (``None``: the model's full size)."""


async def embed(runtime: Runtime, texts: list[str], options: EmbedOptions) -> list[list[float]]:
    """Embed checked ``texts`` (see :func:`validate_texts`); runs on the engine loop."""
    from vllm_inline.engine.seam import vllm_pooling

    truncate, batch_size = options.truncate, options.batch_size
    async with runtime.guard("embedding call", runner="pooling") as llm:
        tasks = await vllm_pooling.supported_tasks(llm)
        if "embed" not in tasks:
            raise UnsupportedTaskError(
                f"The pooling engine for {runtime.model!r} supports {list(tasks)}, not 'embed'. "
                "Start it with convert='embed' (get_engine(model, runner='pooling', "
                "convert='embed')).",
                parameter="model",
                value=runtime.model,
            )
        inputs: list[Any] = []
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            inputs += await _render(runtime, batch, start, truncate)
        params = vllm_pooling.make_pooling_params(options.normalize, options.dimensions)
        limit = batch_size * _BATCHES_IN_FLIGHT
        return await _encode_all(llm, inputs, params, limit)


async def _render(runtime: Runtime, batch: list[str], start: int, truncate: bool) -> list[Any]:
    """Engine inputs for ``batch`` (``texts[start:]``); over-long or empty texts are named."""
    from vllm_inline.engine.seam import vllm_pooling

    llm = runtime.running_llm()
    try:
        inputs = await vllm_pooling.render_texts(llm, batch, truncate=truncate)
    except Exception as e:
        if not vllm_pooling.is_context_length_error(e):
            raise
        for k, text in enumerate(batch):  # find the culprit: renders again, one by one
            try:
                await vllm_pooling.render_texts(llm, [text], truncate=False)
            except Exception as one:
                if not vllm_pooling.is_context_length_error(one):
                    raise
                tokens = getattr(one, "value", None)
                counted = f"{tokens} or more" if isinstance(tokens, int) else "more"
                raise ContextLengthExceededError(
                    f"texts[{start + k}] has {counted} tokens, more than the model's context "
                    f"window of {runtime.max_model_len} (max_model_len). Split it into shorter "
                    f"chunks, pass truncate=True to embed only its first "
                    f"{runtime.max_model_len} tokens, or start the engine with a larger "
                    "max_model_len (vllm_kwargs).",
                    parameter=f"texts[{start + k}]",
                    value=tokens,
                ) from one
        raise
    for k, engine_input in enumerate(inputs):
        if vllm_pooling.token_count(engine_input) == 0:
            raise BadRequestError(
                f"texts[{start + k}] is empty (no tokens): there is nothing to embed. Drop empty "
                "texts before embedding.",
                parameter=f"texts[{start + k}]",
                value=batch[k],
            )
    return inputs


async def _encode_all(
    llm: AsyncLLM, inputs: list[Any], params: PoolingParams, limit: int
) -> list[list[float]]:
    """Submit every input at once (at most ``limit`` in flight); results in input order."""
    from vllm_inline.engine.seam import vllm_pooling

    gate = asyncio.Semaphore(limit)

    async def one(engine_input: Any) -> list[float]:
        async with gate:
            request_id = f"vllm-inline-embed-{next(_request_ids)}"
            return await vllm_pooling.encode_one(llm, engine_input, params, request_id)

    tasks = [asyncio.ensure_future(one(engine_input)) for engine_input in inputs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:  # after an error: abort the requests still running
            t.cancel()
