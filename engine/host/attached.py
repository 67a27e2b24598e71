"""The app's side of a host engine: an :class:`~vllm_inline.engine.Engine` whose requests run in
the host engine's process (:mod:`.owner`), over its Unix socket.

:func:`~vllm_inline.engine.get_engine` returns an :class:`AttachedEngine` when ``keep_alive`` is
set (or ``VLLMINLINE_KEEP_ALIVE``). It has the engine's whole API; each call is checked here
first (the same :func:`~vllm_inline.engine.request.request.build_request` as in-process: bad
arguments raise before anything is sent), then runs there through the engine's public API, and
its deltas come back over one connection per process and engine, read on a loop thread of this
process and handed to callers through the same bridge (:mod:`..loop.bridge`) as an in-process
engine's, so leaving a stream early cancels it there too. This process imports neither torch
nor vLLM; :attr:`AttachedEngine.tokenizer` loads the model's tokenizer with ``transformers``
when it is first read.

:meth:`AttachedEngine.shutdown` detaches this process; the engine stays for its
``keep_alive`` (``python -m vllm_inline engines stop`` stops it).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from vllm_inline.engine.engine import Engine
from vllm_inline.engine.errors import EngineUnavailableError
from vllm_inline.engine.host.attach import attach, stop_owner
from vllm_inline.engine.host.directory import parse_keep_alive
from vllm_inline.engine.host.link import Link
from vllm_inline.engine.life.metrics import EngineStats
from vllm_inline.engine.life.platform_defaults import Choice, PlatformDefaults
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.life.stops import StopPolicy
from vllm_inline.engine.loop.bridge import aiter_on, iter_on
from vllm_inline.engine.pooling import embeddings, scoring
from vllm_inline.engine.request.request import build_request
from vllm_inline.engine.request.sampling import DEFAULTS, layer_sampling
from vllm_inline.engine.stream.deltas import Delta, coalesce

__all__ = ["AttachedEngine"]


class AttachedEngine(Engine):
    """An engine that runs in a host process of its own and outlives this one (see the module
    docstring); get it with ``get_engine(model, keep_alive=..., **vllm_kwargs)``."""

    def __init__(self, model: str, vllm_kwargs: Mapping[str, Any] | None, keep_alive: float):
        super().__init__(model, vllm_kwargs)
        self.keep_alive = keep_alive
        """Seconds the host engine stays after the last process detached (``inf``: until
        ``engines stop``); this process's value when it attached is the engine's from then on."""
        self._link: Link | None = None
        self._link_lock = threading.Lock()
        self._tokenizer: Any = None

    def __repr__(self) -> str:
        link = self._link
        state = f"attached to pid {link.info.get('pid')}" if link else "not attached"
        return f"AttachedEngine(model={self.model!r}, vllm_kwargs={self.vllm_kwargs!r}, {state})"

    # -- attaching -----------------------------------------------------------------------

    def _linked(self) -> Link:
        link = self._link
        if link is not None and link.lost is None:
            return link
        with self._link_lock:
            if self._link is not None and self._link.lost is not None:
                self._link.close()
                self._link = None
            if self._link is None:
                sock, info = attach(self.model, self.vllm_kwargs, self.keep_alive)
                name = f"vllm-inline-host:{self.model.rstrip('/').rsplit('/', 1)[-1]}"
                self._link = Link(sock, info, name)
            return self._link

    async def _alinked(self) -> Link:
        link = self._link
        if link is not None and link.lost is None:
            return link
        return await asyncio.to_thread(self._linked)  # attaching may wait for a start

    @property
    def attached(self) -> bool:
        return True

    @property
    def started(self) -> bool:
        """True while this process is attached to the running host engine."""
        link = self._link
        return link is not None and link.lost is None

    def start(self, *, planned: Sequence[Choice] = ()) -> AttachedEngine:
        """Attach now (starting the host engine if none runs); returns ``self``."""
        self._linked()
        return self

    def shutdown(self) -> None:
        """Detach this process (idempotent): its streams in flight end; the host engine stays
        for its ``keep_alive``. ``python -m vllm_inline engines stop`` stops it."""
        with self._link_lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()

    def restart(self) -> AttachedEngine:
        """Stop the host engine (every attached process's streams in flight end with
        :class:`~vllm_inline.engine.errors.EngineShutdownError`; their next request attaches
        to the new one) and start it again, e.g. after :class:`EngineDeadError`."""
        link = self._link
        self.shutdown()
        if link is not None:
            stop_owner(int(link.info["pid"]), int(link.info["start"]))
        return self.start()

    def set_keep_alive(self, keep_alive: Any) -> None:
        """Ask for another ``keep_alive`` (Ollama's values); the latest a process asks for is
        the host engine's. Sent now when attached, else with the greeting."""
        seconds = parse_keep_alive(keep_alive)
        if seconds is None or seconds == self.keep_alive:
            return
        self.keep_alive = seconds
        link = self._link
        if link is not None and link.lost is None:
            value = -1 if seconds == float("inf") else seconds
            link.loop.run(link.call("keep_alive", value), instead="set_keep_alive(...)")

    # -- what the engine decided ----------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """Not here: the engine runs in its host process (pid in ``repr``)."""
        raise EngineUnavailableError(
            f"The engine for {self.model!r} runs in its host process (keep_alive), not in this "
            "one: there is no vLLM here to reach. Use the engine's methods, engine.stats() or "
            "`python -m vllm_inline engines`."
        )

    @property
    def platform_defaults(self) -> PlatformDefaults | None:
        link = self._link
        return link.info["platform_defaults"] if link is not None else None

    @property
    def stop_policy(self) -> StopPolicy:
        return self._linked().info["stop_policy"]  # type: ignore[no-any-return]

    @property
    def max_model_len(self) -> int:
        return int(self._linked().info["max_model_len"])

    @property
    def accepts_images(self) -> bool:
        return bool(self._linked().info["accepts_images"])

    @property
    def model_defaults(self) -> dict[str, Any]:
        return dict(self._linked().info["model_defaults"])

    @property
    def default_sampling(self) -> dict[str, Any]:
        return layer_sampling(DEFAULTS, self.model_defaults)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded here with ``transformers`` on first use (the engine's
        own is in its host process)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            options = self.vllm_kwargs
            self._tokenizer = AutoTokenizer.from_pretrained(
                options.get("tokenizer") or self.model,
                revision=options.get("tokenizer_revision"),
                trust_remote_code=bool(options.get("trust_remote_code")),
            )
        return self._tokenizer

    def stats(self) -> EngineStats:
        link = self._link
        if link is None or link.lost is not None:
            raise EngineUnavailableError(
                f"This process is not attached to the engine for {self.model!r}: attach "
                "(engine.start(), or any request) first."
            )
        return link.loop.run(link.call("stats"), instead="engine.stats()")  # type: ignore[no-any-return]

    def num_unfinished_requests(self) -> int:
        """Requests in flight in the host engine, from every attached process."""
        link = self._link
        if link is None or link.lost is not None:
            return 0
        return int(link.loop.run(link.call("unfinished"), instead="num_unfinished_requests()"))

    def host_status(self) -> dict[str, Any]:
        """What ``python -m vllm_inline engines`` shows of this engine (attaches)."""
        link = self._linked()
        return link.loop.run(link.call("status"), instead="host_status()")

    # -- requests --------------------------------------------------------------------------

    def _check(self, messages: Any, options: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Refuse bad arguments here, before anything is sent (as in-process); a LoRA
        adapter's directory is sent absolute (the host runs in another directory)."""
        link = self._link
        limit = int(link.info["max_model_len"]) if link is not None else None
        build_request(
            messages,
            options,
            adapters=self.adapters,
            max_model_len=limit,
            engine_options=self.vllm_kwargs,
        )
        options = dict(options)
        lora = options.get("lora")
        if isinstance(lora, str) and os.path.isdir(lora):
            options["lora"] = os.path.abspath(lora)
        elif isinstance(lora, (tuple, list)) and len(lora) == 2 and os.path.isdir(str(lora[1])):
            options["lora"] = (lora[0], os.path.abspath(str(lora[1])))
        return messages, options

    def astream(
        self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> AsyncIterator[Delta]:
        return self._remote_astream(self._check(messages, kwargs))

    async def _remote_astream(self, payload: Any) -> AsyncIterator[Delta]:
        link = await self._alinked()
        async for delta in aiter_on(link.loop, lambda: link.stream(payload), coalesce):
            yield delta

    def stream(
        self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> Iterator[Delta]:
        return self._remote_stream(self._check(messages, kwargs))

    def _remote_stream(self, payload: Any) -> Iterator[Delta]:
        link = self._linked()
        yield from iter_on(link.loop, lambda: link.stream(payload), coalesce)

    async def _acall(self, op: str, payload: Any) -> Any:
        link = await self._alinked()
        return await asyncio.wrap_future(link.loop.submit(link.call(op, payload)))

    def _call(self, op: str, payload: Any, instead: str) -> Any:
        link = self._linked()
        return link.loop.run(link.call(op, payload), instead=instead)

    def check_parsers(
        self, tool_parser: str | None = None, reasoning_parser: str | None = None
    ) -> None:
        """:meth:`Engine.check_parsers`, in the host process (where vLLM's parsers are)."""
        self._call("check_parsers", (tool_parser, reasoning_parser), "engine.check_parsers(...)")

    async def aembed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = embeddings.DEFAULT_BATCH_SIZE,
        dimensions: int | None = None,
    ) -> list[list[float]]:
        if not embeddings.validate_texts(texts, truncate, normalize, batch_size, dimensions):
            return []
        options = _options(truncate, normalize, batch_size, dimensions)
        return await self._acall("embed", (list(texts), options))  # type: ignore[no-any-return]

    def embed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = embeddings.DEFAULT_BATCH_SIZE,
        dimensions: int | None = None,
    ) -> list[list[float]]:
        if not embeddings.validate_texts(texts, truncate, normalize, batch_size, dimensions):
            return []
        options = _options(truncate, normalize, batch_size, dimensions)
        return self._call("embed", (list(texts), options), "engine.aembed(...)")  # type: ignore[no-any-return]

    async def ascore(
        self,
        query: str,
        documents: Sequence[str],
        *,
        truncate: bool = False,
        batch_size: int = scoring.DEFAULT_BATCH_SIZE,
    ) -> list[float]:
        if not scoring.validate_pairs(query, documents, truncate, batch_size):
            return []
        payload = (query, list(documents), {"truncate": truncate, "batch_size": batch_size})
        return await self._acall("score", payload)  # type: ignore[no-any-return]

    def score(
        self,
        query: str,
        documents: Sequence[str],
        *,
        truncate: bool = False,
        batch_size: int = scoring.DEFAULT_BATCH_SIZE,
    ) -> list[float]:
        if not scoring.validate_pairs(query, documents, truncate, batch_size):
            return []
        payload = (query, list(documents), {"truncate": truncate, "batch_size": batch_size})
        return self._call("score", payload, "engine.ascore(...)")  # type: ignore[no-any-return]

    async def aprompt_token_ids(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt: str | list[int] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **prompt_options: Any,
    ) -> list[int]:
        payload = (
            messages,
            _render(prompt, tools, chat_template, chat_template_kwargs, prompt_options),
        )
        return await self._acall("prompt_token_ids", payload)  # type: ignore[no-any-return]

    def prompt_token_ids(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt: str | list[int] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **prompt_options: Any,
    ) -> list[int]:
        payload = (
            messages,
            _render(prompt, tools, chat_template, chat_template_kwargs, prompt_options),
        )
        return self._call("prompt_token_ids", payload, "engine.aprompt_token_ids(...)")  # type: ignore[no-any-return]


def _options(
    truncate: bool, normalize: bool | None, batch_size: int, dimensions: int | None
) -> dict[str, Any]:
    return {
        "truncate": truncate,
        "normalize": normalize,
        "batch_size": batch_size,
        "dimensions": dimensions,
    }


def _render(
    prompt: Any, tools: Any, chat_template: Any, chat_template_kwargs: Any, more: Mapping[str, Any]
) -> dict[str, Any]:
    """``prompt_token_ids``'s keyword arguments, as the host engine's call takes them."""
    return {
        "prompt": prompt,
        "tools": tools,
        "chat_template": chat_template,
        "chat_template_kwargs": chat_template_kwargs,
        **more,
    }
