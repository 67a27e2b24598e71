"""vLLM's pooling API, as the embedding and scoring paths use it (the companion of
:mod:`.vllm_engine`).

Imported only when an embedding or scoring request runs on a started engine. The calls mirror
what vLLM's own ``LLM.embed``/``LLM.score`` and ``/v1/embeddings``/``/score`` do
(``vllm/entrypoints/pooling/``): render the texts with the renderer's completion tokenization
(``default_cmpl_tok_params``: the model's special tokens and ``do_lower_case``), then
``AsyncLLM.encode`` each one with ``PoolingParams(task="embed")``. A cross-encoder's pairs are
rendered by vLLM's own ``CrossEncoderIOProcessor`` (the model's score template, or
``tokenizer(query, document)``) and encoded with ``PoolingParams(task="classify")``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from vllm import PoolingParams
from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor
from vllm.entrypoints.pooling.typing import ScoringRenderParams
from vllm.entrypoints.pooling.utils import enable_scoring_api
from vllm.exceptions import VLLMValidationError
from vllm.outputs import ScoringRequestOutput
from vllm.renderers.inputs.preprocess import parse_model_prompt
from vllm.tasks import SCORE_TYPE_MAP
from vllm.v1.engine.async_llm import AsyncLLM

try:
    from vllm.renderers.chat_utils import ChatTemplateConfig
except ImportError:  # vLLM < 0.32 keeps it with the server's chat utilities
    from vllm.entrypoints.chat_utils import (  # type: ignore[import-not-found,no-redef]
        ChatTemplateConfig,
    )

__all__ = [
    "encode_one",
    "is_context_length_error",
    "make_pooling_params",
    "num_labels",
    "render_pair",
    "render_texts",
    "score_one",
    "score_type",
    "supported_tasks",
    "token_count",
]

# One pair renderer per engine, built on first use (it resolves the model class once).
_cross_encoders: weakref.WeakKeyDictionary[Any, CrossEncoderIOProcessor] = (
    weakref.WeakKeyDictionary()
)


async def supported_tasks(llm: AsyncLLM) -> tuple[str, ...]:
    """The engine's tasks (``"generate"``, ``"embed"``, ``"token_embed"``, ...); cached by vLLM."""
    return tuple(await llm.get_supported_tasks())


def make_pooling_params(normalize: bool | None, dimensions: int | None = None) -> PoolingParams:
    """Embedding parameters; ``normalize=None`` keeps the model's pooler setting, and
    ``dimensions`` (a Matryoshka model's shorter vectors) is checked by vLLM against the model.

    For the ``embed`` task vLLM's ``use_activation`` is the L2 normalisation.
    """
    return PoolingParams(task="embed", use_activation=normalize, dimensions=dimensions)


async def render_texts(llm: AsyncLLM, texts: Sequence[str], *, truncate: bool) -> list[Any]:
    """Tokenize ``texts`` into engine inputs in one renderer call.

    Over-long texts raise vLLM's ``VLLMValidationError`` (see :func:`is_context_length_error`)
    unless ``truncate``: then they keep their first ``max_model_len`` tokens.
    """
    renderer = llm.renderer
    tok_params = renderer.default_cmpl_tok_params
    if truncate:
        tok_params = tok_params.with_kwargs(truncate_prompt_tokens=-1)  # -1: max_model_len
    parsed = [parse_model_prompt(llm.model_config, text) for text in texts]
    return list(await renderer.render_cmpl_async(parsed, tok_params))


def is_context_length_error(e: BaseException) -> bool:
    """True for the renderer's "exceeds the maximum context length" refusal."""
    return isinstance(e, VLLMValidationError) and (
        getattr(e, "parameter", None) in ("input_tokens", "input_text")
        or "maximum context length" in str(e)
    )


def token_count(engine_input: Any) -> int:
    """Prompt tokens of a rendered engine input (or of a rendered pair's prompt)."""
    if "prompts" in engine_input:
        engine_input = engine_input["prompts"]
    return len(engine_input["prompt_token_ids"])


async def encode_one(
    llm: AsyncLLM, engine_input: Any, params: PoolingParams, request_id: str
) -> list[float]:
    """One text's embedding. Cancelling the awaiting task aborts the request in vLLM."""
    last = None
    async for out in llm.encode(engine_input, params, request_id):
        last = out
    if last is None:  # pragma: no cover - vLLM always yields the finished output
        raise RuntimeError(f"vLLM returned no output for request {request_id}")
    return last.outputs.data.tolist()


# -- cross-encoder scoring ---------------------------------------------------------------------


def score_type(llm: AsyncLLM, tasks: Sequence[str]) -> str | None:
    """How vLLM scores pairs on this engine: ``"cross-encoder"`` (a ``classify`` model with one
    label), ``"bi-encoder"``/``"late-interaction"`` (embedders), or ``None`` (no score API)."""
    model_config = llm.model_config
    if not enable_scoring_api(tuple(tasks), model_config):  # type: ignore[arg-type]
        return None
    return SCORE_TYPE_MAP.get(model_config.get_pooling_task(tuple(tasks)))  # type: ignore[arg-type]


def num_labels(llm: AsyncLLM) -> int:
    """The classifier's number of outputs (vLLM scores only ``num_labels == 1``)."""
    return int(getattr(llm.model_config.hf_config, "num_labels", 0))


async def render_pair(
    llm: AsyncLLM, query: str, document: str, *, truncate: bool
) -> dict[str, Any]:
    """The engine input of one query-document pair, as vLLM's ``/score`` renders it.

    Runs the tokenizer on the renderer's worker thread. An over-long pair raises vLLM's
    ``VLLMValidationError`` (see :func:`is_context_length_error`) unless ``truncate``: then
    the tokenizer cuts the pair (longest part first) to ``max_model_len`` tokens.
    """
    processor = _cross_encoders.get(llm)
    if processor is None:
        processor = _cross_encoders[llm] = CrossEncoderIOProcessor(  # type: ignore[no-untyped-call]  # unannotated in vLLM
            vllm_config=llm.vllm_config,
            renderer=llm.renderer,
            chat_template_config=ChatTemplateConfig(),
        )
    tok_params = llm.renderer.default_cmpl_tok_params
    if truncate:
        tok_params = tok_params.with_kwargs(truncate_prompt_tokens=-1)  # -1: max_model_len
    params = ScoringRenderParams(
        data_1=query,
        data_2=document,
        chat_template=None,
        max_tokens_per_query=0,
        max_tokens_per_doc=0,
        tok_params=tok_params,
        prompt_extras=None,
        skip_mm_cache=False,
        params=PoolingParams(task="classify"),
        lora_requests=None,
        priorities=0,
    )
    return dict(await processor.render_async(params))


async def score_one(llm: AsyncLLM, pair_input: dict[str, Any], request_id: str) -> float:
    """One pair's score (sigmoid of the logit unless the model says otherwise).
    Cancelling the awaiting task aborts the request in vLLM."""
    last = None
    async for out in llm.encode(pair_input["prompts"], pair_input["params"], request_id):
        last = out
    if last is None:  # pragma: no cover - vLLM always yields the finished output
        raise RuntimeError(f"vLLM returned no output for request {request_id}")
    return float(ScoringRequestOutput.from_base(last).outputs.score)
