"""``/v1/embeddings``, ``/v1/rerank`` and ``/v1/score`` in ``vllm serve``'s formats, on the
server's embedding and reranker engines (``Engine.aembed``, ``Engine.ascore``).

Usage counts the tokens of each input as the engine's tokenizer encodes it (with the model's
special tokens, pairs as a cross-encoder takes them), as ``vllm serve`` reports them; the
engine's own calls return vectors and scores only, so the count is taken here, in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from vllm_inline.engine import BadRequestError, Engine
from vllm_inline.engine.stream.openai_format import pooling_usage
from vllm_inline.server.chat import read_body
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModels

__all__ = ["pooling_router"]


def pooling_router(models: ServedModels, limits: Limits) -> APIRouter:
    """The embedding and scoring routes for the pooling models of ``models``."""
    router = APIRouter()

    @router.post("/v1/embeddings")
    async def create_embeddings(request: Request) -> JSONResponse:
        body = await read_body(request)
        served = models.find("embedding", body.get("model"))
        texts = _texts(body.get("input"), "input", limits)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise BadRequestError.invalid("encoding_format", encoding, "'float' or 'base64'")
        try:
            vectors = await served.engine.aembed(
                texts,
                truncate=_truncate(body),
                normalize=body.get("normalize"),
                dimensions=body.get("dimensions"),
            )
        except BadRequestError as e:  # named as the engine's call names it: texts[0]
            if e.parameter and e.parameter.startswith("texts"):
                e.parameter = "input" + e.parameter.removeprefix("texts")
            raise
        tokens = sum(await _token_counts(served.engine, texts))
        data = [
            {"index": i, "object": "embedding", "embedding": _encode(vector, encoding)}
            for i, vector in enumerate(vectors)
        ]
        return JSONResponse(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": served.name,
                "data": data,
                "usage": pooling_usage(tokens),
            }
        )

    @router.post("/v1/rerank")
    @router.post("/v2/rerank")
    @router.post("/rerank")
    async def rerank(request: Request) -> JSONResponse:
        body = await read_body(request)
        served = models.find("rerank", body.get("model"))
        query = body.get("query")
        if not isinstance(query, str):
            raise BadRequestError.invalid("query", query, "a string")
        documents = _texts(body.get("documents"), "documents", limits)
        top_n = body.get("top_n") or len(documents)
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
            raise BadRequestError.invalid("top_n", top_n, "a non-negative integer")
        scores = await served.engine.ascore(query, documents, truncate=_truncate(body))
        tokens = sum(await _token_counts(served.engine, documents, query))
        ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:top_n]
        results = [
            {
                "index": i,
                "document": {"text": documents[i], "multi_modal": None},
                "relevance_score": scores[i],
            }
            for i in ranked
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse(
            {
                "id": f"score-{uuid.uuid4().hex}",  # as `vllm serve` names a rerank
                "model": served.name,
                "usage": usage,
                "results": results,
            }
        )

    @router.post("/v1/score")
    @router.post("/score")
    async def score(request: Request) -> JSONResponse:
        body = await read_body(request)
        served = models.find("rerank", body.get("model"))
        first, second = _score_pairs(body, limits)
        if len(first) == 1:
            scores = await served.engine.ascore(first[0], second, truncate=_truncate(body))
            counts = await _token_counts(served.engine, second, first[0])
        else:  # pairs, one query for each document
            each = await asyncio.gather(
                *(
                    served.engine.ascore(q, [d], truncate=_truncate(body))
                    for q, d in zip(first, second)
                )
            )
            scores = [s[0] for s in each]
            counts = [
                (await _token_counts(served.engine, [d], q))[0] for q, d in zip(first, second)
            ]
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return JSONResponse(
            {
                "id": f"score-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": served.name,
                "data": data,
                "usage": pooling_usage(sum(counts)),
            }
        )

    return router


def _texts(value: Any, name: str, limits: Limits) -> list[str]:
    """A string or a non-empty list of strings, within the server's cap."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise BadRequestError.invalid(name, value, "a string or a non-empty list of strings")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequestError.invalid(f"{name}[{i}]", text, "a string")
    if limits.max_documents is not None and len(texts) > limits.max_documents:
        raise BadRequestError.invalid(
            name, len(texts), f"at most {limits.max_documents} on this server (--max-documents)"
        )
    return texts


def _truncate(body: dict[str, Any]) -> bool:
    """``truncate_prompt_tokens``, as ``vllm serve`` takes it: -1 (or any value) keeps the first
    ``max_model_len`` tokens of an over-long input instead of refusing it."""
    return body.get("truncate_prompt_tokens") is not None


def _score_pairs(body: dict[str, Any], limits: Limits) -> tuple[list[str], list[str]]:
    """The two sides of a score request in any of ``vllm serve``'s field names."""
    for one, two in (("queries", "documents"), ("text_1", "text_2"), ("data_1", "data_2")):
        if one in body or two in body:
            first, second = _texts(body.get(one), one, limits), _texts(body.get(two), two, limits)
            if len(first) not in (1, len(second)):
                raise BadRequestError.invalid(
                    one, len(first), f"one, or as many as {two} ({len(second)})"
                )
            return first, second
    raise BadRequestError("A score request needs `queries` and `documents` (or text_1, text_2).")


async def _token_counts(
    engine: Engine, texts: Sequence[str], query: str | None = None
) -> list[int]:
    """Tokens of each text (each ``query``-text pair) as the engine's tokenizer encodes it."""
    tokenizer: Any = engine.tokenizer  # transformers' tokenizer: pairs, special tokens

    def count() -> list[int]:
        if query is None:
            return [len(tokenizer(text)["input_ids"]) for text in texts]
        return [len(tokenizer(query, text)["input_ids"]) for text in texts]

    return await asyncio.to_thread(count)


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    """``float``: the list; ``base64``: little-endian float32 bytes, as OpenAI's API sends them."""
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
