"""The shared engine: one vLLM ``AsyncLLM`` per model and options per process.

:func:`get_engine` returns the same :class:`Engine` for the same model and options, so every
LangChain and LlamaIndex object on a model shares one engine and its continuous batching. The
engine starts on first use, on its own event-loop thread; :meth:`Engine.astream` can be iterated
from any event loop and :meth:`Engine.stream` from any thread, both through
:mod:`vllm_inline.engine.bridge`.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import itertools
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .bridge import LoopThread, aiter_on, iter_on
from .deltas import Delta, TokenLogprob, Usage
from .errors import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    EngineDeadError,
    EngineShutdownError,
    ModelLoadError,
    VLLMInlineError,
)
from .lora import Adapter, registry
from .messages import validate_messages, validate_tool_choice, validate_tools
from .parsing import OutputParser, make_parser_factory
from .platform_defaults import PlatformDefaults
from .sampling import DEFAULTS, check_sampling, layer_sampling
from .stops import StopPolicy, decide_stop_policy
from .templates import TemplateChoice, require_template, resolve_chat_template

if TYPE_CHECKING:
    from . import _vllm

__all__ = ["Engine", "get_engine", "shutdown_all"]

logger = logging.getLogger("vllm_inline")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_request_ids = itertools.count()
_SHUTDOWN_TIMEOUT_S = 3.0


@dataclass
class _Running:
    """A started engine: the ``AsyncLLM``, its loop thread and what was decided at start."""

    llm: Any
    loop: LoopThread
    tokenizer: Any
    template: TemplateChoice
    stop_policy: StopPolicy
    model_defaults: dict[str, Any]
    max_model_len: int
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    closing: bool = False


@dataclass(frozen=True)
class _Request:
    """A validated request, ready to render and send."""

    messages: list[dict[str, Any]] | None
    prompt: str | None
    tools: list[dict[str, Any]] | None
    tool_choice: str | None
    chat_template: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    sampling: dict[str, Any]
    structured_outputs: Mapping[str, Any] | None
    tool_parser: str | None
    reasoning_parser: str | None
    lora: Adapter | None = None


class Engine:
    """vLLM's ``AsyncLLM`` for one model, on its own event-loop thread. Get it with :func:`get_engine`."""

    def __init__(self, model: str, vllm_kwargs: Mapping[str, Any] | None = None) -> None:
        self.model = str(model)
        """Model path or hub id."""
        self.vllm_kwargs: dict[str, Any] = dict(vllm_kwargs or {})
        """The options given by the user (the engine's identity in :func:`get_engine`)."""
        self.platform_defaults: PlatformDefaults | None = None
        """What the engine started with, once started: ``.kwargs`` (every option passed to vLLM)
        and ``.chosen`` (options vllm-inline set for a CPU because the user did not, each with a
        reason: ``dtype``, ``kv_cache_memory_bytes``, ``enforce_eager``). See
        :mod:`.platform_defaults`."""
        self._lock = threading.Lock()
        self._running: _Running | None = None

    def __repr__(self) -> str:
        state = "running" if self._running else "not started"
        return f"Engine(model={self.model!r}, vllm_kwargs={self.vllm_kwargs!r}, {state})"

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True once the engine is up (reading it starts nothing)."""
        return self._running is not None

    def start(self) -> Engine:
        """Start the engine now (it otherwise starts on first use); returns ``self``."""
        self._started()
        return self

    def _started(self) -> _Running:
        running = self._running
        if running is not None:
            return running
        with self._lock:
            if self._running is None:
                self._running = self._start()
            return self._running

    async def _astarted(self) -> _Running:
        running = self._running
        if running is not None:
            return running
        # Starting blocks for seconds: keep it off the caller's event loop.
        return await asyncio.to_thread(self._started)

    def _preflight(self) -> None:
        """Checks that need no engine: the model path and its tokenizer."""
        model = os.path.expanduser(self.model)
        path_like = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
        if not os.path.exists(model):
            if path_like:
                raise ModelLoadError(
                    f"Model path {self.model!r} does not exist. Pass an existing local directory "
                    "or a hub id such as 'Qwen/Qwen3-0.6B'."
                )
            return
        if os.path.isdir(model) and "tokenizer" not in self.vllm_kwargs:
            if not any(os.path.exists(os.path.join(model, f)) for f in _TOKENIZER_FILES):
                raise ModelLoadError(
                    f"Model directory {self.model!r} has no tokenizer (none of "
                    f"{', '.join(_TOKENIZER_FILES)}). Save the tokenizer next to the weights or "
                    "pass vllm_kwargs={'tokenizer': '<path or hub id>'}."
                )

    def _start(self) -> _Running:
        self._preflight()
        loop = LoopThread(name=f"vllm-inline:{os.path.basename(self.model.rstrip('/'))}")
        try:
            llm = loop.submit(self._build()).result()
        except BaseException as e:
            loop.stop()
            if isinstance(e, VLLMInlineError):
                raise
            raise ModelLoadError(
                f"vLLM could not start an engine for {self.model!r} with {self.vllm_kwargs}: "
                f"{type(e).__name__}: {e}"
            ) from e
        tokenizer = llm.get_tokenizer()
        vocab = tokenizer.get_vocab()
        template = resolve_chat_template(getattr(tokenizer, "chat_template", None), vocab)
        generation_config = llm.model_config.try_get_generation_config() or {}
        policy = decide_stop_policy(
            vocab, tokenizer.eos_token_id, generation_config.get("eos_token_id"), template.source
        )
        running = _Running(
            llm=llm,
            loop=loop,
            tokenizer=tokenizer,
            template=template,
            stop_policy=policy,
            model_defaults=dict(llm.model_config.get_diff_sampling_param()),
            max_model_len=int(llm.model_config.max_model_len),
        )
        logger.info(
            "vllm-inline engine started: model=%s template=%s stop_ids=%s (%s) chosen: %s",
            self.model, template.source, list(policy.stop_token_ids), ", ".join(policy.stop_tokens),
            self.platform_defaults.summary() if self.platform_defaults else "none",
        )
        _register_exit()
        return running

    async def _build(self) -> Any:
        # Built on the loop thread, so vLLM's output handler binds to this loop. vLLM is first
        # imported here too: some of its modules keep import-time tracebacks, which would keep
        # the caller's frames (and through them the engine) alive until interpreter exit.
        from . import _vllm

        _vllm.check_engine_kwargs(self.model, self.vllm_kwargs)
        # Measured before anything is spawned: a request for more memory than is free fails here.
        self.platform_defaults = _vllm.decide_engine_kwargs(self.model, self.vllm_kwargs)
        return _vllm.start_engine(self.model, self.platform_defaults.kwargs)

    def shutdown(self) -> None:
        """Stop the engine and free its memory (idempotent). Streams in flight end with
        :class:`EngineShutdownError`. The engine starts again on its next use."""
        with self._lock:
            running, self._running = self._running, None
        if running is None:
            return
        running.closing = True

        async def close() -> None:
            for task in list(running.tasks):
                task.cancel()
            if running.tasks:
                await asyncio.wait(list(running.tasks), timeout=5)
            # vLLM waits 5 s for the engine-core process by default and then kills it anyway
            # (its worker has exited by then); 3 s lets a script end sooner.
            running.llm.shutdown(timeout=_SHUTDOWN_TIMEOUT_S)

        try:
            running.loop.submit(close()).result(timeout=30)
        except Exception:  # noqa: BLE001 - a dead engine still has to let go of its thread
            logger.warning("vllm-inline: engine %s did not shut down cleanly", self.model, exc_info=True)
        running.loop.stop()
        running.llm = None
        gc.collect()  # run AsyncLLM.__del__ now, while the interpreter is whole

    def restart(self) -> Engine:
        """Shut down (if needed) and start a fresh engine, e.g. after :class:`EngineDeadError`."""
        self.shutdown()
        return self.start()

    # -- what the engine decided -----------------------------------------------------------

    @property
    def stop_policy(self) -> StopPolicy:
        """The stop tokens and template source chosen for the model (starts the engine)."""
        return self._started().stop_policy

    @property
    def max_model_len(self) -> int:
        """The context window in tokens (starts the engine)."""
        return self._started().max_model_len

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, as vLLM loaded it (starts the engine)."""
        return self._started().tokenizer

    @property
    def default_sampling(self) -> dict[str, Any]:
        """Sampling values used when a call sets none: package defaults under the model's."""
        return layer_sampling(DEFAULTS, self._started().model_defaults)

    def num_unfinished_requests(self) -> int:
        """Requests in flight in the engine (0 when it is not running)."""
        running = self._running
        if running is None or running.llm is None:
            return 0
        return running.llm.get_num_unfinished_requests()

    # -- requests --------------------------------------------------------------------------

    async def astream(
        self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> AsyncIterator[Delta]:
        """Stream the answer to ``messages`` (OpenAI-style chat) as :class:`Delta` objects.

        Keyword arguments: ``prompt`` (a pre-formatted prompt instead of ``messages``),
        ``tools``, ``tool_choice``, ``chat_template``, ``chat_template_kwargs``,
        ``tool_parser``, ``reasoning_parser``, ``structured_outputs``, ``lora`` (a LoRA adapter
        directory, ``(name, path)`` or a name seen before: see :mod:`.lora`) and any vLLM sampling
        value (``max_tokens``, ``temperature``, ``stop``, ``seed``, ``n``, ``logprobs``, ...).
        Works from any event loop; never blocks it.
        """
        request = self._request(messages, kwargs)
        running = await self._astarted()
        async for delta in aiter_on(running.loop, lambda: self._generate(running, request)):
            yield delta

    def stream(self, messages: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> Iterator[Delta]:
        """The synchronous form of :meth:`astream` (same arguments, same deltas)."""
        request = self._request(messages, kwargs)
        running = self._started()
        yield from iter_on(running.loop, lambda: self._generate(running, request))

    async def aembed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = 64,
    ) -> list[list[float]]:
        """Embed ``texts`` on a pooling engine (``get_engine(model, runner="pooling")``).

        One vector per text, in order. A text longer than ``max_model_len`` raises
        :class:`ContextLengthExceededError` unless ``truncate=True``; ``normalize`` overrides the
        model's L2 normalisation. Texts are tokenized ``batch_size`` at a time and all submitted
        concurrently. Works from any event loop. See :mod:`.embeddings`.
        """
        from .embeddings import aembed

        return await aembed(
            self, texts, truncate=truncate, normalize=normalize, batch_size=batch_size
        )

    def embed(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = False,
        normalize: bool | None = None,
        batch_size: int = 64,
    ) -> list[list[float]]:
        """The synchronous form of :meth:`aembed` (same arguments, same vectors)."""
        from .embeddings import embed

        return embed(self, texts, truncate=truncate, normalize=normalize, batch_size=batch_size)

    async def aprompt_token_ids(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The token ids :meth:`astream` would prefill for ``messages`` (or ``prompt``).

        The same rendering as a request: the model's chat template (or ``chat_template``) with
        ``tools`` and ``chat_template_kwargs``, generation prompt included, through vLLM's
        renderer. ``len(...)`` is the exact prompt size, e.g. to check it against
        :attr:`max_model_len` or to trim a conversation. Starts the engine.
        """
        request = self._render_request(messages, prompt, tools, chat_template, chat_template_kwargs)
        running = await self._astarted()
        return await asyncio.wrap_future(running.loop.submit(self._prompt_ids(running, request)))

    def prompt_token_ids(
        self,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The synchronous form of :meth:`aprompt_token_ids` (same arguments, same ids)."""
        request = self._render_request(messages, prompt, tools, chat_template, chat_template_kwargs)
        running = self._started()
        return running.loop.run(
            self._prompt_ids(running, request), instead="engine.aprompt_token_ids(...)"
        )

    def _render_request(
        self,
        messages: Any,
        prompt: str | None,
        tools: Any,
        chat_template: str | None,
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> _Request:
        return self._request(
            messages,
            {
                "prompt": prompt,
                "tools": tools,
                "chat_template": chat_template,
                "chat_template_kwargs": chat_template_kwargs,
            },
        )

    async def _prompt_ids(self, running: _Running, request: _Request) -> list[int]:
        from . import _vllm

        return list((await self._render(running, request, _vllm))["prompt_token_ids"])

    def _request(self, messages: Any, kwargs: dict[str, Any]) -> _Request:
        """Validate everything that needs no engine, so bad input fails before any work."""
        prompt = kwargs.pop("prompt", None)
        if (messages is None) == (prompt is None):
            raise BadRequestError(
                "Pass exactly one of messages (a chat) or prompt (pre-formatted text).",
                parameter="messages",
                value=messages,
            )
        if prompt is not None and not isinstance(prompt, str):
            raise BadRequestError.invalid("prompt", prompt, "a string")
        tools = validate_tools(kwargs.pop("tools", None))
        tool_choice = validate_tool_choice(kwargs.pop("tool_choice", None), tools)
        chat_template = kwargs.pop("chat_template", None)
        template_kwargs = kwargs.pop("chat_template_kwargs", None)
        if template_kwargs is not None and not isinstance(template_kwargs, Mapping):
            raise BadRequestError.invalid("chat_template_kwargs", template_kwargs, "a mapping")
        structured = kwargs.pop("structured_outputs", None)
        if structured is not None and not isinstance(structured, Mapping):
            raise BadRequestError.invalid("structured_outputs", structured, "a mapping, e.g. {'json': schema}")
        tool_parser = kwargs.pop("tool_parser", None)
        reasoning_parser = kwargs.pop("reasoning_parser", None)
        lora = registry(self).resolve(kwargs.pop("lora", None))
        running = self._running
        sampling = check_sampling(kwargs, max_model_len=running.max_model_len if running else None)
        return _Request(
            messages=validate_messages(messages) if messages is not None else None,
            prompt=prompt,
            tools=tools,
            tool_choice=tool_choice,
            chat_template=chat_template,
            chat_template_kwargs=template_kwargs,
            sampling=sampling,
            structured_outputs=structured,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
            lora=lora,
        )

    async def _generate(self, running: _Running, request: _Request) -> AsyncIterator[Delta]:
        """The one streaming path; runs on the engine loop (see :mod:`.bridge`)."""
        from . import _vllm

        task = asyncio.current_task()
        assert task is not None
        running.tasks.add(task)
        try:
            from .embeddings import require_runner

            require_runner(self.model, running.llm, "generate")  # not on an embedding engine
            async for delta in self._deltas(running, request, _vllm):
                yield delta
        except asyncio.CancelledError:
            if running.closing:
                raise EngineShutdownError(
                    f"The engine for {self.model!r} was shut down while this stream ran."
                ) from None
            raise
        except VLLMInlineError:
            raise
        except Exception as e:
            mapped = _vllm.map_error(e, self.model)
            if mapped is None:
                raise
            raise mapped from e
        finally:
            running.tasks.discard(task)

    async def _render(self, running: _Running, request: _Request, _vllm: Any) -> Any:
        if request.prompt is not None:
            return await _vllm.render_prompt(running.llm, request.prompt)
        if request.chat_template is not None:
            choice = resolve_chat_template(None, {}, request.chat_template)
        else:
            choice = running.template
            require_template(choice, self.model)
        try:
            return await _vllm.render_chat(
                running.llm,
                request.messages,
                chat_template=choice.template,
                chat_template_kwargs=request.chat_template_kwargs,
                tools=request.tools,
            )
        except VLLMInlineError:
            raise
        except Exception as e:
            mapped = _vllm.map_error(e, self.model)
            if isinstance(mapped, (ContextLengthExceededError, EngineDeadError)):
                raise mapped from e
            raise ChatTemplateError(
                f"The chat template of {self.model!r} ({choice.source}) failed to render these "
                f"messages: {type(e).__name__}: {e}. Check the roles and order the template "
                "accepts, or pass chat_template=...",
                parameter="messages",
                value=None,
            ) from e

    async def _deltas(self, running: _Running, request: _Request, _vllm: Any) -> AsyncIterator[Delta]:
        llm = running.llm
        if llm is None or llm.errored:
            raise EngineDeadError(
                f"The vLLM engine for {self.model!r} is dead. Call engine.restart() to start a new one."
            )
        engine_input = await self._render(running, request, _vllm)
        prompt_tokens = len(engine_input["prompt_token_ids"])
        values = layer_sampling(DEFAULTS, running.model_defaults, request.sampling)
        values["max_tokens"] = min(values["max_tokens"], running.max_model_len - prompt_tokens)
        if values["max_tokens"] < 1:
            raise BadRequestError(
                f"The prompt fills the whole context window ({prompt_tokens} of "
                f"{running.max_model_len} tokens): no room to generate. Shorten the messages.",
                parameter="messages",
                value=prompt_tokens,
            )
        if not values.get("ignore_eos"):
            # ignore_eos (fixed-length benchmarks) turns off the end-of-turn policy too.
            values["stop_token_ids"] = list(
                dict.fromkeys([*running.stop_policy.stop_token_ids, *values.get("stop_token_ids", ())])
            )
        make_parser = make_parser_factory(
            tokenizer=running.tokenizer,
            model_config=llm.model_config,
            model=self.model,
            family=running.stop_policy.family,
            messages=request.messages,
            tools=request.tools,
            tool_choice=request.tool_choice,
            tool_parser=request.tool_parser,
            reasoning_parser=request.reasoning_parser,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        if not make_parser.skip_special_tokens:
            values.setdefault("skip_special_tokens", False)
        structured = request.structured_outputs or make_parser.structured_outputs
        params = _vllm.make_sampling_params(values, structured)
        prompt_ids = list(engine_input["prompt_token_ids"])
        parsers: dict[int, OutputParser] = {}
        completion_tokens = 0
        pending_ids: dict[int, list[int]] = {}
        request_id = f"vllm-inline-{next(_request_ids)}"
        lora_request = await registry(self).request(llm, request.lora, _vllm)
        async for out in llm.generate(engine_input, params, request_id, lora_request=lora_request):
            last = len(out.outputs) - 1
            for k, c in enumerate(out.outputs):
                completion_tokens += len(c.token_ids)
                parser = parsers.get(c.index)
                if parser is None:
                    parser = parsers[c.index] = make_parser(prompt_ids)
                finish = c.finish_reason
                text, reasoning, tool_calls = parser.feed(c.text, c.token_ids, finish is not None)
                if finish == "stop" and parser.called_tools:
                    finish = "tool_calls"
                usage = (
                    Usage(len(out.prompt_token_ids or ()) or prompt_tokens, completion_tokens)
                    if out.finished and k == last
                    else None
                )
                ids = pending_ids.pop(c.index, []) + list(c.token_ids)
                if not (text or reasoning or tool_calls or finish):
                    pending_ids[c.index] = ids  # partial UTF-8: carried to the next delta
                    continue
                yield Delta(
                    text=text,
                    reasoning=reasoning,
                    tool_calls=tool_calls,
                    token_ids=tuple(ids),
                    logprobs=_logprobs(c.logprobs, c.token_ids) if c.logprobs is not None else None,
                    index=c.index,
                    finish_reason=finish,
                    stop_reason=c.stop_reason,
                    usage=usage,
                )


def _logprobs(steps: Sequence[Mapping[int, Any]], token_ids: Sequence[int]) -> tuple[TokenLogprob, ...]:
    """vLLM's per-step ``{token_id: Logprob}`` dicts as :class:`TokenLogprob` objects."""
    out = []
    for token_id, step in zip(token_ids, steps):
        chosen = step.get(token_id)
        ranked = sorted(step.items(), key=lambda kv: kv[1].rank or 0)
        out.append(
            TokenLogprob(
                token=(chosen.decoded_token or "") if chosen else "",
                token_id=token_id,
                logprob=float(chosen.logprob) if chosen else float("-inf"),
                top_logprobs=tuple(
                    (lp.decoded_token or "", float(lp.logprob)) for tid, lp in ranked if tid != token_id or len(step) == 1
                ),
            )
        )
    return tuple(out)


# -- the registry --------------------------------------------------------------------------

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()
_exit_registered = False


def _key(model: str, vllm_kwargs: Mapping[str, Any]) -> str:
    return json.dumps([str(model), dict(vllm_kwargs)], sort_keys=True, default=repr)


def get_engine(model: str, **vllm_kwargs: Any) -> Engine:
    """The process's :class:`Engine` for ``model`` and these ``AsyncEngineArgs`` options.

    The same model and options return the same object. Nothing starts until first use.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model):
        raise ModelLoadError(f"model={model!r} is invalid: pass a local path or a hub id.")
    key = _key(os.fspath(model), vllm_kwargs)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = Engine(os.fspath(model), vllm_kwargs)
        return engine


def shutdown_all() -> None:
    """Shut down every engine of the process (runs at interpreter exit)."""
    with _engines_lock:
        engines = list(_engines.values())
    for engine in engines:
        engine.shutdown()


def _at_exit() -> None:
    shutdown_all()
    # Hand the heap the engine froze at start (see _vllm.start_engine) back to the collector,
    # so the interpreter's last collections free it: native extensions (triton's nanobind
    # bindings) otherwise report their objects as leaked on the way out.
    gc.unfreeze()


def _register_exit() -> None:
    global _exit_registered
    with _engines_lock:
        if not _exit_registered:
            atexit.register(_at_exit)
            _exit_registered = True
