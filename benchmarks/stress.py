"""Cancellation storm: many streams left after a few chunks, through the engine and both integrations.

Each phase opens ``--streams`` streams, ``--concurrency`` at a time, on a scripted model that never
stops by itself (``ignore_eos=True``, large ``max_tokens``), reads one to three chunks and leaves in
one of seven ways: ``break``, ``aclose()``, task cancellation, dropping an async generator (left to
the garbage collector), and for synchronous streams ``break``, ``close()`` and dropping the
generator. Before and after every phase it prints the engine's unfinished requests, this process's
RSS, threads and open file descriptors, the engine processes' RSS, and the time the engine took to
drain; at the end one normal request per path must give the scripted answer.

    .venv/bin/python benchmarks/stress.py                 # 1,000 streams x 64 concurrent per path
    .venv/bin/python benchmarks/stress.py --streams 200 --concurrency 32

The storm itself (:func:`storm`, :func:`make_paths`) is also run, scaled down, by
``tests/test_reliability.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STYLES",
    "Path",
    "StormResult",
    "adrain",
    "make_paths",
    "snapshot",
    "storm",
]

ASYNC_STYLES = ("break", "aclose", "cancel", "gc")
SYNC_STYLES = ("sync-break", "sync-close", "sync-gc")
STYLES = ASYNC_STYLES + SYNC_STYLES
"""The ways a caller leaves a stream early."""
USER_TEXT = "hi"
LONG_TOKENS = 400  # far more than any stream reads: every stream is left while generating


@dataclass(frozen=True)
class Path:
    """One way into the engine: how to open an endless stream, and one normal request."""

    name: str
    aopen: Callable[[], Awaitable[AsyncIterator[Any]]]
    """Opens an async stream (awaited first: LlamaIndex's ``astream_chat`` is a coroutine)."""
    open: Callable[[], Iterator[Any]]
    """Opens a synchronous stream."""
    answer: Callable[[], str]
    """One normal (non-streaming) request; returns the answer text."""


def make_paths(model: str, engine_kwargs: dict[str, Any]) -> dict[str, Path]:
    """The engine, ``ChatVLLM`` and LlamaIndex ``VLLM`` on one shared engine."""
    from llama_index.core.base.llms.types import ChatMessage

    from vllm_inline.engine import get_engine
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    engine = get_engine(model, **engine_kwargs)
    user = [{"role": "user", "content": USER_TEXT}]
    endless = {"max_tokens": LONG_TOKENS, "ignore_eos": True}
    chat = ChatVLLM(
        model=model,
        vllm_kwargs=engine_kwargs,
        max_tokens=LONG_TOKENS,
        extra_sampling={"ignore_eos": True},
    )
    llm = VLLM(
        model=model,
        vllm_kwargs=engine_kwargs,
        max_tokens=LONG_TOKENS,
        additional_kwargs={"ignore_eos": True},
    )
    li_user = [ChatMessage(role="user", content=USER_TEXT)]

    async def engine_aopen() -> AsyncIterator[Any]:
        return engine.astream(user, **endless)

    async def chat_aopen() -> AsyncIterator[Any]:
        return chat.astream(USER_TEXT)

    async def llm_aopen() -> AsyncIterator[Any]:
        return await llm.astream_chat(li_user)

    plain_chat = ChatVLLM(model=model, vllm_kwargs=engine_kwargs)
    plain_llm = VLLM(model=model, vllm_kwargs=engine_kwargs)
    return {
        "engine": Path(
            "engine",
            engine_aopen,
            lambda: engine.stream(user, **endless),
            lambda: "".join(d.text for d in engine.stream(user)),
        ),
        "langchain": Path(
            "langchain",
            chat_aopen,
            lambda: chat.stream(USER_TEXT),
            lambda: str(plain_chat.invoke(USER_TEXT).content),
        ),
        "llama_index": Path(
            "llama_index",
            llm_aopen,
            lambda: llm.stream_chat(li_user),
            lambda: plain_llm.chat(li_user).message.content or "",
        ),
    }


# -- leaving a stream early ------------------------------------------------------------------


async def _leave_async(path: Path, style: str, chunks: int) -> None:
    it = await path.aopen()
    if style == "break":
        n = 0
        async for _ in it:
            n += 1
            if n >= chunks:
                break
    elif style == "aclose":
        for _ in range(chunks):
            await it.__anext__()
        await it.aclose()  # type: ignore[attr-defined]
    elif style == "cancel":
        got = asyncio.Event()

        async def consume() -> None:
            n = 0
            try:
                async for _ in it:
                    n += 1
                    if n >= chunks:
                        got.set()
            finally:
                got.set()

        task = asyncio.create_task(consume())
        await got.wait()
        if task.done():  # the stream ended or failed before it could be cancelled
            task.result()
            raise AssertionError(f"{path.name}: an endless stream ended by itself")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    elif style == "gc":
        for _ in range(chunks):
            await it.__anext__()
        del it  # dropped: the loop's async-generator finalizer closes it
    else:
        raise ValueError(style)


def _leave_sync(path: Path, style: str, chunks: int) -> None:
    it = path.open()
    if style == "sync-break":
        for n, _ in enumerate(it, 1):
            if n >= chunks:
                break
    elif style == "sync-close":
        for _ in range(chunks):
            next(it)
        it.close()  # type: ignore[attr-defined]
    elif style == "sync-gc":
        for _ in range(chunks):
            next(it)
        del it  # dropped: reference counting closes the generator
    else:
        raise ValueError(style)


@dataclass
class StormResult:
    """What a storm did."""

    streams: int
    seconds: float
    by_style: dict[str, int] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)


async def storm(
    paths: Sequence[Path],
    streams: int,
    concurrency: int,
    *,
    styles: Sequence[str] = STYLES,
    timeout: float = 120.0,
) -> StormResult:
    """Open ``streams`` streams, ``concurrency`` at a time, each left after 1-3 chunks.

    Stream ``i`` goes through ``paths[i % len(paths)]`` and leaves in style
    ``styles[(i // len(paths)) % len(styles)]``, so every path meets every style. Synchronous
    styles run on a private thread pool, shut down before returning.
    """
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(concurrency)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="storm")
    result = StormResult(streams=streams, seconds=0.0)

    async def one(i: int) -> None:
        path = paths[i % len(paths)]
        style = styles[(i // len(paths)) % len(styles)]
        chunks = 1 + i % 3
        async with sem:
            if style in SYNC_STYLES:
                work = loop.run_in_executor(pool, _leave_sync, path, style, chunks)
            else:
                work = _leave_async(path, style, chunks)
            await asyncio.wait_for(work, timeout)
        result.by_style[style] = result.by_style.get(style, 0) + 1

    start = time.monotonic()
    try:
        outcomes = await asyncio.gather(*(one(i) for i in range(streams)), return_exceptions=True)
    finally:
        pool.shutdown(wait=True)
    result.seconds = time.monotonic() - start
    result.errors = [o for o in outcomes if isinstance(o, BaseException)]
    return result


async def finished_requests(
    engine: Any, streams: int, concurrency: int, tokens: int = 3
) -> StormResult:
    """The control: ``streams`` short requests read to their end (no cancellation)."""
    sem = asyncio.Semaphore(concurrency)
    user = [{"role": "user", "content": USER_TEXT}]

    async def one() -> None:
        async with sem:
            deltas = [d async for d in engine.astream(user, max_tokens=tokens, ignore_eos=True)]
            assert deltas[-1].finish_reason == "length"

    start = time.monotonic()
    outcomes = await asyncio.gather(*(one() for _ in range(streams)), return_exceptions=True)
    return StormResult(
        streams=streams,
        seconds=time.monotonic() - start,
        by_style={"read to the end": streams},
        errors=[o for o in outcomes if isinstance(o, BaseException)],
    )


async def adrain(engine: Any, timeout: float = 1.0) -> float | None:
    """Seconds until ``engine.num_unfinished_requests() == 0`` (``None``: not within
    ``timeout``). Runs the caller's loop meanwhile, so dropped async generators get closed."""
    start = time.monotonic()
    while engine.num_unfinished_requests():
        if time.monotonic() - start > timeout:
            return None
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def snapshot(engine: Any) -> dict[str, Any]:
    """Unfinished requests, this process's RSS/threads/fds and the engine processes' RSS."""
    import psutil

    proc = psutil.Process()
    core = worker = 0
    for child in proc.children(recursive=True):
        try:
            rss = child.memory_info().rss
            if "Worker" in child.name():
                worker += rss
            elif "resource_tracker" not in " ".join(child.cmdline()):
                core += rss
        except psutil.NoSuchProcess:
            pass
    return {
        "unfinished": engine.num_unfinished_requests(),
        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
        "threads": proc.num_threads(),
        "py_threads": threading.active_count(),
        "fds": proc.num_fds(),
        "core_rss_mb": round(core / 2**20, 1),
        "worker_rss_mb": round(worker / 2**20, 1),
    }


# -- the script --------------------------------------------------------------------------------


def _show(label: str, snap: dict[str, Any]) -> None:
    print(f"  {label:<14}" + "  ".join(f"{k}={v}" for k, v in snap.items()), flush=True)


def _delta(before: dict[str, Any], after: dict[str, Any]) -> str:
    keys = ("rss_mb", "threads", "py_threads", "fds", "core_rss_mb", "worker_rss_mb")
    return "  ".join(f"{k}{after[k] - before[k]:+.1f}" for k in keys)


async def _phase(
    name: str,
    paths: Sequence[Path],
    engine: Any,
    streams: int,
    concurrency: int,
    *,
    control: bool = False,
) -> bool:
    print(f"\n== {name}: {streams} streams, {concurrency} concurrent ==", flush=True)
    gc.collect()
    before = snapshot(engine)
    _show("before", before)
    if control:
        result = await finished_requests(engine, streams, concurrency)
    else:
        result = await storm(paths, streams, concurrency)
    drained = await adrain(engine, timeout=1.0)
    right_after = snapshot(engine)
    if drained is None:
        drained_late = await adrain(engine, timeout=30.0)
        print(f"  NOT drained within 1 s (took {drained_late} s more)", flush=True)
    gc.collect()
    after = snapshot(engine)
    rate = result.streams / result.seconds if result.seconds else 0.0
    print(
        f"  storm         {result.seconds:.1f} s ({rate:.0f} streams/s), errors={len(result.errors)}, "
        f"styles={result.by_style}",
        flush=True,
    )
    for e in result.errors[:3]:
        print(f"    error: {type(e).__name__}: {e}", flush=True)
    print(f"  drain         {f'{drained:.3f} s' if drained is not None else '> 1 s'}", flush=True)
    _show("after", right_after)
    _show("after gc", after)
    print(f"  change        {_delta(before, after)}", flush=True)
    return drained is not None and not result.errors


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000, help="streams per phase (1000)")
    parser.add_argument("--concurrency", type=int, default=64, help="streams at once (64)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the mixed phase (1)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="first run as many short requests read to the end (no cancellation), for comparison",
    )
    parser.add_argument("--root", default=None, help="where scripted models are built")
    args = parser.parse_args(argv)

    from vllm_inline.testing import scripted_model

    # The tests' CPU settings: float32, a small KV cache, eager mode, a short context.
    scripted = scripted_model("long", root=args.root)
    model, answer, engine = scripted.path, scripted.scenario.answer, scripted.engine
    t0 = time.monotonic()
    engine.start()
    print(f"model {model}\nengine started in {time.monotonic() - t0:.1f} s", flush=True)
    paths = make_paths(model, scripted.engine_kwargs)

    ok = True
    for path in paths.values():  # warm-up: lazy imports and first-call caches are not leaks
        ok &= path.answer() == answer
    asyncio.run(storm(list(paths.values()), 3 * len(STYLES), 8))

    async def run() -> bool:
        good = True
        if args.control:
            good &= await _phase(
                "control: 3-token requests read to the end",
                [],
                engine,
                args.streams,
                args.concurrency,
                control=True,
            )
        for name, path in paths.items():
            good &= await _phase(name, [path], engine, args.streams, args.concurrency)
        for r in range(1, args.rounds + 1):
            good &= await _phase(
                f"all paths mixed, round {r}",
                list(paths.values()),
                engine,
                args.streams,
                args.concurrency,
            )
        return good

    ok &= asyncio.run(run())
    print("\n== one normal request per path afterwards ==", flush=True)
    for name, path in paths.items():
        t = time.monotonic()
        text = path.answer()
        right = text == answer
        ok &= right
        print(
            f"  {name:<12} {'ok' if right else 'WRONG'} in {time.monotonic() - t:.2f} s: {text[:48]!r}...",
            flush=True,
        )
    t = time.monotonic()
    engine.shutdown()
    print(f"\nshutdown in {time.monotonic() - t:.1f} s; {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
