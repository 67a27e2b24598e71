"""vLLM's pooling API, as the embedding path uses it (the companion of :mod:`._vllm`).

Imported only when an embedding request runs on a started engine. The calls mirror what vLLM's
own ``LLM.embed`` and ``/v1/embeddings`` do (``vllm/entrypoints/pooling/``): render the texts
with the renderer's completion tokenization (``default_cmpl_tok_params``: the model's special
tokens and ``do_lower_case``), then ``AsyncLLM.encode`` each one with
``PoolingParams(task="embed")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm import PoolingParams
from vllm.exceptions import VLLMValidationError
from vllm.renderers.inputs.preprocess import parse_model_prompt
from vllm.v1.engine.async_llm import AsyncLLM

__all__ = [
    "encode_one",
    "is_context_length_error",
    "make_pooling_params",
    "render_texts",
    "runner_type",
    "supported_tasks",
    "token_count",
]


def runner_type(llm: AsyncLLM) -> str:
    """``"generate"`` or ``"pooling"``: the runner the engine was started with."""
    return str(llm.model_config.runner_type)


async def supported_tasks(llm: AsyncLLM) -> tuple[str, ...]:
    """The engine's tasks (``"generate"``, ``"embed"``, ``"token_embed"``, ...); cached by vLLM."""
    return tuple(await llm.get_supported_tasks())


def make_pooling_params(normalize: bool | None) -> PoolingParams:
    """Embedding parameters; ``normalize=None`` keeps the model's pooler setting.

    For the ``embed`` task vLLM's ``use_activation`` is the L2 normalisation.
    """
    return PoolingParams(task="embed", use_activation=normalize)


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
    """Prompt tokens of a rendered engine input."""
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
