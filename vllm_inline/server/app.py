"""The OpenAI-compatible server for the engines an app holds: in the app's own FastAPI app, or
alone (:func:`create_app`, ``python -m vllm_inline serve``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from vllm_inline.engine import Engine, get_engine, prometheus_registry, start_engines
from vllm_inline.server.chat import chat_router
from vllm_inline.server.errors import error_response, install_error_handlers
from vllm_inline.server.guard import Guard
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ModelNotFoundError, ServedModel, ServedModels
from vllm_inline.server.pooling import pooling_router
from vllm_inline.server.responses import (
    BackgroundResponses,
    LazyStore,
    ResponseStore,
    open_store,
    responses_router,
)
from vllm_inline.server.responses.scoped import KeyScopedStore, scope_of
from vllm_inline.server.tokens import tokens_router

__all__ = ["OpenAIServer", "create_app"]


class OpenAIServer:
    """``vllm serve``'s routes for the app's engines, ready to install in a FastAPI app::

        server = OpenAIServer(chat=get_engine(chat_model), embedding=..., rerank=...)
        app = FastAPI(lifespan=server.lifespan)
        server.install(app)  # /v1/..., /health, /metrics, and the chat page at /

    Each engine is an :class:`~vllm_inline.engine.Engine` (``get_engine(...)``: the app's
    LangChain and LlamaIndex objects on the same model and options share it) or a mapping of
    served names to engines. A name defaults to the engine's model.
    """

    def __init__(
        self,
        chat: Engine | Mapping[str, Engine] | None = None,
        *,
        embedding: Engine | Mapping[str, Engine] | None = None,
        rerank: Engine | Mapping[str, Engine] | None = None,
        limits: Limits | None = None,
        reasoning_field: str = "reasoning",
        chat_page: bool = True,
        responses_store: ResponseStore
        | Callable[[], ResponseStore]
        | str
        | os.PathLike[str]
        | None = None,
        reasoning_parser: str | Mapping[str, str] | None = None,
        tool_parser: str | Mapping[str, str] | None = None,
        enable_auto_tool_choice: bool = False,
        chat_template: str | None = None,
        lora_modules: Mapping[str, str] | None = None,
    ) -> None:
        served = [
            ServedModel(
                name,
                engine,
                kind,  # type: ignore[arg-type]
                _parser_of(reasoning_parser, name, kind),
                _parser_of(tool_parser, name, kind),
                enable_auto_tool_choice and _parser_of(tool_parser, name, kind) is not None,
                chat_template if kind == "chat" else None,
            )
            for kind, given in (("chat", chat), ("embedding", embedding), ("rerank", rerank))
            for name, engine in _named(given)
        ]
        if not served:
            msg = "OpenAIServer needs at least one engine: chat=, embedding= or rerank=."
            raise ValueError(msg)
        if lora_modules:
            # As vllm serve's --lora-modules: each adapter a model of its own, on the first
            # chat model's engine, listed with that model as its parent.
            base = next((m for m in served if m.kind == "chat"), None)
            if base is None:
                msg = "lora_modules need a chat model to run on."
                raise ValueError(msg)
            served += [
                dataclasses.replace(base, name=name, lora=(name, str(path)), parent=base.name)
                for name, path in lora_modules.items()
            ]
        chat_names = {m.name for m in served if m.kind == "chat"}
        for option, parsers in (("reasoning_parser", reasoning_parser),
                                ("tool_parser", tool_parser)):  # fmt: skip
            unknown = sorted(set(parsers) - chat_names) if isinstance(parsers, Mapping) else []
            if unknown:
                msg = (
                    f"{option} names {unknown}, which are not chat models of this server; its "
                    f"chat models: {sorted(chat_names)}."
                )
                raise ValueError(msg)
        if enable_auto_tool_choice and not tool_parser:
            # As vllm serve: auto tool parsing needs the parser that reads the model's calls.
            msg = "enable_auto_tool_choice needs tool_parser (vllm serve's --tool-call-parser)."
            raise ValueError(msg)
        self.models = ServedModels(served)
        """The served models, by the names clients send."""
        self.limits = limits or Limits()
        """What the guard refuses before any engine work."""
        self.reasoning_field = reasoning_field
        """Where reasoning text goes in a message: ``reasoning``, as ``vllm serve`` sends it
        (vLLM 0.32), or ``reasoning_content`` for clients that read DeepSeek's name."""
        self.chat_page = chat_page
        """Serve the chat page at ``/``."""
        self.reasoning_parser = reasoning_parser
        """vLLM's reasoning parser for the chat models' answers (``message.reasoning`` on the
        chat route, ``reasoning`` items on ``/v1/responses``), as ``vllm serve
        --reasoning-parser``: one name for every chat model, or served names to parsers;
        ``None``: the reasoning stays in the text."""
        self.tool_parser = tool_parser
        """vLLM's tool parser for the chat models' tool calls (``vllm serve --tool-call-parser``):
        one name, or served names to parsers; ``None``: a named or required tool choice uses the
        engine's default for the model's family."""
        self.enable_auto_tool_choice = enable_auto_tool_choice
        self.lora_modules = dict(lora_modules or {})
        """LoRA adapters served as models of their own, by name: their directories
        (``vllm serve --lora-modules``; the engine needs ``enable_lora``)."""
        """Parse tool calls out of ``auto`` answers with :attr:`tool_parser` (``vllm serve
        --enable-auto-tool-choice``); without it an answer's text comes back as text."""
        given = responses_store
        if isinstance(given, ResponseStore):
            opener: Callable[[], ResponseStore] = lambda: given
        elif callable(given):
            opener = given
        else:
            opener = lambda: open_store(given)
        scope = scope_of(self.limits.api_key)  # another key's conversations are not found
        self.responses_store = LazyStore(
            (lambda: KeyScopedStore(opener(), scope)) if scope else opener
        )
        """The store of ``/v1/responses`` (:mod:`vllm_inline.server.responses.store`): a store,
        a function that opens one (``functools.partial(open_store, path, max_bytes=...)``), an
        SQLite file's path, ``":memory:"`` (one process only), or ``None`` for
        ``$VLLMINLINE_RESPONSES_STORE``, else ``~/.cache/vllm_inline/responses.sqlite3``; opened
        at its first use, closed with the lifespan."""
        self.background_responses = BackgroundResponses(self.responses_store)
        """The ``background: true`` responses this process runs (cancelled with the lifespan)."""

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start every engine with the server (together, one memory plan), in a thread so the
        loop runs meanwhile; at the end stop those it started (an engine already running in
        the process is shared through ``get_engine`` and stays up for its other users)."""
        engines = list({id(m.engine): m.engine for m in self.models.all}.values())
        started_here = [e for e in engines if not e.started]
        await asyncio.to_thread(start_engines, *engines)
        try:
            for model in self.models.all:
                if model.tool_parser or model.reasoning_parser:  # at start, as vllm serve
                    await asyncio.to_thread(
                        model.engine.check_parsers, model.tool_parser, model.reasoning_parser
                    )
            yield
        finally:
            await self.background_responses.close()
            self.responses_store.close()
            for engine in started_here:
                await asyncio.to_thread(engine.shutdown)

    def install(self, app: FastAPI) -> None:
        """Add the routes, the guard and the error handlers to ``app`` (its lifespan must run
        :meth:`lifespan`, or the engines start on their first request)."""
        guarded: list[re.Pattern[str]] = []  # filled below, once the routes are in
        app.add_middleware(
            Guard,
            api_key=self.limits.api_key,
            max_body_bytes=self.limits.max_body_bytes,
            routes=guarded,
        )
        before = set(map(id, app.router.routes))
        install_error_handlers(app)

        async def not_found(request: Request, e: Exception) -> JSONResponse:
            return error_response(404, str(e), "model")

        app.add_exception_handler(ModelNotFoundError, not_found)
        app.include_router(chat_router(self.models, self.limits, self.reasoning_field))
        app.include_router(pooling_router(self.models, self.limits))
        app.include_router(tokens_router(self.models, self.limits))
        app.include_router(
            responses_router(
                self.models,
                self.limits,
                self.responses_store,
                self.background_responses,
            )
        )
        models = self.models

        @app.get("/v1/models")
        async def list_models() -> dict[str, Any]:
            return models.cards()

        @app.get("/health")
        async def health() -> Response:
            """200 while every engine runs; open without a key, as ``vllm serve``'s."""
            up = all(m.engine.started for m in models.all)
            return Response(status_code=200 if up else 503)

        @app.get("/metrics")
        async def metrics() -> Response:
            """vLLM's Prometheus metrics of every engine of the process."""
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return Response(generate_latest(prometheus_registry()), media_type=CONTENT_TYPE_LATEST)

        if self.chat_page:
            chat_names = [m.name for m in models.all if m.kind == "chat"]

            @app.get("/", response_class=HTMLResponse)
            async def chat_page() -> HTMLResponse:
                # The chat models' names, for the page's model list (/v1/models lists every
                # model, as vllm serve's does, without saying which ones chat).
                page = resources.files("vllm_inline.server").joinpath("chat.html").read_text()
                page = page.replace("__CHAT_MODELS__", json.dumps(chat_names).replace("</", "<\\/"))
                return HTMLResponse(page)

        # Every route installed here needs the key, but guard.PUBLIC's.
        ours = [r for r in app.router.routes if id(r) not in before]
        guarded.extend(r.path_regex for r in ours if isinstance(r, Route))


def _parser_of(parsers: str | Mapping[str, str] | None, name: str, kind: str) -> str | None:
    if kind != "chat":
        return None
    return parsers.get(name) if isinstance(parsers, Mapping) else parsers


def _named(given: Engine | Mapping[str, Engine] | None) -> Iterable[tuple[str, Engine]]:
    if given is None:
        return []
    if isinstance(given, Engine):
        return [(given.model, given)]
    return list(given.items())


def create_app(
    chat: str | Engine | Mapping[str, Engine] | None = None,
    *,
    embedding: str | Engine | Mapping[str, Engine] | None = None,
    rerank: str | Engine | Mapping[str, Engine] | None = None,
    limits: Limits | None = None,
    vllm_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> FastAPI:
    """A FastAPI app that is only the server: models given as hub ids or paths get engines
    (``get_engine(model, **vllm_kwargs)``; embedders and rerankers on vLLM's pooling runner)."""

    def engine(model: Any, runner: str | None) -> Any:
        if not isinstance(model, str):
            return model
        extra = {"runner": runner} if runner else {}
        return get_engine(model, **{**(vllm_kwargs or {}), **extra})

    server = OpenAIServer(
        engine(chat, None),
        embedding=engine(embedding, "pooling"),
        rerank=engine(rerank, "pooling"),
        limits=limits,
        **options,
    )
    app = FastAPI(lifespan=server.lifespan, title="vllm-inline")
    server.install(app)
    return app
