"""One Responses request's state, between the route and the store: the fold of its deltas
(:class:`~.output.OutputFold`), the fields its response object reports, what it stores; and
the store itself, opened at its first use (:class:`LazyStore`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vllm_inline.engine import DEFAULTS
from vllm_inline.server.models import ServedModel
from vllm_inline.server.responses.inputs import output_messages
from vllm_inline.server.responses.output import OutputFold, response_object, usage_object
from vllm_inline.server.responses.store import ResponseStore, StoredResponse
from vllm_inline.server.responses.tools import CallName

__all__ = ["LazyStore", "Turn", "reported_sampling"]

logger = logging.getLogger("vllm_inline")


class LazyStore:
    """The store, opened at the first request that needs it (a server that never serves
    ``/v1/responses`` writes no file)."""

    def __init__(self, opener: Callable[[], ResponseStore]) -> None:
        self._opener = opener
        self._store: ResponseStore | None = None
        self._lock = threading.Lock()

    def __call__(self) -> ResponseStore:
        with self._lock:
            if self._store is None:
                self._store = self._opener()
            return self._store

    def close(self) -> None:
        """Close the store if it was opened."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


class Turn:
    """One request's state: the fold, the response object's fields, what to store."""

    def __init__(self, body: Mapping[str, Any], served: ServedModel, kwargs: dict[str, Any],
                 echoed: dict[str, Any], history: list[dict[str, Any]],
                 new: list[dict[str, Any]],
                 tool_names: Mapping[str, CallName] | None = None) -> None:  # fmt: skip
        self.served = served
        self.echoed = echoed
        self.history = [*history, *new]
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.store = body.get("store", True) is not False
        self.fold = OutputFold(
            include_reasoning=body.get("include_reasoning", True) is not False,
            parallel_tool_calls=echoed["parallel_tool_calls"],
            top_logprobs=kwargs.get("logprobs"),
            whole=not body.get("stream"),
            tool_names=tool_names or {},
        )
        self.sampling = reported_sampling(served, kwargs)

    def response(
        self, status: str, error: dict[str, Any] | None = None, streamed: bool = True
    ) -> dict[str, Any]:
        fold = self.fold
        usage = None
        if fold.usage is not None:
            # vLLM's reasoning parsers count the tokens between their markers; the text's own
            # tokens are that count (the markers are not in it).
            tokenizer = self.served.engine.tokenizer
            reasoning = len(tokenizer.encode(fold.reasoning, add_special_tokens=False))
            usage = usage_object(fold.usage, reasoning if fold.reasoning else 0)
        output = list(fold.output) if status != "in_progress" else []
        if not streamed:  # as vllm serve builds a whole answer: a reasoning item has no status
            output = [{**i, "status": None} if i["type"] == "reasoning" else i for i in output]
        return response_object(
            response_id=self.id,
            created_at=self.created_at,
            model=self.served.name,
            echoed=self.echoed,
            sampling=self.sampling,
            output=output,
            status=status,
            usage=usage if status != "in_progress" else None,
            error=error,
        )

    def status(self) -> str:
        return "incomplete" if self.fold.finish_reason == "length" else "completed"

    def stored(self, response: dict[str, Any]) -> StoredResponse:
        """``response`` with its conversation, as the store keeps it."""
        return StoredResponse(response, [*self.history, *output_messages(response["output"])])

    async def keep(
        self,
        store: Callable[[], ResponseStore],
        response: dict[str, Any],
        keep_cancelled: bool = False,
    ) -> None:
        """Store ``response`` with its conversation (if the request asked to store it);
        ``keep_cancelled``: not over a response cancelled meanwhile."""
        if not self.store:
            return
        stored = self.stored(response)
        try:
            await asyncio.to_thread(lambda: store().put(stored, keep_cancelled=keep_cancelled))
        except ValueError as e:  # larger than the whole store: answered, not kept
            logger.warning("Response %s not stored: %s", self.id, e)


def reported_sampling(served: ServedModel, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling values a response reports: the request's, else the model's
    ``generation_config``, else vLLM's defaults; ``max_output_tokens`` the request's, else the
    engine's default cap."""
    defaults = served.engine.model_defaults if served.engine.started else {}
    layered = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, **defaults}  # fmt: skip
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if kwargs.get(key) is not None:
            layered[key] = kwargs[key]
    max_tokens = kwargs.get("max_tokens") or DEFAULTS["max_tokens"]
    greedy = float(layered["temperature"]) < 1e-5  # vLLM's SamplingParams then sets top_p 1
    return {
        "temperature": float(layered["temperature"]),
        "top_p": 1.0 if greedy else float(layered["top_p"]),
        "presence_penalty": float(layered["presence_penalty"]),
        "frequency_penalty": float(layered["frequency_penalty"]),
        "max_output_tokens": int(max_tokens),
    }
