"""The shared engine: one vLLM ``AsyncLLM`` per model and options per process.

:func:`~vllm_inline.engine.get_engine` (:mod:`.registry`) returns the same :class:`Engine` for the same model and options, so every
LangChain and LlamaIndex object on a model shares one engine and its continuous batching.
:class:`Engine` is the facade over the stages (docs/architecture.md): it starts vLLM on first
use (``life/``), checks each call (``request/``) and runs it on the engine's event-loop thread
(``stream/``, ``pooling/``), from any event loop or thread through ``loop/bridge.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from vllm_inline.engine.errors import EngineUnavailableError
from vllm_inline.engine.life import together
from vllm_inline.engine.life.metrics import EngineStats
from vllm_inline.engine.life.platform_defaults import Choice, PlatformDefaults
from vllm_inline.engine.life.runtime import Runtime, start_runtime
from vllm_inline.engine.life.stops import StopPolicy
from vllm_inline.engine.loop.bridge import aiter_on, iter_on
from vllm_inline.engine.pooling import embeddings, scoring
from vllm_inline.engine.request import render
from vllm_inline.engine.request.lora import LoRARegistry
from vllm_inline.engine.request.request import Request, build_request
from vllm_inline.engine.request.sampling import DEFAULTS, layer_sampling
from vllm_inline.engine.seam.vllm_types import TokenizerLike
from vllm_inline.engine.stream.deltas import Delta, coalesce
from vllm_inline.engine.stream.generate import generate

__all__ = ["Engine"]

T = TypeVar("T")


class Engine:
    """vLLM's ``AsyncLLM`` for one model, on its own event-loop thread. Get it with
    :func:`get_engine`."""

    def __init__(self, model: str, vllm_kwargs: Mapping[str, Any] | None = None) -> None:
        self.model = str(model)
        """Model path or hub id."""
        self.vllm_kwargs: dict[str, Any] = dict(vllm_kwargs or {})
        """The options given by the user (the engine's identity in :func:`get_engine`); on a CPU
        the engine adds defaults for the ones left unset (:attr:`platform_defaults`)."""
        self.adapters = LoRARegistry()
        """The LoRA adapters calls have named (kept across restarts: same directory, same id)."""
        self._lock = threading.Lock()
        self._runtime: Runtime | None = None

    def __repr__(self) -> str:
        state = "running" if self._runtime else "not started"
        return f"Engine(model={self.model!r}, vllm_kwargs={self.vllm_kwargs!r}, {state})"

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        """True when the engine runs in a host process of its own that this process attaches
        to (``keep_alive``: :mod:`vllm_inline.engine.host`), False when it runs here."""
        return False

    @property
    def started(self) -> bool:
        """True once the engine is up (reading it starts nothing)."""
        return self._runtime is not None

    @property
    def runtime(self) -> Runtime:
        """The running engine: vLLM's ``AsyncLLM`` (``runtime.llm``), its loop thread
        (``runtime.loop``) and what was decided at start (starts the engine). For tools that
        need vLLM itself, e.g. a benchmark against the raw engine."""
        return self._started()

    def start(self, *, planned: Sequence[Choice] = ()) -> Engine:
        """Start the engine now (it otherwise starts on first use); returns ``self``. ``planned``:
        memory options from a plan of engines started together (:func:`.start_engines`)."""
        self._started(planned)
        return self

    def _started(self, planned: Sequence[Choice] = ()) -> Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._lock:
            if self._runtime is None:
                together.starting(self)
                try:
                    runtime = start_runtime(
                        self.model, self.vllm_kwargs, planned, together.others_running(self)
                    )
                except BaseException:
                    together.stopped(self)
                    raise
                together.started(self, runtime.platform_defaults.kwargs)
                self._runtime = runtime
            return self._runtime

    async def _astarted(self) -> Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        # Starting blocks for seconds: keep it off the caller's event loop.
        return await asyncio.to_thread(self._started)

    def shutdown(self) -> None:
        """Stop the engine and free its memory (idempotent). Streams in flight end with
        :class:`EngineShutdownError`. The engine starts again on its next use."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            together.stopped(self)
            runtime.shutdown()

    def restart(self) -> Engine:
        """Shut down (if needed) and start a fresh engine, e.g. after :class:`EngineDeadError`."""
        self.shutdown()
        return self.start()

    # -- what the engine decided -----------------------------------------------------------

    @property
    def platform_defaults(self) -> PlatformDefaults | None:
        """What the running engine started with (``None`` before it starts): ``.kwargs`` (every
        option passed to vLLM) and ``.chosen`` (options vllm-inline set for a CPU because the
        user did not, each with a reason: ``dtype``, ``kv_cache_memory_bytes``,
        ``enforce_eager``, ...). See :mod:`vllm_inline.engine.life.platform_defaults`."""
        runtime = self._runtime
        return runtime.platform_defaults if runtime is not None else None

    @property
    def stop_policy(self) -> StopPolicy:
        """The stop tokens and template source chosen for the model (starts the engine)."""
        return self._started().stop_policy

    @property
    def max_model_len(self) -> int:
        """The context window in tokens (starts the engine)."""
        return self._started().max_model_len

    @property
    def tokenizer(self) -> TokenizerLike:
        """The model's tokenizer, as vLLM loaded it (starts the engine)."""
        return self._started().tokenizer

    @property
    def accepts_images(self) -> bool:
        """True when the model takes images in messages (a vision-language model; starts the
        engine). See ``docs/multimodal.md``."""
        return self._started().media.multimodal

    @property
    def model_defaults(self) -> dict[str, Any]:
        """Sampling values of the model's ``generation_config.json`` (starts the engine)."""
        return dict(self._started().model_defaults)

    @property
    def default_sampling(self) -> dict[str, Any]:
        """Sampling values used when a call sets none: package defaults under the model's."""
        return layer_sampling(DEFAULTS, self.model_defaults)

    def stats(self) -> EngineStats:
        """A snapshot of the running engine: requests running and waiting, KV-cache usage,
        prefix-cache hit rate, tokens so far (cheap: no call into vLLM). Raises
        :class:`EngineUnavailableError` when the engine is not running and
        :class:`StatsDisabledError` when it was started with ``disable_log_stats=True``."""
        runtime = self._runtime
        if runtime is None:
            raise EngineUnavailableError(
                f"The engine for {self.model!r} is not running, so it has no stats: start it "
                "(engine.start(), or any request) first."
            )
        return runtime.stats.snapshot()

    def num_unfinished_requests(self) -> int:
        """Requests in flight in the engine (0 when it is not running)."""
        runtime = self._runtime
        if runtime is None or runtime.llm is None:
            return 0
        return runtime.llm.get_num_unfinished_requests()

    # -- requests --------------------------------------------------------------------------

    def astream(
        self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> AsyncIterator[Delta]:
        """Stream the answer to ``messages`` (OpenAI-style chat) as :class:`Delta` objects.

        Keyword arguments: ``prompt`` (a pre-formatted prompt instead of ``messages``: text, or
        token ids), ``tools``,
        ``tool_choice``, ``chat_template``, ``chat_template_kwargs``, ``tool_parser``,
        ``reasoning_parser``, ``structured_outputs``, ``lora`` (a LoRA adapter directory, ``(name,
        path)`` or a name seen before: see :mod:`vllm_inline.engine.request.lora`), ``priority`` (an
        int, lower first; needs ``scheduling_policy="priority"``), ``timeout`` (seconds, then the
        request is aborted with :class:`RequestTimeoutError`), ``stream=False`` (the whole answer as
        one delta: ``Request.stream``), ``return_prompt_token_ids=True`` (the prompt's ids on the
        first delta of each choice), any vLLM sampling value (``max_tokens``, ``stop``,
        ``prompt_logprobs``: on the first delta of each choice too, ...). Bad
        arguments raise here, before anything starts; iterate the result from any event loop (it
        never blocks it). The engine starts on the first iteration.
        """
        return self._astream(self._request(messages, kwargs))

    async def _astream(self, request: Request) -> AsyncIterator[Delta]:
        runtime = await self._astarted()
        async for delta in aiter_on(runtime.loop, lambda: generate(runtime, request), coalesce):
            yield delta

    def stream(
        self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> Iterator[Delta]:
        """The synchronous form of :meth:`astream` (same arguments, same deltas)."""
        return self._stream(self._request(messages, kwargs))

    def _stream(self, request: Request) -> Iterator[Delta]:
        runtime = self._started()
        yield from iter_on(runtime.loop, lambda: generate(runtime, request), coalesce)

    async def aembed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = embeddings.DEFAULT_BATCH_SIZE,
        dimensions: int | None = None,
    ) -> list[list[float]]:
        """Embed ``texts`` on a pooling engine (``get_engine(model, runner="pooling")``).

        One vector per text, in order. A text longer than ``max_model_len`` raises
        :class:`ContextLengthExceededError` unless ``truncate=True``; ``normalize`` overrides the
        model's L2 normalisation; ``dimensions`` asks a Matryoshka model for shorter vectors.
        Texts are tokenized ``batch_size`` at a time and all submitted concurrently. Works from
        any event loop. See :mod:`vllm_inline.engine.pooling.embeddings`.
        """
        items = embeddings.validate_texts(texts, truncate, normalize, batch_size, dimensions)
        if not items:  # nothing to embed: the engine is not started for it
            return []
        options = embeddings.EmbedOptions(truncate, normalize, batch_size, dimensions)
        return await self._arun(lambda runtime: embeddings.embed(runtime, items, options))

    def embed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = embeddings.DEFAULT_BATCH_SIZE,
        dimensions: int | None = None,
    ) -> list[list[float]]:
        """The synchronous form of :meth:`aembed` (same arguments, same vectors)."""
        items = embeddings.validate_texts(texts, truncate, normalize, batch_size, dimensions)
        if not items:  # nothing to embed: the engine is not started for it
            return []
        options = embeddings.EmbedOptions(truncate, normalize, batch_size, dimensions)
        return self._run(
            lambda runtime: embeddings.embed(runtime, items, options), instead="engine.aembed(...)"
        )

    async def ascore(
        self,
        query: str,
        documents: Sequence[str],
        *,
        truncate: bool = False,
        batch_size: int = scoring.DEFAULT_BATCH_SIZE,
    ) -> list[float]:
        """Score ``documents`` against ``query`` on a reranker (a cross-encoder on a pooling
        engine, ``get_engine(model, runner="pooling")``).

        One float per document, in order (higher is more relevant). A query-document pair
        longer than ``max_model_len`` raises :class:`ContextLengthExceededError` naming
        ``documents[i]`` unless ``truncate=True``. Pairs are rendered ``batch_size`` at a time,
        each batch submitted as soon as it is rendered. Works from any event loop. See
        :mod:`vllm_inline.engine.pooling.scoring`.
        """
        docs = scoring.validate_pairs(query, documents, truncate, batch_size)
        if not docs:
            return []
        return await self._arun(
            lambda runtime: scoring.score(
                runtime, query, docs, truncate=truncate, batch_size=batch_size
            )
        )

    def score(
        self,
        query: str,
        documents: Sequence[str],
        *,
        truncate: bool = False,
        batch_size: int = scoring.DEFAULT_BATCH_SIZE,
    ) -> list[float]:
        """The synchronous form of :meth:`ascore` (same arguments, same scores)."""
        docs = scoring.validate_pairs(query, documents, truncate, batch_size)
        if not docs:
            return []
        return self._run(
            lambda runtime: scoring.score(
                runtime, query, docs, truncate=truncate, batch_size=batch_size
            ),
            instead="engine.ascore(...)",
        )

    def check_parsers(
        self, tool_parser: str | None = None, reasoning_parser: str | None = None
    ) -> None:
        """Start vLLM's named parsers once on the model's tokenizer, as ``vllm serve`` does at
        its start: a :class:`ValueError` names a parser the tokenizer cannot serve (a missing
        token), before any request. Starts the engine."""
        from vllm_inline.engine.stream.parsing import check_parsers

        check_parsers(self.tokenizer, self.model, tool_parser, reasoning_parser)

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
        """The token ids :meth:`astream` would prefill for ``messages`` (or ``prompt``).

        The same rendering as a request: the model's chat template (or ``chat_template``) with
        ``tools`` and ``chat_template_kwargs``, generation prompt included, through vLLM's
        renderer. ``len(...)`` is the exact prompt size, e.g. to check it against
        :attr:`max_model_len` or to trim a conversation. ``prompt_options`` are a request's
        rendering options (``add_generation_prompt``, ``continue_final_message``,
        ``add_special_tokens``, ...: :class:`~vllm_inline.engine.request.prompt_options.
        PromptOptions`). Starts the engine.
        """
        options = _render_options(prompt, tools, chat_template, chat_template_kwargs)
        options.update(prompt_options)
        request = self._request(messages, options)
        return await self._arun(lambda runtime: render.prompt_token_ids(runtime, request))

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
        """The synchronous form of :meth:`aprompt_token_ids` (same arguments, same ids)."""
        options = _render_options(prompt, tools, chat_template, chat_template_kwargs)
        options.update(prompt_options)
        request = self._request(messages, options)
        return self._run(
            lambda runtime: render.prompt_token_ids(runtime, request),
            instead="engine.aprompt_token_ids(...)",
        )

    # -- the two ways onto the engine loop ---------------------------------------------------

    def _request(self, messages: Any, options: Mapping[str, Any]) -> Request:
        runtime = self._runtime
        limit = runtime.max_model_len if runtime else None
        return build_request(
            messages,
            options,
            adapters=self.adapters,
            max_model_len=limit,
            engine_options=self.vllm_kwargs,
        )

    async def _arun(self, job: Callable[[Runtime], Coroutine[Any, Any, T]]) -> T:
        """Run ``job(runtime)`` on the engine loop and await it from the caller's loop."""
        runtime = await self._astarted()
        return await asyncio.wrap_future(runtime.loop.submit(job(runtime)))

    def _run(self, job: Callable[[Runtime], Coroutine[Any, Any, T]], *, instead: str) -> T:
        """Run ``job(runtime)`` on the engine loop and wait for it (``instead``: see
        :meth:`vllm_inline.engine.loop.bridge.LoopThread.run`); ``KeyboardInterrupt`` cancels it."""
        runtime = self._started()
        return runtime.loop.run(job(runtime), instead=instead)


def _render_options(prompt: Any, tools: Any, template: Any, kwargs: Any) -> dict[str, Any]:
    """The request options of ``prompt_token_ids``: what rendering takes, no sampling."""
    return {
        "prompt": prompt,
        "tools": tools,
        "chat_template": template,
        "chat_template_kwargs": kwargs,
    }
