"""GPU-rate simulation: our per-token budget when the engine is far faster than these CPUs.

A BENCHMARK HARNESS, NOT A TEST: nothing here shows that streaming works (the tests do that on
real engines). It measures what vllm-inline and the frameworks cost per token at GPU rates.

A real engine is started on a tiny scripted model, then its ``AsyncLLM`` is wrapped
(:class:`SimulatedLLM`): its engine is replaced by a stand-in modelled on vLLM's ``AsyncLLM``.
One output-handler task emits one DELTA ``RequestOutput`` per running request per simulated
engine step (``streams / step`` tokens/s in all), at the engine's pace whatever the consumers
do, into each request's vLLM ``RequestOutputCollector``, which merges the DELTA outputs a
lagging consumer has not taken yet; ``generate`` yields from the collector as
``AsyncLLM.generate`` does. Everything else (renderer, sampling params, the request path,
parsers, ``Delta``, the bridge, the LangChain and LlamaIndex converters and the frameworks' own
per-chunk work) is the real code. ``BareChatModel.astream`` and ``BareLLM.astream_chat``
(:mod:`bare_frameworks`) are baselines: LangChain's and LlamaIndex's own streaming over
``Engine.astream`` with no integration work, what any integration of theirs costs at least. Each emitted token carries a serial number in its text; the
consumer looks up when it was emitted (put into its collector), which gives the consumer lag.

(An earlier version emitted each token only when its consumer pulled, so a lagging consumer
slowed the stand-in down and every token went through the request path one by one; vLLM does
neither. Its figures are replaced.)

Per path and offered rate, over the steady state (from the last stream's first token to the
first stream's last): delivered tok/s, lag p50/p99, how late the output handler ran (the loop
was busy), and client CPU per token (this process's CPU time over delivered tokens, requests'
start included; the stand-in's own cost, measured alone, is subtracted in the summary). A path
sustains a rate if it delivers >= 95 % of it with lag p99 <= 50 ms; the ceiling is the highest
offered rate it sustains.

    python benchmarks/gpu_sim.py [--streams 256] [--rates 6400,12800,25600] [--quick]
                                 [--paths ChatVLLM.astream,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import percentile

LAG_BUDGET_S = 0.050
DELIVERY_FLOOR = 0.95
"""A path sustains an offered rate if it delivers at least this share of it, lag p99 in budget."""
PATH_NAMES = (
    "stand-in alone",
    "Engine.astream",
    "Engine.stream",
    "BareChatModel.astream",
    "ChatVLLM.astream",
    "ChatVLLM.stream",
    "BareLLM.astream_chat",
    "VLLM.astream_chat",
    "VLLM.stream_chat",
)
"""``BareChatModel`` and ``BareLLM`` (:mod:`bare_frameworks`) are baselines, not our paths: the
frameworks' own streaming over ``Engine.astream`` with no integration work."""
ASYNC_TARGET = 25_600


class _Running:
    """One request the stand-in is generating for: its vLLM output collector and progress."""

    __slots__ = ("collector", "max_tokens", "produced", "prompt_ids")

    def __init__(self, collector: Any, prompt_ids: list[int], max_tokens: int) -> None:
        self.collector = collector
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.produced = 0


class SimulatedLLM:
    """A real ``AsyncLLM`` whose engine is a stand-in producing tokens at an offered rate.

    Modelled on ``AsyncLLM`` (vllm/v1/engine/async_llm.py): one output-handler task (the clock)
    turns every simulated engine step into one DELTA ``RequestOutput`` per running request, at
    the engine's pace whatever the consumers do, and ``put``s it into that request's vLLM
    ``RequestOutputCollector``, which merges DELTA outputs while its consumer lags (as vLLM's
    does). ``generate`` registers a collector and yields ``q.get_nowait() or await q.get()``
    until the request finishes, exactly as ``AsyncLLM.generate`` does; closing it unregisters
    the request (vLLM aborts it). Between chunks of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` outputs
    the handler yields to the loop, as vLLM's does.
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
        """Of those, how many the collector had merged (more than one token)."""
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
                    serial = len(emitted)
                    out = CompletionOutput(
                        index=0,
                        text=f"{serial},",
                        token_ids=[7],
                        cumulative_logprob=None,
                        logprobs=None,
                        finish_reason="length" if last else None,
                    )
                    request_id = r.collector.request_id
                    emitted.append(time.perf_counter())
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
        self._requests[request_id] = _Running(
            q, list(engine_input["prompt_token_ids"]), params.max_tokens
        )
        if self._handler is None or self._handler.done():
            self._handler = asyncio.get_running_loop().create_task(self._output_handler())
        try:
            finished = False
            while not finished:
                out = q.get_nowait() or await q.get()
                finished = out.finished
                self.outputs += 1
                self.merged += len(out.outputs[0].token_ids) > 1
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


def _consumers(engine: Any, chat: Any, li: Any, tokens: int) -> dict[str, Any]:
    from bare_frameworks import BareChatModel, BareLLM
    from llama_index.core.llms import ChatMessage

    bare_chat, bare_li = BareChatModel(engine=engine), BareLLM(engine=engine)

    messages = [{"role": "user", "content": "Hi"}]
    kw = {"max_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    li_messages = [ChatMessage(role="user", content="Hi")]

    async def engine_async(lags: StreamLags) -> None:
        async for d in engine.astream(messages, **kw):
            lags.saw(d.text)

    def engine_sync(lags: StreamLags) -> None:
        for d in engine.stream(messages, **kw):
            lags.saw(d.text)

    async def lc_async(lags: StreamLags) -> None:
        async for c in chat.astream("Hi", **kw):
            lags.saw(c.content)

    def lc_sync(lags: StreamLags) -> None:
        for c in chat.stream("Hi", **kw):
            lags.saw(c.content)

    async def bare_lc_async(lags: StreamLags) -> None:
        async for c in bare_chat.astream("Hi", **kw):
            lags.saw(c.content)

    async def bare_li_async(lags: StreamLags) -> None:
        async for r in await bare_li.astream_chat(li_messages, **kw):
            lags.saw(r.delta or "")

    async def li_async(lags: StreamLags) -> None:
        async for r in await li.astream_chat(li_messages, **kw):
            lags.saw(r.delta or "")

    def li_sync(lags: StreamLags) -> None:
        for r in li.stream_chat(li_messages, **kw):
            lags.saw(r.delta or "")

    return {
        "Engine.astream": engine_async,
        "Engine.stream": engine_sync,
        "BareChatModel.astream": bare_lc_async,
        "ChatVLLM.astream": lc_async,
        "ChatVLLM.stream": lc_sync,
        "BareLLM.astream_chat": bare_li_async,
        "VLLM.astream_chat": li_async,
        "VLLM.stream_chat": li_sync,
    }


def _stand_in_alone(runtime: Any, sim: SimulatedLLM, streams: int, tokens: int, lags: Lags) -> None:
    """The stand-in's own cost: its outputs consumed on the engine loop, nothing of ours."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens)

    async def one(i: int) -> None:
        stream = lags.stream()
        async for out in sim.generate({"prompt_token_ids": [1]}, params, f"alone-{i}"):
            stream.saw(out.outputs[0].text)

    async def all_streams() -> None:
        await asyncio.gather(*(one(i) for i in range(streams)))

    runtime.loop.submit(all_streams()).result()


def _run(
    consume: Callable[..., Any] | None,
    runtime: Any,
    sim: SimulatedLLM,
    streams: int,
    tokens: int,
    lags: Lags,
) -> None:
    if consume is None:
        _stand_in_alone(runtime, sim, streams, tokens, lags)
    elif asyncio.iscoroutinefunction(consume):

        async def all_streams() -> None:
            await asyncio.gather(*(consume(lags.stream()) for _ in range(streams)))

        asyncio.run(all_streams())
    else:
        threads = [threading.Thread(target=consume, args=(lags.stream(),)) for _ in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class GcPauses:
    """The garbage collector's pauses while it is installed (``gc.callbacks``): every thread
    of the process waits for a collection, so each one is lag for every stream.

    A pause is the collecting thread's CPU time between the two callbacks, not the wall time:
    entering the "stop" callback is a Python call, where the interpreter hands over to the
    threads that waited during the collection, and the wall time then counts their turns too
    (a synthetic heap with a busy second thread: wall 45-48 ms, CPU 29-41 ms,
    ``gc.DEBUG_STATS``' own clock 26-37 ms).
    """

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int, float]] = []
        """``(end perf_counter, generation, seconds)`` per collection."""
        self._start = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        cpu = time.thread_time()
        if phase == "start":
            self._start = cpu
        else:
            self.pauses.append((time.perf_counter(), info["generation"], cpu - self._start))

    def within(self, lo: float, hi: float) -> dict[str, float]:
        full = [d for t, g, d in self.pauses if lo <= t <= hi and g == 2]
        every = [d for t, g, d in self.pauses if lo <= t <= hi]
        return {
            "gc_full_collections": len(full),
            "gc_full_max_ms": max(full, default=0.0) * 1e3,
            "gc_total_ms": sum(every) * 1e3,
        }


def measure(
    name: str,
    consume: Callable[..., Any] | None,
    runtime: Any,
    sim: SimulatedLLM,
    streams: int,
    tokens: int,
) -> dict[str, Any]:
    sim.emitted.clear()
    lags = Lags(sim.emitted)
    gc_pauses = GcPauses()
    cpu0, t0 = time.process_time(), time.perf_counter()
    gc_pauses.start()
    try:
        _run(consume, runtime, sim, streams, tokens, lags)
    finally:
        gc_pauses.stop()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert lags.tokens == streams * tokens, (name, lags.tokens, streams * tokens)
    steady, (lo, hi) = lags.steady(), lags.window()
    marks = [m for m in sim.cpu_marks if lo <= m[0] <= hi]
    steady_cpu = float("nan")
    if len(marks) >= 2:
        (t1, c1), (t2, c2) = marks[0], marks[-1]
        seen = sum(1 for t in lags.seen if t1 < t <= t2)
        steady_cpu = (c2 - c1) / max(seen, 1) * 1e6
    return {
        "path": name,
        # Steady state: from the first token any consumer saw to the last (the requests' start,
        # rendering included, is not a rate).
        "delivered_tok_s": lags.delivered_tok_s(),
        "wall_s": wall,
        "lag_p50_ms": percentile(steady, 50) * 1e3,
        "lag_p99_ms": percentile(steady, 99) * 1e3,
        "lag_p99_all_ms": percentile(lags.values, 99) * 1e3,
        "window_s": hi - lo,
        "cpu_us_per_token": cpu / lags.tokens * 1e6,
        # The same over the steady window only (the requests' start left out).
        "steady_cpu_us_per_token": steady_cpu,
        "collector_merged_share": sim.merged / max(sim.outputs, 1),
        # Share of one core this process got in the window: well below 1 while it falls behind
        # means the host (other processes), not this process, ran out of CPU.
        "steady_cpu_share": (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
        if len(marks) >= 2
        else float("nan"),
        # How late the stand-in's output handler put its outputs (the loop was busy): lag that
        # the consumer lag above does not show, as in vLLM, where the engine core keeps going.
        **gc_pauses.within(lo, hi),
        "handler_delay_p99_ms": percentile([d for t, d in sim.handler_delay if lo <= t <= hi], 99)
        * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument(
        "--rates",
        default="6400,12800,25600,51200,102400",
        help="offered total tok/s, comma-separated, increasing",
    )
    ap.add_argument("--seconds", type=float, default=2.0, help="simulated seconds per run")
    ap.add_argument("--quick", action="store_true", help="64 streams, two rates, 1 s runs")
    ap.add_argument(
        "--json",
        help="write the results here (default: benchmarks/results/gpu_sim.json, not with --quick)",
    )
    ap.add_argument(
        "--paths", help="comma-separated paths to run (the stand-in alone always runs first)"
    )
    ap.add_argument(
        "--backpressure",
        choices=["on", "off", "both"],
        default="on",
        help="off: pumps never wait for their consumers (as before engine/loop/window.py); both: "
        "each path with and without, one after the other, in this one process",
    )
    args = ap.parse_args()
    if args.quick:
        args.streams, args.rates, args.seconds = 64, "6400,25600", 1.0
    elif args.json is None:
        here = os.path.dirname(os.path.abspath(__file__))
        args.json = os.path.join(here, "results", "gpu_sim.json")
    rates = [int(r) for r in args.rates.split(",")]
    names = list(PATH_NAMES)
    if args.paths:
        wanted = args.paths.split(",")
        unknown = set(wanted) - set(PATH_NAMES)
        if unknown:
            ap.error(f"unknown --paths {sorted(unknown)}; choose from {', '.join(PATH_NAMES[1:])}")
        names = [n for n in PATH_NAMES if n == PATH_NAMES[0] or n in wanted]

    from vllm_inline.engine import get_engine, window
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
    print(
        f"SIMULATION (stand-in engine, not vLLM's model): {args.streams} streams, "
        f"rates {rates} tok/s, {args.seconds} s per run",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    ceilings: dict[str, int] = {}
    started, load_before = time.time(), os.getloadavg()
    on = window.WINDOW
    modes = {"on": [on], "off": [None], "both": [on, None]}[args.backpressure]
    labels = [(names[0], names[0], on)]
    labels += [(n + ("" if w else " [no backpressure]"), n, w) for n in names[1:] for w in modes]
    try:
        for name, path, pump_window in labels:
            # ``None``: the pump never waits (a window no consumer can fill).
            window.WINDOW = pump_window or 1 << 62
            for rate in rates:
                step = args.streams / rate
                tokens = max(10, min(3500, int(args.seconds / step)))
                sim = SimulatedLLM(real, step)
                runtime.llm = sim
                consume = None
                if path != "stand-in alone":
                    consume = _consumers(engine, chat, li, tokens)[path]
                row = measure(name, consume, runtime, sim, args.streams, tokens)
                row["offered_tok_s"] = rate
                results.append(row)
                row["sustained"] = (
                    row["lag_p99_ms"] <= LAG_BUDGET_S * 1e3
                    and row["delivered_tok_s"] >= DELIVERY_FLOOR * rate
                )
                print(
                    f"  {name:38s} offered {rate:>7d}  delivered {row['delivered_tok_s']:9.0f} "
                    f"lag p50 {row['lag_p50_ms']:7.1f} ms  p99 {row['lag_p99_ms']:8.1f} ms  "
                    f"(all {row['lag_p99_all_ms']:7.1f})  handler late p99 "
                    f"{row['handler_delay_p99_ms']:7.1f} ms  window {row['window_s']:4.1f} s  "
                    f"cpu {row['cpu_us_per_token']:6.1f} us/tok (steady "
                    f"{row['steady_cpu_us_per_token']:5.1f}, {row['steady_cpu_share']:4.0%} of a core)  "
                    f"merged {row['collector_merged_share']:4.0%}  gc: {row['gc_full_collections']} "
                    f"full (max {row['gc_full_max_ms']:.0f} ms), {row['gc_total_ms']:.0f} ms in all"
                    f"{'' if row['sustained'] else '  NOT sustained'}",
                    flush=True,
                )
                if not row["sustained"]:
                    break
                ceilings[name] = rate
    finally:
        window.WINDOW = on
        runtime.llm = real
        engine.shutdown()
    alone = {r["offered_tok_s"]: r for r in results if r["path"] == "stand-in alone"}
    print(
        "\nceilings (highest offered rate sustained: >= 95 % delivered, lag p99 <= 50 ms); own "
        "CPU per token over the steady window, less the stand-in's (measured alone)"
    )
    for name, _, _ in labels[1:]:
        rows = [r for r in results if r["path"] == name]
        own = [
            r["steady_cpu_us_per_token"]
            - alone.get(r["offered_tok_s"], {}).get("steady_cpu_us_per_token", 0.0)
            for r in rows
        ]
        ceiling = ceilings.get(name, 0)
        target = ""
        if name.startswith("Bare"):
            target = "  (a baseline: the framework alone over Engine.astream)"
        elif name.split(".")[1].startswith("a"):
            met = "met" if ceiling >= ASYNC_TARGET else "MISSED"
            target = f"  target >= {ASYNC_TARGET} tok/s over {args.streams} streams: {met}"
        print(
            f"  {name:38s} ceiling {ceiling:>7d} tok/s  own cpu {min(own):5.1f}-{max(own):5.1f} "
            f"us/tok{target}"
        )
    after = os.getloadavg()
    print(f"host load average (1, 5, 15 min) before {load_before}, after {after}: a shared host")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "simulation": True,
                    "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                    "load_average_before_after": [load_before, after],
                    "streams": args.streams,
                    "seconds": args.seconds,
                    "results": results,
                    "ceilings": ceilings,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
