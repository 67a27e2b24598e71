"""GPU-rate simulation: our per-token budget when the engine is far faster than these CPUs.

A BENCHMARK HARNESS, NOT A TEST: nothing here shows that streaming works (the tests do that on
real engines). It measures what vllm-inline and the frameworks cost per token at GPU rates.

A real engine is started on a tiny scripted model, then its ``AsyncLLM`` is wrapped
(:class:`SimulatedLLM`): ``generate`` is replaced by a stand-in that emits one DELTA
``RequestOutput`` per stream per simulated engine step, ``streams / step`` tokens/s in all, while
everything else (renderer, sampling params, the request path, parsers, ``Delta``, the bridge,
the LangChain and LlamaIndex converters and the frameworks' own per-chunk work) is the real code.
Each emitted token carries a serial number in its text; the consumer looks up when it was
emitted, which gives the consumer lag (emitted -> seen by the consumer).

Per path and offered rate: delivered tok/s (first to last token seen), lag p50/p99, client CPU
per token (this process's CPU time over delivered tokens, requests' start included, less the
stand-in's own cost measured alone), and the highest offered rate each path sustains with lag
p99 <= 50 ms.

    python benchmarks/gpu_sim.py [--streams 256] [--rates 6400,12800,25600,51200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import percentile  # noqa: E402

LAG_BUDGET_S = 0.050
PATH_NAMES = (
    "stand-in alone",
    "Engine.astream",
    "Engine.stream",
    "ChatVLLM.astream",
    "ChatVLLM.stream",
    "VLLM.astream_chat",
    "VLLM.stream_chat",
)
ASYNC_TARGET = 25_600


class SimulatedLLM:
    """A real ``AsyncLLM`` whose ``generate`` is a stand-in emitting at an offered rate."""

    def __init__(self, real: Any, step_s: float) -> None:
        self._real = real
        self.step_s = step_s
        """Simulated engine step: every running stream gets one token per step."""
        self.emitted: list[float] = []
        """``perf_counter()`` at which token ``serial`` was emitted."""
        self._tick: asyncio.Future[None] | None = None
        self._clock: asyncio.Task[None] | None = None
        self._running = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def _run_clock(self) -> None:
        loop = asyncio.get_running_loop()
        next_step = loop.time()
        while self._running:
            next_step += self.step_s
            await asyncio.sleep(max(0.0, next_step - loop.time()))
            tick, self._tick = self._tick, loop.create_future()
            if tick is not None:
                tick.set_result(None)

    async def generate(self, engine_input: Any, params: Any, request_id: str, **_: Any) -> Any:
        from vllm.outputs import CompletionOutput, RequestOutput

        loop = asyncio.get_running_loop()
        if self._tick is None:
            self._tick = loop.create_future()
        self._running += 1
        if self._clock is None or self._clock.done():
            self._clock = loop.create_task(self._run_clock())
        prompt_ids = list(engine_input["prompt_token_ids"])
        emitted = self.emitted
        try:
            for i in range(params.max_tokens):
                await asyncio.shield(self._tick)  # type: ignore[arg-type]
                serial = len(emitted)
                emitted.append(time.perf_counter())
                last = i == params.max_tokens - 1
                out = CompletionOutput(
                    index=0, text=f"{serial},", token_ids=[7], cumulative_logprob=None,
                    logprobs=None, finish_reason="length" if last else None,
                )
                yield RequestOutput(request_id, None, prompt_ids, None, [out], finished=last)
        finally:
            self._running -= 1


class Lags:
    """Consumer lags of the serials found in the text a consumer saw (thread-safe appends)."""

    def __init__(self, emitted: list[float]) -> None:
        self.emitted = emitted
        self.values: list[float] = []
        self.tokens = 0
        self.first = self.last = 0.0

    def saw(self, text: str) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        emitted, values = self.emitted, self.values
        for serial in text.split(",")[:-1]:
            values.append(now - emitted[int(serial)])
            self.tokens += 1


def _consumers(engine: Any, chat: Any, li: Any, tokens: int) -> dict[str, Any]:
    from llama_index.core.llms import ChatMessage

    messages = [{"role": "user", "content": "Hi"}]
    kw = {"max_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    li_messages = [ChatMessage(role="user", content="Hi")]

    async def engine_async(lags: Lags) -> None:
        async for d in engine.astream(messages, **kw):
            lags.saw(d.text)

    def engine_sync(lags: Lags) -> None:
        for d in engine.stream(messages, **kw):
            lags.saw(d.text)

    async def lc_async(lags: Lags) -> None:
        async for c in chat.astream("Hi", **kw):
            lags.saw(c.content)

    def lc_sync(lags: Lags) -> None:
        for c in chat.stream("Hi", **kw):
            lags.saw(c.content)

    async def li_async(lags: Lags) -> None:
        async for r in await li.astream_chat(li_messages, **kw):
            lags.saw(r.delta or "")

    def li_sync(lags: Lags) -> None:
        for r in li.stream_chat(li_messages, **kw):
            lags.saw(r.delta or "")

    return {
        "Engine.astream": engine_async, "Engine.stream": engine_sync,
        "ChatVLLM.astream": lc_async, "ChatVLLM.stream": lc_sync,
        "VLLM.astream_chat": li_async, "VLLM.stream_chat": li_sync,
    }


def _stand_in_alone(runtime: Any, sim: SimulatedLLM, streams: int, tokens: int, lags: Lags) -> None:
    """The stand-in's own cost: its outputs consumed on the engine loop, nothing of ours."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens)

    async def one(i: int) -> None:
        async for out in sim.generate({"prompt_token_ids": [1]}, params, f"alone-{i}"):
            lags.saw(out.outputs[0].text)

    async def all_streams() -> None:
        await asyncio.gather(*(one(i) for i in range(streams)))

    runtime.loop.submit(all_streams()).result()


def measure(
    name: str, consume: Callable[..., Any] | None, runtime: Any, sim: SimulatedLLM,
    streams: int, tokens: int,
) -> dict[str, Any]:
    sim.emitted.clear()
    lags = Lags(sim.emitted)
    cpu0, t0 = time.process_time(), time.perf_counter()
    if consume is None:
        _stand_in_alone(runtime, sim, streams, tokens, lags)
    elif asyncio.iscoroutinefunction(consume):
        async def all_streams() -> None:
            await asyncio.gather(*(consume(lags) for _ in range(streams)))

        asyncio.run(all_streams())
    else:
        threads = [threading.Thread(target=consume, args=(lags,)) for _ in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert lags.tokens == streams * tokens, (name, lags.tokens, streams * tokens)
    return {
        "path": name,
        # Steady state: from the first token any consumer saw to the last (the requests' start,
        # rendering included, is not a rate).
        "delivered_tok_s": lags.tokens / max(lags.last - lags.first, 1e-9),
        "wall_s": wall,
        "lag_p50_ms": percentile(lags.values, 50) * 1e3,
        "lag_p99_ms": percentile(lags.values, 99) * 1e3,
        "cpu_us_per_token": cpu / lags.tokens * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--rates", default="6400,12800,25600,51200,102400",
                    help="offered total tok/s, comma-separated, increasing")
    ap.add_argument("--seconds", type=float, default=2.0, help="simulated seconds per run")
    ap.add_argument("--quick", action="store_true", help="64 streams, two rates, 1 s runs")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.streams, args.rates, args.seconds = 64, "6400,25600", 1.0
    rates = [int(r) for r in args.rates.split(",")]

    from vllm_inline.engine import get_engine
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM
    from vllm_inline.testing import scripted_model

    model = scripted_model("demo")
    kwargs = {**model.engine_kwargs, "max_model_len": 4096}
    engine = get_engine(model.path, **kwargs).start()
    runtime = engine.runtime
    real = runtime.llm
    chat = ChatVLLM(model=model.path, vllm_kwargs=kwargs)
    li = VLLM(model=model.path, vllm_kwargs=kwargs)
    print(f"SIMULATION (stand-in engine, not vLLM's model): {args.streams} streams, "
          f"rates {rates} tok/s, {args.seconds} s per run", flush=True)
    results: list[dict[str, Any]] = []
    ceilings: dict[str, int] = {}
    try:
        for name in PATH_NAMES:
            for rate in rates:
                step = args.streams / rate
                tokens = max(10, min(3500, int(args.seconds / step)))
                sim = SimulatedLLM(real, step)
                runtime.llm = sim
                consume = None
                if name != "stand-in alone":
                    consume = _consumers(engine, chat, li, tokens)[name]
                row = measure(name, consume, runtime, sim, args.streams, tokens)
                row["offered_tok_s"] = rate
                results.append(row)
                print(f"  {name:20s} offered {rate:>7d}  delivered {row['delivered_tok_s']:9.0f} "
                      f"lag p50 {row['lag_p50_ms']:7.1f} ms  p99 {row['lag_p99_ms']:8.1f} ms  "
                      f"cpu {row['cpu_us_per_token']:6.1f} us/tok", flush=True)
                if row["lag_p99_ms"] > LAG_BUDGET_S * 1e3:
                    break
                ceilings[name] = rate
    finally:
        runtime.llm = real
        engine.shutdown()
    alone = {r["offered_tok_s"]: r["cpu_us_per_token"] for r in results if r["path"] == "stand-in alone"}
    print("\nceilings (highest offered rate with lag p99 <= 50 ms), and our cost per token")
    for name in PATH_NAMES[1:]:
        rows = [r for r in results if r["path"] == name]
        own = [r["cpu_us_per_token"] - alone.get(r["offered_tok_s"], 0.0) for r in rows]
        ceiling = ceilings.get(name, 0)
        target = ""
        if name.split(".")[1].startswith("a"):
            met = "met" if ceiling >= ASYNC_TARGET else "MISSED"
            target = f"  target >= {ASYNC_TARGET} tok/s over {args.streams} streams: {met}"
        print(f"  {name:20s} ceiling {ceiling:>7d} tok/s  own cpu {min(own):5.1f}-{max(own):5.1f} "
              f"us/tok{target}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"streams": args.streams, "results": results, "ceilings": ceilings}, f, indent=1)


if __name__ == "__main__":
    main()
