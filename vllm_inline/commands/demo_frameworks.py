"""The LangChain and LlamaIndex half of ``python -m vllm_inline demo``.

Both run on the demo's engine: a ``ChatVLLM`` or a ``VLLM`` with the same ``model`` and
``vllm_kwargs`` looks up the same shared engine, so nothing starts twice.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["run", "run_langchain", "run_llama_index"]


def _summary(
    finish_reason: str | None, prompt_tokens: Any, completion_tokens: Any, ttft: float | None
) -> str:
    """The line that ends each part of the demo (same shape as the engine part's)."""
    shown = f"{ttft * 1000:.0f} ms" if ttft is not None else "n/a"
    return (
        f"[finish_reason={finish_reason} prompt_tokens={prompt_tokens} "
        f"completion_tokens={completion_tokens} time_to_first_token={shown}]"
    )


def run_langchain(engine: Any, question: str, max_tokens: int = 128, **sampling: Any) -> str:
    """Stream ``ChatPromptTemplate | ChatVLLM | StrOutputParser`` to stdout, then its usage."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from vllm_inline.integrations.langchain import ChatVLLM

    class Usage(BaseCallbackHandler):
        """Keeps the chat model's final message (usage and finish reason ride on it)."""

        message: Any = None

        def on_llm_end(self, response: Any, **kwargs: Any) -> None:
            self.message = response.generations[0][0].message

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a concise assistant."), ("human", "{question}")]
    )
    llm = ChatVLLM(
        model=engine.model, vllm_kwargs=engine.vllm_kwargs, max_tokens=max_tokens, **sampling
    )
    chain = prompt | llm | StrOutputParser()
    usage = Usage()
    start = time.perf_counter()
    ttft = None
    pieces = []
    for piece in chain.stream({"question": question}, config={"callbacks": [usage]}):
        if piece and ttft is None:
            ttft = time.perf_counter() - start
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    message = usage.message
    counts = (message.usage_metadata or {}) if message is not None else {}
    finish = message.response_metadata.get("finish_reason") if message is not None else None
    print(
        _summary(finish, counts.get("input_tokens"), counts.get("output_tokens"), ttft), flush=True
    )
    return "".join(pieces)


def run_llama_index(engine: Any, question: str, max_tokens: int = 128, **sampling: Any) -> str:
    """Stream ``VLLM.stream_chat`` to stdout, then its usage."""
    from llama_index.core.llms import ChatMessage

    from vllm_inline.integrations.llama_index import VLLM

    llm = VLLM(
        model=engine.model, vllm_kwargs=engine.vllm_kwargs, max_tokens=max_tokens, **sampling
    )
    messages = [
        ChatMessage(role="system", content="You are a concise assistant."),
        ChatMessage(role="user", content=question),
    ]
    start = time.perf_counter()
    ttft = None
    last = None
    for response in llm.stream_chat(messages):
        if response.delta and ttft is None:
            ttft = time.perf_counter() - start
        print(response.delta or "", end="", flush=True)
        last = response
    print()
    extra = last.additional_kwargs if last is not None else {}
    print(
        _summary(
            extra.get("finish_reason"),
            extra.get("prompt_tokens"),
            extra.get("completion_tokens"),
            ttft,
        ),
        flush=True,
    )
    return (last.message.content or "") if last is not None else ""


def run(engine: Any, question: str, max_tokens: int = 128, **sampling: Any) -> None:
    """Both framework parts of the demo, on ``engine``; ``sampling`` as the integrations'
    fields (``temperature=0.0`` for greedy)."""
    print(f"\n== LangChain: ChatPromptTemplate | ChatVLLM | StrOutputParser, streamed: {question}")
    run_langchain(engine, question, max_tokens, **sampling)
    print(f"\n== LlamaIndex: VLLM.stream_chat: {question}")
    run_llama_index(engine, question, max_tokens, **sampling)
