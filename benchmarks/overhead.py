"""Where the time of a LangChain stream goes, and what the frozen GC heap saves: one engine.

Two measurements on the tiny benchmark model at one concurrency (default 32), each path run
``--repeats`` times, interleaved, reporting medians of tokens/s and client CPU per token:

* ``split``: raw ``AsyncLLM``, ``Engine.astream``, ``ChatVLLM._astream`` (vllm-inline's chunk
  converter alone) and ``ChatVLLM.astream`` (with LangChain's ``BaseChatModel.astream``), so the
  differences give the engine+bridge, converter and LangChain wrapper shares, each also split by
  thread (engine loop, caller, vLLM's renderer pool; Linux ``/proc``);
* ``gc``: ``ChatVLLM.astream`` with the start-up heap frozen (what the engine does) and unfrozen,
  with the garbage collector's collections per generation and their total pause time.

    .venv/bin/python benchmarks/overhead.py               # both, ~3 min
    .venv/bin/python benchmarks/overhead.py --only gc --repeats 6
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paths as P
from measure import Record
from models import SPECS, build_model
from run import ENGINE_OPTIONS


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's live threads, summed by role (Linux only)."""
    import threading

    roles = {}
    for t in threading.enumerate():
        name = t.name
        role = (
            "engine loop"
            if name.startswith("vllm-inline:")
            else "caller"
            if t is threading.main_thread()
            else "renderer pool"
            if name.startswith("ThreadPoolExecutor")
            else "other"
        )
        roles[t.native_id] = role
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid, role in roles.items():
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class GcTimer:
    """Collections per generation and their summed pause, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.reset()
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.pause_s = 0.0
        self.collections = [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pause_s += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["split", "gc"])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    spec = SPECS["tiny"]
    model = str(build_model(spec))
    from vllm_inline.engine import get_engine

    engine = get_engine(model, **ENGINE_OPTIONS).start()
    runtime = engine.runtime  # the AsyncLLM and its loop thread
    chat = P.chat_vllm(model, ENGINE_OPTIONS)
    tokens, c, rounds = spec.tokens, args.concurrency, 3
    kw = P.sampling(tokens)
    messages = P.lc_messages()

    async def converter_only() -> Record:
        rec, n = Record(), 0
        async for chunk in chat._astream(messages, **kw):
            usage = chunk.message.usage_metadata
            n += usage["output_tokens"] if usage else 0
            rec.chunk(chunk.message.content)
        return rec.done(n)

    raw = P.raw_request(runtime.llm, P.prompt_ids(model), tokens)
    requests: dict[str, Callable[[], Awaitable[Record]]] = {
        "raw AsyncLLM": raw,
        "Engine.astream": P.engine_async(engine, tokens),
        "ChatVLLM._astream": converter_only,
        "ChatVLLM.astream": P.langchain_async(chat, tokens, **kw),
    }
    timer = GcTimer()

    roles = ("engine loop", "caller", "renderer pool")
    by_thread: dict[str, list[dict[str, float]]] = {name: [] for name in requests}

    def run(name: str) -> tuple[float, float]:
        threads0 = thread_cpu()
        t0, cpu0 = time.perf_counter(), time.process_time()
        if name == "raw AsyncLLM":
            runtime.loop.submit(P.run_async_load(raw, c, rounds)).result()
        else:
            asyncio.run(P.run_async_load(requests[name], c, rounds))
        n = c * rounds * tokens
        threads1 = thread_cpu()
        by_thread[name].append(
            {r: (threads1.get(r, 0.0) - threads0.get(r, 0.0)) * 1e6 / n for r in roles}
        )
        return n / (time.perf_counter() - t0), (time.process_time() - cpu0) * 1e6 / n

    for name, request in requests.items():  # warm-up
        if name != "raw AsyncLLM":
            asyncio.run(P.run_async_load(request, 4, 1))

    if args.only in (None, "split"):
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in requests}
        for _ in range(args.repeats):
            for name in requests:
                results[name].append(run(name))
        print(f"\n== split: tiny model, c={c}, median of {args.repeats} interleaved runs ==")
        base = statistics.median(r[1] for r in results["raw AsyncLLM"])
        for name, runs in results.items():
            tps = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            split = "  ".join(
                f"{r} {statistics.median(t[r] for t in by_thread[name]):5.1f}" for r in roles
            )
            print(
                f"{name:<20} {tps:7.0f} tok/s  client CPU {cpu:6.1f} us/token ({cpu - base:+.1f})"
                f"  by thread: {split}"
            )

    if args.only in (None, "gc"):
        gc_runs: dict[bool, list[tuple[float, float, float, list[int]]]] = {True: [], False: []}
        for rep in range(args.repeats):
            for frozen in (True, False) if rep % 2 == 0 else (False, True):
                if frozen:
                    gc.collect()
                    gc.freeze()
                else:
                    gc.unfreeze()
                timer.reset()
                tps, cpu = run("ChatVLLM.astream")
                gc_runs[frozen].append((tps, cpu, timer.pause_s, list(timer.collections)))
        gc.collect()
        gc.freeze()  # as the engine left it
        print(
            f"\n== ChatVLLM.astream, c={c}: start-up heap ({gc.get_freeze_count()} objects) "
            f"frozen or not, {args.repeats} interleaved runs each =="
        )
        for frozen, runs in gc_runs.items():
            pauses = ", ".join(f"{r[2] * 1e3:.0f} ms {r[3]}" for r in runs)
            print(
                f"frozen={frozen!s:<5} {statistics.median(r[0] for r in runs):7.0f} tok/s  "
                f"client CPU {statistics.median(r[1] for r in runs):6.1f} us/token  "
                f"GC pause per run [collections gen0, gen1, gen2]: {pauses}"
            )
    engine.shutdown()


if __name__ == "__main__":
    main()
