"""Typed deltas: what :meth:`Engine.astream` and :meth:`Engine.stream` yield.

A :class:`Delta` is built straight from one vLLM ``RequestOutputKind.DELTA`` output; nothing here
diffs cumulative text.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from vllm_inline.engine.life.metrics import RequestMetrics

__all__ = ["Delta", "RankedLogprob", "TokenLogprob", "ToolCallDelta", "Usage", "coalesce"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request, from the real token ids."""

    prompt_tokens: int
    """Tokens in the rendered prompt."""
    completion_tokens: int
    """Tokens generated, over all choices."""
    cached_tokens: int = 0
    """Prompt tokens found in vLLM's prefix cache (not computed again); part of
    ``prompt_tokens``."""

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens``."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call, as OpenAI streams them.

    The first fragment of a call carries ``id`` and ``name``; later ones append to
    ``arguments`` (a JSON text). Fragments of one call share ``index``.
    """

    index: int
    """Position of the call in the message (0 for the first call)."""
    id: str | None = None
    """Call id (first fragment only)."""
    name: str | None = None
    """Function name (first fragment only)."""
    arguments: str = ""
    """The next piece of the JSON arguments."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log probability of one generated token, with its top alternatives."""

    token: str
    """Decoded text of the token."""
    token_id: int
    """Token id."""
    logprob: float
    """Log probability of the token."""
    top_logprobs: tuple[tuple[str, float], ...] = ()
    """The most likely tokens at this step, as ``(text, logprob)``."""
    top_token_ids: tuple[int, ...] = ()
    """The ids of :attr:`top_logprobs`, in the same order."""


@dataclass(frozen=True, slots=True)
class RankedLogprob:
    """One token's log probability at a prompt position, as vLLM reports it."""

    token_id: int
    """Token id."""
    logprob: float
    """Log probability of the token there."""
    rank: int | None
    """Its rank among all tokens at that position (1: the most likely)."""
    token: str | None
    """Decoded text of the token."""


@dataclass(frozen=True, slots=True)
class Delta:
    """One step of a streamed answer.

    The last delta of a choice has ``finish_reason`` set; the last delta of the request also
    carries ``usage`` and ``metrics``.
    """

    text: str = ""
    """New answer text (never a special token, never text after a stop)."""
    reasoning: str = ""
    """New reasoning text, when a reasoning parser is active."""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    """New tool-call fragments, when a tool parser is active."""
    token_ids: tuple[int, ...] = ()
    """Ids of the tokens generated in this step."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Per-token log probabilities, when requested."""
    index: int = 0
    """Choice index (``n > 1``)."""
    finish_reason: str | None = None
    """``"stop"``, ``"length"``, ``"tool_calls"`` or ``"abort"`` on the last delta of a choice."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended the choice, if any."""
    usage: Usage | None = None
    """Token counts, on the last delta of the request."""
    metrics: RequestMetrics | None = None
    """Timings of the request (queue, first token, prefill, decode, end to end), on the last
    delta of the request."""
    prompt_token_ids: tuple[int, ...] | None = None
    """The rendered prompt's token ids, on the first delta of each choice of a request that
    asked for them (``return_prompt_token_ids=True``)."""
    prompt_logprobs: tuple[tuple[RankedLogprob, ...] | None, ...] | None = None
    """Per prompt token (the first has none: ``None``), its log probability and those of the
    most likely tokens there, on the first delta of each choice of a request that asked for
    ``prompt_logprobs``."""


def coalesce(deltas: list[Delta]) -> list[Delta]:
    """Join consecutive deltas of the same choice into one, for a consumer that fell behind.

    Still true deltas: text, reasoning, token ids and logprobs concatenate in order, tool-call
    fragments follow one another, and the later delta's ``finish_reason``, ``stop_reason``,
    ``usage`` and ``metrics`` are kept (the earlier one has none: it was not the last). Deltas
    of different choices (``n > 1``) stay apart.
    """
    out: list[Delta] = []
    run: list[Delta] = []
    for delta in deltas:
        if run:
            prev = run[-1]
            if (
                prev.index == delta.index
                and prev.finish_reason is None
                and (prev.logprobs is None) == (delta.logprobs is None)
            ):
                run.append(delta)
                continue
            out.append(_joined(run))
        run = [delta]
    if run:
        out.append(_joined(run))
    return out


def _joined(run: list[Delta]) -> Delta:
    """One delta for a run of joinable ones, built once (a run of k pending deltas is one
    object and one string join, not k - 1 intermediate deltas: the cost stays flat per token
    however far the consumer fell behind)."""
    if len(run) == 1:
        return run[0]
    last = run[-1]
    chain = itertools.chain.from_iterable
    logprobs = None
    if last.logprobs is not None:
        logprobs = tuple(chain([d.logprobs for d in run]))  # type: ignore[misc]
    return Delta(
        text="".join([d.text for d in run]),
        reasoning="".join([d.reasoning for d in run]),
        tool_calls=tuple(chain([d.tool_calls for d in run])),
        token_ids=tuple(chain([d.token_ids for d in run])),
        logprobs=logprobs,
        index=last.index,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        usage=last.usage,
        metrics=last.metrics,
        prompt_token_ids=run[0].prompt_token_ids,
        prompt_logprobs=run[0].prompt_logprobs,
    )
