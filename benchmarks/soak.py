"""Soak: many requests through ChatVLLM and LlamaIndex's VLLM, a quarter left mid-stream, while
this process's RSS, threads, open file descriptors and asyncio tasks are sampled.

After a warm-up the figures must stay flat: a leak shows as a slope. The script fits a line to
the RSS samples after the warm-up and prints the growth per 10,000 requests (target: under
1 MiB), the threads', descriptors' and tasks' ranges, and with ``--tracemalloc`` the ten
allocation sites that grew most between the end of the warm-up and the end (what a slope is
made of: a cache that fills up and stops, or a list that never does).

    .venv/bin/python benchmarks/soak.py                      # 50,000 requests, 32 at a time
    .venv/bin/python benchmarks/soak.py --requests 10000 --tracemalloc

The requests rotate over four calls on one shared engine (a scripted model, the tests' CPU
settings): ``ChatVLLM.stream`` (in a worker thread), ``ChatVLLM.astream``, ``ChatVLLM.ainvoke``
and ``VLLM.astream_chat``; every fourth streamed request is left after its first chunk
(``break``, which closes the stream and aborts the request).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stress import snapshot  # this process's RSS, threads, descriptors; the engine's unfinished

USER_TEXT = "hi"


def make_calls(
    model: str, engine_kwargs: dict[str, Any]
) -> list[Callable[[bool], Awaitable[None]]]:
    """The four calls, each ``call(leave_early)``."""
    from llama_index.core.base.llms.types import ChatMessage

    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    chat = ChatVLLM(model=model, vllm_kwargs=engine_kwargs)
    llm = VLLM(model=model, vllm_kwargs=engine_kwargs)
    li_user = [ChatMessage(role="user", content=USER_TEXT)]

    def sync_stream(leave: bool) -> None:
        for _ in chat.stream(USER_TEXT):
            if leave:
                break

    async def chat_stream(leave: bool) -> None:
        await asyncio.to_thread(sync_stream, leave)

    async def chat_astream(leave: bool) -> None:
        async for _ in chat.astream(USER_TEXT):
            if leave:
                break

    async def chat_ainvoke(leave: bool) -> None:
        await chat.ainvoke(USER_TEXT)  # not a stream: never left early

    async def llm_astream_chat(leave: bool) -> None:
        async for _ in await llm.astream_chat(li_user):
            if leave:
                break

    return [chat_stream, chat_astream, chat_ainvoke, llm_astream_chat]


def sample(engine: Any, done: int, started: float) -> dict[str, Any]:
    snap = snapshot(engine)
    return {
        "requests": done,
        "s": round(time.monotonic() - started, 1),
        "rss_mb": snap["rss_mb"],
        "threads": snap["threads"],
        "fds": snap["fds"],
        "tasks": len(asyncio.all_tasks()),
        "unfinished": snap["unfinished"],
    }


async def soak(
    calls: list[Callable[[bool], Awaitable[None]]],
    engine: Any,
    requests: int,
    concurrency: int,
    every: int,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Run ``requests`` calls, ``concurrency`` at a time; a sample every ``every`` requests
    (numbered from ``offset``)."""
    numbers = itertools.count()
    done = 0
    started = time.monotonic()
    samples = [sample(engine, offset, started)]

    async def worker() -> None:
        nonlocal done
        while (n := next(numbers)) < requests:
            # Each call in turn; every fourth time a call comes round, a stream is left early.
            await calls[n % len(calls)]((n // len(calls)) % 4 == 0)
            done += 1
            if done % every == 0:
                gc.collect()
                samples.append(sample(engine, offset + done, started))
                print("  " + "  ".join(f"{k}={v}" for k, v in samples[-1].items()), flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def slope_per_10k(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs``, per 10,000 of ``xs``."""
    return statistics.linear_regression(xs, ys).slope * 10_000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests in all (50,000)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests at once (32)")
    parser.add_argument("--every", type=int, default=2_500, help="requests between samples")
    parser.add_argument("--warmup", type=int, default=5_000, help="requests before the fit")
    parser.add_argument("--tracemalloc", action="store_true", help="the sites that grew most")
    parser.add_argument("--root", default=None, help="where scripted models are built")
    args = parser.parse_args(argv)

    from vllm_inline.testing import scripted_model

    scripted = scripted_model("llama3", root=args.root)
    engine = scripted.engine.start()
    calls = make_calls(scripted.path, scripted.engine_kwargs)
    print(
        f"model {scripted.path}; {args.requests} requests, {args.concurrency} at a time, "
        f"calls: ChatVLLM.stream, ChatVLLM.astream, ChatVLLM.ainvoke, VLLM.astream_chat; "
        "every 4th stream left after its first chunk",
        flush=True,
    )

    async def run() -> list[dict[str, Any]]:
        warm = await soak(calls, engine, args.warmup, args.concurrency, args.every)
        if args.tracemalloc:
            tracemalloc.start(8)
        gc.collect()
        before = tracemalloc.take_snapshot() if args.tracemalloc else None
        rest = await soak(
            calls, engine, args.requests - args.warmup, args.concurrency, args.every, args.warmup
        )
        if before is not None:
            gc.collect()
            grown = tracemalloc.take_snapshot().compare_to(before, "traceback")
            print("\nallocation sites that grew most after the warm-up (tracemalloc):")
            for stat in grown[:10]:
                print(
                    f"  {stat.size_diff / 1024:+9.1f} KiB  {stat.count_diff:+7d} blocks  "
                    f"{stat.traceback.format()[-1].strip()}"
                )
        return warm + rest[1:]

    started = time.monotonic()
    samples = asyncio.run(run())
    after = [s for s in samples if s["requests"] >= args.warmup]
    xs = [s["requests"] for s in after]
    growth = slope_per_10k(xs, [s["rss_mb"] for s in after])
    rate = args.requests / (time.monotonic() - started)
    print(
        f"\n{args.requests} requests in {time.monotonic() - started:.0f} s ({rate:.0f}/s); "
        "tasks and unfinished are sampled while the other workers' requests run"
    )
    print(
        f"RSS after the warm-up: {after[0]['rss_mb']} -> {after[-1]['rss_mb']} MiB, "
        f"fitted growth {growth:+.2f} MiB per 10,000 requests (target under 1)"
        + (" (tracemalloc's own bookkeeping included)" if args.tracemalloc else "")
    )
    for key in ("threads", "fds", "tasks", "unfinished"):
        values = [s[key] for s in after]
        print(f"{key}: {min(values)}-{max(values)}")
    engine.shutdown()
    return 0 if growth < 1 and after[-1]["unfinished"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
