"""The stand-in engine of ``gpu_sim.py``, and the consumer lags read from the tokens it emits.

:class:`SimulatedLLM` wraps a real ``AsyncLLM`` and replaces its engine by a stand-in modelled on
vLLM's: one output-handler task emits one DELTA ``RequestOutput`` per running request per
simulated engine step, at the engine's pace whatever the consumers do, into each request's vLLM
``RequestOutputCollector``. Each token's text is its serial number (``"17,"``), and the stand-in
notes when it put each serial into its collector; :class:`Lags` (one :class:`StreamLags` per
stream) reads the serials in what the consumers see and gives the consumer lag of every token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["Lags", "SimulatedLLM", "StreamLags"]


class _Running:
    """One request the stand-in is generating for: its vLLM output collector and progress."""

    __slots__ = (
        "collector",
        "held",
        "held_text",
        "interval",
        "max_tokens",
        "produced",
        "prompt_ids",
    )

    def __init__(
        self, collector: Any, prompt_ids: list[int], max_tokens: int, interval: int
    ) -> None:
        self.collector = collector
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.interval = interval
        """vLLM's ``stream_interval`` for this request: tokens per output after the first."""
        self.produced = 0
        self.held = 0
        """Tokens produced and not put into the collector yet (``stream_interval`` > 1)."""
        self.held_text = ""


class SimulatedLLM:
    """A real ``AsyncLLM`` whose engine is a stand-in producing tokens at an offered rate.

    Modelled on ``AsyncLLM`` (vllm/v1/engine/async_llm.py): one output-handler task (the clock)
    turns every simulated engine step into one DELTA ``RequestOutput`` per running request, at
    the engine's pace whatever the consumers do, and ``put``s it into that request's vLLM
    ``RequestOutputCollector``, which merges DELTA outputs while its consumer lags (as vLLM's
    does). ``generate`` registers a collector and yields ``q.get_nowait() or await q.get()``
    until the request finishes, exactly as ``AsyncLLM.generate`` does; closing it unregisters
    the request (vLLM aborts it). Between chunks of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` outputs
    the handler yields to the loop, as vLLM's does. With vLLM's ``stream_interval`` (the
    request's, or the engine's if larger) above 1, the handler holds a request's tokens as vLLM's
    output processor does: it puts the first token, then one output per ``stream_interval``
    tokens, and the last one; a held token's lag counts from the step that produced it.
    """

    def __init__(self, real: Any, step_s: float) -> None:
        from vllm import envs

        self._real = real
        self.step_s = step_s
        """Simulated engine step: every running stream gets one token per step."""
        self.emitted: list[float] = []
        """``perf_counter()`` at which token ``serial`` was put into its collector."""
        self.handler_delay: list[tuple[float, float]] = []
        """Per step: when, and how late against the step's due time, the handler put its
        outputs."""
        self.outputs = 0
        """Outputs ``generate`` yielded."""
        self.merged = 0
        """Of those, how many the collector had merged (more tokens than ``stream_interval``)."""
        self.cpu_marks: list[tuple[float, float]] = []
        """Per step: ``perf_counter()`` and this process's ``process_time()`` after it."""
        self._requests: dict[str, _Running] = {}
        self._handler: asyncio.Task[None] | None = None
        self._chunk = envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def _output_handler(self) -> None:
        from vllm.outputs import CompletionOutput, RequestOutput

        loop = asyncio.get_running_loop()
        offset = time.perf_counter() - loop.time()
        next_step = loop.time()
        emitted, requests, chunk = self.emitted, self._requests, self._chunk
        while requests:
            next_step += self.step_s
            delay = next_step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # else: behind, as when vLLM's handler finds the next step's outputs already queued
            # (``await queue.get()`` returns without yielding): it goes straight on, and the
            # collectors of requests whose consumers have not run yet merge the two steps.
            running = list(requests.values())
            for start in range(0, len(running), chunk):
                for r in running[start : start + chunk]:
                    r.produced += 1
                    last = r.produced == r.max_tokens
                    emitted.append(time.perf_counter())
                    r.held += 1
                    r.held_text += f"{len(emitted) - 1},"
                    # vLLM's OutputProcessor with stream_interval: the first token, then every
                    # ``interval`` tokens, and the last.
                    if not (last or r.produced == 1 or r.held >= r.interval):
                        continue
                    out = CompletionOutput(
                        index=0,
                        text=r.held_text,
                        token_ids=[7] * r.held,
                        cumulative_logprob=None,
                        logprobs=None,
                        finish_reason="length" if last else None,
                    )
                    r.held, r.held_text = 0, ""
                    request_id = r.collector.request_id
                    r.collector.put(
                        RequestOutput(request_id, None, r.prompt_ids, None, [out], finished=last)
                    )
                    if last:
                        requests.pop(request_id, None)
                if start + chunk < len(running):
                    await asyncio.sleep(0)  # as vLLM's handler does between chunks
            now = time.perf_counter()
            self.handler_delay.append((now, now - (next_step + offset)))
            self.cpu_marks.append((now, time.process_time()))

    async def generate(self, engine_input: Any, params: Any, request_id: str, **_: Any) -> Any:
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.output_processor import RequestOutputCollector

        q = RequestOutputCollector(RequestOutputKind.DELTA, request_id)
        engine_interval = self._real.vllm_config.scheduler_config.stream_interval
        interval = max(params.stream_interval or 1, engine_interval)
        self._requests[request_id] = _Running(
            q, list(engine_input["prompt_token_ids"]), params.max_tokens, interval
        )
        if self._handler is None or self._handler.done():
            self._handler = asyncio.get_running_loop().create_task(self._output_handler())
        try:
            finished = False
            while not finished:
                out = q.get_nowait() or await q.get()
                finished = out.finished
                self.outputs += 1
                self.merged += len(out.outputs[0].token_ids) > interval
                yield out
        finally:
            self._requests.pop(request_id, None)  # vLLM aborts a request closed early


class Lags:
    """Consumer lags of the serials found in the texts consumers saw (thread-safe appends)."""

    def __init__(self, emitted: list[float]) -> None:
        self.emitted = emitted
        self.values: list[float] = []
        """Per token seen: emitted (put into its collector) -> seen by the consumer, in s."""
        self.seen: list[float] = []
        """Per token seen: when the consumer saw it."""
        self.streams: list[StreamLags] = []

    @property
    def tokens(self) -> int:
        return len(self.values)

    def stream(self) -> StreamLags:
        """A recorder for one stream's consumer."""
        s = StreamLags(self)
        self.streams.append(s)
        return s

    def window(self) -> tuple[float, float]:
        """The steady state: from the last stream's first token to the first stream's last one.

        The requests' staggered start (256 prompts rendered at once on the engine loop while
        the first streams already run) and end are not the rate under test; if the streams
        barely overlap, the window is first to last token seen.
        """
        firsts = [s.first for s in self.streams if s.first]
        lasts = [s.last for s in self.streams if s.last]
        lo, hi = max(firsts), min(lasts)
        if hi - lo < 0.25 * (max(lasts) - min(firsts)):
            lo, hi = min(firsts), max(lasts)
        return lo, hi

    def steady(self) -> list[float]:
        """Lags of the tokens seen in :meth:`window`."""
        lo, hi = self.window()
        return [v for v, t in zip(self.values, self.seen) if lo <= t <= hi]

    def delivered_tok_s(self) -> float:
        """Tokens seen in :meth:`window`, per second."""
        lo, hi = self.window()
        return sum(1 for t in self.seen if lo <= t <= hi) / max(hi - lo, 1e-9)


class StreamLags:
    """One stream's recorder: feeds the shared :class:`Lags`."""

    __slots__ = ("first", "lags", "last")

    def __init__(self, lags: Lags) -> None:
        self.lags = lags
        self.first = self.last = 0.0

    def saw(self, text: str) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        emitted, values, seen = self.lags.emitted, self.lags.values, self.lags.seen
        for serial in text.split(",")[:-1]:  # several serials when vLLM's collector merged
            values.append(now - emitted[int(serial)])
            seen.append(now)
