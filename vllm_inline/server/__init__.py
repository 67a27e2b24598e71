"""An OpenAI-compatible server for the engines an app holds: ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses`` (:mod:`.responses`), ``/v1/embeddings``, ``/v1/rerank``,
``/v1/score``, ``/v1/models``, ``/tokenize``, ``/detokenize``, ``/version``, ``/health``,
Prometheus ``/metrics`` and a chat page at ``/``, in ``vllm serve``'s wire format, taking every
field of ``vllm serve``'s chat and completion requests (:mod:`vllm_inline.server.fields`).

Install the extra: ``pip install 'vllm-inline[server]'`` (FastAPI and uvicorn). Then, in your own
FastAPI app, next to your own routes, on the engines your chains use::

    from fastapi import FastAPI
    from vllm_inline.engine import get_engine
    from vllm_inline.server import OpenAIServer

    server = OpenAIServer(chat=get_engine("Qwen/Qwen3-0.6B"))
    app = FastAPI(lifespan=server.lifespan)
    server.install(app)

or alone: ``python -m vllm_inline serve --model M [--embedding-model E] [--rerank-model R]``
(:func:`create_app`). docs/server.md says what each route takes.
"""

from vllm_inline.server.app import OpenAIServer, create_app
from vllm_inline.server.limits import MAX_BODY_BYTES, MAX_N, Limits

__all__ = ["MAX_BODY_BYTES", "MAX_N", "Limits", "OpenAIServer", "create_app"]
