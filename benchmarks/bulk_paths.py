"""The bulk paths of ``bulk.py`` (and ``compare.py``'s bulk lines): each a ``run(n)`` that sends
the first ``n`` of the same conversations at once and returns the tokens generated.

Every path generates exactly ``tokens`` tokens for each input, with the sampling values of
``paths.sampling`` (those of ``run.py``), on the engine options it is given:

- :func:`inline_paths`: ``ChatVLLM.batch``/``abatch``, LangChain's thread pool, LlamaIndex's
  gather over ``VLLM.achat``, and two baselines of no framework: ``AsyncLLM.generate`` gathered
  (:data:`BASELINE`, vLLM alone) and ``Engine.astream(stream=False)`` gathered (our engine);
- :func:`bare_paths`: the same two framework calls over ``bare_frameworks.py``'s bare models;
- :func:`callback_paths`: ``ChatVLLM.batch``/``abatch`` with LangChain's own usage callback
  attached (a handler with no token method, as cost trackers are);
- :func:`extractor_paths`: LlamaIndex's ``QuestionsAnsweredExtractor`` over ``n`` nodes.

An async path counts its tokens inside the coroutine that ``asyncio.run`` runs and returns the
count, not the answers. On the main thread ``asyncio.run`` formats the ``repr`` of its main
task when it ends (CPython's ``Runner.run`` checks ``signal.getsignal(SIGINT)``, which tries
``Handlers(<its handler>)``, whose ``ValueError`` message holds the handler's ``repr``, and so
the task's and a ``reprlib`` excerpt of its result), and LangChain's ``repr`` of one answer
costs 0.8 ms here (``Serializable.__repr_args__`` asks pydantic for every field's default,
which inspects each default factory's signature): ~10 ms at the end of every call, which an
app that awaits ``abatch`` in its own loop never pays (docs/performance.md, "Bulk").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from paths import sampling

__all__ = [
    "AA_PATH",
    "BASELINE",
    "MAX_INPUTS",
    "STATS_OFF",
    "bare_paths",
    "callback_paths",
    "conversations",
    "engine_gather",
    "extractor_paths",
    "inline_paths",
    "prompts",
    "raw_gather",
]

MAX_INPUTS = 4096
"""Prompts prepared for the largest size."""


def prompts(n: int) -> list[str]:
    """The ``n`` inputs, the same on every run: ``"Write a short story about robot number i."``"""
    return [f"Write a short story about robot number {i}." for i in range(n)]


def conversations(n: int) -> list[list[dict[str, str]]]:
    """:func:`prompts` as one-turn chat conversations."""
    return [[{"role": "user", "content": p}] for p in prompts(n)]


BASELINE = "AsyncLLM.generate gather (baseline)"
"""vLLM's own async engine gathered over the N conversations: the in-process limit."""

AA_PATH = "vllm.LLM.chat, a second engine (A/A)"
"""The reference against itself: a second ``vllm.LLM.chat`` child, paired like every path. Its
paired ratios are what this host's noise alone gives; a path's line can be read against it."""

STATS_OFF = " [stats off]"
"""Suffix of the paths measured on an engine started with ``disable_log_stats=True``."""


def _lc_tokens(messages: list[Any]) -> int:
    return sum(m.usage_metadata["output_tokens"] for m in messages)


def _lc_abatch(chat: Any, texts: list[str], kw: dict[str, Any]) -> Callable[[int], int]:
    """LangChain's ``abatch`` over the first ``n`` texts, all at once."""

    def run(n: int) -> int:
        async def go() -> int:
            return _lc_tokens(await chat.abatch(texts[:n], **kw))

        return asyncio.run(go())

    return run


def _li_gather(llm: Any, texts: list[str], kw: dict[str, Any]) -> Callable[[int], int]:
    """``asyncio.gather`` over LlamaIndex's ``achat``, one per text of the first ``n``."""
    from llama_index.core.base.llms.types import ChatMessage

    def run(n: int) -> int:
        async def go() -> int:
            answers = await asyncio.gather(
                *(llm.achat([ChatMessage(role="user", content=t)], **kw) for t in texts[:n])
            )
            return sum(int(r.additional_kwargs["completion_tokens"]) for r in answers)

        return asyncio.run(go())

    return run


def raw_gather(model: str, tokens: int, options: dict[str, Any]) -> Callable[[int], int]:
    """vLLM's ``AsyncLLM`` alone, as any in-process integration built on it has it: the N
    conversations rendered with the model's chat template, then ``asyncio.gather`` over
    ``AsyncLLM.generate`` (final output only), on the engine's own loop. No vllm-inline
    request path and no framework: what vLLM's own async engine gives a bulk caller."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    params = SamplingParams(**sampling(tokens), output_kind=RequestOutputKind.FINAL_ONLY)
    convs = conversations(MAX_INPUTS)
    ids = itertools.count()
    checked: list[bool] = []

    def run(n: int) -> int:
        runtime = engine.runtime
        llm, tokenizer = runtime.llm, engine.tokenizer

        async def one(conv: list[dict[str, str]]) -> int:
            text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            async for out in llm.generate({"prompt_token_ids": prompt}, params, f"raw-{next(ids)}"):
                final = out
            return len(final.outputs[0].token_ids)

        async def all_at_once() -> list[int]:
            return await asyncio.gather(*(one(c) for c in convs[:n]))

        if not checked:  # the first call is the warm-up: same prompt as the engine renders
            text = tokenizer.apply_chat_template(
                convs[0], add_generation_prompt=True, tokenize=False
            )
            mine = tokenizer.encode(text, add_special_tokens=False)
            assert mine == engine.prompt_token_ids(convs[0]), "the baseline renders otherwise"
            checked.append(True)
        return sum(runtime.loop.submit(all_at_once()).result())

    return run


def engine_gather(model: str, tokens: int, options: dict[str, Any]) -> Callable[[int], int]:
    """vllm-inline's engine alone: ``asyncio.gather`` over ``Engine.astream(stream=False)``
    (the final answer as one delta), no framework."""
    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    kw = sampling(tokens)
    convs = conversations(MAX_INPUTS)

    def run(n: int) -> int:
        async def one(conv: list[dict[str, str]]) -> int:
            return sum([len(d.token_ids) async for d in engine.astream(conv, stream=False, **kw)])

        async def all_at_once() -> list[int]:
            return await asyncio.gather(*(one(c) for c in convs[:n]))

        return sum(asyncio.run(all_at_once()))

    return run


def inline_paths(
    model: str, tokens: int, options: dict[str, Any]
) -> dict[str, Callable[[int], int]]:
    """Name -> ``run(n)`` returning the tokens generated for the first ``n`` prompts."""
    from langchain_core.runnables import Runnable

    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    chat = ChatVLLM(model=model, vllm_kwargs=options)
    li = VLLM(model=model, vllm_kwargs=options)
    texts = prompts(MAX_INPUTS)

    def lc_batch(n: int) -> int:
        return _lc_tokens(chat.batch(texts[:n], **kw))

    def lc_thread_pool(n: int) -> int:
        return _lc_tokens(Runnable.batch(chat, texts[:n], **kw))

    return {
        BASELINE: raw_gather(model, tokens, options),
        "Engine.astream gather (baseline)": engine_gather(model, tokens, options),
        "ChatVLLM.batch": lc_batch,
        "ChatVLLM.abatch": _lc_abatch(chat, texts, kw),
        "Runnable.batch (thread pool)": lc_thread_pool,
        "LlamaIndex gather(achat)": _li_gather(li, texts, kw),
    }


def callback_paths(
    model: str, tokens: int, options: dict[str, Any]
) -> dict[str, Callable[[int], int]]:
    """``ChatVLLM.batch``/``abatch`` with a fresh ``UsageMetadataCallbackHandler`` per call (what
    ``get_usage_metadata_callback`` attaches): a synchronous handler that implements no token
    method. LangChain hands each of its events to a thread-pool worker in an async run."""
    from langchain_core.callbacks import UsageMetadataCallbackHandler

    from vllm_inline.integrations.langchain import ChatVLLM

    kw = sampling(tokens)
    chat = ChatVLLM(model=model, vllm_kwargs=options)
    texts = prompts(MAX_INPUTS)

    def counted(handler: UsageMetadataCallbackHandler, n: int) -> int:
        generated = sum(u["output_tokens"] for u in handler.usage_metadata.values())
        assert generated == n * tokens, f"the usage callback counted {generated} tokens"
        return generated

    def lc_batch(n: int) -> int:
        handler = UsageMetadataCallbackHandler()
        chat.batch(texts[:n], {"callbacks": [handler]}, **kw)
        return counted(handler, n)

    def lc_abatch(n: int) -> int:
        handler = UsageMetadataCallbackHandler()

        async def go() -> None:
            await chat.abatch(texts[:n], {"callbacks": [handler]}, **kw)

        asyncio.run(go())
        return counted(handler, n)

    return {
        "ChatVLLM.batch (usage callback)": lc_batch,
        "ChatVLLM.abatch (usage callback)": lc_abatch,
    }


def extractor_paths(
    model: str, tokens: int, options: dict[str, Any]
) -> dict[str, Callable[[int], int]]:
    """``QuestionsAnsweredExtractor.extract`` over n nodes, default workers and all at once."""
    from llama_index.core.extractors import QuestionsAnsweredExtractor
    from llama_index.core.schema import TextNode

    from vllm_inline.integrations.llama_index import VLLM

    kw = sampling(tokens)
    llm = VLLM(
        model=model,
        vllm_kwargs=options,
        max_tokens=kw.pop("max_tokens"),
        temperature=kw.pop("temperature"),
        repetition_penalty=kw.pop("repetition_penalty"),
        additional_kwargs=kw,
    )
    nodes = [TextNode(text=p) for p in prompts(MAX_INPUTS)]

    def run(workers: int | None) -> Callable[[int], int]:
        def go(n: int) -> int:
            extractor = QuestionsAnsweredExtractor(llm=llm, questions=1, num_workers=workers or n)
            extractor.extract(nodes[:n])
            return n * tokens  # ignore_eos: each call generates exactly ``tokens``

        return go

    return {
        "QuestionsAnsweredExtractor num_workers=4": run(4),
        "QuestionsAnsweredExtractor num_workers=N": run(None),
    }


def bare_paths(model: str, tokens: int, options: dict[str, Any]) -> dict[str, Callable[[int], int]]:
    """LangChain's ``abatch`` (all at once) and LlamaIndex's gather over the bare models."""
    from bare_frameworks import BareChatModel, BareLLM

    from vllm_inline.engine import get_engine

    engine = get_engine(model, **options)
    chat, li = BareChatModel(engine=engine), BareLLM(engine=engine)
    kw = sampling(tokens)
    texts = prompts(MAX_INPUTS)

    return {
        "bare LangChain abatch (baseline)": _lc_abatch(chat, texts, kw),
        "bare LlamaIndex gather(achat) (baseline)": _li_gather(li, texts, kw),
    }
