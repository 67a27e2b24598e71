"""GPU-rate simulation: our per-token budget when the engine is far faster than these CPUs.

A BENCHMARK HARNESS, NOT A TEST: nothing here shows that streaming works (the tests do that on
real engines). It measures what vllm-inline and the frameworks cost per token at GPU rates.

A real engine is started on a tiny scripted model, then its ``AsyncLLM`` is wrapped
(``simulated_engine.SimulatedLLM``): its engine is replaced by a stand-in modelled on vLLM's
``AsyncLLM``. One output-handler task emits one DELTA ``RequestOutput`` per running request per
simulated engine step (``streams / step`` tokens/s in all), at the engine's pace whatever the
consumers do, into each request's vLLM ``RequestOutputCollector``, which merges the DELTA
outputs a lagging consumer has not taken yet; ``generate`` yields from the collector as
``AsyncLLM.generate`` does. Everything else (renderer, sampling params, the request path,
parsers, ``Delta``, the bridge, the LangChain and LlamaIndex converters and the frameworks' own
per-chunk work) is the real code. ``BareChatModel.astream`` and ``BareLLM.astream_chat``
(:mod:`bare_frameworks`) are baselines: LangChain's and LlamaIndex's own streaming over
``Engine.astream`` with no integration work, what any integration of theirs costs at least.
Each emitted token carries a serial number in its text; the consumer looks up when it was
emitted (put into its collector), which gives the consumer lag (``simulated_engine.Lags``).

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
                                 [--paths ChatVLLM.astream,...] [--stream-interval 2]
                                 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import GcPauses, percentile
from report import write_json
from simulated_engine import Lags, SimulatedLLM, StreamLags

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
TARGET = 25_600
"""The rate every async path, and `ChatVLLM.stream` (issue 66), should sustain."""


def _consumers(
    engine: Any, chat: Any, li: Any, tokens: int, stream_interval: int
) -> dict[str, Any]:
    from bare_frameworks import BareChatModel, BareLLM
    from llama_index.core.llms import ChatMessage

    bare_chat, bare_li = BareChatModel(engine=engine), BareLLM(engine=engine)

    messages = [{"role": "user", "content": "Hi"}]
    kw: dict[str, Any] = {"max_tokens": tokens, "ignore_eos": True, "temperature": 1.0}
    if stream_interval > 1:  # vLLM's own SamplingParams field, passed per call as users would
        kw["stream_interval"] = stream_interval
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
        "--stream-interval",
        type=int,
        default=1,
        help="vLLM's stream_interval per request (tokens per streamed output after the first); "
        "the stand-in holds tokens as vLLM's output processor does",
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

    from vllm_inline.engine import get_engine
    from vllm_inline.engine.loop import window
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
    interval = f" [stream_interval {args.stream_interval}]" if args.stream_interval > 1 else ""
    labels += [
        (n + interval + ("" if w else " [no backpressure]"), n, w) for n in names[1:] for w in modes
    ]
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
                    consume = _consumers(engine, chat, li, tokens, args.stream_interval)[path]
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
        elif name.split(".")[1].startswith("a") or name.startswith("ChatVLLM."):
            met = "met" if ceiling >= TARGET else "MISSED"
            target = f"  target >= {TARGET} tok/s over {args.streams} streams: {met}"
        print(
            f"  {name:38s} ceiling {ceiling:>7d} tok/s  own cpu {min(own):5.1f}-{max(own):5.1f} "
            f"us/tok{target}"
        )
    after = os.getloadavg()
    print(f"host load average (1, 5, 15 min) before {load_before}, after {after}: a shared host")
    if args.json:
        write_json(
            args.json,
            {
                "simulation": True,
                "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                "load_average_before_after": [load_before, after],
                "streams": args.streams,
                "seconds": args.seconds,
                "stream_interval": args.stream_interval,
                "results": results,
                "ceilings": ceilings,
            },
        )


if __name__ == "__main__":
    main()
