"""The measured paths: one streamed request each, recorded as the consumer sees it.

Every path sends the same chat turn with the same sampling values (:data:`SAMPLING`), on an
engine started with the same options, and generates exactly ``tokens`` tokens (``ignore_eos``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from measure import Record

__all__ = ["MESSAGES", "PATHS", "prompt_ids", "run_async_load", "run_sync_load", "sampling"]

PROMPT = "Write a short story about a robot."
MESSAGES = [{"role": "user", "content": PROMPT}]


def prompt_ids(model: str) -> list[int]:
    """:data:`MESSAGES` rendered with ``model``'s chat template (generation prompt added): the
    token ids the raw path sends."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return list(
        tok.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )


def sampling(tokens: int) -> dict[str, Any]:
    """Sampling values every path sends (vLLM ``SamplingParams`` names)."""
    # repetition_penalty is set because vllm-inline's own default is 1.1 (vLLM's is 1.0).
    return {"max_tokens": tokens, "ignore_eos": True, "temperature": 1.0, "repetition_penalty": 1.0}


# -- (1) raw AsyncLLM.generate, DELTA output ------------------------------------------------

_ids = itertools.count()


def raw_request(llm: Any, prompt_ids: list[int], tokens: int) -> Callable[[], Awaitable[Record]]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(**sampling(tokens), output_kind=RequestOutputKind.DELTA)
    engine_input = {"prompt_token_ids": prompt_ids}

    async def request() -> Record:
        rec = Record()
        n = 0
        async for out in llm.generate(engine_input, params, f"raw-{next(_ids)}"):
            for c in out.outputs:
                n += len(c.token_ids)
                rec.chunk(c.text)
        return rec.done(n)

    return request


# -- (2) Engine.astream / Engine.stream ------------------------------------------------------


def engine_async(engine: Any, tokens: int) -> Callable[[], Awaitable[Record]]:
    kw = sampling(tokens)

    async def request() -> Record:
        rec = Record()
        n = 0
        async for d in engine.astream(MESSAGES, **kw):
            n += len(d.token_ids)
            rec.chunk(d.text)
        return rec.done(n)

    return request


def engine_sync(engine: Any, tokens: int) -> Callable[[], Record]:
    kw = sampling(tokens)

    def request() -> Record:
        rec = Record()
        n = 0
        for d in engine.stream(MESSAGES, **kw):
            n += len(d.token_ids)
            rec.chunk(d.text)
        return rec.done(n)

    return request


# -- (3) ChatVLLM.astream / .stream, and (5) ChatOpenAI.astream against vLLM's server ----------


def lc_messages() -> list[Any]:
    from langchain_core.messages import HumanMessage

    return [HumanMessage(PROMPT)]


def _lc_tokens(chunk: Any) -> int:
    usage = getattr(chunk, "usage_metadata", None)
    return int(usage["output_tokens"]) if usage else 0


def langchain_async(chat: Any, tokens: int, **call_kwargs: Any) -> Callable[[], Awaitable[Record]]:
    messages = lc_messages()

    async def request() -> Record:
        rec = Record()
        n = 0
        async for chunk in chat.astream(messages, **call_kwargs):
            n += _lc_tokens(chunk)
            rec.chunk(chunk.content)
        return rec.done(n)

    return request


def langchain_sync(chat: Any, tokens: int, **call_kwargs: Any) -> Callable[[], Record]:
    messages = lc_messages()

    def request() -> Record:
        rec = Record()
        n = 0
        for chunk in chat.stream(messages, **call_kwargs):
            n += _lc_tokens(chunk)
            rec.chunk(chunk.content)
        return rec.done(n)

    return request


def chat_vllm(model: str, vllm_kwargs: dict[str, Any]) -> Any:
    from vllm_inline.integrations.langchain import ChatVLLM

    return ChatVLLM(model=model, vllm_kwargs=vllm_kwargs)


def chat_openai(model: str, base_url: str, tokens: int) -> Any:
    from langchain_openai import ChatOpenAI

    kw = sampling(tokens)
    return ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key="EMPTY",
        max_tokens=kw.pop("max_tokens"),
        temperature=kw.pop("temperature"),
        extra_body=kw,  # ignore_eos, repetition_penalty: vLLM's extra sampling fields
        stream_usage=True,
        max_retries=0,
        timeout=300,
    )


# -- (4) LlamaIndex VLLM.astream_chat / .stream_chat ------------------------------------------


def _li_messages() -> list[Any]:
    from llama_index.core.base.llms.types import ChatMessage

    return [ChatMessage(role="user", content=PROMPT)]


def _li_tokens(response: Any) -> int:
    return int(response.additional_kwargs.get("completion_tokens", 0))


def llama_index_llm(model: str, vllm_kwargs: dict[str, Any]) -> Any:
    from vllm_inline.integrations.llama_index import VLLM

    return VLLM(model=model, vllm_kwargs=vllm_kwargs)


def llama_index_async(llm: Any, tokens: int) -> Callable[[], Awaitable[Record]]:
    messages = _li_messages()
    kw = sampling(tokens)

    async def request() -> Record:
        rec = Record()
        n = 0
        async for r in await llm.astream_chat(messages, **kw):
            n = _li_tokens(r) or n
            rec.chunk(r.delta)
        return rec.done(n)

    return request


def llama_index_sync(llm: Any, tokens: int) -> Callable[[], Record]:
    messages = _li_messages()
    kw = sampling(tokens)

    def request() -> Record:
        rec = Record()
        n = 0
        for r in llm.stream_chat(messages, **kw):
            n = _li_tokens(r) or n
            rec.chunk(r.delta)
        return rec.done(n)

    return request


# -- load ---------------------------------------------------------------------------------


async def run_async_load(
    request: Callable[[], Awaitable[Record]], concurrency: int, rounds: int
) -> list[Record]:
    """``concurrency`` tasks, each sending ``rounds`` requests one after the other."""

    async def user() -> list[Record]:
        return [await request() for _ in range(rounds)]

    results = await asyncio.gather(*(user() for _ in range(concurrency)))
    return [r for rs in results for r in rs]


def run_sync_load(request: Callable[[], Record], concurrency: int, rounds: int) -> list[Record]:
    """``concurrency`` threads, each sending ``rounds`` requests one after the other."""
    results: list[list[Record]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []

    def user(i: int) -> None:
        try:
            for _ in range(rounds):
                results[i].append(request())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)

    threads = [
        threading.Thread(target=user, args=(i,), name=f"user-{i}") for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for rs in results for r in rs]


PATHS = (
    "raw AsyncLLM",
    "Engine.astream",
    "Engine.stream",
    "ChatVLLM.astream",
    "ChatVLLM.stream",
    "VLLM.astream_chat",
    "VLLM.stream_chat",
    "HTTP ChatOpenAI.astream",
)
"""Path names, in table order."""
