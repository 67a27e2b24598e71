"""Generation: the request path from a checked request to :class:`~.deltas.Delta` objects.

:func:`generate` is the one streaming path, on the engine loop, under :meth:`Runtime.guard
<.runtime.Runtime.guard>`:

1. render the prompt (:mod:`vllm_inline.engine.request.render`);
2. the output parsers (:mod:`.parsing`) and the final sampling values
   (:func:`vllm_inline.engine.request.sampling.final_sampling`: defaults, the model's
   generation_config, what the parsers need, the call's, the stop policy);
3. the LoRA request (:mod:`vllm_inline.engine.request.lora`), then vLLM's ``AsyncLLM.generate``
   in DELTA mode, or in FINAL_ONLY mode for a request with ``stream=False``
   (:attr:`vllm_inline.engine.request.request.Request.stream`);
4. each output's new text and token ids go through the choice's parser, and a :class:`Delta`
   is built here, in :func:`generate`'s loop.

A ``stream=False`` request goes the same way with one output per request: each choice's whole
answer is parsed as vLLM's server parses a non-streamed one (:meth:`.parsing.OutputParser.parse`)
and becomes one :class:`Delta` with the finish reason, usage and metrics, built by the same
code as the last delta of a stream. Stop strings and stop tokens are applied by vLLM's output
processor in both modes (it detokenizes every step either way); nothing here looks for them.

:meth:`Engine.astream <vllm_inline.engine.Engine.astream>` and ``stream`` hand its deltas to the
caller through :mod:`vllm_inline.engine.loop.bridge`; closing the stream closes this generator,
which aborts the request.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from vllm_inline.engine.errors import GenerationFailedError
from vllm_inline.engine.life.metrics import request_metrics
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.request.images import text_view
from vllm_inline.engine.request.lora import lora_request
from vllm_inline.engine.request.render import render, template_kwargs
from vllm_inline.engine.request.request import Request
from vllm_inline.engine.request.sampling import final_sampling, special_tokens_hidden
from vllm_inline.engine.stream.deltas import Delta, RankedLogprob, TokenLogprob, Usage
from vllm_inline.engine.stream.parsing import OutputParser, make_parser_factory

__all__ = ["generate"]

_request_ids = itertools.count()


async def generate(runtime: Runtime, request: Request) -> AsyncIterator[Delta]:
    """Stream ``request``'s answer as deltas; runs on the engine loop (see
    :mod:`vllm_inline.engine.loop.bridge`)."""
    from vllm_inline.engine.seam import vllm_engine

    async with runtime.guard("stream", runner="generate", timeout=request.timeout) as llm:
        engine_input = await render(runtime, request)
        prompt_ids = list(engine_input["prompt_token_ids"])
        prompt_tokens = len(prompt_ids)
        make_parser = make_parser_factory(
            tokenizer=runtime.tokenizer,
            model_config=llm.model_config,
            model=runtime.model,
            family=runtime.stop_policy.family,
            messages=text_view(request.messages),
            tools=request.tools,
            tool_choice=request.tool_choice,
            tool_parser=request.tool_parser,
            reasoning_parser=request.reasoning_parser,
            chat_template_kwargs=template_kwargs(request) if request.messages else None,
            parallel_tool_calls=request.parallel_tool_calls,
        )
        values = final_sampling(
            request.sampling,
            model_defaults=runtime.model_defaults,
            parser_needs={"skip_special_tokens": make_parser.skip_special_tokens},
            stop_token_ids=runtime.stop_policy.stop_token_ids,
            max_model_len=runtime.max_model_len,
            prompt_tokens=prompt_tokens,
        )
        if make_parser.skip_special_tokens is False and special_tokens_hidden(
            request.sampling, runtime.model_defaults
        ):
            make_parser.hide_special_tokens()  # the parsers needed them; the caller did not
        structured = request.structured_outputs or make_parser.structured_outputs
        params = vllm_engine.make_sampling_params(values, structured, stream=request.stream)
        lora = await lora_request(runtime, request.lora)
        parsers: dict[int, OutputParser] = {}
        completion_tokens = 0
        pending_ids: dict[int, list[int]] = {}
        # The first delta of each choice carries the prompt's ids (when asked for) and logprobs
        # (when vLLM computed them), as vLLM's server puts them on every choice. Only a request
        # that asked for either pays for it: one copy of the prompt, a set while choices start,
        # and a copy of each choice's first delta; every other delta is built once, with no
        # per-delta dict or keyword unpacking.
        prompt_out = tuple(prompt_ids) if request.return_prompt_token_ids else None
        want_prompt_logprobs = request.sampling.get("prompt_logprobs") is not None
        prompt_logprobs: tuple[tuple[RankedLogprob, ...] | None, ...] | None = None
        unstarted: set[int] = set()  # choices whose first delta is still to come
        for attempt in (1, 2):
            request_id = f"vllm-inline-{next(_request_ids)}"
            more = {"session_id": request.session_id} if request.session_id is not None else {}
            stream = llm.generate(
                engine_input,
                params,
                request_id,
                lora_request=lora,
                priority=request.priority,
                **more,
            )
            async for out in stream:
                if out.finished and any(c.finish_reason == "error" for c in out.outputs):
                    break
                if (
                    want_prompt_logprobs
                    and prompt_logprobs is None
                    and out.prompt_logprobs is not None
                ):
                    # DELTA outputs hand them over once (with n > 1, once per choice at most,
                    # and an output merged into another loses them): keep the first.
                    prompt_logprobs = _prompt_logprobs(out.prompt_logprobs)
                last = len(out.outputs) - 1
                for k, c in enumerate(out.outputs):
                    completion_tokens += len(c.token_ids)
                    parser = parsers.get(c.index)
                    if parser is None:
                        parser = parsers[c.index] = make_parser(prompt_ids)
                        if prompt_out is not None or want_prompt_logprobs:
                            unstarted.add(c.index)
                    finish = c.finish_reason
                    if request.stream:
                        parsed = parser.feed(c.text, c.token_ids, finish is not None)
                    else:  # FINAL_ONLY: the whole answer of a finished choice
                        parsed = parser.parse(c.text, c.token_ids)
                    text, reasoning, tool_calls = parsed
                    if not request.include_reasoning:
                        reasoning = ""  # parsed out, then dropped, as vLLM's server does
                    if finish == "stop" and parser.called_tools:
                        finish = "tool_calls"
                    usage = metrics = None
                    if out.finished and k == last:
                        usage = Usage(
                            len(out.prompt_token_ids or ()) or prompt_tokens,
                            completion_tokens,
                            out.num_cached_tokens or 0,
                        )
                        metrics = request_metrics(out.metrics)
                    ids = pending_ids.pop(c.index, []) + list(c.token_ids)
                    if not (text or reasoning or tool_calls or finish):
                        pending_ids[c.index] = ids  # partial UTF-8: carried to the next delta
                        continue
                    delta = Delta(
                        text=text,
                        reasoning=reasoning,
                        tool_calls=tool_calls,
                        token_ids=tuple(ids),
                        logprobs=_logprobs(c.logprobs, c.token_ids)
                        if c.logprobs is not None
                        else None,
                        index=c.index,
                        finish_reason=finish,
                        stop_reason=c.stop_reason,
                        usage=usage,
                        metrics=metrics,
                    )
                    if unstarted and c.index in unstarted:  # a choice's first delta
                        unstarted.discard(c.index)
                        delta = replace(
                            delta, prompt_token_ids=prompt_out, prompt_logprobs=prompt_logprobs
                        )
                    yield delta

            else:
                return
            # vLLM ended the request with its "error" finish (FinishReason.ERROR), which it
            # defines as a retryable request-level failure. Seen here: its multimodal cache drift
            # (an image rendered before, e.g. by prompt_token_ids, is taken for cached in the
            # engine core, which never got it; vLLM then drops the entry, so a request rendered
            # again carries the image). Its server answers 500 and leaves the retry to the
            # client: the client is this loop, once, while nothing has been streamed.
            if completion_tokens or attempt == 2:
                raise GenerationFailedError(
                    f"vLLM failed this request on {runtime.model!r} (finish_reason 'error', "
                    f"{attempt} attempt(s)). The engine keeps serving; sending the request again "
                    "may work (see the log above for the cause)."
                )
            engine_input = await render(runtime, request)


def _logprobs(
    steps: Sequence[Mapping[int, Any]], token_ids: Sequence[int]
) -> tuple[TokenLogprob, ...]:
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
                    (lp.decoded_token or "", float(lp.logprob))
                    for tid, lp in ranked
                    if tid != token_id or len(step) == 1
                ),
                top_token_ids=tuple(tid for tid, lp in ranked if tid != token_id or len(step) == 1),
            )
        )
    return tuple(out)


def _prompt_logprobs(
    positions: Sequence[Mapping[int, Any] | None],
) -> tuple[tuple[RankedLogprob, ...] | None, ...]:
    """vLLM's per-prompt-position ``{token_id: Logprob}`` dicts (``None`` for the first)."""
    return tuple(
        None
        if step is None
        else tuple(
            RankedLogprob(tid, float(lp.logprob), lp.rank, lp.decoded_token)
            for tid, lp in step.items()
        )
        for step in positions
    )
