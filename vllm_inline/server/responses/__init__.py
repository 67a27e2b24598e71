"""OpenAI's Responses API (``/v1/responses``) on the app's chat engines, as ``vllm serve``
serves it: :mod:`.inputs` and :mod:`.params` turn a request into the engine's call,
:mod:`.output` the engine's deltas into output items and stream events, :mod:`.route` is the
three routes, :mod:`.store` keeps responses for ``previous_response_id`` across every worker
(SQLite by default). ``OpenAIServer.install`` adds the routes; docs/server.md says what each
field does."""

from vllm_inline.server.responses.background import BackgroundResponses
from vllm_inline.server.responses.route import responses_router
from vllm_inline.server.responses.store import (
    CANCELLABLE,
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_SECONDS,
    MEMORY,
    STORE_VARIABLE,
    MemoryResponseStore,
    ResponseStore,
    SQLiteResponseStore,
    StoredResponse,
    default_store_path,
    open_store,
)
from vllm_inline.server.responses.turn import LazyStore

__all__ = [
    "CANCELLABLE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TTL_SECONDS",
    "MEMORY",
    "STORE_VARIABLE",
    "BackgroundResponses",
    "LazyStore",
    "MemoryResponseStore",
    "ResponseStore",
    "SQLiteResponseStore",
    "StoredResponse",
    "default_store_path",
    "open_store",
    "responses_router",
]
