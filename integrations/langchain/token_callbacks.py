"""Does a LangChain run have a consumer for its tokens? Decides how ``invoke`` asks the engine.

``BaseChatModel`` decides first: ``invoke`` (and each input of ``batch``) goes through
``ChatVLLM._stream``/``_astream`` when the call passes ``stream=True``, the model has
``streaming=True``, or a v1 streaming handler (``astream_events``, ``astream_log``, LangGraph's
``stream_mode="messages"``) is attached; LangChain then fires ``on_llm_new_token`` for every
chunk itself. Otherwise it calls ``_generate``/``_agenerate``, and there :func:`wants_tokens`
decides between:

- the engine's stream (one delta per engine step, ``on_llm_new_token`` per chunk, as before),
  when a handler of the run implements ``on_llm_new_token``. Such a handler may be a user's
  token printer attached without ``streaming=True`` (``ChatOpenAI`` would give it nothing; this
  package always has, and keeps doing so) or a tracer (LangSmith's ``LangChainTracer`` records
  token events); ``ignore_llm`` handlers never see them and do not count;
- otherwise the final answer only (the engine's ``stream=False``: vLLM's FINAL_ONLY output), so
  that neither vLLM nor this process does per-token work nobody looks at. The message is the
  same (text, tool calls, reasoning, usage, finish reason, metrics): the engine builds its one
  delta with the same code, and the same converter and aggregation turn it into the message.

A call's own ``stream=False`` keyword forces the final-only request (LangChain passes the
call's keywords through to ``_generate``).

When no handler would see them, ``_generate``/``_agenerate`` fire no ``on_llm_new_token`` at
all: LangChain would still dispatch each one to every handler, and an async call hands a
synchronous handler's event (a no-op here) to a thread-pool worker, the way
``UsageMetadataCallbackHandler`` or any ``on_llm_end``-only handler is called.
"""

from __future__ import annotations

from langchain_core.callbacks import AsyncCallbackHandler, BaseRunManager
from langchain_core.callbacks.base import LLMManagerMixin

__all__ = ["wants_tokens"]

_NO_OP_TOKEN_METHODS = (LLMManagerMixin.on_llm_new_token, AsyncCallbackHandler.on_llm_new_token)
"""``on_llm_new_token`` of the base handler classes: doing nothing."""


def wants_tokens(run_manager: BaseRunManager | None) -> bool:
    """True when a handler of the run (``CallbackManagerForLLMRun`` or its async form) would
    see ``on_llm_new_token``: it implements it and does not ignore LLM events."""
    if run_manager is None:
        return False
    for handler in run_manager.handlers:
        if getattr(handler, "ignore_llm", False):
            continue
        method = getattr(handler, "on_llm_new_token", None)
        if getattr(method, "__func__", method) not in _NO_OP_TOKEN_METHODS:
            return True
    return False
